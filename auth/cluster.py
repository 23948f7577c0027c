"""The auth state that gateway nodes share, kept in a Redis Cluster (docs/AUTH.md,
"Several nodes").

With ``engine = "redis"`` several nodes serve one gateway, and a token one node issued
must be accepted by all, a client revoked on one refused by all, and a guesser must not
get N times the tries from N nodes. What one node keeps in its data directory
otherwise (:mod:`auth.issuer`, :mod:`auth.clients`, :mod:`auth.revocations`) and the
per-account bound on failed secret checks (:mod:`auth.limits`) live here instead, in
keys of one hash tag (``N`` is the ``redis_namespace`` setting, ``restms`` by default,
which the engine's keys use too)::

    {N:auth}:signing-key        string: PEM of the token signing key (SET NX: the
                                first node's key wins, the others read it)
    {N:auth}:clients            hash: client id -> {"secret_hash", "scopes"} (JSON)
    {N:auth}:revoked            hash: client id, or <client id>:<jti> for one token,
                                -> Unix time of its revocation
    {N:auth}:failures:<sha256>  hash: one account's bucket of failed secret checks
                                (tokens, at), expiring once it would be full again

One hash tag keeps the few multi-key needs in one slot and the traffic is small (token
requests, failed logins, revocations; never a request that carries a valid token).
Buckets use the server's clock (``TIME``), so nodes whose clocks differ share one
bucket fairly. A revocation's time is the revoking node's clock, as a token's ``iat``
is its issuer's: nodes' clocks must agree within ``token_leeway`` already.

Failures. Every Redis failure (cluster down, a failover under way, a timeout) becomes
:class:`SharedStateError`, an :class:`OSError` like a disk that fails, which the gateway
answers with a retriable 503: it never accepts a token, a client or a retry it could
not check. A node that has not read the revocation list for :data:`STALE_AFTER`
seconds refuses tokens of the built-in issuer (503) until it has.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import math
import re
import time
import urllib.parse
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol

import redis
from joserfc.errors import JoseError
from joserfc.jwk import ECKey
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.exceptions import RedisClusterException, RedisError

from .clients import (
    DUMMY_HASH,
    Client,
    check_client_id,
    client_from_json,
    hash_secret,
    new_secret,
    verify_secret,
)
from .issuer import SigningKey
from .revocations import MARGIN, check_entry, refused

log = logging.getLogger(__name__)

AUTH_TAG = "auth"
TIMEOUT = 2.0  # seconds a Redis call may take before it is a failure (and a 503)
STALE_AFTER = 3.0  # seconds without reading the revocation list: tokens refused (503)
REPLICA_WAIT = 1.0  # seconds a new signing key waits for a replica to have it
READY_PAUSE = 0.5  # seconds between a starting node's looks at a cluster not ready
_NAMESPACE = re.compile(r"[A-Za-z0-9._-]{1,64}")  # inside a hash tag: no braces
# Told to the server (CLIENT SETINFO); given, so that opening a connection does not read
# the package's metadata from disk (a blocking call on the event loop).
_DRIVER = redis.DriverInfo(lib_version=redis.__version__)


class SharedStateError(OSError):
    """The shared state did not answer: the gateway's 503, retry later. The message names
    the kind of failure only, never a key or a value (they may hold secrets)."""


@contextlib.contextmanager
def answering() -> Iterator[None]:
    """Turn every failure of the block's Redis calls into :class:`SharedStateError`."""
    try:
        yield
    except (RedisError, RedisClusterException, OSError) as exc:
        if isinstance(exc, SharedStateError):
            raise
        raise SharedStateError(f"the shared state did not answer ({type(exc).__name__})") from exc


