"""Authentication at the HTTP edge: the principal of every request and the built-in OAuth
server's endpoints (the logic is in the top-level auth package).
"""
