"""HTTP edge of the built-in authorization server (the logic is :mod:`auth.issuer`).

* ``POST /oauth/token``: the client-credentials grant. Its errors are RFC 6749
  section 5.2 JSON, not the ``text/plain`` of the rest of the gateway, because OAuth
  client libraries read them; every reply carries ``Cache-Control: no-store``.
* ``GET /.well-known/jwks.json``: the public signing key.
* ``GET /.well-known/oauth-authorization-server``: RFC 8414 metadata.

The three paths (:data:`PUBLIC_PATHS`) need no bearer token. Client lookup and
secret checks (scrypt, file reads) run in a thread, never on the loop. Secrets and
tokens are never logged. Where the client registry or the bounds on secret checks
cannot be reached (the shared state of several nodes, docs/AUTH.md), the answer is a
503 ``temporarily_unavailable`` with ``Retry-After``, never a token.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import orjson
from aiohttp import web

from auth.clients import Clients, ClientStore, FileClients
from auth.issuer import (
    JWKS_PATH,
    MAX_FORM,
    METADATA_PATH,
    TOKEN_PATH,
    InvalidClient,
    InvalidRequest,
    Issuer,
    OAuthError,
    TooManyChecks,
    parse_token_request,
)
from gateway.server.keys import CHECKS, CLIENTS, ISSUER, SERVICE

log = logging.getLogger(__name__)

PUBLIC_PATHS: frozenset[str] = frozenset({TOKEN_PATH, JWKS_PATH, METADATA_PATH})

_NO_STORE = {"Cache-Control": "no-store", "Pragma": "no-cache"}
_CACHEABLE = {"Cache-Control": "public, max-age=300"}
_CHALLENGE = 'Basic realm="restms"'


class Unavailable(OAuthError):
    """The registry or the bounds did not answer: RFC 6749 section 4.1.2.1's code for
    "try again later", with the gateway's 503."""

    error = "temporarily_unavailable"
    status = 503


def add_routes(app: web.Application, issuer: Issuer, clients: Clients | ClientStore) -> None:
    """Serve the token endpoint, the JWKS and the metadata from ``app``."""
    app[ISSUER] = issuer
    app[CLIENTS] = FileClients(clients) if isinstance(clients, ClientStore) else clients
    app.router.add_post(TOKEN_PATH, token)
    app.router.add_get(JWKS_PATH, jwks)
    app.router.add_get(METADATA_PATH, metadata)


def _json(document: dict[str, Any], headers: dict[str, str], status: int = 200) -> web.Response:
    body = orjson.dumps(document)
    return web.Response(status=status, body=body, content_type="application/json", headers=headers)


async def token(request: web.Request) -> web.Response:
    """RFC 6749 section 4.4: authenticate the client, then issue it an access token."""
    try:
        body = await _read_form(request)
        wanted = parse_token_request(
            request.content_type, body, request.headers.get("Authorization")
        )
        checks = request.app.get(CHECKS)
        try:
            if checks is not None:  # 429 past a bound, an OAuth error as the others here
                wait, reason = await checks.admit(
                    request.remote, wanted.client_id, wanted.client_secret
                )
                if wait:
                    raise TooManyChecks(reason, max(1, math.ceil(wait)))
            client = await request.app[CLIENTS].authenticate(wanted.client_id, wanted.client_secret)
            if client is not None and checks is not None:
                await checks.passed(wanted.client_id, wanted.client_secret)
        except OSError as exc:  # a store that did not answer; the reason names no secret
            log.warning("token request not served: %s", exc)
            raise Unavailable("the client registry cannot be reached; retry later") from exc
        if client is None:
            # not the id sent: a client that swapped id and secret would log its secret
            log.info("token refused: bad client credentials", extra={"peer": request.remote})
            service = request.app.get(SERVICE)  # none on an authorization server alone
            events = service.events if service is not None else None
            if events is not None:  # auth.failed, coalesced with the others of its scheme
                events.auth_failed("client", request.remote, "unknown client or wrong secret")
            raise InvalidClient("unknown client or wrong secret")
        reply = request.app[ISSUER].token(client, wanted.scope)
    except OAuthError as exc:
        headers = dict(_NO_STORE)
        if exc.status == 401:  # RFC 9110 section 15.5.2: a 401 names a scheme to use
            headers["WWW-Authenticate"] = _CHALLENGE
        if isinstance(exc, TooManyChecks):
            headers["Retry-After"] = str(exc.retry_after)
        elif isinstance(exc, Unavailable):
            headers["Retry-After"] = "1"
        document = {"error": exc.error, "error_description": exc.description}
        return _json(document, headers, exc.status)
    log.info("token issued", extra={"client_id": client.client_id, "scope": reply["scope"]})
    return _json(reply, _NO_STORE)


async def _read_form(request: web.Request) -> bytes:
    """The body, refused as soon as it passes :data:`MAX_FORM` bytes."""
    length = request.content_length
    if length is not None and length > MAX_FORM:
        raise InvalidRequest(f"the request body is larger than {MAX_FORM} bytes")
    body = bytearray()
    while chunk := await request.content.read(MAX_FORM + 1 - len(body)):
        body += chunk
        if len(body) > MAX_FORM:
            raise InvalidRequest(f"the request body is larger than {MAX_FORM} bytes")
    return bytes(body)


async def jwks(request: web.Request) -> web.Response:
    return _json(request.app[ISSUER].jwks(), _CACHEABLE)


async def metadata(request: web.Request) -> web.Response:
    return _json(request.app[ISSUER].metadata(), _CACHEABLE)
