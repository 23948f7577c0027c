"""Traffic events for the mirror (docs/ANALYTICS.md, "Event schema"), built by the engine.

The engine has one optional sink, ``engine.mirror``: a callable taking one plain
tuple per event in the column order of :mod:`spark_sink.schema` (this package does
not import it: the tuple is the whole contract). Each emission point is written as::

    if self.mirror is not None:
        emit_...(self.mirror, ...)

so a gateway with the mirror off pays one ``is None`` test per point, and one with
it on builds one tuple per event and never waits: the sink only queues (or drops).

A pipe is named by a digest of its key, the same one :func:`feeds.delivery.label`
shows, never by its name (a capability); a private feed by a digest of its key too.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from restms.specs import Duplicate, EmbeddedContent, MessageSpec

from .config import DEFAULT_FEED
from .model import Feed, Message, Pipe

Sink = Callable[[tuple[Any, ...]], None]

OK = "ok"
ORIGIN = "x-original-feed"  # the header a dead letter names its feed in
PRIVATE = "(private)"  # a message's feed when it came from a private feed of another kind


@functools.lru_cache(maxsize=65_536)
def digest(key: str) -> str:
    """The twelve hex digits of SHA-256 that name a pipe (or a private feed) in events."""
    return hashlib.sha256(key.encode()).hexdigest()[:12]


def feed_name(feed: Feed) -> str:
    return feed.name if feed.name is not None else digest(feed.key)


def address(feed: str | None, spec: MessageSpec) -> str | None:
    """The message's address, as a digest where it is a pipe's name: on the default
    feed (F15) and on dead letters that came from it, wherever they go."""
    if not spec.address:
        return None
    if feed == DEFAULT_FEED or (spec.headers and (ORIGIN, DEFAULT_FEED) in spec.headers):
        return digest(spec.address)
    return spec.address


def emit_feed(
    sink: Sink,
    kind: str,
    now: float,
    feed: Feed,
    spec: MessageSpec,
    size: int,
    principal: str | None,
    outcome: str = OK,
    pipe: Pipe | None = None,
    bridge: str | None = None,
) -> None:
    """An event about a message in a feed: publish, route (with ``pipe``), a refused
    publish (drop), bridge in (with ``bridge``). Written for speed: a route event is
    made for every copy of every message."""
    name = feed.name
    where: str | None = spec.address
    if where and (name == DEFAULT_FEED or spec.headers):
        where = address(name, spec)
    sink(
        (
            now,
            kind,
            feed.domain.name,
            name if name is not None else digest(feed.key),
            feed.type,
            where or None,
            None if pipe is None else digest(pipe.key),
            spec.prop("message_id") if spec.props else None,
            size,
            principal,
            outcome,
            None,
            bridge,
        )
    )


def emit_pipe(
    sink: Sink,
    kind: str,
    now: float,
    pipe: Pipe,
    message: Message,
    feeds: Mapping[str, Feed],
    outcome: str = OK,
    *,
    latency: bool = False,
    bridge: str | None = None,
) -> None:
    """An event about a message held in a pipe: deliver, ack, redeliver, expire, dead
    letter, drop, bridge out, webhook attempt. The principal is the pipe's owner (its
    reader); with ``latency``, the milliseconds since the message arrived."""
    source = message.source
    spec = message.spec
    if source is not None:
        name, feed_type = feed_name(source), source.type
    elif message.feed_name is not None:
        found = feeds.get(message.feed_name)
        name, feed_type = message.feed_name, found.type if found is not None else ""
    else:
        name, feed_type = PRIVATE, ""
    sink(
        (
            now,
            kind,
            pipe.domain.name,
            name,
            feed_type,
            address(message.feed_name, spec),
            digest(pipe.key),
            spec.prop("message_id") if spec.props else None,
            message.size,
            pipe.owner,
            outcome,
            max(0.0, (now - message.arrived) * 1000) if latency else None,
            bridge,
        )
    )


def emit_publish(
    sink: Sink,
    now: float,
    feed: Feed,
    messages: Sequence[MessageSpec],
    counts: Sequence[int] | None,
    principal: str | None,
) -> None:
    """One event per message of a publish: "publish" with outcome "ok" or "duplicate"
    (by its count), or, when the feed refused them all (``counts`` None), "drop" with
    outcome "refused". The size counts the message's embedded contents."""
    kind, outcome = ("publish", OK) if counts is not None else ("drop", "refused")
    name = feed.name
    domain, shown, feed_type = feed.domain.name, feed_name(feed), feed.type
    plain = name != DEFAULT_FEED
    for index, spec in enumerate(messages):
        size = 0
        for content in spec.contents:
            if type(content) is EmbeddedContent:
                size += len(content.value)
        where: str | None = spec.address
        if where and (not plain or spec.headers):
            where = address(name, spec)
        if counts is not None and type(counts[index]) is Duplicate:
            outcome = "duplicate"
        elif counts is not None:
            outcome = OK
        sink(
            (
                now,
                kind,
                domain,
                shown,
                feed_type,
                where or None,
                None,
                spec.prop("message_id") if spec.props else None,
                size,
                principal,
                outcome,
                None,
                None,
            )
        )