class Shared:
    """A connection to the Redis Cluster and the namespace the gateway's keys live in.

    Opening one does no I/O: the cluster is reached on the first call (and its layout
    learnt again after a failover by the client itself). The ``namespace`` (the
    ``redis_namespace`` setting, which the engine's keys use too) lets two gateways, or
    tests, share one cluster apart: 1 to 64 letters, digits and ``. _ -``.
    """

    def __init__(self, cluster: RedisCluster, namespace: str = "restms") -> None:
        if not _NAMESPACE.fullmatch(namespace):
            raise ValueError("the shared state's namespace must be 1 to 64 of A-Z a-z 0-9 . _ -")
        self.redis = cluster
        self.namespace = namespace

    @classmethod
    def open(
        cls, url: str, namespace: str = "restms", seeds: Sequence[tuple[str, int]] = ()
    ) -> Shared:
        """The cluster reached through the seed node ``url`` (``redis://`` or
        ``rediss://``, which may carry ``user:password@``), or through any of ``seeds``
        (host, port) when that one does not answer; ``url``'s credentials and TLS
        serve for all."""
        cluster = RedisCluster.from_url(
            url,
            startup_nodes=[ClusterNode(host, port) for host, port in seeds],
            socket_timeout=TIMEOUT,
            socket_connect_timeout=TIMEOUT,
            decode_responses=False,
            driver_info=_DRIVER,
        )
        return cls(cluster, namespace)

    async def ready(self, within: float) -> None:
        """Return once the cluster serves every slot and each master answers, waiting
        at most ``within`` seconds: a node that starts while the cluster fails over, or
        while a seed node restarts and loads its data, waits for it instead of
        failing. Raises :class:`SharedStateError` naming the last failure's kind."""
        deadline = time.monotonic() + within
        said = ""
        while True:
            try:
                with answering():
                    await self.redis.initialize()
                    await self.redis.ping(target_nodes=RedisCluster.PRIMARIES)
                    info = await self.redis.cluster_info(target_nodes=RedisCluster.RANDOM)
                if info.get("cluster_state") == "ok":
                    return
                cause = "the cluster's state is not ok"
            except SharedStateError as exc:
                cause = str(exc)
            if time.monotonic() + READY_PAUSE > deadline:
                raise SharedStateError(cause)
            if cause != said:
                log.warning("%s: waiting up to %.0f s for the cluster", cause, within)
                said = cause
            await asyncio.sleep(READY_PAUSE)

    def key(self, tag: str, *parts: str) -> str:
        """``{<namespace>:<tag>}:<part>:<part>``: every key of one tag in one slot."""
        return f"{{{self.namespace}:{tag}}}:" + ":".join(parts)

    async def close(self) -> None:
        await self.redis.aclose()


class Settings(Protocol):
    """The settings that say where the shared state is (the gateway's Config)."""

    @property
    def engine(self) -> str: ...

    @property
    def redis_url(self) -> str: ...

    @property
    def redis_namespace(self) -> str: ...


def for_settings(settings: Settings) -> Shared | None:
    """The shared state of a configuration: the Redis Cluster at ``redis_url`` when the
    engine is ``"redis"`` (every node of one gateway shares it); None for the embedded
    engine, whose node keeps its own in its data directory and memory."""
    if settings.engine != "redis":
        return None
    url, more = seeds(settings.redis_url)
    return Shared.open(url, settings.redis_namespace, more)


def seeds(setting: str) -> tuple[str, list[tuple[str, int]]]:
    """The ``redis_url`` setting, one seed URL or several separated by commas, as the
    first URL (whose credentials and TLS serve for all) and the others' (host, port).
    Raises ValueError, naming no part of the setting (the first URL may hold a
    password), when one is not ``redis://host:port`` or ``rediss://host:port``, when
    the schemes differ, or when a later one carries credentials of its own."""
    first, *others = (part.strip() for part in setting.split(","))
    scheme = _seed(first)[0]
    more = []
    for other in others:
        kind, host, port, private = _seed(other)
        if kind != scheme or private:
            raise ValueError("the seed URLs after the first share its scheme and credentials")
        more.append((host, port))
    return first, more


def _seed(url: str) -> tuple[str, str, int, bool]:
    bad = ValueError("a seed URL must be redis://host:port or rediss://host:port")
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port or 6379
    except ValueError:
        raise bad from None
    if parts.scheme not in ("redis", "rediss") or not parts.hostname:
        raise bad
    return parts.scheme, parts.hostname, port, bool(parts.username or parts.password)


# ---------------------------------------------------------------- the signing key
async def signing_key(shared: Shared) -> SigningKey:
    """The signing key every node uses: read, or made and stored if there is none yet
    (SET NX: of nodes starting at once, the first one's key wins and all read it)."""
    name = shared.key(AUTH_TAG, "signing-key")
    with answering():
        pem = await shared.redis.get(name)
        if pem is None:
            fresh = await asyncio.to_thread(ECKey.generate_key, "P-256", private=True)
            if await _create(shared.redis, name, fresh.as_pem(private=True)):
                log.info("generated a new token signing key in the shared state")
            pem = await shared.redis.get(name)
    if pem is None:
        raise SharedStateError("the shared signing key was not kept")
    try:
        return SigningKey(ECKey.import_key(pem))
    except (ValueError, JoseError) as exc:
        raise ValueError(f"the shared signing key is not an EC private key: {exc}") from exc


