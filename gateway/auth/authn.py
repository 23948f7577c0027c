"""Authentication: the middleware that gives every request its principal (docs/AUTH.md).

Order of the checks, cheapest first: the token cache (a dict lookup for a token seen
before), then the full token check (signature, claims, keys fetched from a JWKS URL
or an RFC 7662 introspection call), then HTTP Basic (scrypt, in a thread, its result
remembered for a while), then the anonymous loopback guest. Then the principal's
rate limit. Failures are 401 with ``WWW-Authenticate`` challenges (RFC 6750 3.1).
Every secret checked with scrypt (a Basic login not remembered, a token request) is
also bounded per client address and per account (:class:`auth.limits.SecretChecks`),
so a guesser can neither keep the scrypt threads busy nor spread its guesses over
many addresses.

The policy itself (who may do what) lives in :mod:`auth`; this module reads the
request, calls it, and turns its answers into replies.

State. One node keeps its signing key, clients and revocation list in its data
directory. Given a :class:`auth.cluster.Shared` (several nodes on one Redis Cluster,
docs/AUTH.md "Several nodes"), the signing key, the client registry, the revocation
list and the per-account bound on failed secret checks are those every node shares;
where that state does not answer, a request it would decide is a retriable 503.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import logging
import math
import time
import urllib.parse
from collections import OrderedDict
from collections.abc import Awaitable, Mapping
from typing import Any

from aiohttp import hdrs, web

from auth import GUEST, Guests, Principal, Tenants, User, cluster, grants
from auth.clients import DUMMY_HASH, verify_secret
from auth.limits import RateLimiter, SecretChecks, Slots
from auth.revocations import (
    CLIENT_REVOKED,
    RevocationList,
    client_of,
)
from auth.tokens import TokenError, Verifier
from gateway.admin import page
from gateway.server.config import Config
from gateway.server.connections import waits
from gateway.server.keys import SERVICE
from restms.errors import ServiceUnavailable, TooManyRequests, Unauthorized

log = logging.getLogger(__name__)

REALM = "restms"
BASIC_REALM = "RestMS::"  # the realm older RestMS clients answer (L31)
LOGIN_MEMORY = 300.0  # seconds a checked Basic password is remembered
LOGINS_KEPT = 10_000
CHECK_RATE, CHECK_BURST = 5.0, 20  # scrypt secret checks per second per client address
# What holds a wait slot (:func:`waiting`): asynclets, evented GETs, SSE and stream-pipe
# readers hold a principal's wait slots, WebSockets its socket slots.
WAIT_KINDS = ("asynclet", "evented", "sse", "stream", "websocket")


class Authenticator:
    """Everything needed to turn a request's credentials into a :class:`Principal`."""

    def __init__(self, config: Config, shared: cluster.Shared | None = None) -> None:
        self.shared = shared  # the state several nodes share; None: this node's own
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
        self.secret_checks = SecretChecks(
            address_rate=CHECK_RATE,
            address_burst=CHECK_BURST,
            account_rate=config.account_failure_rate,
            account_burst=config.account_failure_burst,
            accounts=None
            if shared is None
            else cluster.RedisBuckets(
                shared, config.account_failure_rate, config.account_failure_burst
            ),
        )
        self.waits = Slots(config.max_waits_per_principal)
        self.sockets = Slots(config.websocket_max_per_principal)  # open WebSockets
        self.open_waits = dict.fromkeys(WAIT_KINDS, 0)  # held now, by kind (GET /metrics)
        # What each principal of the built-in issuer holds open (a revocation ends it):
        # client id -> its waits, streams and WebSockets. Others are not kept here.
        self.held: dict[str, set[Waiting]] = {}
        self.verifier: Verifier | None = None  # set when the app starts (keys are read)
        # The built-in issuer's revoked clients (set at start with the issuer, if any).
        self.revocations: RevocationList | None = None
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
        issued = None
        if claims.issuer == self.builtin:
            # Revocable: a token without iat (none of ours) is refused as if issued never.
            issued = -math.inf if claims.issued is None else claims.issued
            revoked = self.revocations
            if revoked is not None and (revoked.at or revoked.stale()):  # usually neither
                if revoked.stale():
                    raise ServiceUnavailable("the revocation list cannot be read; retry later")
                why = revoked.refuses(claims.subject, issued, claims.token_id)
                if why:
                    raise Revoked(why, f"bearer token refused: {why}")
        prefix = self.prefixes.get(claims.issuer)
        if prefix is None:  # introspected, from no issuer we know: named after the endpoint
            prefix = self.introspected
        name = prefix + claims.subject
        if name == GUEST:  # reserved for loopback guests: never reached through a token
            raise Unauthorized("bearer token refused: its subject is reserved", self.challenges)
        token_id = claims.token_id if issued is not None else None  # ours only: revocable
        return Principal(name, grants(claims.scopes), claims.expires, "bearer", issued, token_id)

    async def basic(self, credentials: str, peer: str | None, forwarded: bool) -> Principal:
        try:
            # A str with non-ASCII characters (raw bytes in the header) is a ValueError
            # of its own, not the binascii.Error of bad base64: caught as one.
            decoded = base64.b64decode(credentials, validate=True).decode("utf-8")
        except ValueError:  # binascii.Error and UnicodeDecodeError among them
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
        await self.admit(peer, name, password)
        user = self.users.get(name)
        encoded = user.password_hash if user is not None else DUMMY_HASH
        ok = await asyncio.to_thread(verify_secret, password, encoded)
        if user is None or not ok:
            raise Unauthorized("wrong user name or password", self.challenges)
        await self._passed(name, password)
        principal = Principal(user.name, grants(user.scopes), None, "basic")
        self._remember(key, principal)
        return principal

    # ------------------------------------------------------------ revocation
    def refuses(self, principal: Principal) -> str | None:
        """Why ``principal``'s token has been refused since it was accepted (its client
        or the token itself was revoked), or None."""
        revoked = self.revocations
        if principal.issued is None or revoked is None or not revoked.at:
            return None
        return revoked.refuses(principal.name, principal.issued, principal.token_id)

    def end_revoked(self, entry: str) -> int:
        """End every wait, stream and WebSocket held with a token that the revocation
        ``entry`` (a client id, or one token of it: :func:`auth.revocations.token_entry`)
        refuses now (its :class:`Waiting` ends it); returns how many."""
        client_id = client_of(entry)
        ended = 0
        for held in list(self.held.get(client_id, ())):
            why = self.refuses(held.principal)
            if why and held.revoke(why):
                ended += 1
        if ended:
            log.info("connections of revoked tokens ended", extra={"client_id": client_id})
        return ended

    def _remember(self, key: tuple[str, bytes], principal: Principal) -> None:
        self._logins[key] = (principal, time.monotonic() + LOGIN_MEMORY)
        while len(self._logins) > LOGINS_KEPT:
            self._logins.popitem(last=False)

    # ------------------------------------------------------------ limits
    async def admit(self, peer: str | None, account: str, secret: str) -> None:
        """Before a secret is checked with scrypt (a Basic login not remembered, a token
        request): 429 past the bounds per client address and per account
        (:class:`auth.limits.SecretChecks`), 503 when shared bounds do not answer; the
        caller reports a right secret with ``secret_checks.passed``."""
        try:
            wait, reason = await self.secret_checks.admit(peer, account, secret)
        except OSError as exc:
            raise ServiceUnavailable(f"the login bounds cannot be checked: {exc}") from exc
        if wait:
            raise TooManyRequests(reason, max(1, math.ceil(wait)))

    async def _passed(self, account: str, secret: str) -> None:
        try:
            await self.secret_checks.passed(account, secret)
        except OSError as exc:  # what it paid stays paid: it regains it at the bound's rate
            log.warning("a right secret's check not given back: %s", exc)

    def take(self, principal: Principal) -> None:
        """The principal's rate limit: 429 with Retry-After when its bucket is empty."""
        wait = self.limiter.take(principal.name)
        if wait:
            raise TooManyRequests(
                f"rate limit: more than {self.rate:g} requests per second",
                max(1, math.ceil(wait)),
            )


