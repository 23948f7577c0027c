"""Abuse limits, framework-free: a token bucket per principal and counted slots.

:class:`RateLimiter` answers "may this principal make a request now, and if not, how
long until it may?" with one bucket per key: a bucket holds at most ``burst`` tokens,
refills at ``rate`` tokens per second and pays ``cost`` tokens per request. A bucket is
stored as its token count at the moment it was last touched; refilling is computed
on the next touch, so nothing runs between requests.

Memory stays bounded without a sweeper. A bucket that has refilled to ``burst`` is
indistinguishable from one never created, so it can be forgotten at no cost: buckets
are kept in least-recently-used order, and each time a new key arrives the oldest
buckets are dropped while they are full. What is left is the keys that made a request
in the last ``burst / rate`` seconds. If even those exceed ``max_keys``, the oldest one
is dropped anyway: that key forgets its debt and gets a full burst back. This is the
trade-off for a hard bound: keys are authenticated principals, so reaching it takes
``max_keys`` accounts all active within one refill period, and the most it gains each
of them is one extra burst per cycle through ``max_keys`` others.

:class:`Slots` counts things held at once per key (waiting requests, open streams,
connections from one address) and refuses one past the limit.

:class:`SecretChecks` bounds the secrets checked with scrypt (a Basic password, a
client secret at the token endpoint), in two ways at once:

* **per client address** (:func:`address_key`: an IPv4 address as it is, an IPv6
  address by its /64, the smallest network one subscriber is usually given, so that
  rotating addresses within it gains nothing): a bucket of checks, each check paid
  before it runs, so a guesser cannot keep the scrypt threads busy;
* **per account** (a user or client id, whether it exists or not): a bucket of
  failures, so that spreading guesses over many addresses gains nothing either. A
  check takes one before it runs (checks in flight count, else a thousand guesses at
  once would all pass) and gives it back if the secret was right.

An attacker can keep both buckets empty for an account, or for an address it shares
with the account's holder, for as long as it keeps guessing; what stops that locking
the holder out is that the right secret is known when it comes again. A secret that
checked right is remembered (an HMAC of the account and the secret under a key made
at start, never the secret) for :data:`KNOWN_FOR` seconds, and a check presenting it
skips the account's bound and pays into an address bucket of its own (keyed by the
address and the account), which no guesser shares. Only someone who has the secret
gets past a bound that way, and the holder is never slowed by a guesser once it has
succeeded; its own checks are still bounded per address, so nobody makes the gateway
hash without bound. An account whose holder has not succeeded since the process
started waits as the guesser does: ``Retry-After`` at most ``1 / account_rate``
seconds, one try each time the bucket refills.

All three are single-threaded: they belong to one event loop.

Several nodes (docs/AUTH.md, "Several nodes"). The per-account bucket of failed checks
is behind :class:`Buckets`: one node's :class:`LocalBuckets`, or buckets every node
shares (:class:`auth.cluster.RedisBuckets`), so that N nodes do not give a guesser N
times the tries. The per-address bucket, the secrets known right and the per-principal
:class:`RateLimiter` stay each node's own: the first two bound what one node spends on
scrypt, and the last is on every request's path, where a shared bucket would cost a
round trip to Redis each time (N nodes behind a balancer allow N times ``rate_limit``).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import hmac
import ipaddress
import math
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Protocol

__all__ = [
    "Buckets",
    "LocalBuckets",
    "RateLimiter",
    "Remembered",
    "SecretChecks",
    "Slots",
    "address_key",
]

KNOWN_FOR = 7 * 24 * 3600.0  # seconds a secret that checked right skips the bounds
KNOWN_KEPT = 10_000  # such secrets remembered at most (the least recently used go)


class RateLimiter:
    """Token buckets per key: ``rate`` tokens per second, ``burst`` at most.

    ``rate == 0`` turns the limiter off: :meth:`take` always allows and keeps no state.
    """

    __slots__ = ("_buckets", "_burst", "_clock", "_max_keys", "_rate")

    def __init__(
        self,
        rate: float,
        burst: int,
        *,
        max_keys: int = 100_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if rate < 0:
            raise ValueError("rate must not be negative")
        if burst < 1:
            raise ValueError("burst must be at least 1")
        if max_keys < 1:
            raise ValueError("max_keys must be at least 1")
        self._rate = float(rate)
        self._burst = float(burst)
        self._max_keys = max_keys
        self._clock = clock
        # A bucket is [tokens, when]: tokens held at monotonic time ``when``. Mutated in
        # place, so that a request on a known key allocates nothing.
        self._buckets: OrderedDict[str, list[float]] = OrderedDict()

    def __len__(self) -> int:
        """How many keys have a bucket (a key without one has a full bucket)."""
        return len(self._buckets)

    def take(self, key: str, cost: float = 1.0) -> float:
        """Pay ``cost`` tokens from ``key``'s bucket.

        Returns 0.0 when they were paid, otherwise the seconds until the bucket will hold
        ``cost`` tokens (nothing is paid then). A ``cost`` above ``burst`` can never be
        paid: the answer is ``math.inf``.
        """
        rate = self._rate
        if not rate:
            return 0.0
        now = self._clock()
        buckets = self._buckets
        bucket = buckets.get(key)
        if bucket is None:
            tokens = self._burst
        else:
            buckets.move_to_end(key)
            tokens = bucket[0] + (now - bucket[1]) * rate
            tokens = min(tokens, self._burst)
        if tokens < cost:
            if cost > self._burst:
                return math.inf
            return (cost - tokens) / rate
        if bucket is None:
            buckets[key] = [tokens - cost, now]
            self._forget(now)
        else:
            bucket[0] = tokens - cost
            bucket[1] = now
        return 0.0

    def give(self, key: str, cost: float = 1.0) -> None:
        """Give back ``cost`` tokens :meth:`take` paid (never past ``burst``)."""
        bucket = self._buckets.get(key)
        if bucket is not None:  # a key without one has a full bucket
            bucket[0] = min(bucket[0] + cost, self._burst)

    def _forget(self, now: float) -> None:
        """Drop the oldest buckets while they are full; the oldest one if still too many."""
        buckets, rate, burst = self._buckets, self._rate, self._burst
        # Stopping at the first bucket that is not full keeps this amortised O(1): each
        # key is dropped at most once per insertion. Full buckets behind it wait for
        # their turn at the front (or for max_keys).
        while buckets:
            oldest = next(iter(buckets))
            tokens, when = buckets[oldest]
            if tokens + (now - when) * rate < burst:
                break
            del buckets[oldest]
        if len(buckets) > self._max_keys:
            buckets.popitem(last=False)


class Buckets(Protocol):
    """Token buckets per key, as :class:`SecretChecks` uses them for accounts."""

    async def take(self, key: str) -> float:
        """0.0 when a token was paid, else the seconds until one will be there."""
        ...

    async def give(self, key: str) -> None:
        """Give back a token :meth:`take` paid."""
        ...


class LocalBuckets:
    """One node's :class:`RateLimiter` behind :class:`Buckets` (answered at once)."""

    __slots__ = ("limiter",)

    def __init__(self, limiter: RateLimiter) -> None:
        self.limiter = limiter

    async def take(self, key: str) -> float:
        return self.limiter.take(key)

    async def give(self, key: str) -> None:
        self.limiter.give(key)


