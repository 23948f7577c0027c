"""Bearer-token verification for the resource server (RFC 6750), framework-free.

Theory of operation
-------------------
:class:`Verifier` is the one entry point. A token it has verified before is answered
from a bounded LRU keyed by the token's SHA-256, until the token's ``exp``: a repeat
request costs a hash and a dict lookup, never JWT parsing. Otherwise a token shaped like
a JWS (three base64url parts) goes to :class:`JwtVerifier`, anything else to
:class:`Introspector`.

:class:`JwtVerifier` (RFC 7515, 7519, 8725) checks, in this order:

1. Shape: at most ``MAX_TOKEN`` characters of ASCII, three base64url parts, a JSON
   header and a JSON object payload. No ``crit`` header parameter: we understand no
   extension, and RFC 7515 4.1.11 says to refuse what is critical and not understood
   (``b64: false`` would make the payload something other than the JWT's claims).
2. Issuer: the *unverified* ``iss`` picks one :class:`TrustedIssuer`; from then on only
   that issuer's algorithms and keys count, so one issuer's key can never vouch for
   another issuer's tokens.
3. Algorithm: the header's ``alg`` must be one of the issuer's, all asymmetric. ``none``
   and the HMAC family are refused outright, which defeats the confusion attack of an
   HS256 token keyed with the issuer's public key: no key we hold is ever a secret.
4. Key: the key named by ``kid`` (or, without one, every key) whose type, curve,
   ``use`` and ``alg`` suit the algorithm. Keys come from the issuer's JWKS URL,
   fetched on first use, again when older than ``JWKS_MAX_AGE``, and again when a
   token names a ``kid`` we do not have (key rotation). Fetches are single-flight
   (concurrent requests share one) and at most one per ``refresh_interval`` per
   issuer, so tokens with random kids cannot make us hammer the JWKS URL. A failed
   fetch keeps the keys we had.
5. Signature, by joserfc.
6. Claims: ``aud`` names our audience; ``exp`` is present and not past; ``nbf`` is
   past and ``iat`` not in the future, each with ``leeway`` seconds for clock skew;
   ``sub`` is present.

:class:`Introspector` asks an RFC 7662 endpoint. Concurrent questions about one token
share one call; inactive answers are remembered for ``INACTIVE_MEMORY`` seconds so a
flood of garbage tokens does not become a flood of introspection calls.

Exceptions
----------
::

    Exception
     └── TokenError      every refusal; .error is the RFC 6750 code, .description is
                         safe to show the client (no token, no key material)

joserfc, JSON and fetch failures are converted to :class:`TokenError` where they
happen, with ``raise ... from``.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import re
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import orjson
from joserfc import jws
from joserfc.errors import JoseError, UnsupportedAlgorithmError
from joserfc.jwa import JWSAlgModel
from joserfc.jwk import JWKRegistry, Key

log = logging.getLogger(__name__)

MAX_TOKEN = 8192  # characters in a bearer token at most
ALGORITHMS = frozenset({"RS256", "ES256", "EdDSA"})  # asymmetric only (RFC 8725 3.1)
JWKS_MAX_AGE = 600.0  # seconds before a fetched JWKS is fetched again
UNTIMED_MEMORY = 60.0  # seconds an introspected token without "exp" is remembered
INACTIVE_MEMORY = 10.0  # seconds an inactive introspection answer is remembered
INACTIVE_KEPT = 10_000  # inactive answers remembered at most
_KEY_TYPES = frozenset({"RSA", "EC", "OKP"})  # never "oct": a JWKS holds no secrets
_JWS_SHAPE = re.compile(r"[A-Za-z0-9_-]*\.[A-Za-z0-9_-]*\.[A-Za-z0-9_-]*")

Fetch = Callable[[str], Awaitable[bytes]]
Post = Callable[[str, Mapping[str, str], tuple[str, str]], Awaitable[tuple[int, bytes]]]
K = TypeVar("K")
V = TypeVar("V")


class TokenError(Exception):
    """A bearer token is refused. `error` is the RFC 6750 code ("invalid_token" or
    "invalid_request"), `description` a short human reason safe to show the client
    (never echo the token, never leak key material)."""

    def __init__(self, description: str, error: str = "invalid_token") -> None:
        super().__init__(description)
        self.description = description
        self.error = error


@dataclass(frozen=True, slots=True, kw_only=True)
class Claims:
    """What a verified token says: who, from which issuer, allowed what, until when."""

    subject: str
    issuer: str
    scopes: tuple[str, ...]
    expires: float | None  # epoch seconds; None only for introspected tokens
    client_id: str | None = None
    issued: float | None = None  # "iat", epoch seconds (revoked clients: auth.revocations)
    token_id: str | None = None  # "jti" (a token revoked alone: auth.revocations)

    def __post_init__(self) -> None:
        if not self.subject:
            raise ValueError("a token's claims need a subject")


@dataclass(frozen=True, slots=True, kw_only=True)
class TrustedIssuer:
    """An authorization server whose JWTs we accept, and where its public keys are."""

    issuer: str  # exact "iss" expected
    audience: str  # "aud" must equal this or contain it (list)
    jwks_url: str | None = None  # keys fetched from here, or
    keys: Mapping[str, Any] | None = None  # a JWKS document {"keys": [...]} given directly
    algorithms: tuple[str, ...] = ("RS256", "ES256", "EdDSA")

    def __post_init__(self) -> None:
        if not self.issuer or not self.audience:
            raise ValueError("a trusted issuer needs an issuer and an audience")
        if (self.jwks_url is None) == (self.keys is None):
            raise ValueError(f"issuer {self.issuer}: give exactly one of jwks_url and keys")
        bad = set(self.algorithms) - ALGORITHMS
        if bad or not self.algorithms:
            raise ValueError(
                f"issuer {self.issuer}: algorithms must be among {', '.join(sorted(ALGORITHMS))}"
            )


# ---------------------------------------------------------------- small machinery
class _Expiring(Generic[V]):
    """A bounded LRU whose entries also lapse at their own deadline (checked on read)."""

    def __init__(self, size: int, clock: Callable[[], float]) -> None:
        if size < 1:
            raise ValueError("a cache needs room for at least one entry")
        self._size = size
        self._clock = clock
        self._entries: OrderedDict[bytes, tuple[V, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: bytes) -> V | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        if self._clock() >= entry[1]:
            del self._entries[key]
            return None
        self._entries.move_to_end(key)
        return entry[0]

    def put(self, key: bytes, value: V, until: float) -> None:
        self._entries[key] = (value, until)
        self._entries.move_to_end(key)
        if len(self._entries) > self._size:
            self._entries.popitem(last=False)


class _Flights(Generic[K, V]):
    """Concurrent callers asking for the same key share one task. Each waits through
    a shield: a caller that gives up (its request was cancelled) does not cancel the
    answer the others are waiting for."""

    def __init__(self) -> None:
        self._tasks: dict[K, asyncio.Task[V]] = {}

    def busy(self, key: K) -> bool:
        return key in self._tasks

    async def run(self, key: K, work: Callable[[], Coroutine[Any, Any, V]]) -> V:
        task = self._tasks.get(key)
        if task is None:
            task = asyncio.create_task(work())
            self._tasks[key] = task
            task.add_done_callback(lambda done: self._landed(key, done))
        return await asyncio.shield(task)

    def _landed(self, key: K, task: asyncio.Task[V]) -> None:
        if self._tasks.get(key) is task:
            del self._tasks[key]
        if not task.cancelled():
            task.exception()  # seen, even if every caller has given up waiting


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


def _number(claims: Mapping[str, Any], name: str) -> float | None:
    """A NumericDate claim (RFC 7519 2): a finite JSON number, or None if absent."""
    value = claims.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise TokenError(f'malformed "{name}" claim')
    return float(value)


def _scopes(claims: Mapping[str, Any]) -> tuple[str, ...]:
    """Scopes from "scope" (RFC 8693 4.2: space-separated) or "scp" (a list, or a string)."""
    value = claims.get("scope", claims.get("scp"))
    if value is None:
        return ()
    if isinstance(value, str):
        value = value.split()
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise TokenError("malformed scope claim")
    return tuple(dict.fromkeys(item for item in value if item))


def _text(claims: Mapping[str, Any], name: str) -> str | None:
    value = claims.get(name)
    return value if isinstance(value, str) and value else None


def _import_jwks(document: Any, issuer: str) -> list[Key]:
    """The usable public signing keys of a JWKS document (RFC 7517 5). Entries of other
    types or uses are left out; a malformed one is logged and left out, so one bad key
    does not take its issuer's other keys down with it."""
    if not isinstance(document, Mapping) or not isinstance(document.get("keys"), list):
        raise ValueError("not a JWKS document")
    keys: list[Key] = []
    for entry in document["keys"]:
        if not isinstance(entry, dict) or entry.get("kty") not in _KEY_TYPES:
            continue
        if entry.get("use", "sig") != "sig":
            continue
        try:
            keys.append(JWKRegistry.import_key(entry))
        except (JoseError, ValueError, TypeError) as exc:
            log.warning("issuer %s: a key in its JWKS is unusable: %s", issuer, exc)
    return keys


