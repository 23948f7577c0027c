"""Rotator and service feeds on the Redis engine (F8, P3): each message is handed to
the pipe of the next join in turn that has room, else queued (a list in the feed's
slot) until a join comes (:func:`drain`) or an ondemand pipe's read asks for work
(:func:`take_work`); a leased message that came back goes to another worker's pipe
(:func:`hand_over`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..model import message_size
from ..routing import QUEUEING_TYPES
from ..store import decode_parts, dumps, loads, message_spec, persistent
from . import mirror
from .catalogue import FeedRec, PipeRec
from .link import FUNCTIONS
from .placing import Item, Refused, place

if TYPE_CHECKING:
    from .service import RedisEngine


def _queue(engine: RedisEngine, feed: FeedRec) -> tuple[str, str]:
    tag = f"{{{engine.keys.ns}:f:{feed.key}}}"
    return f"{tag}:q", f"{tag}:rr"


async def queued(engine: RedisEngine, feed: FeedRec) -> tuple[int, int]:
    """How many messages wait in the feed's queue, and their bytes."""
    queue, _rr = _queue(engine, feed)
    items = await engine.link.call(queue, "LRANGE", queue, 0, -1)
    return len(items), sum(loads(item)[0] for item in items)


async def queueing(
    engine: RedisEngine, feed: FeedRec, items: list[Item], exact: bool = False
) -> tuple[list[int], int, bool, list[PipeRec | None]]:
    """F8: each message to the next join's pipe that has room, else to the queue. Each
    message's position, how many were queued, whether durably, and the pipe of each."""
    queue, _rr = _queue(engine, feed)
    durable = any(item[3] for item in items)
    waiting = await engine.link.call(queue, "LLEN", queue)
    placed: list[int] = []
    pipes: list[PipeRec | None] = []
    left: list[Item] = []
    for item in items:
        if waiting or left:
            position, pipe = 0, None
        else:
            position, pipe = await _hand_out(engine, feed, item, durable, exact)
        placed.append(position)
        pipes.append(pipe)
        if not position:
            left.append(item)
    if left:
        if waiting + len(left) > engine.config.max_feed_queue:
            if engine._mirror is not None:  # those handed out before the queue was full
                for (spec, _record, size, _kept), pipe in zip(items, pipes, strict=True):
                    if pipe is not None:
                        mirror.copied(engine, feed, spec, size, [(pipe, True, 1)])
            raise Refused("the feed's queue is full; retry", publisher=True)
        entries = [dumps([size, record.decode(), kept]) for _spec, record, size, kept in left]
        await engine.link.call(queue, "RPUSH", queue, *entries, write=True, durable=durable)
        engine.counters.queued += len(left)
    return placed, len(left), durable, pipes


async def _hand_out(
    engine: RedisEngine, feed: FeedRec, item: Item, durable: bool, exact: bool = False
) -> tuple[int, PipeRec | None]:
    """Place one message in the pipe of the next join in turn that takes it: its
    position there and the pipe; 0 and None: none took it."""
    joins = [j for j in feed.joins.values() if j.pipe in engine.cache.pipes]
    joins = [j for j in joins if engine.cache.pipes[j.pipe].type != "ondemand"]
    if not joins:
        return 0, None
    _queue_key, rr = _queue(engine, feed)
    start = int(await engine.link.call(rr, "INCR", rr, write=True)) - 1
    for step in range(len(joins)):
        join = joins[(start + step) % len(joins)]
        pipe = engine.cache.pipes[join.pipe]
        got = await place(engine, {pipe.key: pipe}, {pipe.key: [0]}, [item], durable, exact)
        if got[pipe.key][0]:
            engine.counters.routed += 1
            return got[pipe.key][0], pipe
    return 0, None


async def take_work(engine: RedisEngine, pipe: PipeRec) -> bool:
    """P3: an ondemand pipe's waiting read takes one message from the queue of a
    feed it joins; whether it got one."""
    for join in list(pipe.joins.values()):
        feed = engine.cache.feeds.get(join.feed)
        if feed is None or feed.type not in QUEUEING_TYPES:
            continue
        queue, _rr = _queue(engine, feed)
        head = await engine.link.call(queue, "LPOP", queue, write=True)
        if head is None:
            continue
        size, record, kept = loads(head)
        item: Item = (message_spec(loads(record)), record.encode(), size, kept)
        got = await place(engine, {pipe.key: pipe}, {pipe.key: [0]}, [item], kept)
        if got[pipe.key][0]:
            engine.counters.routed += 1
            if engine._mirror is not None:
                mirror.copied(engine, feed, item[0], size, [(pipe, True, 1)])
            return True
        await engine.link.call(queue, "LPUSH", queue, head, write=True)  # full: back
    return False


async def hand_over(
    engine: RedisEngine, feed: FeedRec, pipe: PipeRec, position: int, times: int
) -> None:
    """A leased message of a rotator or service feed that came back: to another
    worker's pipe when one takes it (carrying its redeliveries), else it stays."""
    others = [
        j
        for j in feed.joins.values()
        if j.pipe != pipe.key
        and j.pipe in engine.cache.pipes
        and engine.cache.pipes[j.pipe].type != "ondemand"
    ]
    if not others:
        return
    stream, state, tag = engine.keys.pipe(pipe.key)
    taken = await engine.link.call(
        tag, "FCALL", FUNCTIONS + "take_out", 2, stream, state, tag, position, write=True
    )
    if not taken:
        return
    data = taken[0]
    fields = loads(data)
    spec = message_spec(fields)
    size = message_size(spec, decode_parts(fields[6]))
    item: Item = (spec, data, size, persistent(spec))
    for join in others:
        target = engine.cache.pipes[join.pipe]
        got = await place(
            engine, {target.key: target}, {target.key: [0]}, [item], item[3], redelivered=times
        )
        if got[target.key][0]:
            return
    await place(engine, {pipe.key: pipe}, {pipe.key: [0]}, [item], item[3])  # none: back


async def drain(engine: RedisEngine, feed: FeedRec) -> None:
    """Hand queued messages out while a pipe takes them (a join came, F8)."""
    queue, _rr = _queue(engine, feed)
    while True:
        head = await engine.link.call(queue, "LINDEX", queue, 0)
        if head is None:
            return
        size, record, kept = loads(head)
        spec = message_spec(loads(record))
        _position, pipe = await _hand_out(engine, feed, (spec, record.encode(), size, kept), kept)
        if pipe is None:
            return
        if engine._mirror is not None:
            mirror.copied(engine, feed, spec, size, [(pipe, True, 1)])
        await engine.link.call(queue, "LPOP", queue, write=True)
