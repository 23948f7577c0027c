"""Changes to the catalogue: feeds, pipes, joins and staged contents (RestMS C1-C9,
R2-R5, F10-F16, P4-P5, M1-M4) on the Redis engine, each decided against the cached
catalogue and made by one compare-and-set call (:func:`.syncing.change`)."""

from __future__ import annotations

import dataclasses
import secrets
import time
from typing import TYPE_CHECKING

from restms import names
from restms.errors import BadRequest, Forbidden, NotFound
from restms.specs import FeedSpec, JoinSpec, PipeSpec, Update

from ..config import DEFAULT_FEED
from ..routing import QUEUEING_TYPES, matcher
from ..service import HIDDEN, Blob, FeedInfo, JoinInfo, PipeInfo, StagedInfo
from . import lookups, queueing, syncing, waiting, webhooks
from .catalogue import DomainRec, FeedRec, JoinRec, PipeRec, StagedRec, encode, field_of, replace
from .values import staged_info

if TYPE_CHECKING:
    from .service import RedisEngine
    from .syncing import Fields


def domain_touched(engine: RedisEngine, name: str, now: float) -> tuple[str, bytes]:
    domain = engine.cache.domains[name]
    made = DomainRec(name=name, title=domain.title, version=domain.version + 1, modified=now)
    return field_of(made), encode(made)


async def create_feed(
    engine: RedisEngine, principal: str, domain: str, spec: FeedSpec
) -> tuple[FeedInfo, bool]:
    if domain not in engine.cache.domains:
        raise NotFound(f"no domain named {domain!r}")
    key = spec.name if spec.name is not None else names.new_hash()

    def build() -> tuple[Fields, tuple[str, bool]]:
        if spec.name is not None and spec.name in engine.cache.feeds:
            return [], (spec.name, False)
        now = time.time()
        feed = FeedRec(
            key=key,
            name=spec.name,
            type=spec.type,
            title=spec.title,
            license=spec.license,
            domain=domain,
            owner=principal,
            modified=now,
        )
        fields: Fields = [(field_of(feed), encode(feed))]
        if spec.name is not None:
            fields.append(domain_touched(engine, domain, now))
        return fields, (key, True)

    if spec.name is not None:
        await syncing.fresh(engine)
    made, created = await syncing.change(engine, build)
    return lookups.feed_of(engine, engine.cache.feeds[made]), created


async def update_feed(
    engine: RedisEngine, principal: str | None, key: str, update: Update
) -> FeedInfo:
    await syncing.feed(engine, principal, key)

    def build() -> tuple[Fields, None]:
        feed = _changeable(engine, principal, key, "changed")
        if update.name and update.name != (feed.name or ""):
            raise Forbidden("a feed's name cannot be changed")
        if update.type and update.type != feed.type:
            raise Forbidden("a feed's type cannot be changed")
        made = replace(
            feed,
            title=update.title or None,
            license=update.license or None,
            modified=time.time(),
        )
        return [(field_of(made), encode(made))], None

    await syncing.change(engine, build)
    return lookups.feed_of(engine, engine.cache.feeds[key])


async def delete_feed(engine: RedisEngine, principal: str | None, key: str) -> None:
    await syncing.feed(engine, principal, key)

    def build() -> tuple[Fields, None]:
        feed = _changeable(engine, principal, key, "deleted")
        return feed_gone(engine, feed, time.time()), None

    await syncing.change(engine, build)


def _changeable(engine: RedisEngine, principal: str | None, key: str, done: str) -> FeedRec:
    """The feed ``principal`` may have changed or deleted (``done``): 403 for a
    configured feed (F17) and for another's public feed (Q7)."""
    feed = engine.cache.feeds.get(key)
    if feed is None:
        raise NotFound(f"no feed named {key!r}")
    if feed.configured:
        raise Forbidden(f"configured feeds cannot be {done}")
    if principal is not None and feed.owner != principal:
        raise Forbidden(f"only its creator may have a public feed {done}")
    return feed


def feed_gone(engine: RedisEngine, feed: FeedRec, now: float) -> Fields:
    fields: Fields = [(f"f:{feed.key}", None)]
    fields += [(f"j:{j}", None) for j in feed.joins]
    fields += pipes_touched(engine, {j.pipe for j in feed.joins.values()}, now)
    fields += [(f"s:{s.key}", None) for s in engine.cache.staged.values() if s.feed == feed.key]
    if feed.name is not None:
        fields.append(domain_touched(engine, feed.domain, now))
    return fields


