"""The Redis engine's calls that name a resource or a message by key: resolving a key,
whether a position or content is there, evented waits (H9-H11), delivered contents
(D2, D6) and dead letters."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any, cast

from restms.errors import NotFound

from ..service import (
    HIDDEN,
    Blob,
    ContentRef,
    DomainInfo,
    FeedInfo,
    PipeInfo,
    Resource,
    Slot,
    Watched,
)
from . import lookups, mirror, publishing, syncing, waiting
from .catalogue import bucket
from .link import FUNCTIONS
from .values import first_position

if TYPE_CHECKING:
    from .service import RedisEngine


async def resolve(engine: RedisEngine, principal: str | None, key: str) -> Resource:
    cache = engine.cache
    await syncing.fresh(engine)  # made or deleted through another node a moment ago?
    feed = cache.feeds.get(key)
    if feed is not None and feed.name is None:
        if principal is not None and feed.owner != principal:
            raise NotFound(HIDDEN)
        return lookups.feed_of(engine, feed)
    if key in cache.pipes:
        return await engine.pipe(principal, key)
    if key in cache.joins:
        return await engine.join(principal, key)
    if key in cache.staged:
        return (await engine.staged(principal, key))[0]
    pipe_key, dot, rest = key.partition(".")
    found = cache.pipes.get(pipe_key) if dot else None
    if found is not None:
        pipe = await syncing.pipe(engine, principal, pipe_key)
        seq, dot, index = rest.partition(".")
        if seq.isdigit() and (not dot or index.isdigit()):
            if dot:
                return ContentRef(
                    pipe=pipe.key, position=int(seq), index=int(index), domain=pipe.domain
                )
            return Slot(pipe=pipe.key, position=int(seq), domain=pipe.domain, pipe_type=pipe.type)
    raise NotFound(HIDDEN)


async def exists(engine: RedisEngine, principal: str | None, at: Slot | ContentRef) -> bool:
    pipe = await syncing.pipe(engine, principal, at.pipe)
    if isinstance(at, Slot):
        reply = await engine._range(pipe.key, at.position, 1)
        return reply[0] == at.position or first_position(reply) == at.position
    try:
        await engine.content(principal, at)
    except NotFound:
        return False
    return True


async def changed(
    engine: RedisEngine, principal: str | None, value: Watched, wait: float
) -> Watched | None:
    deadline = time.monotonic() + wait
    loop = asyncio.get_running_loop()
    while True:
        if engine._closing:
            raise engine._unavailable()
        future: asyncio.Future[bool] = loop.create_future()
        engine._watching_catalogue.add(future)
        pipe = value.key if isinstance(value, PipeInfo) else None
        if pipe is not None:
            await waiting.listen(engine, bucket(pipe))
            engine._waiters[pipe].add(future)
        try:
            current = await now(engine, principal, value)
            if current.version != value.version:
                return cast("Watched", current)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            await asyncio.wait({future}, timeout=remaining)
        finally:
            engine._watching_catalogue.discard(future)
            if pipe is not None:
                engine._waiters.get(pipe, set()).discard(future)


async def now(engine: RedisEngine, principal: str | None, value: Watched) -> Any:
    if isinstance(value, DomainInfo):
        return await engine.domain(value.name)
    if isinstance(value, FeedInfo):
        return await engine.feed(principal, value.key)
    if isinstance(value, PipeInfo):
        return await engine.pipe(principal, value.key)
    return await engine.join(principal, value.key)


async def content(engine: RedisEngine, principal: str | None, ref: ContentRef) -> Blob:
    message = await engine.look(principal, ref.pipe, ref.position)
    if message is None or not 0 <= ref.index < len(message.parts):
        raise NotFound("no such content")
    part = message.parts[ref.index]
    if not isinstance(part, Blob):  # deleted, or embedded: nothing to fetch (D2)
        raise NotFound("no such content")
    return part


async def delete_content(engine: RedisEngine, principal: str | None, ref: ContentRef) -> None:
    await syncing.pipe(engine, principal, ref.pipe)
    stream, state, tag = engine.keys.pipe(ref.pipe)
    await engine.link.call(
        tag,
        "FCALL",
        FUNCTIONS + "delete_content",
        2,
        stream,
        state,
        ref.position,
        ref.index,
        write=True,
    )


async def dead_letter(
    engine: RedisEngine,
    principal: str | None,
    pipe: str,
    position: int,
    reason: str,
    *,
    feed: str | None = None,
    headers: tuple[tuple[str, str], ...] = (),
) -> bool:

    found = await syncing.pipe(engine, principal, pipe)
    stream, state, tag = engine.keys.pipe(found.key)
    taken = await engine.link.call(
        tag, "FCALL", FUNCTIONS + "take_out", 2, stream, state, tag, position, "lost", write=True
    )
    if not taken:
        raise NotFound("no message at that position")
    moved = await publishing.dead_letter(engine, found, taken[0], reason, headers, feed)
    if engine._mirror is not None:  # a bridge reading the pipe is done with it: passed on
        via = next((c.via for c in engine._cursors if c.pipe == found.key and c.via), None)
        if via is not None:
            held = mirror.Held.of_record(taken[0])
            mirror.pipe_event(engine, "bridge_out", found, held, bridge=via)
    return moved
