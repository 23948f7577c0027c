"""Authentication: the middleware that gives every request its principal (docs/AUTH.md).

Order of the checks, cheapest first: the token cache (a dict lookup for a token seen
before), then the full token check (signature, claims, keys fetched from a JWKS URL
or an RFC 7662 introspection call), then HTTP Basic (scrypt, in a thread, its result
remembered for a while), then the anonymous loopback guest. Then the principal's
rate limit. Failures are 401 with ``WWW-Authenticate`` challenges (RFC 6750 3.1).
Every secret checked with scrypt (a Basic login not remembered, a token request) is
also rate limited per peer address, so a guesser cannot keep the scrypt threads busy.

The policy itself (who may do what) lives in :mod:`auth`; this module reads the
request, calls it, and turns its answers into replies.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import json
import logging
import math
import time
import urllib.parse
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Mapping
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import hdrs, web
from joserfc.jwk import ECKey

from auth import ACTIONS, GUEST, Guests, Principal, Tenants, User, grants
from auth.clients import CLIENTS_FILE, DUMMY_HASH, ClientStore, verify_secret
from auth.issuer import KEY_FILE, Issuer, SigningKey
from auth.limits import RateLimiter, Slots
from auth.revocations import REVOKED_FILE, Revocations
from auth.tokens import Introspector, JwtVerifier, TokenError, TrustedIssuer, Verifier
from restms.errors import TooManyRequests, Unauthorized

from . import oauth, page
from .config import Config
from .connections import waits
from .keys import CONFIG, ENGINE

log = logging.getLogger(__name__)

REALM = "restms"
BASIC_REALM = "RestMS::"  # the realm older RestMS clients answer (L31)
LOGIN_MEMORY = 300.0  # seconds a checked Basic password is remembered
LOGINS_KEPT = 10_000
FAILED_RATE, FAILED_BURST = 5.0, 20  # scrypt secret checks per second per peer address
FETCH_LIMIT = 1024 * 1024  # bytes of a JWKS or introspection answer at most
FETCH_TIMEOUT = 5.0  # seconds for a JWKS or introspection call
# What holds a wait slot (:func:`waiting`): asynclets, evented GETs, SSE and stream-pipe
# readers hold a principal's wait slots, WebSockets its socket slots.
WAIT_KINDS = ("asynclet", "evented", "sse", "stream", "websocket")


class Authenticator:
    """Everything needed to turn a request's credentials into a :class:`Principal`."""

    def __init__(self, config: Config) -> None:
        self.guests = Guests(
            anonymous=config.anonymous,
            guest_user=config.guest_user,
            scopes=config.guest_scopes.split(),
            insecure=config.insecure,
        )
        self.users: dict[str, User] = {u.name: u for u in config.users}
        self.tenants = Tenants(dict(config.domain_principals))
        self.rate = config.rate_limit
        self.limiter = RateLimiter(config.rate_limit, config.rate_burst)
        self.failures = RateLimiter(FAILED_RATE, FAILED_BURST)
        self.waits = Slots(config.max_waits_per_principal)
        self.sockets = Slots(config.websocket_max_per_principal)  # open WebSockets
        self.open_waits = dict.fromkeys(WAIT_KINDS, 0)  # held now, by kind (GET /metrics)
        self.verifier: Verifier | None = None  # set when the app starts (keys are read)
        # The built-in issuer's revoked clients (set at start with the issuer, if any).
        self.revocations: Revocations | None = None
        self.builtin = ""  # the built-in issuer's "iss"
        self.prefixes: dict[str, str] = {}  # token issuer -> prefix of its principals' names
        endpoint = urllib.parse.urlsplit(config.introspection_url).netloc
        self.introspected = endpoint + "/"  # prefix for introspected tokens of unknown iss
        # Checked Basic logins: (name, sha256 of password) -> (principal, until when)
        self._logins: OrderedDict[tuple[str, bytes], tuple[Principal, float]] = OrderedDict()
        basic = self.users or config.guest_user
        self.challenges = (f'Bearer realm="{REALM}"',) + (
            (f'Basic realm="{BASIC_REALM}"',) if basic else ()
        )

    # ------------------------------------------------------------ the three ways in
    async def principal(
        self, header: str | None, peer: str | None, forwarded: bool = False
    ) -> Principal:
        if header is None:
            return self.anonymous(peer, forwarded)
        scheme, _, credentials = header.strip().partition(" ")
        scheme = scheme.lower()
        if scheme == "bearer":
            return await self.bearer(credentials.strip())
        if scheme == "basic":
            return await self.basic(credentials.strip(), peer, forwarded)
        raise Unauthorized(
            "unsupported authorization scheme: use Bearer (or Basic)", self.challenges
        )

    def anonymous(self, peer: str | None, forwarded: bool = False) -> Principal:
        """The principal of a request without credentials, or 401."""
        principal = self.guests.anonymous_for(peer, forwarded)
        if principal is None:
            raise Unauthorized("authentication required", self.challenges)
        return principal

    async def bearer(self, token: str) -> Principal:
        verifier = self.verifier
        if verifier is None:
            raise Unauthorized("bearer tokens are not accepted here", self.challenges)
        claims = verifier.cached(token)
        if claims is None:
            try:
                claims = await verifier.verify(token)
            except TokenError as exc:
                challenge = bearer_challenge(exc.error, exc.description)
                raise Unauthorized(
                    f"bearer token refused: {exc.description}", (challenge,)
                ) from None
        revoked = self.revocations
        if (
            revoked is not None
            and revoked.at  # usually empty: no call on the hot path
            and claims.issuer == self.builtin
            and revoked.refuses(claims.subject, claims.issued)
        ):
            challenge = bearer_challenge("invalid_token", "its client was revoked")
            raise Unauthorized("bearer token refused: its client was revoked", (challenge,))
        prefix = self.prefixes.get(claims.issuer)
        if prefix is None:  # introspected, from no issuer we know: named after the endpoint
            prefix = self.introspected
        name = prefix + claims.subject
        if name == GUEST:  # reserved for loopback guests: never reached through a token
            raise Unauthorized("bearer token refused: its subject is reserved", self.challenges)
        return Principal(name, grants(claims.scopes), claims.expires, "bearer")

    async def basic(self, credentials: str, peer: str | None, forwarded: bool) -> Principal:
        try:
            decoded = base64.b64decode(credentials, validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            raise Unauthorized("malformed Basic credentials", self.challenges) from None
        name, colon, password = decoded.partition(":")
        if not colon:
            raise Unauthorized("malformed Basic credentials", self.challenges)
        guest = self.guests.guest_login(name, password, peer, forwarded)
        if guest is not None:
            return guest
        key = (name, hashlib.sha256(password.encode()).digest())
        remembered = self._logins.get(key)
        if remembered is not None and time.monotonic() < remembered[1]:
            return remembered[0]
        self.check_rate(peer)
        user = self.users.get(name)
        encoded = user.password_hash if user is not None else DUMMY_HASH
        ok = await asyncio.to_thread(verify_secret, password, encoded)
        if user is None or not ok:
            raise Unauthorized("wrong user name or password", self.challenges)
        principal = Principal(user.name, grants(user.scopes), None, "basic")
        self._remember(key, principal)
        return principal

    def _remember(self, key: tuple[str, bytes], principal: Principal) -> None:
        self._logins[key] = (principal, time.monotonic() + LOGIN_MEMORY)
        while len(self._logins) > LOGINS_KEPT:
            self._logins.popitem(last=False)

    # ------------------------------------------------------------ limits
    def check_rate(self, peer: str | None) -> None:
        """Secrets checked with scrypt (Basic logins not remembered, token requests) are
        rate limited per peer address, so a guesser cannot keep the threads busy."""
        wait = self.failures.take(peer or "")
        if wait:
            raise TooManyRequests("too many secret checks from this address", math.ceil(wait))

    def take(self, principal: Principal) -> None:
        """The principal's rate limit: 429 with Retry-After when its bucket is empty."""
        wait = self.limiter.take(principal.name)
        if wait:
            raise TooManyRequests(
                f"rate limit: more than {self.rate:g} requests per second",
                max(1, math.ceil(wait)),
            )


def bearer_challenge(error: str, description: str) -> str:
    """An RFC 6750 3 challenge naming what was wrong with the bearer token."""
    description = description.replace("\\", "").replace('"', "'")
    return f'Bearer realm="{REALM}", error="{error}", error_description="{description}"'


AUTH = web.AppKey("authenticator", Authenticator)
PRINCIPAL = web.RequestKey("principal", Principal)
PUBLIC = frozenset(("/healthz", "/readyz", "/profile/x-gateway", *page.PATHS))  # page: page.py
# Not authenticated here: PUBLIC, and /metrics, which decides for itself who may scrape
# (metrics_access, gateway/metrics.py) and calls authenticate(always=True) when it must.
UNCHECKED = PUBLIC | {"/metrics"}
UNCHECKED_UNDER = ("/oauth/", "/.well-known/")  # the built-in issuer's endpoints


def checks_every_path(route: web.AbstractRoute) -> bool:
    """Whether every path ``route`` matches is one :func:`authenticate` checks, decided
    from the route's fixed beginning (its template up to the first variable part), so
    the middleware may pass ``always=True`` instead of testing each request's path.

    The router matches a path on its beginning as written (``%`` escapes in the path
    do not reach into a fixed beginning without ``%``), so a path the route matches
    starts with it, and request.path as well. False when in doubt: the test is then
    made per request, as :func:`authenticate` does by default.
    """
    resource = route.resource
    fixed = resource.canonical.partition("{")[0] if resource is not None else ""
    if not fixed.startswith("/") or "%" in fixed:
        return False
    if any(path.startswith(fixed) for path in UNCHECKED):
        return False
    return not any(fixed.startswith(p) or p.startswith(fixed) for p in UNCHECKED_UNDER)


def authenticate(
    request: web.Request, authenticator: Authenticator, *, always: bool = False
) -> Awaitable[None] | None:
    """Give the request its principal (:data:`PRINCIPAL`), or raise 401 or 429.

    Paths anyone may use get none, unless ``always`` (a handler of a public path that
    needs a principal after all, as ``/metrics`` may, or a caller that knows the path
    is none of them: the middleware, for a route of which :func:`checks_every_path`).
    A request without credentials is the anonymous guest (or 401) at once: that is
    most traffic on loopback, so it is decided here, without a coroutine. Returns None
    when it is decided, or an awaitable that decides it (credentials to check), which
    the caller awaits.

    Headers are looked up by aiohttp's ``hdrs`` names here and on the rest of a request's
    path: they are ``istr``, whose case-folded form is made once, where a ``str`` name
    is folded again at every lookup.
    """
    if not always:
        path = request.path
        if path in UNCHECKED or path.startswith(UNCHECKED_UNDER):
            if request.method == "POST":  # the token endpoint checks a secret with scrypt
                authenticator.check_rate(request.remote)
            return None
    headers = request.headers
    header = headers.get(hdrs.AUTHORIZATION)
    if header is None and hdrs.UPGRADE in headers:
        header = socket_bearer(headers)
    if header is not None:
        return _check(request, authenticator, header, is_relayed(headers))
    try:
        principal = authenticator.anonymous(request.remote, is_relayed(headers))
    except Unauthorized as exc:
        _failed(request, header, exc)
        raise
    if authenticator.rate:  # no limit (0): no bucket to take from
        authenticator.take(principal)
    request[PRINCIPAL] = principal
    return None


async def _check(
    request: web.Request, authenticator: Authenticator, header: str, forwarded: bool
) -> None:
    try:
        principal = await authenticator.principal(header, request.remote, forwarded)
    except Unauthorized as exc:
        _failed(request, header, exc)
        raise
    authenticator.take(principal)
    request[PRINCIPAL] = principal


def is_relayed(headers: Mapping[str, str]) -> bool:
    """Whether a proxy relayed the request (it says so in a forwarding header): such a
    request is never the loopback guest, whatever its peer address."""
    return hdrs.FORWARDED in headers or hdrs.X_FORWARDED_FOR in headers or hdrs.X_REAL_IP in headers


def _failed(request: web.Request, header: str | None, exc: Unauthorized) -> None:
    """An ``auth.failed`` event (docs/EVENTS.md), coalesced per scheme: the scheme, the
    peer address and the reason, never the credentials."""
    events = request.app[ENGINE].events
    if events is not None:
        scheme = header.strip().partition(" ")[0].lower() if header is not None else "none"
        shown = scheme if scheme in ("bearer", "basic", "none") else "other"
        events.auth_failed(shown, request.remote, exc.reason)


SOCKET_BEARER = "restms.bearer."  # subprotocol prefix carrying a token (docs/BROWSER.md)


def socket_bearer(headers: Mapping[str, str]) -> str | None:
    """A browser cannot set ``Authorization`` on a WebSocket, so its upgrade request may
    offer the bearer token as a subprotocol, ``restms.bearer.<token>``, instead.

    Honoured on upgrade requests only; the gateway never selects that subprotocol, so
    the token is not echoed back, and like every credential it is never logged.
    """
    if headers.get("Upgrade", "").lower() != "websocket":
        return None
    for offered in headers.get("Sec-WebSocket-Protocol", "").split(","):
        protocol = offered.strip()
        if protocol.startswith(SOCKET_BEARER):
            return "Bearer " + protocol[len(SOCKET_BEARER) :]
    return None


# ---------------------------------------------------------------- start-up
def issuer_url(config: Config) -> str:
    if config.oauth_issuer:
        return config.oauth_issuer.rstrip("/")
    scheme = "https" if config.tls_cert else "http"
    host = f"[{config.host}]" if ":" in config.host else config.host
    return f"{scheme}://{host}:{config.port}"


def oauth_dir(config: Config) -> Path:
    return Path(config.data_dir) / "oauth"


def _read_json(path: str) -> Mapping[str, Any]:
    with open(path, encoding="utf-8") as handle:
        data = json.load(handle)
    if not isinstance(data, dict) or not isinstance(data.get("keys"), list):
        raise ValueError(f"{path} is not a JWKS document")
    return data


async def auth_context(app: web.Application) -> AsyncIterator[None]:
    """Read keys and clients (in threads), start the HTTP client for JWKS and introspection."""
    config = app[CONFIG]
    authenticator = app[AUTH]
    session = aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(total=FETCH_TIMEOUT),
        headers={"User-Agent": "restms-gateway"},
    )

    async def fetch(url: str) -> bytes:
        async with session.get(url, allow_redirects=False) as reply:
            if reply.status != 200:
                raise OSError(f"{url} answered {reply.status}")
            body = await reply.content.read(FETCH_LIMIT + 1)
        if len(body) > FETCH_LIMIT:
            raise OSError(f"{url} answered more than {FETCH_LIMIT} bytes")
        return body

    async def post(url: str, form: Mapping[str, str], basic: tuple[str, str]) -> tuple[int, bytes]:
        # RFC 6749 2.3.1: the id and secret are form-encoded before the Basic encoding.
        user, password = (urllib.parse.quote(part, safe="") for part in basic)
        headers = {"Authorization": aiohttp.encode_basic_auth(user, password)}
        async with session.post(
            url, data=dict(form), headers=headers, allow_redirects=False
        ) as reply:
            body = await reply.content.read(FETCH_LIMIT + 1)
            return reply.status, body[:FETCH_LIMIT]

    trusted: list[TrustedIssuer] = []
    if config.builtin_issuer:
        directory = oauth_dir(config)
        if config.store == "memory":  # nothing on disk: tokens end with the process
            key = SigningKey(await asyncio.to_thread(ECKey.generate_key, "P-256", private=True))
        else:
            key = await asyncio.to_thread(SigningKey.load_or_create, directory / KEY_FILE.name)
        clients = ClientStore(directory / CLIENTS_FILE.name, config.clients)
        issuer = Issuer(
            issuer_url(config),
            config.audience,
            key,
            config.token_ttl,
            scopes=[f"restms:{action}" for action in ACTIONS],
        )
        app[oauth.ISSUER] = issuer
        app[oauth.CLIENTS] = clients
        revoked_file = None if config.store == "memory" else directory / REVOKED_FILE.name
        revocations = Revocations(revoked_file, config.token_ttl + config.token_leeway)
        await asyncio.to_thread(revocations.load)
        authenticator.revocations, authenticator.builtin = revocations, issuer.issuer
        trusted.append(
            TrustedIssuer(issuer=issuer.issuer, audience=config.audience, keys=key.public_jwks())
        )
        authenticator.prefixes[issuer.issuer] = ""
    for entry in config.issuers:
        keys = await asyncio.to_thread(_read_json, entry.jwks_file) if entry.jwks_file else None
        trusted.append(
            TrustedIssuer(
                issuer=entry.issuer,
                audience=entry.audience or config.audience,
                jwks_url=entry.jwks_url or None,
                keys=keys,
                algorithms=entry.algorithms,
            )
        )
        authenticator.prefixes[entry.issuer] = entry.principal_prefix
    jwt = (
        JwtVerifier(
            trusted, fetch, leeway=config.token_leeway, refresh_interval=config.jwks_refresh
        )
        if trusted
        else None
    )
    introspector = (
        Introspector(
            config.introspection_url,
            config.introspection_client_id,
            config.introspection_client_secret,
            post,
        )
        if config.introspection_url
        else None
    )
    if jwt is not None or introspector is not None:
        authenticator.verifier = Verifier(jwt, introspector, cache_size=config.token_cache)
    try:
        yield
    finally:
        await session.close()