class Slots:
    """Counts of things each key holds at once, at most ``limit`` each.

    A key holding nothing has no entry, so memory follows what is held right now.
    """

    __slots__ = ("_held", "limit")

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError("limit must be at least 1")
        self.limit = limit
        self._held: dict[str, int] = {}

    def __len__(self) -> int:
        """How many keys hold something."""
        return len(self._held)

    def count(self, key: str) -> int:
        """How many slots ``key`` holds."""
        return self._held.get(key, 0)

    def acquire(self, key: str) -> bool:
        """Take a slot for ``key``; False (and nothing taken) when it holds ``limit``."""
        held = self._held.get(key, 0)
        if held >= self.limit:
            return False
        self._held[key] = held + 1
        return True

    def release(self, key: str) -> None:
        """Give back a slot ``key`` holds; releasing one it does not hold is a bug."""
        held = self._held[key] - 1
        if held:
            self._held[key] = held
        else:
            del self._held[key]

    @contextlib.contextmanager
    def hold(self, key: str) -> Iterator[bool]:
        """``with slots.hold(key) as held:`` holds a slot for the block if ``held``.

        When the key is at its limit, ``held`` is False and nothing is released after.
        """
        held = self.acquire(key)
        try:
            yield held
        finally:
            if held:
                self.release(key)


