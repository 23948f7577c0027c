"""Publishing on the Redis engine: route on this engine (the cached catalogue), then
one function call per bucket of target pipes places the copies (:mod:`.placing`);
rotator and service feeds hand each message to one pipe in turn or queue it (a list
in the feed's slot, :mod:`.queueing`). Here too: dead letters and the room a publish
would find (:func:`room`).

A publish is all or nothing as far as the cluster lets it be: everything that can
refuse it (a missing or foreign staged content, a full "reject" pipe, a full feed
queue) is checked before anything is placed; when a bucket's call or its ``WAIT``
fails, the copies placed in other buckets are taken out again before NotCommitted is
raised (their positions stay gaps: a position is never issued twice).

With the mirror on, what each publish, hand-out and dead letter did is offered to it as
the embedded engine offers it (:mod:`.mirror`): the routes collect each message's pipes
in the order of its joins for that.

Message ids are claimed before anything is placed (:mod:`.claims`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import Sequence
from typing import TYPE_CHECKING

from restms.errors import (
    Forbidden,
    NotFound,
    RestMSError,
    ServiceUnavailable,
)
from restms.specs import Duplicate, EmbeddedContent, LinkedContent, MessageSpec
from restms.uris import split_path

from ..model import Blob as HeldBlob
from ..publishing import message_ids
from ..routing import QUEUEING_TYPES
from ..service import Placed, PublishResult
from ..store import decode_parts, loads, message_spec, persistent, stamp_in
from . import claims, mirror, placing, queueing, settling, syncing, waiting
from .catalogue import FeedRec, PipeRec, bucket
from .link import FUNCTIONS
from .mirror import Copy, Held
from .placing import Item, Refused
from .values import encode_message

if TYPE_CHECKING:
    from .service import RedisEngine

log = logging.getLogger(__name__)


async def publish(
    engine: RedisEngine,
    principal: str,
    key: str,
    messages: Sequence[MessageSpec],
    via: str | None = None,
) -> PublishResult:
    """Publish, to the end even when the caller goes away (a client that gave up): the
    copies placed are then committed or taken back, and the ids remembered or released,
    as if it had waited; only the reply is lost. Stopped midway, a placed copy would
    stay without its ``WAIT`` or withdrawal, its id released: a retry would place it
    again."""
    task = asyncio.ensure_future(_publish(engine, principal, key, messages, via))
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        await asyncio.wait([task])  # bounded: each of its calls has the link's timeout
        if not task.cancelled():
            task.exception()  # its failure, if any, is nobody's to answer now
        raise


async def _publish(
    engine: RedisEngine,
    principal: str,
    key: str,
    messages: Sequence[MessageSpec],
    via: str | None,
) -> PublishResult:
    await syncing.fresh(engine)  # route with every join committed before this publish
    feed = await syncing.feed(engine, principal, key)
    now = time.time()
    items, used = await _contents(engine, principal, feed, messages, now)
    window = engine.config.dedup_window
    seen: dict[str, int | None] = {}
    # Each message's id, when the window is on and any message has one (most have none).
    named = message_ids(messages) if window > 0 else None
    ids = named or [None] * len(messages)
    wanted = sorted({i for i in ids if i})
    if wanted:  # a concurrent publish of one on any node waits its turn
        seen = await claims.claim_all(engine, feed, wanted, window)
    claimed = [i for i in wanted if seen.get(i) is None]
    counts: list[int] = [0] * len(messages)
    routed = _routed(ids, seen, counts) if named else list(range(len(messages)))
    engine.counters.published += len(messages)
    copies: dict[int, Sequence[Copy]] = {}  # (the mirror's)
    exact = bool(claimed)  # a repeat must find the message once: marked places
    try:
        if feed.type in QUEUEING_TYPES:
            placed, queued, committed, outs = await queueing.queueing(
                engine, feed, [items[i] for i in routed], exact
            )
            took = {i: 1 if n else 0 for i, n in zip(routed, placed, strict=True)}
            placements: list[Placed] = []
            if engine._mirror is not None:
                copies = {i: [(p, True, 1)] for i, p in zip(routed, outs, strict=True) if p}
        else:
            took, placements, committed, copies = await placing.fanout(
                engine, feed, items, routed, exact
            )
            queued = 0
    except BaseException as exc:
        if isinstance(exc, Refused) and engine._mirror is not None:
            mirror.refused(engine, feed, messages, principal if exc.publisher else None)
        if isinstance(exc, settling.Unsettled):  # the ids stay claimed until it is settled
            fanout = feed.type not in QUEUEING_TYPES
            by_index = {index: mid for index, mid in enumerate(ids) if mid} if fanout else None
            claims.after(engine, feed, claimed, by_index, exc.settled, window)
        else:
            await claims.release(engine, feed, claimed)  # nothing was kept: the ids are free
        raise
    for index in routed:
        counts[index] = took[index]
    if named:
        for index, count in enumerate(counts):
            if count < 0:
                counts[index] = Duplicate(counts[-1 - count])
                engine.counters.duplicates += 1
            elif isinstance(count, Duplicate):
                engine.counters.duplicates += 1
    if engine._mirror is not None:
        sizes = [item[2] for item in items]
        mirror.published(engine, feed, messages, counts, principal, sizes, copies, bool(used), now)
    if named:
        done = [(mid, counts[i]) for i in routed if (mid := ids[i])]
        await claims.remember(engine, feed, done, window)
    if used:
        await syncing.change(
            engine, lambda: ([(f"s:{k}", None) for k in used if k in engine.cache.staged], None)
        )
    if via is not None and engine._mirror is not None:
        mirror.bridged_in(engine, feed, messages, counts, principal, via)
    return PublishResult(
        counts=tuple(counts), placed=tuple(placements), queued=queued, committed=committed
    )


def _routed(ids: list[str | None], seen: dict[str, int | None], counts: list[int]) -> list[int]:
    """The indexes of the messages to route: not those whose id the window holds (their
    count is a Duplicate of the one kept), nor an id's repeats in this publish (their
    count, until the first's is known, is -1 - the first's index)."""
    routed: list[int] = []
    first_of: dict[str, int] = {}
    for index, mid in enumerate(ids):
        if mid and seen.get(mid) is not None:
            counts[index] = Duplicate(seen[mid] or 0)
        elif mid and mid in first_of:
            counts[index] = -1 - first_of[mid]
        else:
            if mid:
                first_of[mid] = index
            routed.append(index)
    return routed


async def _contents(
    engine: RedisEngine,
    principal: str | None,
    feed: FeedRec,
    messages: Sequence[MessageSpec],
    now: float,
) -> tuple[list[Item], list[str]]:
    """Each message as its entry holds it; staged contents are read and checked (M7-M10)
    before anything is placed."""
    items: list[Item] = []
    used: list[str] = []
    for spec in messages:
        parts: list[EmbeddedContent | HeldBlob] = []
        for content in spec.contents:
            if isinstance(content, LinkedContent):
                where = split_path(content.path)
                key = where[1] if where is not None and where[0] == "resource" else ""
                staged = await syncing.staged(engine, principal, key) if key else None
                if staged is None or key in used:
                    raise NotFound(f"no staged content at {content.path}")
                if staged.feed != feed.key:
                    raise Forbidden("a staged content may only be published to its own feed")
                data = await engine.link.call(engine.keys.cat, "GET", engine.keys.staged(key))
                if data is None:
                    raise NotFound(f"no staged content at {content.path}")
                parts.append(HeldBlob(data, staged.content_type))
                used.append(key)
            else:
                parts.append(content)
        record, size = encode_message(spec, tuple(parts), feed.name, now, next(engine.stamps))
        items.append((spec, record, size, persistent(spec) if spec.props else False))
    return items, used


# ---------------------------------------------------------------- dead letters
async def dead_letter(
    engine: RedisEngine,
    pipe: PipeRec,
    data: bytes,
    reason: str,
    why: tuple[tuple[str, str], ...],
    feed: str | None,
) -> bool:
    """Publish a copy of a message taken out of ``pipe`` to a dead-letter feed (``feed``
    by name, else the pipe's, else the configured one); False when there is none."""
    cache = engine.cache
    settings = engine.settings(pipe)
    target: FeedRec | None
    if feed:
        target = cache.feeds.get(feed)
    elif settings.dead_letter is None:
        target = cache.feeds.get(engine.config.dead_letter_feed)
    else:
        try:
            target = cache.feed_at(settings.dead_letter) if settings.dead_letter else None
        except RestMSError:  # the feed went since the pipe named it: discarded, counted
            target = None
    if target is None:
        engine.counters.dead_discarded += 1
        if engine._mirror is not None:
            mirror.pipe_event(engine, "drop", pipe, Held.of_record(data), "discarded")
        return False
    fields = loads(data)
    spec = message_spec(fields)
    headers = (
        *spec.headers,
        ("x-death-reason", reason),
        *why,
        ("x-original-feed", fields[3] or ""),
    )
    copy = MessageSpec(address=spec.address, props=spec.props, headers=headers)
    parts = tuple(p for p in decode_parts(fields[6]) if p is not None)
    stamp = stamp_in(fields) or next(engine.stamps)  # the message's own, when it has one
    record, size = encode_message(copy, parts, fields[3], fields[4], stamp)
    item: Item = (copy, record, size, persistent(copy))
    copies: Sequence[Copy] = ()
    try:
        if target.type in QUEUEING_TYPES:
            pipes = (await queueing.queueing(engine, target, [item]))[3]
            copies = [(pipe, True, 1) for pipe in pipes if pipe is not None]
        else:
            copies = (await placing.fanout(engine, target, [item], [0]))[3].get(0, [])
    except ServiceUnavailable:
        engine.counters.dead_discarded += 1
        if engine._mirror is not None:
            mirror.pipe_event(engine, "drop", pipe, Held.of_record(data), "discarded")
        return False
    engine.counters.dead_lettered += 1
    if engine._mirror is not None:
        mirror.dead_lettered(engine, pipe, data, reason, target, copy, size, copies)
    return True


async def room(
    engine: RedisEngine, principal: str, key: str, messages: Sequence[MessageSpec], wait: float
) -> int:
    """How many leading messages every "skip" pipe they reach can hold together."""
    feed = await syncing.feed(engine, principal, key)
    if feed.type in QUEUEING_TYPES:
        return len(messages)
    deadline = time.monotonic() + wait
    while True:
        fit, pipes = await _room_now(engine, feed, messages)
        remaining = deadline - time.monotonic()
        if fit or remaining <= 0 or not pipes:
            return fit
        futures = [waiting.watch(engine, p) for p in pipes]
        for p in pipes:
            await waiting.listen(engine, bucket(p))
        try:
            fit, _ = await _room_now(engine, feed, messages)
            if fit:
                return fit
            await asyncio.wait(futures, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for p, future in zip(pipes, futures, strict=True):
                waiting.unwatch(engine, p, future)


async def _room_now(
    engine: RedisEngine, feed: FeedRec, messages: Sequence[MessageSpec]
) -> tuple[int, list[str]]:
    cache = engine.cache
    sizes = [
        spec.head_size + sum(len(c.value) for c in spec.contents if isinstance(c, EmbeddedContent))
        for spec in messages
    ]
    reach: dict[str, list[int]] = defaultdict(list)
    for index, spec in enumerate(messages):
        for join in cache.matching(feed, spec.address, spec.headers):
            pipe = cache.pipes.get(join.pipe)
            skips = pipe is not None and engine.settings(pipe).overflow == "skip"
            if skips and (not reach[join.pipe] or reach[join.pipe][-1] != index):
                reach[join.pipe].append(index)
    fit = len(messages)
    full: list[str] = []
    for key, indexes in reach.items():
        settings = engine.settings(cache.pipes[key])
        stream, state, tag = engine.keys.pipe(key)
        took = await engine.link.call(
            tag,
            "FCALL",
            FUNCTIONS + "room",
            2,
            stream,
            state,
            settings.max_messages,
            settings.max_bytes,
            len(indexes),
            *[sizes[i] for i in indexes],
        )
        taken = int(took[0])
        if taken < len(indexes):
            fit = min(fit, indexes[taken])
            full.append(key)
    return fit, full