def pipes_touched(engine: RedisEngine, pipes: set[str], now: float) -> Fields:
    fields: Fields = []
    for key in pipes:
        pipe = engine.cache.pipes.get(key)
        if pipe is not None:
            made = replace(pipe, modified=now)
            fields.append((field_of(made), encode(made)))
    return fields


async def create_pipe(engine: RedisEngine, principal: str, domain: str, spec: PipeSpec) -> PipeInfo:
    if domain not in engine.cache.domains:
        raise NotFound(f"no domain named {domain!r}")
    options = spec.options
    config = engine.config
    for name, asked, most in (
        ("max_messages", options.max_messages, config.max_pipe_messages),
        ("max_bytes", options.max_bytes, config.max_pipe_bytes),
    ):
        if asked is not None and asked > most:
            raise BadRequest(f"pipe {name} may be at most {most}, not {asked}")
    if options.dead_letter:
        await syncing.fresh(engine)
        try:
            engine.cache.feed_at(options.dead_letter)
        except BadRequest:
            raise BadRequest(
                f"pipe dead_letter names no existing feed: {options.dead_letter}"
            ) from None
    hook = options.webhook
    if hook is not None:
        if hook.secret is None:
            hook = dataclasses.replace(hook, secret=secrets.token_urlsafe(32))
            options = dataclasses.replace(options, webhook=hook)
        config.webhooks.fill(hook)  # 400 above a maximum
    key = names.new_hash()
    now = time.time()
    pipe = PipeRec(
        key=key,
        type=spec.type,
        title=spec.title,
        domain=domain,
        owner=principal,
        options=options.given(),
        modified=now,
    )
    settings = engine.settings(pipe)
    _stream, state, tag = engine.keys.pipe(key)
    await engine.link.call(
        tag, "HSET", state, "md", settings.max_deliveries, "at", int(now * 1000), write=True
    )
    fields: Fields = [(field_of(pipe), encode(pipe))]
    if spec.type != "ondemand":
        default = JoinRec(
            key=names.new_hash(),
            pipe=key,
            feed=DEFAULT_FEED,
            address=key,
            is_default=True,
            modified=now,
        )
        fields.append((field_of(default), encode(default)))
    await syncing.change(engine, lambda: (fields, None), decided=False)
    made = engine.cache.pipes[key]
    if made.type == "webhook":
        await engine.owners.claim(key)
    return await lookups.pipe_of(engine, made)


async def update_pipe(
    engine: RedisEngine, principal: str | None, key: str, update: Update
) -> PipeInfo:
    found = await syncing.pipe(engine, principal, key)
    if update.type is not None and update.type not in ("", found.type, "fifo"):
        raise Forbidden("a pipe's type cannot be changed")
    options = found.options
    if update.webhook is not None:  # 400 before anything changes
        options = await webhooks.changed(engine, found, update.webhook)

    def build() -> tuple[Fields, None]:
        pipe = engine.cache.pipes.get(key)
        if pipe is None:
            raise NotFound(HIDDEN)
        made = replace(pipe, title=update.title or None, options=options, modified=time.time())
        return [(field_of(made), encode(made))], None

    await syncing.change(engine, build)
    if update.webhook is not None:
        await engine.owners.changed(key)
    return await engine.pipe(principal, key)


async def delete_pipe(engine: RedisEngine, principal: str | None, key: str) -> None:
    await syncing.pipe(engine, principal, key)
    await drop_pipe(engine, key)


async def drop_pipe(engine: RedisEngine, key: str) -> bool:
    """Delete a pipe, its joins and its messages; False when it was gone already (another
    node dropped it first)."""
    known = engine.cache.pipes.get(key)

    def build() -> tuple[Fields, bool]:
        pipe = engine.cache.pipes.get(key)
        if pipe is None:
            return [], False
        fields: Fields = [(f"p:{key}", None)]
        fields += [(f"j:{j}", None) for j in pipe.joins]
        now = time.time()
        for join in pipe.joins.values():  # F8: a service feed goes with its last join
            feed = engine.cache.feeds.get(join.feed)
            service = feed is not None and feed.type == "service" and not feed.configured
            if feed is not None and service and set(feed.joins) <= set(pipe.joins):
                fields += feed_gone(engine, feed, now)
        return fields, True

    dropped = await syncing.change(engine, build)
    stream, state, tag = engine.keys.pipe(key)
    await engine.link.batch(tag, [("UNLINK", stream, state), ("SPUBLISH", tag, key)], write=True)
    waiting.wake(engine, key)
    if known is not None and known.type == "webhook":
        engine.owners.dropped(key)
    for cursor in list(engine._cursors):
        if cursor.pipe == key:
            cursor.end("deleted")
    return dropped


