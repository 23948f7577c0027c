"""HTTP edge of the built-in authorization server (the logic is :mod:`auth.issuer` and
:mod:`auth.token_endpoints`).

* ``POST /oauth/token``: the client-credentials grant.
* ``POST /oauth/introspect``: RFC 7662 introspection of the issuer's own tokens.
* ``POST /oauth/revoke``: RFC 7009 revocation of one of the client's tokens.
* ``GET /.well-known/jwks.json``: the public signing key.
* ``GET /.well-known/oauth-authorization-server``: RFC 8414 metadata.

The three POST endpoints authenticate the client the same way (:func:`_client`: HTTP
Basic or form fields, the secret checks bounded per address and per account, a secret
that checked right lately not checked again); their
errors are RFC 6749 section 5.2 JSON, not the ``text/plain`` of the rest of the
gateway, because OAuth client libraries read them, and every reply carries
``Cache-Control: no-store``.

The five paths (:data:`PUBLIC_PATHS`) need no bearer token. Client lookup and
secret checks (scrypt, file reads) run in a thread, never on the loop. Secrets and
tokens are never logged. Where the client registry, the bounds on secret checks or the
revocation list cannot be reached (the shared state of several nodes, docs/AUTH.md),
the answer is a 503 ``temporarily_unavailable`` with ``Retry-After``, never a token
and never a guess.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from aiohttp import web

from auth.clients import CheckedSecrets, Client, Clients, ClientStore, FileClients
from auth.issuer import (
    INTROSPECTION_PATH,
    JWKS_PATH,
    MAX_FORM,
    METADATA_PATH,
    REVOCATION_PATH,
    TOKEN_PATH,
    InvalidClient,
    InvalidRequest,
    Issuer,
    OAuthError,
    TooManyChecks,
    Unavailable,
    parse_token_request,
)
from auth.token_endpoints import OwnTokens, parse_token_query
from gateway.server import compression
from gateway.server.bodies import read_at_most
from gateway.server.keys import CHECKS, CLIENTS, ISSUER, SERVICE

log = logging.getLogger(__name__)

PUBLIC_PATHS: frozenset[str] = frozenset(
    {TOKEN_PATH, INTROSPECTION_PATH, REVOCATION_PATH, JWKS_PATH, METADATA_PATH}
)
# The introspection and revocation endpoints' logic, set at start with the issuer.
OWN_TOKENS = web.AppKey("oauth_own_tokens", OwnTokens)
CHECKED = web.AppKey("oauth_checked_secrets", CheckedSecrets)

_NO_STORE = {"Cache-Control": "no-store", "Pragma": "no-cache"}
_CACHEABLE = {"Cache-Control": "public, max-age=300"}
_CHALLENGE = 'Basic realm="restms"'


def add_routes(
    app: web.Application,
    issuer: Issuer,
    clients: Clients | ClientStore,
    own: OwnTokens | None = None,
) -> None:
    """Serve the built-in issuer from ``app``, with its state given (an authorization
    server alone; the gateway sets the state at start-up and calls :func:`serve`)."""
    app[ISSUER] = issuer
    app[CLIENTS] = FileClients(clients) if isinstance(clients, ClientStore) else clients
    if own is not None:
        app[OWN_TOKENS] = own
    serve(app)


def serve(app: web.Application) -> None:
    """The routes of the five endpoints."""
    app[CHECKED] = CheckedSecrets()
    app.router.add_post(TOKEN_PATH, token)
    app.router.add_post(INTROSPECTION_PATH, introspect)
    app.router.add_post(REVOCATION_PATH, revoke)
    app.router.add_get(JWKS_PATH, jwks)
    app.router.add_get(METADATA_PATH, metadata)


def _json(document: dict[str, Any], headers: dict[str, str], status: int = 200) -> web.Response:
    body = orjson.dumps(document)
    return web.Response(status=status, body=body, content_type="application/json", headers=headers)


async def _answered(work: Callable[[], Awaitable[web.Response]]) -> web.Response:
    """``work``'s reply, or its :class:`OAuthError` as RFC 6749 section 5.2 JSON."""
    try:
        return await work()
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


