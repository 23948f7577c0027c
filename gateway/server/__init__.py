"""The server: application factory, connections, the concerns every request passes,
configuration, shutdown and readiness.
"""