async def create_join(
    engine: RedisEngine, principal: str | None, pipe: str, spec: JoinSpec
) -> tuple[JoinInfo, bool]:
    await syncing.pipe(engine, principal, pipe)
    await syncing.fresh(engine)
    key = names.new_hash()

    def build() -> tuple[Fields, tuple[str, bool]]:
        found = engine.cache.pipes.get(pipe)
        if found is None:
            raise NotFound(HIDDEN)
        feed = engine.cache.feed_at(spec.feed_path)
        if feed.name is None and principal is not None and feed.owner != principal:
            raise BadRequest(f"join names no existing feed: {spec.feed_path}")
        if feed.key == DEFAULT_FEED and feed.configured:
            default = next((j for j in found.joins.values() if j.is_default), None)
            if default is not None and spec.address == pipe and not spec.headers:
                return [], (default.key, False)
            raise Forbidden("the default feed takes no joins besides each pipe's default join")
        if found.type == "ondemand" and feed.type not in QUEUEING_TYPES:
            raise Forbidden("ondemand pipes may only join rotator or service feeds")
        identity = (feed.key, spec.type, spec.address, tuple(sorted(spec.headers)))
        for join in found.joins.values():
            if (join.feed, join.type, join.address, tuple(sorted(join.headers))) == identity:
                return [], (join.key, False)

        matcher(feed.type, spec.address, spec.headers)  # 400 for a bad pattern
        now = time.time()
        made = JoinRec(
            key=key,
            pipe=pipe,
            feed=feed.key,
            type=spec.type,
            address=spec.address,
            headers=spec.headers,
            modified=now,
        )
        fields: Fields = [(field_of(made), encode(made))]
        fields += pipes_touched(engine, {pipe}, now)
        return fields, (key, True)

    made, created = await syncing.change(engine, build)
    join = engine.cache.joins[made]
    if created:
        feed = engine.cache.feeds.get(join.feed)
        if feed is not None and feed.type in QUEUEING_TYPES:
            await queueing.drain(engine, feed)
    return lookups.join_of(engine, join), created


async def delete_join(engine: RedisEngine, principal: str | None, key: str) -> None:
    await syncing.join(engine, principal, key)

    def build() -> tuple[Fields, None]:
        join = engine.cache.joins.get(key)
        if join is None:
            raise NotFound(HIDDEN)
        if join.is_default:
            raise Forbidden("a pipe's default join cannot be deleted")
        now = time.time()
        fields: Fields = [(f"j:{key}", None)]
        fields += pipes_touched(engine, {join.pipe}, now)
        feed = engine.cache.feeds.get(join.feed)
        if (
            feed is not None
            and feed.type == "service"
            and not feed.configured
            and set(feed.joins) == {key}
        ):
            fields += feed_gone(engine, feed, now)
        return fields, None

    await syncing.change(engine, build)


async def stage(
    engine: RedisEngine, principal: str, feed: str, data: bytes, content_type: str
) -> StagedInfo:
    target = await syncing.feed(engine, principal, feed)
    key = names.new_hash()
    now = time.time()
    ttl = engine.config.staged_ttl
    await engine.link.call(
        engine.keys.cat, "SET", engine.keys.staged(key), data, "PX", int(ttl * 1000), write=True
    )
    made = StagedRec(
        key=key,
        feed=target.key,
        content_type=content_type,
        size=len(data),
        owner=principal,
        modified=now,
        expires=now + ttl,
    )
    await syncing.change(engine, lambda: ([(field_of(made), encode(made))], None), decided=False)
    engine.counters.staged += 1
    return staged_info(made, target.name is not None, target.domain)


async def staged(engine: RedisEngine, principal: str | None, key: str) -> tuple[StagedInfo, Blob]:
    found = await syncing.staged(engine, principal, key)
    data = await engine.link.call(engine.keys.cat, "GET", engine.keys.staged(key))
    if data is None:
        raise NotFound(HIDDEN)
    feed = engine.cache.feeds.get(found.feed)
    info = staged_info(found, feed is None or feed.name is not None, feed.domain if feed else "")
    return info, Blob(data=data, content_type=found.content_type)


async def delete_staged(engine: RedisEngine, principal: str | None, key: str) -> None:
    await syncing.staged(engine, principal, key)
    await syncing.change(engine, lambda: ([(f"s:{key}", None)], None), decided=False)
    await engine.link.call(engine.keys.cat, "UNLINK", engine.keys.staged(key), write=True)
