"""Message ids (``message_id``) on the Redis engine: claimed in the cluster, so the
same id published through two nodes at once is routed once (dedup within
``dedup_window``).

A publish claims each of its ids (``SET NX``, IN_FLIGHT) before its message is placed,
and gives the id the publish's count once that is done (:func:`remember`). Another
publish of the id, a retry on any node, is answered as a duplicate only from that
count: while the claim is unfinished it waits (SETTLE_WAIT, then 503), for that publish
may yet fail and its message not be kept. A publish that fails having placed nothing
releases its claims; one that may have placed copies keeps them until those are
settled (:mod:`.settling`: taken back, the ids then released; or gone already, the ids
then remembered as kept). A claim lasts CLAIM_TTL, and the engine renews its claims
while their publish (or its settling) runs: a publish waiting on a stopped master (the
link's socket timeout) keeps its ids. A claim nobody will finish (its node died, or
its release was refused while the cluster failed over) is free CLAIM_TTL after its
last renewal, and a repeat then places the message again (at least once, never lost).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING

from restms.errors import ServiceUnavailable

from .catalogue import FeedRec

if TYPE_CHECKING:
    from .service import RedisEngine

log = logging.getLogger(__name__)
IN_FLIGHT = -1  # a claimed message id whose publish has not finished
# Seconds an unfinished claim lasts: as long as the link waits for a silent master (its
# socket timeout), so that a claim nobody will finish (its node died, or its release
# was refused during a failover) soon frees the id.
CLAIM_TTL = 5
SETTLE_WAIT = 1.5  # seconds a publish waits for another one's claim of its id to finish
SETTLE_POLL = 0.02
RENEW = 1.0  # seconds between renewals of the claims held


class Holding:
    """The claims this engine's publishes hold now: key -> (when claimed, its TTL)."""

    def __init__(self) -> None:
        self.keys: dict[str, tuple[float, int]] = {}

    def add(self, keys: list[str], ttl: int) -> None:
        now = time.monotonic()
        for key in keys:
            self.keys[key] = (now, ttl)

    def drop(self, keys: list[str]) -> None:
        for key in keys:
            self.keys.pop(key, None)


async def renew(engine: RedisEngine) -> None:
    """Forever: every RENEW seconds, the claims held longer than that live their TTL
    from now (``EXPIRE ... GT``: a remembered id's longer life is never cut)."""
    while True:
        await asyncio.sleep(RENEW)
        now = time.monotonic()
        due = [(k, ttl) for k, (since, ttl) in engine.holding.keys.items() if now - since >= RENEW]
        outcomes = await asyncio.gather(
            *(engine.link.call(k, "EXPIRE", k, ttl, "GT", write=True) for k, ttl in due),
            return_exceptions=True,
        )
        failed = [o for o in outcomes if isinstance(o, ServiceUnavailable)]
        if failed:
            log.warning("%d message-id claims were not renewed: %s", len(failed), failed[0].reason)


async def claim_all(
    engine: RedisEngine, feed: FeedRec, ids: list[str], window: float
) -> dict[str, int | None]:
    """Claim each id: None for those this publish now holds, else the count of the
    publish that routed it. When one cannot be had, the others are released and the
    failure raised: nothing is published."""
    found = await asyncio.gather(
        *(_claim(engine, feed, mid, window) for mid in ids), return_exceptions=True
    )
    seen: dict[str, int | None] = {}
    failed: BaseException | None = None
    for mid, got in zip(ids, found, strict=True):
        if isinstance(got, BaseException):
            failed = failed or got
        else:
            seen[mid] = got
    if failed is not None:
        await release(engine, feed, [mid for mid, got in seen.items() if got is None])
        raise failed
    ttl = max(1, int(min(window, CLAIM_TTL)))
    engine.holding.add([engine.keys.dedup(feed.key, m) for m, g in seen.items() if g is None], ttl)
    return seen


async def _claim(engine: RedisEngine, feed: FeedRec, mid: str, window: float) -> int | None:
    """Claim a message id for this publish: None when it is ours; else the count of
    the publish that routed it. While that one is still under way this one waits for
    it (SETTLE_WAIT at most, then 503): it may yet fail, and its message not be kept."""
    key = engine.keys.dedup(feed.key, mid)
    ttl = max(1, int(min(window, CLAIM_TTL)))
    deadline = time.monotonic() + SETTLE_WAIT
    while True:
        if await engine.link.call(key, "SET", key, IN_FLIGHT, "NX", "EX", ttl, write=True):
            return None
        old = await engine.link.call(key, "GET", key)
        if old is not None and int(old) != IN_FLIGHT:
            return int(old)
        if time.monotonic() >= deadline:
            raise ServiceUnavailable(
                "a publish of the same message_id is under way; retry", retry_after=1
            )
        if old is not None:  # still under way (gone: that publish failed, claim it again)
            await asyncio.sleep(SETTLE_POLL)


async def release(engine: RedisEngine, feed: FeedRec, ids: list[str]) -> None:
    """Free the claims of a publish that kept nothing (best effort: CLAIM_TTL else)."""
    engine.holding.drop([engine.keys.dedup(feed.key, mid) for mid in ids])
    for mid in ids:
        key = engine.keys.dedup(feed.key, mid)
        with contextlib.suppress(ServiceUnavailable):
            await engine.link.call(key, "DEL", key, write=True)


def after(
    engine: RedisEngine,
    feed: FeedRec,
    ids: list[str],
    named: dict[int, str] | None,
    settled: asyncio.Task[dict[int, int] | None],
    window: float,
) -> None:
    """The claims ``ids`` of a publish being settled: held until it is, then released
    (its copies were taken back) or remembered (a copy had gone already: the message
    was kept). ``named``: each message's id by index, None when the settled indexes do
    not name the publish's messages (a rotator's hand-outs); such ids, and every id of
    a publish that could not be settled, are left to run out."""

    async def when_settled() -> None:
        try:
            kept = await settled
        except Exception:  # logged by the engine's background tasks
            kept = None
        if kept is not None and named is not None:
            counts = {named[index]: n for index, n in kept.items() if index in named}
            await remember(engine, feed, list(counts.items()), window)
            await release(engine, feed, [mid for mid in ids if mid not in counts])
        elif kept == {}:
            await release(engine, feed, ids)
        else:  # not settled: a repeat must not place the message at once
            engine.holding.drop([engine.keys.dedup(feed.key, mid) for mid in ids])

    engine.adopt(asyncio.get_running_loop().create_task(when_settled()))


async def remember(
    engine: RedisEngine, feed: FeedRec, done: list[tuple[str, int]], window: float
) -> None:
    """Give each id of a finished publish its count, kept for ``window`` seconds."""
    if not done:
        return
    outcomes = await asyncio.gather(
        *(
            engine.link.call(
                engine.keys.dedup(feed.key, mid),
                "SET",
                engine.keys.dedup(feed.key, mid),
                count,
                "XX",
                "EX",
                max(1, int(window)),
                write=True,
            )
            for mid, count in done
        ),
        return_exceptions=True,
    )
    engine.holding.drop([engine.keys.dedup(feed.key, mid) for mid, _count in done])
    for outcome in outcomes:
        if isinstance(outcome, ServiceUnavailable):
            # The messages are placed (and committed): their answer stands. The id's
            # claim stays unfinished until CLAIM_TTL, so a repeat meanwhile is 503.
            log.warning("a published message id was not remembered: %s", outcome.reason)
        elif isinstance(outcome, BaseException):
            raise outcome
