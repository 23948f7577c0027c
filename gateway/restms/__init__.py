"""The RestMS resources over HTTP: handlers, documents, conditional and evented GETs,
streams, WebSocket, idempotency and access control.
"""
