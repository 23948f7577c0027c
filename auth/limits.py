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

Both are single-threaded: they belong to one event loop.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator

__all__ = ["RateLimiter", "Slots"]


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
