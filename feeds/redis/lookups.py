"""The engine service's look-ups on the Redis engine: a domain, feed, pipe or join as
its value (:mod:`.values` builds them from the catalogue's records), each read from
the catalogue as it is now (:func:`.syncing.fresh`), a pipe's with its figures and
webhook, a rotator or service feed's with its queue."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from restms.errors import BadRequest, NotFound

from ..config import DEFAULT_FEED
from ..routing import QUEUEING_TYPES
from ..service import HIDDEN, DomainInfo, FeedInfo, JoinInfo, Owned, PipeInfo
from . import queueing, syncing, webhooks
from .catalogue import FeedRec, JoinRec, PipeRec
from .values import Figures, domain_info, feed_info, join_info, pipe_info

if TYPE_CHECKING:
    from .service import RedisEngine


def feed_of(engine: RedisEngine, feed: FeedRec) -> FeedInfo:
    system = bool(engine.config.system_feed) and feed.key == engine.config.system_feed
    return feed_info(feed, feed.configured and feed.key == DEFAULT_FEED, system)


def join_of(engine: RedisEngine, join: JoinRec) -> JoinInfo:
    feed = engine.cache.feeds.get(join.feed)
    return join_info(join, engine.cache.pipes[join.pipe], feed is None or feed.name is not None)


async def pipe_of(engine: RedisEngine, pipe: PipeRec, use: bool = True) -> PipeInfo:
    joins = tuple(join_of(engine, j) for j in pipe.joins.values())
    figures = await figures_of(engine, pipe.key, use)
    hook = await webhooks.hook_of(engine, pipe)
    if pipe.key not in engine.cache.pipes:  # deleted meanwhile
        raise NotFound(HIDDEN)
    return pipe_info(pipe, engine.settings(pipe), joins, figures, engine._dead_letter, hook)


async def figures_of(engine: RedisEngine, pipe: str, use: bool = True) -> Figures:
    """Held, oldest, asynclet, the version of a pipe's messages and its marks."""
    _stream, _state, tag = engine.keys.pipe(pipe)
    reply = await engine._range(pipe, 0, 0, use)
    return figures(reply, await engine.link.call(tag, *marks_command(engine, pipe)))


def marks_command(engine: RedisEngine, pipe: str) -> tuple[Any, ...]:
    """The read of a pipe's version and marks that :func:`figures` takes."""
    _stream, state, _tag = engine.keys.pipe(pipe)
    return ("HMGET", state, "ver", "acked", "lost")


def figures(ranged: list[Any], marks: list[Any]) -> Figures:
    """A pipe's figures from a range call with no message (streams.read_range) and the
    read of its marks (:func:`marks_command`)."""
    version, acked, lost = marks
    return Figures(
        held=ranged[3],
        oldest=ranged[2] or None,
        asynclet=ranged[0],
        version=int(version or 0),
        acked=int(acked or 0),
        lost=int(lost or 0),
    )


async def domain(engine: RedisEngine, name: str) -> DomainInfo:
    # Listings read the catalogue as it is now: a feed another node made (or
    # deleted) a moment ago is listed (or not), whichever node a client asks.
    await syncing.fresh(engine)
    found = engine.cache.domains.get(name)
    if found is None:
        raise NotFound(f"no domain named {name!r}")
    return domain_info(found, [f.key for f in engine.cache.public_feeds(name)])


async def domains(engine: RedisEngine) -> tuple[DomainInfo, ...]:
    await syncing.fresh(engine)
    return tuple([await engine.domain(name) for name in engine.cache.domains])


# A resource looked up by key reads the catalogue as it is now too: one deleted
# through another node a moment ago is 404 here, whichever node a client asks.
async def feed(engine: RedisEngine, principal: str | None, key: str) -> FeedInfo:
    await syncing.fresh(engine)
    return await feed_with_queue(engine, await syncing.feed(engine, principal, key))


async def feed_with_queue(engine: RedisEngine, feed: FeedRec) -> FeedInfo:
    """:func:`feed_of`, with how many messages its queue holds (F8)."""
    made = feed_of(engine, feed)
    if feed.type not in QUEUEING_TYPES:
        return made

    count, _size = await queueing.queued(engine, feed)
    return dataclasses.replace(made, queued=count)


async def feeds(engine: RedisEngine, domain: str) -> tuple[FeedInfo, ...]:
    await engine.domain(domain)
    return tuple([await feed_with_queue(engine, f) for f in engine.cache.public_feeds(domain)])


async def pipe(engine: RedisEngine, principal: str | None, key: str) -> PipeInfo:
    await syncing.fresh(engine)
    return await pipe_of(engine, await syncing.pipe(engine, principal, key))


async def pipes(engine: RedisEngine, principal: str) -> tuple[PipeInfo, ...]:
    await syncing.fresh(engine)
    return tuple([await pipe_of(engine, p) for p in engine.cache.pipes_owned(principal)])


async def join(engine: RedisEngine, principal: str | None, key: str) -> JoinInfo:
    await syncing.fresh(engine)
    return join_of(engine, await syncing.join(engine, principal, key))


async def feed_at(engine: RedisEngine, principal: str | None, path: str) -> FeedInfo:
    await syncing.fresh(engine)
    target = engine.cache.feed_at(path)
    if target.name is None and principal is not None and target.owner != principal:
        raise BadRequest(f"join names no existing feed: {path}")
    return feed_of(engine, target)


async def listed_feeds(engine: RedisEngine, domain: str) -> tuple[FeedInfo, ...]:
    await engine.domain(domain)  # 404 for none
    feeds = {f.key: f for f in engine.cache.public_feeds(domain)}
    feeds.setdefault(DEFAULT_FEED, engine.cache.feeds[DEFAULT_FEED])
    return tuple(feed_of(engine, f) for f in feeds.values())


async def owned(engine: RedisEngine, principal: str) -> Owned:
    await syncing.fresh(engine)
    cache = engine.cache
    pipes = cache.pipes_owned(principal)
    return Owned(
        feeds=cache.feeds_owned(principal),
        pipes=len(pipes),
        joins=sum(len(p.joins) for p in pipes),
    )
