"""The Redis engine's cached catalogue kept in step with the cluster's (docs/CLUSTER.md,
"Caching and freshness"): the news read when the catalogue's channel announces a
version, when a key asked for is missing and before each publish (:func:`fresh`), or
the whole catalogue read a piece at a time when the news no longer reach back
(:func:`reload`); a change made against the version it was decided on
(:func:`change`); the readers of what changed woken. And the look-ups of records by
key, another principal's being 404 (:func:`pipe`, :func:`feed`, :func:`join`,
:func:`staged`)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

from restms.errors import NotFound, ServiceUnavailable

from ..service import HIDDEN
from . import waiting
from .catalogue import Cache, FeedRec, JoinRec, PipeRec, StagedRec
from .link import FUNCTIONS

if TYPE_CHECKING:
    from .service import RedisEngine

log = logging.getLogger(__name__)
T = TypeVar("T")
PIECE = 1000  # catalogue fields a reload reads in one call and takes in one turn of the loop
RELOADS = 5  # whole reads tried (the catalogue changing faster than its log keeps, failovers)
Fields = list[tuple[str, bytes | None]]


def heard(engine: RedisEngine, channel: str, data: bytes) -> None:
    if channel == engine.keys.cat:
        if int(data or 0) > engine.cache.version and not engine._closing:
            background(engine, sync(engine))
        return
    waiting.heard(engine, data)


def background(engine: RedisEngine, work: Coroutine[Any, Any, None]) -> None:
    """Run ``work`` beside the calls (reading news): tracked, ended by close, its
    failure logged (the next call looks again)."""

    async def run() -> None:
        try:
            await work
        except ServiceUnavailable as exc:
            log.warning("reading the catalogue's news failed: %s", exc.reason)

    task = asyncio.get_running_loop().create_task(run())
    engine._announcing.add(task)
    task.add_done_callback(engine._announcing.discard)


def lost(engine: RedisEngine) -> None:
    """A wake-up may have been missed: every waiter looks again."""
    for pipe in list(engine._waiters):
        waiting.wake(engine, pipe)
    if not engine._closing:
        background(engine, sync(engine))


async def sync(engine: RedisEngine) -> None:
    """Read the catalogue's news since the version cached."""
    async with engine._syncing:
        reply = await _since(engine, engine.cache.version)
        if reply[1:2] == [b"full"]:
            await reload(engine, int(reply[0]))
        else:
            news(engine, reply)


async def _since(engine: RedisEngine, version: int) -> list[Any]:
    keys = engine.keys
    reply: list[Any] = await engine.link.call(
        keys.cat, "FCALL", FUNCTIONS + "cat_since", 2, keys.cat, keys.log, version
    )
    return reply


def news(engine: RedisEngine, reply: list[Any]) -> None:
    version = int(reply[0])
    if len(reply) == 1 or version <= engine.cache.version:
        return
    items = _fields(reply[2:])
    engine.cache.load(version, items)
    changed(engine, _pipes(items))


def _fields(flat: list[Any]) -> Fields:
    return [(flat[i].decode(), flat[i + 1] or None) for i in range(0, len(flat) - 1, 2)]


def _pipes(fields: Fields) -> list[str]:
    """The pipes that fields of the catalogue name."""
    return [name[2:] for name, _ in fields if name.startswith("p:")]


async def reload(engine: RedisEngine, version: int) -> None:
    """Read the whole catalogue (at the start, or when the log no longer reaches back
    to the version cached) into a new cache, a piece at a time (:func:`_read`), take
    the news since ``version`` (the catalogue's when the read began) until it is as new
    as the cache in use (:func:`_catch_up`), then swap it in:
    a catalogue of 100,000 pipes holds neither the master nor this node's loop for its
    whole read."""
    for _ in range(RELOADS):
        cache = await _read(engine, version)
        if cache is None:  # read from two servers: a failover or a restart meanwhile
            continue
        behind = await _catch_up(engine, cache, version)
        if behind is not None:  # more changed meanwhile than the log keeps: again
            version = behind
            continue
        engine.cache.swap(cache)
        changed(engine, list(engine._waiters))  # anything may have changed: all look
        background(engine, _let_go(cache))  # (the news need not wait for it)
        return
    raise ServiceUnavailable("the catalogue changes too fast to be read whole now; retry")


async def _catch_up(engine: RedisEngine, cache: Cache, version: int) -> int | None:
    """Take the news since ``version`` into ``cache`` (read whole from then) until it is
    as new as the cache in use: this engine's own changes load into that one as their
    answers come (:func:`change`), and may be newer than news read a moment before.
    None once caught up, or after ``RELOADS`` tries (still behind, it is swapped in as
    it is: the next news bring the rest); the catalogue's version when its log no
    longer reaches back to ``version``."""
    for _ in range(RELOADS):
        reply = await _since(engine, version)
        if reply[1:2] == [b"full"]:
            return int(reply[0])
        version = int(reply[0])
        cache.load(version, _fields(reply[2:]))
        if version >= engine.cache.version:
            return None
    return None


