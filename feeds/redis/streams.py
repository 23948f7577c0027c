"""A pipe's stream on the Redis engine: its messages read by range (what expired is
counted), listings, single reads that may wait for their message (:mod:`.waiting`),
deliveries leased, and acknowledgements. Every range is read through the engine's
``_range`` (which calls :func:`read_range`), a read's included."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from restms.errors import NotFound

from ..service import HIDDEN, Listing, Message
from . import mirror, queueing, syncing, waiting
from .catalogue import PipeRec, bucket
from .link import FUNCTIONS
from .values import decode_message, first_position

if TYPE_CHECKING:
    from .service import RedisEngine

# How often a waiting read of an ondemand pipe asks its feeds' queues again: a queue
# announces nothing when a message joins it.
ONDEMAND_POLL = 0.05
# Positions come from HINCRBY (a signed 64-bit counter): past it, none was ever issued,
# and a stream refuses such an id.
MAX_POSITION = 2**63 - 1


async def read_range(
    engine: RedisEngine, pipe: str, first: int, count: int, use: bool = True
) -> list[Any]:
    """The pipe's figures and up to ``count`` messages from ``first`` (0: the oldest):
    asynclet, expired now, oldest, held, then five items a message."""
    command = range_command(engine, pipe, first, count, use)
    if engine._mirror is not None and count:  # it also answers what expired
        reply = await mirror.ranged(engine, pipe, command)
    else:
        _stream, _state, tag = engine.keys.pipe(pipe)
        reply = await engine.link.call(tag, *command, write=True)
    return ranged(engine, reply)


def range_command(
    engine: RedisEngine, pipe: str, first: int, count: int, use: bool = True
) -> tuple[Any, ...]:
    """The call :func:`read_range` makes (it removes what expired: a write)."""
    stream, state, _tag = engine.keys.pipe(pipe)
    now = int(time.time() * 1000)
    return ("FCALL", FUNCTIONS + "range", 2, stream, state, first, count, now, int(use))


def ranged(engine: RedisEngine, reply: list[Any]) -> list[Any]:
    """A range call's reply, what it found expired counted."""
    if reply[1]:
        engine.counters.expired += int(reply[1])
    return list(reply)


def decoded(pipe: str, reply: list[Any]) -> list[Message]:
    return [
        decode_message(pipe, reply[i], reply[i + 1], reply[i + 2], reply[i + 3], reply[i + 4])
        for i in range(4, len(reply), 5)
    ]


async def listing(engine: RedisEngine, principal: str | None, pipe: str) -> Listing:
    await syncing.fresh(engine)
    found = await syncing.pipe(engine, principal, pipe)
    cap = engine.config.listing_cap
    reply = await engine._range(found.key, 0, cap + 1)
    held = decoded(found.key, reply)
    capped = len(held) > cap
    return Listing(messages=tuple(held[:cap]), asynclet=None if capped else reply[0])


async def read(
    engine: RedisEngine, principal: str | None, pipe: str, position: int, wait: float, lease: bool
) -> Message | None:
    found = await syncing.pipe(engine, principal, pipe)
    if not 1 <= position <= MAX_POSITION:  # never issued (0 would ask for the oldest)
        raise NotFound("no message at that position")
    deadline = time.monotonic() + wait
    if wait > 0:
        if engine._closing:
            raise engine._unavailable()
        await waiting.listen(engine, bucket(pipe))
    while True:
        future = waiting.watch(engine, pipe) if wait > 0 else None
        try:
            reply = await engine._range(pipe, position, 1)
            if reply[0] != position:
                if first_position(reply) != position:
                    raise NotFound("no message at that position")
                got = decoded(pipe, reply)[0]
                if lease:
                    await delivered(engine, found, got)
                return got
            remaining = deadline - time.monotonic()
            if future is None or remaining <= 0:
                return None
            if found.type == "ondemand":  # its wait asks its feeds for work (P3)
                if reply[3] == 0 and await queueing.take_work(engine, found):
                    continue
                remaining = min(remaining, ONDEMAND_POLL)
            await asyncio.wait({future}, timeout=remaining)
            if engine._closing:
                raise engine._unavailable()
            if pipe not in engine.cache.pipes:
                raise NotFound(HIDDEN)
            woken = waiting.carried(pipe, position, future)
            if woken is not None:
                if lease:
                    await delivered(engine, found, woken)
                return woken
        finally:
            if future is not None:
                waiting.unwatch(engine, pipe, future)


async def delivered(engine: RedisEngine, pipe: PipeRec, message: Message) -> None:
    """A delivery: unless acknowledged within the pipe's lease it comes back."""
    engine.counters.delivered += 1
    engine.latency.observe(max(0.0, time.time() - message.arrived))
    if engine._mirror is not None:
        mirror.delivered(engine, pipe, message)
    settings = engine.settings(pipe)
    if settings.lease <= 0:
        return
    index = bucket(pipe.key)
    leases, _lock = engine.keys.leases(index)
    due = int((time.time() + settings.lease) * 1000)
    await engine.link.call(
        engine.keys.tag(index), "ZADD", leases, due, f"{pipe.key} {message.position}", write=True
    )
    engine._leased_buckets.add(index)


async def look(
    engine: RedisEngine, principal: str | None, pipe: str, position: int
) -> Message | None:
    found = await syncing.pipe(engine, principal, pipe)
    if not 1 <= position <= MAX_POSITION:
        return None
    reply = await engine._range(found.key, position, 1)
    if first_position(reply) != position:
        return None
    return decoded(found.key, reply)[0]


async def ack(engine: RedisEngine, principal: str | None, pipe: str, position: int) -> int:
    found = await syncing.pipe(engine, principal, pipe)
    return await acknowledge(engine, found.key, position)


async def acknowledge(
    engine: RedisEngine,
    pipe: str,
    position: int,
    durable: bool = True,
    use: bool = True,
    via: str | None = None,
) -> int:
    """Acknowledge every message up to ``position``: how many it removed; the pipe's
    waiters look again. ``use``: whether it counts as the pipe's use (its idle time;
    an administrator's purge does not)."""
    stream, state, tag = engine.keys.pipe(pipe)
    now = int(time.time() * 1000) if use else 0
    command = ("FCALL", FUNCTIONS + "ack", 2, stream, state, tag, position, now)
    if engine._mirror is not None:  # it also answers what it removes
        removed = await mirror.ack(engine, pipe, command, durable, via)
    else:
        removed = int(await engine.link.call(tag, *command, write=True, durable=durable))
    engine.counters.acknowledged += removed
    waiting.wake(engine, pipe)
    return removed