def waiting(request: web.Request, kind: str) -> Waiting:
    """Hold one of the principal's concurrent-wait slots, or for a ``"websocket"`` one
    of its WebSocket slots (429 when it has none left); counted by ``kind``
    (:data:`WAIT_KINDS`) while held. Use: ``with waiting(request, kind):``.

    Every long wait starts here, so here its connection's keep-alive timer is stopped
    (:func:`gateway.connections.waits`: memory only, while a request is in hand).
    """
    waits(request)
    return Waiting(request.app[AUTH], kind, request[PRINCIPAL].name)


class Waiting:
    """A wait slot, held from ``__enter__`` to ``__exit__`` (see :func:`waiting`).

    A plain object, not a ``contextlib.contextmanager``: it lives as long as the wait,
    and a generator's frame and its wrapper cost each waiting request some 400 bytes.
    """

    __slots__ = ("_authenticator", "_kind", "_name")

    def __init__(self, authenticator: Authenticator, kind: str, name: str) -> None:
        self._authenticator = authenticator
        self._kind = kind
        self._name = name

    def _slots(self) -> Slots:
        authenticator = self._authenticator
        return authenticator.sockets if self._kind == "websocket" else authenticator.waits

    def __enter__(self) -> None:
        slots = self._slots()
        if not slots.acquire(self._name):
            what = "WebSockets" if self._kind == "websocket" else "waiting requests or streams"
            raise TooManyRequests(f"more than {slots.limit} {what} open at once", 1)
        self._authenticator.open_waits[self._kind] += 1

    def __exit__(self, *exc_info: object) -> None:
        self._authenticator.open_waits[self._kind] -= 1
        self._slots().release(self._name)