async def _read(engine: RedisEngine, version: int) -> Cache | None:
    """The catalogue as ``HSCAN`` reads it, ``PIECE`` fields a call and a turn of the
    event loop, the joins linked last (a join may come before its pipe or feed); None
    when the pieces came from more than one server (by its run id): a cursor means
    nothing to another server, or to the same one restarted, and the read would miss
    fields."""
    keys = engine.keys
    cache = Cache(engine.config)
    joins: Fields = []
    cursor, server = 0, None
    while True:
        (cursor, found), info = await engine.link.batch(
            keys.cat,
            [("HSCAN", keys.cat, cursor, "COUNT", PIECE), ("INFO", "server")],
            write=False,
        )
        if server not in (None, info["run_id"]):
            return None
        server = info["run_id"]
        items = [(name.decode(), value) for name, value in found.items()]
        joins += [item for item in items if item[0].startswith("j:")]
        cache.load(version, [item for item in items if not item[0].startswith("j:")])
        if cursor == 0:
            break
    for start in range(0, len(joins), PIECE):
        if start:
            await asyncio.sleep(0)
        cache.load(version, joins[start : start + PIECE])
    return cache


async def _let_go(old: Cache) -> None:
    """Free what a cache held a piece at a time: 100,000 pipes' records freed at once
    would hold the loop as their reading would have."""
    for table in (old.joins, old.pipes, old.feeds, old.staged):
        while table:
            for _ in range(min(PIECE, len(table))):
                table.popitem()
            await asyncio.sleep(0)


def changed(engine: RedisEngine, pipes: list[str]) -> None:
    """After the cache took a change: the readers of each of ``pipes`` (changed or
    deleted) and the evented GETs on the catalogue look again. In proportion to the
    change, not to the pipes known: a change costs the same at 100,000 pipes as at 100."""
    for pipe in pipes:
        waiting.wake(engine, pipe)
    watching, engine._watching_catalogue = engine._watching_catalogue, set()
    for future in watching:
        if not future.done():
            future.set_result(True)


async def change(
    engine: RedisEngine, build: Callable[[], tuple[Fields, T]], *, decided: bool = True
) -> T:
    """Make a change the cache decides (``build``: the fields to write, and the
    answer), atomically against the version it was decided on: when another engine
    changed the catalogue first, read the news and decide again. ``decided=False``: a
    change that depends on nothing the catalogue holds (a record under a new random key,
    a staged content taken away), made whatever the version. Concurrent creations then
    do not turn each other away: n of them at once cost n calls, not n(n+1)/2."""
    keys = engine.keys
    for _ in range(50):
        fields, answer = build()
        if not fields:
            return answer
        args: list[Any] = []
        for name, value in fields:
            args += [name, value or b""]
        expected: int | str = engine.cache.version if decided else "*"
        made, version = await engine.link.call(
            keys.cat,
            "FCALL",
            FUNCTIONS + "cat_change",
            2,
            keys.cat,
            keys.log,
            expected,
            keys.cat,
            *args,
            write=True,
            durable=True,
        )
        if made:
            if version == engine.cache.version + 1:
                engine.cache.load(version, fields)
                changed(engine, _pipes(fields))
            elif version > engine.cache.version:
                await sync(engine)
            return answer
        await sync(engine)
    raise ServiceUnavailable("the catalogue is too busy to change now; retry", retry_after=1)


async def fresh(engine: RedisEngine) -> None:
    """Catch up when the catalogue moved on (a cheap version check, shared by the
    calls that ask before it is sent)."""
    version = await engine.link.call(engine.keys.cat, "HGET", engine.keys.cat, "v", share=True)
    if int(version or 0) != engine.cache.version:
        await sync(engine)


# ---------------------------------------------------------------- look-ups (another's: 404)
async def find(engine: RedisEngine, table: str, key: str) -> Any:
    found = getattr(engine.cache, table).get(key)
    if found is None:
        await fresh(engine)  # made by another engine a moment ago?
        found = getattr(engine.cache, table).get(key)
    return found


async def pipe(engine: RedisEngine, principal: str | None, key: str) -> PipeRec:
    found: PipeRec | None = await find(engine, "pipes", key)
    if found is None or (principal is not None and found.owner != principal):
        raise NotFound(HIDDEN)
    return found


async def feed(engine: RedisEngine, principal: str | None, key: str) -> FeedRec:
    found: FeedRec | None = await find(engine, "feeds", key)
    if found is None or (found.name is None and principal is not None and found.owner != principal):
        raise NotFound(f"no feed named {key!r}")
    return found


async def join(engine: RedisEngine, principal: str | None, key: str) -> JoinRec:
    found: JoinRec | None = await find(engine, "joins", key)
    if found is None:
        raise NotFound(HIDDEN)
    pipe = engine.cache.pipes[found.pipe]
    if principal is not None and pipe.owner != principal:
        raise NotFound(HIDDEN)
    return found


async def staged(engine: RedisEngine, principal: str | None, key: str) -> StagedRec:
    found: StagedRec | None = await find(engine, "staged", key)
    if (
        found is None
        or found.expires <= time.time()
        or (principal is not None and found.owner != principal)
    ):
        raise NotFound(HIDDEN)
    return found