class Revoked(Unauthorized):
    """A revoked token (its client was revoked, or the token alone): refused when it
    arrives, and ended where it is held open (a wait answers this 401; a stream or a
    WebSocket says so and ends). ``why`` is :data:`auth.revocations.CLIENT_REVOKED` or
    :data:`~auth.revocations.TOKEN_REVOKED`."""

    def __init__(self, why: str = CLIENT_REVOKED, reason: str | None = None) -> None:
        challenge = bearer_challenge("invalid_token", why)
        super().__init__(reason or f"{why}; get a new token", (challenge,))
        self.why = why


def bearer_challenge(error: str, description: str) -> str:
    """An RFC 6750 3 challenge naming what was wrong with the bearer token."""
    description = description.replace("\\", "").replace('"', "'")
    return f'Bearer realm="{REALM}", error="{error}", error_description="{description}"'


AUTH = web.AppKey("authenticator", Authenticator)
PRINCIPAL = web.RequestKey("principal", Principal)
PUBLIC = frozenset(("/healthz", "/readyz", "/profile/x-gateway", *page.PATHS))  # page: page.py
# Not authenticated here: PUBLIC, and /metrics, which decides for itself who may scrape
# (metrics_access, gateway/admin/metrics.py) and calls authenticate(always=True) when it must.
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
            return None  # the token endpoint bounds its secret checks itself
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
    events = request.app[SERVICE].events
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
def waiting(request: web.Request, kind: str) -> Waiting:
    """Hold one of the principal's concurrent-wait slots, or for a ``"websocket"`` one
    of its WebSocket slots (429 when it has none left); counted by ``kind``
    (:data:`WAIT_KINDS`) while held. Use: ``with waiting(request, kind):``.

    Every long wait starts here, so here its connection's keep-alive timer is stopped
    (:func:`gateway.server.connections.waits`: memory only, while a request is in hand).
    """
    waits(request)
    return Waiting(request.app[AUTH], kind, request[PRINCIPAL])