# ---------------------------------------------------------------- JWT
class _Signatures(jws.JWSRegistry):
    """joserfc's registry narrowed to one issuer's algorithms. joserfc warns at every
    use of "EdDSA" (RFC 9864 deprecates the name in favour of "Ed25519"); the operator
    listed it on purpose, and a warning per request would be noise."""

    def get_alg(self, name: str) -> JWSAlgModel:
        if not self.allowed or name not in self.allowed:
            raise UnsupportedAlgorithmError(f"Algorithm of '{name}' is not allowed")
        return self.algorithms[name]


@dataclass(slots=True, eq=False)
class _IssuerKeys:
    """One trusted issuer's keys, and when they were fetched (mutable, private)."""

    issuer: TrustedIssuer
    signatures: _Signatures
    keys: list[Key] = field(default_factory=list)
    loaded: float | None = None  # when the last successful fetch began; None: never
    tried: float | None = None  # when the last fetch began
    failed: bool = False  # the last fetch failed

    def candidates(self, algorithm: JWSAlgModel, kid: str | None) -> list[Key]:
        """The keys that may have signed a token with this algorithm and kid."""
        found = []
        for key in self.keys:
            if kid is not None and key.kid != kid:
                continue
            try:
                algorithm.check_key(key)  # type, curve, "use" and "alg" of the key
            except JoseError:
                continue
            found.append(key)
        return found