async def _client(request: web.Request, client_id: str, secret: str) -> Client:
    """The client whose id and secret these are, checked within the bounds on secret
    checks; :class:`InvalidClient` (401) for a wrong one, as at every endpoint here. A
    secret that checked right lately against the client as it is now is not checked
    again (:class:`auth.clients.CheckedSecrets`)."""
    checks = request.app.get(CHECKS)
    registry, checked = request.app[CLIENTS], request.app[CHECKED]
    try:
        client = await registry.get(client_id)
        if client is not None and checked.holds(client, secret):
            return client
        if checks is not None:  # 429 past a bound, an OAuth error as the others here
            wait, reason = await checks.admit(request.remote, client_id, secret)
            if wait:
                raise TooManyChecks(reason, max(1, math.ceil(wait)))
        client = await registry.authenticate(client_id, secret)
        if client is not None:
            checked.add(client, secret)
            if checks is not None:
                await checks.passed(client_id, secret)
    except OSError as exc:  # a store that did not answer; the reason names no secret
        log.warning("client not authenticated: %s", exc)
        raise Unavailable("the client registry cannot be reached; retry later") from exc
    if client is None:
        # not the id sent: a client that swapped id and secret would log its secret
        log.info("client refused: bad client credentials", extra={"peer": request.remote})
        service = request.app.get(SERVICE)  # none on an authorization server alone
        events = service.events if service is not None else None
        if events is not None:  # auth.failed, coalesced with the others of its scheme
            events.auth_failed("client", request.remote, "unknown client or wrong secret")
        raise InvalidClient("unknown client or wrong secret")
    return client


async def token(request: web.Request) -> web.Response:
    """RFC 6749 section 4.4: authenticate the client, then issue it an access token."""

    async def work() -> web.Response:
        body = await _read_form(request)
        wanted = parse_token_request(
            request.content_type, body, request.headers.get("Authorization")
        )
        client = await _client(request, wanted.client_id, wanted.client_secret)
        reply = request.app[ISSUER].token(client, wanted.scope)
        log.info("token issued", extra={"client_id": client.client_id, "scope": reply["scope"]})
        return _json(reply, _NO_STORE)

    return await _answered(work)


async def introspect(request: web.Request) -> web.Response:
    """RFC 7662 section 2: what the token is, for an authenticated client."""

    async def work() -> web.Response:
        query = parse_token_query(
            request.content_type, await _read_form(request), request.headers.get("Authorization")
        )
        client = await _client(request, query.client_id, query.client_secret)
        return _json(await _own(request).introspect(client, query.token), _NO_STORE)

    return await _answered(work)


async def revoke(request: web.Request) -> web.Response:
    """RFC 7009 section 2: revoke one of the authenticated client's tokens; 200 whether
    it was one or not."""

    async def work() -> web.Response:
        query = parse_token_query(
            request.content_type, await _read_form(request), request.headers.get("Authorization")
        )
        client = await _client(request, query.client_id, query.client_secret)
        try:
            revoked = await _own(request).revoke(client, query.token)
        except OSError as exc:  # not recorded: the client retries
            log.warning("token not revoked: %s", exc)
            raise Unavailable("the revocation list cannot be written; retry later") from exc
        except ValueError as exc:  # a revocation file damaged by hand: not overwritten
            log.warning("token not revoked: %s", exc)
            raise Unavailable("the revocation list cannot be read; retry later") from exc
        if revoked:
            log.info("token revoked", extra={"client_id": client.client_id})
        return web.Response(status=200, headers=_NO_STORE)

    return await _answered(work)


def _own(request: web.Request) -> OwnTokens:
    own = request.app.get(OWN_TOKENS)
    if own is None:  # an authorization server alone, given no revocation list
        raise Unavailable("this server does not introspect or revoke tokens")
    return own


# Parameters refused in the URL: access logs and proxies keep a query string.
_SECRET_PARAMETERS = frozenset(("token", "client_secret", "client_assertion"))


async def _read_form(request: web.Request) -> bytes:
    """The body, refused as soon as it passes :data:`MAX_FORM` bytes, and the request
    refused when it puts a token or a secret in the URL instead."""
    if not _SECRET_PARAMETERS.isdisjoint(request.query):
        raise InvalidRequest(
            "send token and client_secret in the form body (application/x-www-form-"
            "urlencoded), never in the URL, which logs keep"
        )
    length = request.content_length
    if length is not None and length > MAX_FORM:
        raise InvalidRequest(f"the request body is larger than {MAX_FORM} bytes")
    coding = compression.coding_of(request.headers)
    if coding is not None:
        try:
            decoded = await compression.read_decoded(request.content, coding, MAX_FORM)
        except compression.Undecodable as exc:
            raise InvalidRequest(f"the request body does not decode: {exc}") from exc
        if len(decoded) > MAX_FORM:
            raise InvalidRequest(f"the request body is larger than {MAX_FORM} bytes")
        return decoded
    body, more = await read_at_most(request.content, MAX_FORM)
    if more:
        raise InvalidRequest(f"the request body is larger than {MAX_FORM} bytes")
    return body


async def jwks(request: web.Request) -> web.Response:
    return _json(request.app[ISSUER].jwks(), _CACHEABLE)


async def metadata(request: web.Request) -> web.Response:
    return _json(request.app[ISSUER].metadata(), _CACHEABLE)