class Waiting:
    """A wait slot, held from ``__enter__`` to ``__exit__`` (see :func:`waiting`).

    A plain object, not a ``contextlib.contextmanager``: it lives as long as the wait,
    and a generator's frame and its wrapper cost each waiting request some 400 bytes.

    A principal with a revocable token (of the built-in issuer) is also listed in
    :attr:`Authenticator.held` while it waits. When its client is revoked,
    :meth:`revoke` cancels the task that waits, as ``asyncio.timeout`` does, and
    ``__exit__`` turns that cancellation into :class:`Revoked`: whatever the task was
    awaiting (a message, a change, a client frame) it stops there and unwinds as for
    a client that went away, and the caller answers 401 or ends its stream.
    """

    __slots__ = ("_authenticator", "_cancelling", "_kind", "_task", "_why", "principal")

    def __init__(self, authenticator: Authenticator, kind: str, principal: Principal) -> None:
        self._authenticator = authenticator
        self._kind = kind
        self.principal = principal
        self._task: asyncio.Task[Any] | None = None  # set while listed; None once revoked
        self._cancelling = 0
        self._why = CLIENT_REVOKED  # what revoked it

    def _slots(self) -> Slots:
        authenticator = self._authenticator
        return authenticator.sockets if self._kind == "websocket" else authenticator.waits

    def __enter__(self) -> None:
        slots = self._slots()
        name = self.principal.name
        if not slots.acquire(name):
            what = "WebSockets" if self._kind == "websocket" else "waiting requests or streams"
            raise TooManyRequests(f"more than {slots.limit} {what} open at once", 1)
        authenticator = self._authenticator
        authenticator.open_waits[self._kind] += 1
        if self.principal.issued is not None:
            task = asyncio.current_task()
            if task is not None:
                self._task, self._cancelling = task, task.cancelling()
                authenticator.held.setdefault(name, set()).add(self)

    def revoke(self, why: str = CLIENT_REVOKED) -> bool:
        """End the wait (its task is cancelled, and ``__exit__`` raises
        :class:`Revoked` saying ``why``); False when it is not listed, or was revoked
        already."""
        task = self._task
        if task is None or task.done():
            return False
        self._task, self._why = None, why
        self._unlist()
        task.cancel(why)
        return True

    def _unlist(self) -> None:
        held = self._authenticator.held
        name = self.principal.name
        mine = held.get(name)
        if mine is not None:
            mine.discard(self)
            if not mine:
                del held[name]

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: object
    ) -> None:
        authenticator = self._authenticator
        authenticator.open_waits[self._kind] -= 1
        self._slots().release(self.principal.name)
        if self.principal.issued is None:
            return
        if self._task is not None:  # not revoked: leaves the list
            self._task = None
            self._unlist()
            return
        task = asyncio.current_task()
        # Only the cancellation revoke() asked for becomes Revoked; another one (the
        # client went away, shutdown) stays a cancellation.
        if (
            kind is not None
            and issubclass(kind, asyncio.CancelledError)
            and task is not None
            and task.uncancel() <= self._cancelling
        ):
            raise Revoked(self._why) from None