class JwtVerifier:
    """Verifies JWT access tokens from trusted issuers (see the module docstring)."""

    def __init__(
        self,
        issuers: Sequence[TrustedIssuer],
        fetch: Fetch,
        *,
        leeway: float = 30.0,
        refresh_interval: float = 30.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if leeway < 0 or refresh_interval < 0:
            raise ValueError("leeway and refresh_interval must not be negative")
        self._fetch = fetch
        self._leeway = leeway
        self._refresh_interval = refresh_interval
        self._clock = clock
        self._flights: _Flights[str, None] = _Flights()
        self._issuers: dict[str, _IssuerKeys] = {}
        for trusted in issuers:
            if trusted.issuer in self._issuers:
                raise ValueError(f"issuer {trusted.issuer} is listed twice")
            state = _IssuerKeys(
                trusted, _Signatures(algorithms=trusted.algorithms, strict_check_header=False)
            )
            if trusted.keys is not None:
                state.keys = _import_jwks(trusted.keys, trusted.issuer)
                state.loaded = math.inf  # given, never fetched
            self._issuers[trusted.issuer] = state

    async def verify(self, token: str) -> Claims:
        """The claims of a valid token; :class:`TokenError` for anything else."""
        signed, header, payload = _parse(token)
        iss = payload.get("iss")
        state = self._issuers.get(iss) if isinstance(iss, str) else None
        if state is None:
            raise TokenError("token issuer is not trusted")
        alg, kid = header.get("alg"), header.get("kid")
        if not isinstance(alg, str) or alg not in state.issuer.algorithms:
            raise TokenError("token signing algorithm is not accepted")
        if kid is not None and not isinstance(kid, str):
            raise TokenError("malformed token header")
        try:
            state.signatures.check_header(header)
        except JoseError as exc:
            raise TokenError("malformed token header") from exc
        algorithm = state.signatures.get_alg(alg)
        if not any(
            _signed_by(signed, key, state) for key in await self._keys(state, algorithm, kid)
        ):
            raise TokenError("token signature is invalid")
        return self._claims(state.issuer, payload)

    def _claims(self, issuer: TrustedIssuer, payload: Mapping[str, Any]) -> Claims:
        now, leeway = self._clock(), self._leeway
        aud = payload.get("aud")
        if aud != issuer.audience and not (isinstance(aud, list) and issuer.audience in aud):
            raise TokenError("token is not meant for this audience")
        expires = _number(payload, "exp")
        if expires is None:
            raise TokenError("token has no expiry")
        if now >= expires + leeway:
            raise TokenError("token has expired")
        not_before = _number(payload, "nbf")
        if not_before is not None and now + leeway < not_before:
            raise TokenError("token is not valid yet")
        issued = _number(payload, "iat")
        if issued is not None and issued > now + leeway:
            raise TokenError("token is issued in the future")
        subject = _text(payload, "sub")
        if subject is None:
            raise TokenError("token has no subject")
        return Claims(
            subject=subject,
            issuer=issuer.issuer,
            scopes=_scopes(payload),
            expires=expires,
            client_id=_text(payload, "client_id") or _text(payload, "azp"),
            issued=issued,
            token_id=_text(payload, "jti"),
        )

    async def _keys(self, state: _IssuerKeys, algorithm: JWSAlgModel, kid: str | None) -> list[Key]:
        if state.loaded is None or self._clock() - state.loaded >= JWKS_MAX_AGE:
            await self._refresh(state)
        keys = state.candidates(algorithm, kid)
        if not keys:  # perhaps a key published since we last looked (rotation)
            await self._refresh(state)
            keys = state.candidates(algorithm, kid)
        if keys:
            return keys
        if state.loaded is None or state.failed:
            raise TokenError("token signing keys unavailable")
        raise TokenError("token signing key is unknown")

    async def _refresh(self, state: _IssuerKeys) -> None:
        """Fetch the issuer's JWKS, joining a fetch under way, unless one began less
        than ``refresh_interval`` ago."""
        url = state.issuer.jwks_url
        if url is None:
            return
        if not self._flights.busy(state.issuer.issuer):
            now = self._clock()
            if state.tried is not None and now - state.tried < self._refresh_interval:
                return
            state.tried = now
        await self._flights.run(state.issuer.issuer, lambda: self._load(state, url))

    async def _load(self, state: _IssuerKeys, url: str) -> None:
        began = self._clock()
        try:
            keys = _import_jwks(orjson.loads(await self._fetch(url)), state.issuer.issuer)
        except Exception as exc:  # any failure of the caller's fetch: keep the old keys
            state.failed = True
            log.warning(
                "issuer %s: fetching its keys from %s failed: %r", state.issuer.issuer, url, exc
            )
            return
        state.keys, state.loaded, state.failed = keys, began, False


def _signed_by(signed: jws.CompactSignature, key: Key, state: _IssuerKeys) -> bool:
    try:
        return jws.validate_compact(signed, key, registry=state.signatures)
    except (JoseError, ValueError, TypeError):  # e.g. an OKP key of an X25519 curve
        return False


def _parse(token: str) -> tuple[jws.CompactSignature, dict[str, Any], dict[str, Any]]:
    """The unverified parts of a compact JWS whose payload is a JSON object."""
    if len(token) > MAX_TOKEN:
        raise TokenError("token is too long")
    if not token.isascii():
        raise TokenError("malformed token")
    try:
        signed = jws.extract_compact(token.encode("ascii"))
        payload = orjson.loads(signed.payload)
    except (JoseError, ValueError, TypeError, RecursionError) as exc:
        # RecursionError: joserfc reads the header with the stdlib JSON decoder, which
        # gives up on deep nesting that way (its 512-byte header limit keeps it out today)
        raise TokenError("malformed token") from exc
    header = signed.headers()
    if not isinstance(payload, dict) or not isinstance(header, dict):
        raise TokenError("malformed token")
    if "crit" in header or header.get("b64", True) is not True:
        raise TokenError("token header has critical parameters we do not understand")
    return signed, header, payload


# ---------------------------------------------------------------- introspection
class Introspector:
    """Asks an RFC 7662 introspection endpoint about tokens, as a client with HTTP Basic."""

    def __init__(
        self,
        url: str,
        client_id: str,
        client_secret: str,
        post: Post,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._url = url
        self._credentials = (client_id, client_secret)
        self._post = post
        self._clock = clock
        self._inactive: _Expiring[str] = _Expiring(INACTIVE_KEPT, clock)
        self._flights: _Flights[bytes, Claims] = _Flights()

    async def verify(self, token: str) -> Claims:
        """The claims of an active token; :class:`TokenError` for anything else."""
        if len(token) > MAX_TOKEN:
            raise TokenError("token is too long")
        key = _digest(token)
        reason = self._inactive.get(key)
        if reason is not None:
            raise TokenError(reason)
        return await self._flights.run(key, lambda: self._introspect(token, key))

    async def _introspect(self, token: str, key: bytes) -> Claims:
        form = {"token": token, "token_type_hint": "access_token"}
        try:
            status, body = await self._post(self._url, form, self._credentials)
        except Exception as exc:  # any failure of the caller's post
            log.warning("token introspection at %s failed: %r", self._url, exc)
            raise TokenError("token introspection unavailable") from exc
        if status != 200:
            log.warning("token introspection at %s answered %d", self._url, status)
            raise TokenError("token introspection failed")
        try:
            answer = orjson.loads(body)
        except ValueError as exc:
            raise TokenError("malformed token introspection answer") from exc
        if not isinstance(answer, dict) or not isinstance(answer.get("active"), bool):
            raise TokenError("malformed token introspection answer")
        expires = _number(answer, "exp")
        if not answer["active"] or (expires is not None and expires <= self._clock()):
            self._inactive.put(key, "token is not active", self._clock() + INACTIVE_MEMORY)
            raise TokenError("token is not active")
        subject = _text(answer, "sub") or _text(answer, "username") or _text(answer, "client_id")
        if subject is None:
            raise TokenError("token introspection answer names no subject")
        return Claims(
            subject=subject,
            issuer=_text(answer, "iss") or "",
            scopes=_scopes(answer),
            expires=expires,
            client_id=_text(answer, "client_id"),
        )


# ---------------------------------------------------------------- the entry point
class Verifier:
    """The resource server's one entry point: JWT-shaped tokens (three base64url parts) go
    to the JwtVerifier, other tokens to the Introspector (if none configured: TokenError).
    Verified tokens are cached (bounded LRU of `cache_size`, keyed by the token string or
    its hash) until they expire, so repeat requests cost a dict lookup."""

    def __init__(
        self,
        jwt: JwtVerifier | None,
        introspector: Introspector | None,
        *,
        cache_size: int = 100_000,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._jwt = jwt
        self._introspector = introspector
        self._clock = clock
        self._verified: _Expiring[Claims] = _Expiring(cache_size, clock)

    def cached(self, token: str) -> Claims | None:
        """A still-valid earlier verification of this token, else None (O(1), no parsing)."""
        if len(token) > MAX_TOKEN:
            return None
        return self._verified.get(_digest(token))

    async def verify(self, token: str) -> Claims:
        """The claims of a valid token (cached ones first); :class:`TokenError` otherwise."""
        claims = self.cached(token)
        if claims is not None:
            return claims
        if not token:
            raise TokenError("empty bearer token", "invalid_request")
        if len(token) > MAX_TOKEN:
            raise TokenError("token is too long")
        if self._jwt is not None and _JWS_SHAPE.fullmatch(token):
            claims = await self._jwt.verify(token)
        elif self._introspector is not None:
            claims = await self._introspector.verify(token)
        else:
            raise TokenError("token is not a JWT, and no introspection is configured")
        now = self._clock()
        until = claims.expires if claims.expires is not None else now + UNTIMED_MEMORY
        if until > now:
            self._verified.put(_digest(token), claims, until)
        return claims