@functools.lru_cache(maxsize=4096)
def address_key(peer: str | None) -> str:
    """The key a client address is limited by: an IPv4 address (also one mapped into
    IPv6) as it is, an IPv6 address by its /64 network; anything else (a Unix socket
    path, nothing) as it is."""
    if not peer:
        return ""
    try:
        address = ipaddress.ip_address(peer.strip("[]"))
    except ValueError:
        return peer
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)


class Remembered:
    """Keys (HMACs) remembered for ``ttl`` seconds each, at most ``kept`` of them, the
    least recently added forgotten first. Single-threaded."""

    __slots__ = ("_clock", "_kept", "_ttl", "_until")

    def __init__(self, ttl: float, kept: int, clock: Callable[[], float] = time.monotonic) -> None:
        self._ttl, self._kept, self._clock = ttl, kept, clock
        self._until: OrderedDict[bytes, float] = OrderedDict()

    def __contains__(self, key: bytes) -> bool:
        if not self._until:
            return False
        until = self._until.get(key)
        if until is None:
            return False
        if until <= self._clock():
            del self._until[key]
            return False
        return True

    def add(self, key: bytes) -> bool:
        """Remember ``key`` from now on; whether it was not held already (expired or
        not)."""
        new = self._until.pop(key, None) is None
        self._until[key] = self._clock() + self._ttl
        while len(self._until) > self._kept:
            self._until.popitem(last=False)
        return new


class SecretChecks:
    """Secret checks per client address and per account, and the secrets known right
    (see the module docstring). Single-threaded, like the buckets it holds.

    Use: :meth:`admit` before a check (a refusal is the seconds to wait and why), then
    :meth:`passed` after a check that succeeded. ``account_rate == 0`` turns the
    per-account bound off. ``accounts`` are the per-account buckets when they are not
    this node's own (then ``account_rate`` and ``account_burst`` are theirs to know).
    """

    __slots__ = ("_key", "_known", "accounts", "addresses")

    def __init__(
        self,
        *,
        address_rate: float,
        address_burst: int,
        account_rate: float,
        account_burst: int,
        max_keys: int = 100_000,
        clock: Callable[[], float] = time.monotonic,
        accounts: Buckets | None = None,
    ) -> None:
        self.addresses = RateLimiter(address_rate, address_burst, max_keys=max_keys, clock=clock)
        if accounts is None:
            local = RateLimiter(account_rate, account_burst, max_keys=max_keys, clock=clock)
            accounts = LocalBuckets(local)
        self.accounts = accounts
        self._key = secrets.token_bytes(32)
        self._known = Remembered(KNOWN_FOR, KNOWN_KEPT, clock)  # HMACs of right secrets

    def _mac(self, account: str, secret: str) -> bytes:
        data = account.encode("utf-8", "surrogatepass") + b"\0"
        return hmac.new(
            self._key, data + secret.encode("utf-8", "surrogatepass"), hashlib.sha256
        ).digest()

    def known(self, account: str, secret: str) -> bool:
        """Whether this secret checked right for this account lately."""
        return self._mac(account, secret) in self._known

    async def admit(self, peer: str | None, account: str, secret: str) -> tuple[float, str]:
        """``(0.0, "")`` when the check may run; else the seconds until it may and the
        reason. A secret known right skips the account's bound, and pays into an address
        bucket of its own (the address's and the account's): still no more checks a
        second than anyone, but none of them taken by a guesser at the same address."""
        address = address_key(peer)
        known = self.known(account, secret)
        if known:
            address = f"{address} {account}"  # no address key holds a space
        wait = self.addresses.take(address)
        if wait:
            return wait, "too many secret checks from this address"
        if not known:
            wait = await self.accounts.take(account)
            if wait:
                return wait, "too many failed secret checks for this account"
        return 0.0, ""

    async def passed(self, account: str, secret: str) -> None:
        """The check :meth:`admit` let run found the secret right: the account gets back
        what it paid, and the secret is known right from now on."""
        # A secret known already paid nothing into the account's bucket.
        if self._known.add(self._mac(account, secret)):
            await self.accounts.give(account)
