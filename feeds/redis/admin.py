"""What the Redis engine's administrators and monitors see and do: statistics,
readiness, pipe states, purge and the inventory (docs/ADMIN.md)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from restms.errors import NotFound, ServiceUnavailable

from ..config import LATENCY_BOUNDS
from ..routing import QUEUEING_TYPES
from ..service import HIDDEN, Census, Histogram, Inventory, PipeState, Readiness, Stats, StoreStats
from . import lookups, streams, syncing, waiting, webhooks
from .catalogue import PipeRec
from .values import pipe_info

if TYPE_CHECKING:
    from .service import RedisEngine


async def stats(engine: RedisEngine) -> Stats:
    from dataclasses import asdict

    return Stats(
        counters=tuple(asdict(engine.counters).items()),
        census=await census(engine),
        latency=Histogram(
            bounds=LATENCY_BOUNDS,
            counts=tuple(engine.latency.counts),
            total=engine.latency.total,
        ),
        closing=engine._closing,
        store=StoreStats(
            kind="redis-cluster",
            running=not engine._closed,
            failing=engine.link.failing,
            commits=engine.link.commits,
            batches=engine.link.commits,
            failures=engine.link.failures,
            commit_seconds=engine.link.commit_seconds,
            waiting=0,
        ),
    )


async def census(engine: RedisEngine) -> Census:
    pipes: dict[str, int] = {}
    messages = deepest = held_bytes = 0
    if not engine._closed:
        # A bucket at a time: one round trip for its pipes (at 100,000 pipes, 64 in all,
        # not 100,000), and the event loop turns between the buckets.
        for index, here in engine.cache.buckets():
            commands: list[tuple[str, ...]] = []
            for pipe in here:
                pipes[pipe.type] = pipes.get(pipe.type, 0) + 1
                stream, state, _tag = engine.keys.pipe(pipe.key)
                commands += [("XLEN", stream), ("HGET", state, "bytes")]
            replies = await engine.link.batch(engine.keys.tag(index), commands, write=False)
            for held, size in zip(replies[::2], replies[1::2], strict=True):
                messages += held
                deepest = max(deepest, held)
                held_bytes += int(size or 0)
    queued = queued_bytes = 0
    if not engine._closed:
        from .queueing import queued as queue_of

        for feed in list(engine.cache.feeds.values()):
            if feed.type in QUEUEING_TYPES:
                count, size = await queue_of(engine, feed)
                queued += count
                queued_bytes += size
    return Census(
        feeds=sum(1 for f in engine.cache.feeds.values()),
        pipes=tuple(sorted(pipes.items())),
        joins=len(engine.cache.joins),
        messages=messages,
        on_disk=0,
        deepest=deepest,
        queued=queued,
        queued_bytes=queued_bytes,
        queued_on_disk=0,
        staged_bytes=sum(s.size for s in engine.cache.staged.values()),
        held_bytes=held_bytes,
        webhook_pipes=len(engine.cache.hooks),
    )


async def readiness(engine: RedisEngine, timeout: float) -> Readiness:
    if engine._closing:
        return Readiness(problems=("the engine is shutting down",), checked=())
    try:
        await asyncio.wait_for(probe(engine), timeout)
    except (ServiceUnavailable, TimeoutError) as exc:
        why = exc.reason if isinstance(exc, ServiceUnavailable) else "timed out"
        return Readiness(problems=(f"the Redis Cluster does not commit: {why}",), checked=())
    return Readiness(problems=(), checked=("the Redis Cluster commits (a test write)",))


async def probe(engine: RedisEngine) -> None:
    probe = f"{{{engine.keys.ns}:probe}}"
    await engine.link.call(probe, "SET", probe, "1", "PX", 60_000, write=True, durable=True)


# Pipes whose states one round trip reads: a state takes some 50 µs to make, and the
# event loop turns between two round trips.
STATES_AT_ONCE = 100


async def pipe_states(engine: RedisEngine) -> tuple[PipeState, ...]:
    """Every pipe's state, read for up to STATES_AT_ONCE pipes of a bucket at a time in
    one round trip (one pipe at a time took four)."""
    await syncing.fresh(engine)
    states: list[PipeState] = []
    for index, here in engine.cache.buckets():
        for at in range(0, len(here), STATES_AT_ONCE):
            piece = here[at : at + STATES_AT_ONCE]
            states += await _states(engine, engine.keys.tag(index), piece)
    return tuple(states)


async def pipe_state(engine: RedisEngine, principal: str | None, key: str) -> PipeState:
    found = await syncing.pipe(engine, principal, key)
    for state in await _states(engine, engine.keys.pipe(key)[2], [found]):
        return state
    raise NotFound(HIDDEN)  # deleted meanwhile


async def _states(engine: RedisEngine, tag: str, pipes: list[PipeRec]) -> list[PipeState]:
    """The states of pipes of one bucket (``tag``), read in one round trip, but for
    those deleted meanwhile; a look here is not a use (Q1)."""
    commands: list[tuple[Any, ...]] = []
    for pipe in pipes:
        _stream, state, _tag = engine.keys.pipe(pipe.key)
        commands += [
            streams.range_command(engine, pipe.key, 0, 0, use=False),
            lookups.marks_command(engine, pipe.key),
            ("HMGET", state, "bytes", "hook"),
        ]
    replies = await engine.link.batch(tag, commands, write=True)
    pinned = {c.pipe for c in engine._cursors if c.ended is None}
    states: list[PipeState] = []
    for at, pipe in enumerate(pipes):
        if pipe.key not in engine.cache.pipes:
            continue
        ranged, marks, (size, kept) = replies[3 * at : 3 * at + 3]
        settings = engine.settings(pipe)
        hook = None if settings.webhook is None else webhooks.hook_from(settings.webhook, kept)
        joins = tuple(lookups.join_of(engine, j) for j in pipe.joins.values())
        figures = lookups.figures(streams.ranged(engine, ranged), marks)
        info = pipe_info(pipe, settings, joins, figures, engine._dead_letter, hook)
        states.append(
            PipeState(
                info=info,
                on_disk=0,
                bytes=int(size or 0),
                waiting=waiting.count(engine, pipe.key),
                pinned=pipe.key in pinned,
                webhook=None if info.webhook is None else info.webhook.state,
            )
        )
    return states


async def purge(engine: RedisEngine, principal: str | None, pipe: str) -> int:
    found = await syncing.pipe(engine, principal, pipe)
    reply = await engine._range(found.key, 0, 0, use=False)
    return await streams.acknowledge(engine, found.key, reply[0] - 1, use=False)


async def inventory(engine: RedisEngine) -> Inventory:
    feeds = engine.cache.feeds.values()
    return Inventory(
        domains=len(engine.cache.domains),
        public_feeds=sum(1 for f in feeds if f.name is not None),
        private_feeds=sum(1 for f in feeds if f.name is None),
        pipes=len(engine.cache.pipes),
        joins=len(engine.cache.joins),
        staged=len(engine.cache.staged),
    )
