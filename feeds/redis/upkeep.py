"""The Redis engine's upkeep, run by every engine: leases that ran out (a bucket at a
time, one engine at a time under the lock the sweep function takes), staged contents
past their TTL and idle pipes (Q1, looked for every tenth of the idle timeout, at most
every minute)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from typing import TYPE_CHECKING, Any

from restms.errors import ServiceUnavailable

from ..routing import QUEUEING_TYPES
from ..store import loads
from . import mirror, resources, syncing, waiting
from .catalogue import BUCKETS
from .link import FUNCTIONS
from .publishing import dead_letter
from .queueing import hand_over

if TYPE_CHECKING:
    from .service import RedisEngine
    from .syncing import Fields

log = logging.getLogger(__name__)
FULL_SWEEP = 1.0  # seconds between sweeps of every bucket (leases others took)
IDLE_LOOK = 60.0  # seconds between looks for idle pipes, at most (a tenth of the timeout)


async def sweeper(engine: RedisEngine) -> None:
    """The engine's upkeep: leases of the buckets it leased in, every bucket now and
    then (leases other engines took), staged contents' TTLs and idle pipes."""
    every = 0.0
    idle_every = min(IDLE_LOOK, engine.config.pipe_idle_timeout / 10)
    idle_due = time.monotonic() + idle_every
    while not engine._closing:
        await asyncio.sleep(engine._sweep_interval)
        every += engine._sweep_interval
        try:
            if every >= FULL_SWEEP:
                every = 0.0
                buckets = set(range(BUCKETS))
            else:
                buckets = set(engine._leased_buckets)
            for index in buckets:
                await sweep(engine, index)
            if engine._events is not None:
                engine._events.flush()
            if not every:
                await expire_staged(engine)
            # Looking at every pipe's last use costs in proportion to the pipes, so
            # not every second: a pipe is collected within a tenth of its timeout.
            if time.monotonic() >= idle_due:
                idle_due = time.monotonic() + idle_every
                await collect_idle(engine, idle_every)
        except ServiceUnavailable as exc:
            log.warning("sweep failed: %s", exc.reason)


async def sweep(engine: RedisEngine, index: int) -> None:
    """Leases of one bucket that ran out: moved, handed to another worker of their
    rotator or service feed, or dead-lettered."""
    leases, lock = engine.keys.leases(index)
    tag = engine.keys.tag(index)
    lock_ms = max(1, int(engine._sweep_interval * 1000 / 2))
    reply = await engine.link.call(
        tag,
        "FCALL",
        FUNCTIONS + "sweep",
        2,
        leases,
        lock,
        tag,
        int(time.time() * 1000),
        lock_ms,
        tag,
        write=True,
    )
    for i in range(0, len(reply), 5):
        pipe, moved, data, times = reply[i].decode(), reply[i + 2], reply[i + 3], reply[i + 4]
        engine.counters.redelivered += 1
        waiting.wake(engine, pipe)
        found = engine.cache.pipes.get(pipe)
        if found is None:
            continue
        if engine._mirror is not None:
            mirror.pipe_event(engine, "redeliver", found, mirror.Held.of_record(data))
        if not moved:
            why = (("x-delivery-count", str(times)),)
            await dead_letter(engine, found, data, "max-deliveries", why, None)
            continue
        source = engine.cache.feeds.get(loads(data)[3] or "")
        if source is not None and source.type in QUEUEING_TYPES:
            await hand_over(engine, source, found, moved, times)


async def collect_idle(engine: RedisEngine, every: float) -> None:
    """Q1: pipes nobody used for ``pipe_idle_timeout`` go; a pipe a cursor of this
    engine holds open is used now (its reader makes no requests). Every engine marks
    those it holds; the pipes of a bucket are looked at by one engine a round (``every``
    seconds), whichever takes the bucket's ``idle`` lock first (it lasts nine tenths of
    a round): each pipe's last use is read once a round for all the engines, and an
    idle pipe is collected once."""
    timeout = engine.config.pipe_idle_timeout
    if timeout <= 0:
        return
    now = int(time.time() * 1000)
    held = {c.pipe for c in engine._cursors if c.ended is None}
    by_tag: dict[str, list[tuple[Any, ...]]] = defaultdict(list)
    for key in held:
        _stream, state, tag = engine.keys.pipe(key)
        by_tag[tag].append(("HSET", state, "at", now))
    for tag, commands in by_tag.items():
        await engine.link.batch(tag, commands, write=True)
    lock_ms = max(1, int(every * 900))
    for index, pipes in engine.cache.buckets():
        tag = engine.keys.tag(index)
        if not await engine.link.call(
            tag, "SET", f"{tag}:idle", engine.link.origin, "NX", "PX", lock_ms, write=True
        ):
            continue
        here = [pipe.key for pipe in pipes]
        last = await engine.link.batch(
            tag, [("HGET", engine.keys.pipe(key)[1], "at") for key in here], write=False
        )
        for key, at in zip(here, last, strict=True):
            idle = key not in held and now - int(at or 0) > timeout * 1000
            if idle and await resources.drop_pipe(engine, key):  # (False: another node did)
                engine.counters.collected += 1


async def expire_staged(engine: RedisEngine) -> None:
    now = time.time()
    gone = [s.key for s in engine.cache.staged.values() if s.expires <= now]
    if gone:

        def build() -> tuple[Fields, None]:
            return [(f"s:{k}", None) for k in gone if k in engine.cache.staged], None

        await syncing.change(engine, build)
        engine.counters.staged_expired += len(gone)