async def _create(cluster: RedisCluster, name: str, value: bytes) -> bool:
    """``SET name value NX`` on the master of its slot, then ``WAIT`` for a replica on
    the same connection (WAIT counts the writes of its own connection), so that a key
    made once survives a failover right after: a master lost before a replica had it
    would let a later node make a second key. False when the key was there already.
    A cluster without a replica that answers in time keeps it on the master alone
    (logged)."""
    await cluster.initialize()  # the slot map, to find the master
    node = cluster.get_node_from_key(name)
    if node is None:
        raise SharedStateError("no master serves the signing key's slot")
    connection = node.acquire_connection()
    try:
        await connection.send_command("SET", name, value, "NX")
        created = await connection.read_response() is not None
        await connection.send_command("WAIT", 1, int(REPLICA_WAIT * 1000))
        replicas = await connection.read_response()
    except BaseException:
        await connection.disconnect()  # a reply may be pending: not for the next caller
        raise
    finally:
        node.release(connection)
    if created and not replicas:
        log.warning("the shared signing key is on one master only: no replica had it in time")
    return created


# ---------------------------------------------------------------- the client registry
class RedisClients:
    """The configured clients plus those in the shared hash: the async client registry
    (:class:`auth.clients.Clients`) of a gateway on several nodes. A client added or
    removed on one node is known to all at their next lookup (nothing is cached)."""

    def __init__(self, shared: Shared, configured: Sequence[Client] = ()) -> None:
        self._redis = shared.redis
        self._key = shared.key(AUTH_TAG, "clients")
        self._configured = {c.client_id: c for c in configured}
        if len(self._configured) != len(configured):
            raise ValueError("a client id is configured twice")

    async def get(self, client_id: str) -> Client | None:
        found = self._configured.get(client_id)
        if found is not None:
            return found
        with answering():
            raw = await self._redis.hget(self._key, client_id)
        return None if raw is None else _decode(client_id, _text(raw))

    async def authenticate(self, client_id: str, secret: str) -> Client | None:
        """The client if ``secret`` is its secret (scrypt, in a thread), else None; an
        unknown id costs one verification too."""
        client = await self.get(client_id)
        encoded = client.secret_hash if client is not None else DUMMY_HASH
        ok = await asyncio.to_thread(verify_secret, secret, encoded)
        return client if client is not None and ok else None

    async def clients(self) -> list[Client]:
        with answering():
            raw = await self._redis.hgetall(self._key)
        stored = sorted(
            (_decode(_text(k), _text(v)) for k, v in raw.items()), key=lambda c: c.client_id
        )
        return sorted(self._configured.values(), key=lambda c: c.client_id) + stored

    async def add(self, client_id: str, scopes: Sequence[str]) -> str:
        """Add a client and return its new secret (not kept); ValueError when the id is
        malformed, configured or taken, or a scope is not a scope-token."""
        check_client_id(client_id)
        if client_id in self._configured:
            raise ValueError(f"client {client_id!r} is in the configuration already")
        secret = new_secret()
        hashed = await asyncio.to_thread(hash_secret, secret)
        client = Client(client_id=client_id, secret_hash=hashed, scopes=tuple(scopes))
        value = json.dumps({"secret_hash": client.secret_hash, "scopes": list(client.scopes)})
        with answering():
            added = await self._redis.hsetnx(self._key, client_id, value)
        if not added:
            raise ValueError(f"client {client_id!r} exists already")
        return secret

    async def remove(self, client_id: str) -> None:
        """Remove a client; KeyError if there is none, ValueError if it is configured."""
        if client_id in self._configured:
            raise ValueError(f"client {client_id!r} is configured: remove it from the config")
        with answering():
            removed = await self._redis.hdel(self._key, client_id)
        if not removed:
            raise KeyError(client_id)


def _text(raw: bytes | str) -> str:
    """A reply as text (the connection answers bytes; a str is let through as it is)."""
    return raw.decode("utf-8") if isinstance(raw, bytes) else raw


def _decode(client_id: str, raw: str) -> Client:
    try:
        item = json.loads(raw)
        return client_from_json({**item, "client_id": client_id})
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"the shared client {client_id!r} is malformed: {exc}") from exc


# ---------------------------------------------------------------- revocations
# Record a revocation (the later time holds) and drop entries no unexpired token predates.
_REVOKE = """
local old = redis.call('HGET', KEYS[1], ARGV[1])
if not old or tonumber(old) < tonumber(ARGV[2]) then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
end
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  if tonumber(all[i + 1]) <= tonumber(ARGV[3]) then redis.call('HDEL', KEYS[1], all[i]) end
end
return redis.call('HGET', KEYS[1], ARGV[1])
"""


class RedisRevocations:
    """The revocation list (:class:`auth.revocations.RevocationList`) in the shared
    hash. :meth:`refuses` reads this node's copy (:attr:`at`, a dict lookup on the hot
    path), which :meth:`update` refreshes: the gateway calls it every half second, so a
    revocation made on one node is in force on all within a second. A copy older than
    :data:`STALE_AFTER` seconds is :meth:`stale`: tokens it would judge are answered 503.
    """

    def __init__(self, shared: Shared, keep: float, clock: Callable[[], float] = time.time) -> None:
        self._redis = shared.redis
        self._key = shared.key(AUTH_TAG, "revoked")
        self._script = shared.redis.register_script(_REVOKE)
        self.keep = keep
        self._clock = clock
        self.at: dict[str, float] = {}  # replaced whole, never changed in place
        self._fresh_until = -math.inf  # monotonic time the copy goes stale

    def __len__(self) -> int:
        return len(self.at)

    def refuses(
        self, client_id: str | None, issued: float | None, token_id: str | None = None
    ) -> str | None:
        return refused(self.at, client_id, issued, token_id)

    def stale(self) -> bool:
        return time.monotonic() > self._fresh_until

    async def update(self) -> list[str]:
        """Read the shared list; the entries revoked since the last read."""
        started = time.monotonic()
        with answering():
            raw = await self._redis.hgetall(self._key)
        cutoff = self._clock() - self.keep - MARGIN
        at: dict[str, float] = {}
        for name, when in raw.items():
            try:
                entry, revoked = check_entry(_text(name)), float(when)
            except ValueError:
                log.warning("a malformed entry in the shared revocation list is ignored")
                continue
            if revoked > cutoff:
                at[entry] = revoked
        before, self.at = self.at, at
        self._fresh_until = started + STALE_AFTER
        return [c for c, when in at.items() if when > before.get(c, -1.0)]

    async def record(self, entry: str) -> float:
        """Record that ``entry`` (a client id, or one of its tokens:
        :func:`auth.revocations.token_entry`) is revoked now, in the shared list before
        this returns; the time recorded (a later one another node recorded holds)."""
        check_entry(entry)
        now = self._clock()
        cutoff = now - self.keep - MARGIN
        with answering():
            kept = await self._script(keys=[self._key], args=[entry, repr(now), repr(cutoff)])
        when = float(kept)
        self.at = {**self.at, entry: when}
        return when


# ---------------------------------------------------------------- failed secret checks
# A token bucket on the server's clock: ARGV rate, burst, cost (-1 gives one back).
# Returns the seconds to wait as a string ("0": paid), Lua numbers being truncated.
_BUCKET = """
local rate, burst, cost = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local held = redis.call('HMGET', KEYS[1], 'tokens', 'at')
if cost < 0 and not held[1] then return '0' end
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local tokens = burst
if held[1] then
  tokens = math.min(burst, tonumber(held[1]) + math.max(0, now - tonumber(held[2])) * rate)
end
if cost > 0 and tokens < cost then return tostring((cost - tokens) / rate) end
tokens = math.min(burst, tokens - cost)
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'at', tostring(now))
redis.call('PEXPIRE', KEYS[1], math.ceil((burst - tokens) / rate * 1000) + 1000)
return '0'
"""


class RedisBuckets:
    """Token buckets (:class:`auth.limits.Buckets`) every node shares: ``rate`` tokens a
    second, ``burst`` at most, one bucket per key (an account: hashed into the key name,
    so any name is a safe key). ``rate == 0`` turns them off, with no call made."""

    def __init__(self, shared: Shared, rate: float, burst: int, *, name: str = "failures") -> None:
        if rate < 0 or burst < 1:
            raise ValueError("rate must not be negative and burst must be at least 1")
        self._shared = shared
        self._name = name
        self._script = shared.redis.register_script(_BUCKET)
        self.rate = float(rate)
        self.burst = burst

    def _key(self, key: str) -> str:
        digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()
        return self._shared.key(AUTH_TAG, self._name, digest)

    async def _pay(self, key: str, cost: int) -> float:
        with answering():
            wait = await self._script(
                keys=[self._key(key)], args=[repr(self.rate), self.burst, cost]
            )
        return float(wait)

    async def take(self, key: str) -> float:
        """0.0 when one token was paid, else the seconds until one will be there."""
        if not self.rate:
            return 0.0
        return await self._pay(key, 1)

    async def give(self, key: str) -> None:
        """Give back a token :meth:`take` paid (never past ``burst``)."""
        if self.rate:
            await self._pay(key, -1)
