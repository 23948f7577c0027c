"""The Redis engine's traffic events (docs/ANALYTICS.md, "Event schema"): the events of
:mod:`feeds.mirroring`, made by its functions at the points where the embedded engine
makes them, so the lake holds the same rows whichever engine runs.

Theory of operation
-------------------
Each emission point is written as the embedded engine's are::

    if engine._mirror is not None:
        mirror.something(engine, ...)

so with the mirror off a point costs one ``is None`` test; with it on, the events are
built and handed to the sink, which only queues (or drops): nothing here waits on it.

:mod:`feeds.mirroring` reads a few attributes of a feed, a pipe and a message. Here
they are views: of the catalogue's records (:func:`feed_view`, :func:`pipe_view`) and
of a message, made from a :class:`feeds.service.Message`, a stored record or the head
of a stream entry (:class:`Held`). A pipe's messages are named by their public feed's
name, looked up in the catalogue for its type.

Three function calls of ``library.lua`` remove messages: ``ack`` (the cumulative
acknowledgement), ``range`` (what expired among the entries it reads) and ``place`` (the
oldest, dropped for room by a "drop-oldest" pipe). With the mirror on, each is sent with
one more argument, and its answer then also holds the heads of the entries it removed
(:func:`heads`: size, address, properties, headers, feed and arrival, never the
contents), made as it removes them: the same call, the same round trip, and no other
reader's work in between.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from restms.specs import Duplicate, MessageSpec

from ..mirroring import (
    OK,
    Keyed,
    Sink,
    embedded,
    emit_bridge_in,
    emit_feed,
    emit_pipe,
    emit_publish,
    emit_request,
    emit_routed,
)
from ..model import message_size
from ..publishing import message_ids
from ..service import Message
from ..store import decode_parts, loads, message_spec
from .catalogue import FeedRec, PipeRec

if TYPE_CHECKING:
    from .service import RedisEngine

# What a pipe's messages are to the events about them: the pipe that took a copy or
# skipped it, whether it took it, and how many of the message's joins led to it.
Copy = tuple[PipeRec, bool, int]


# ---------------------------------------------------------------- views
@dataclass(frozen=True, slots=True)
class _Domain:
    name: str


@dataclass(frozen=True, slots=True)
class FeedView:
    """A feed as :mod:`feeds.mirroring` reads it (:class:`feeds.mirroring.FeedLike`)."""

    key: str
    name: str | None
    type: str
    domain: _Domain


@dataclass(frozen=True, slots=True)
class PipeView:
    """A pipe as :mod:`feeds.mirroring` reads it (:class:`feeds.mirroring.PipeLike`)."""

    key: str
    owner: str
    domain: _Domain


def feed_view(feed: FeedRec) -> FeedView:
    return FeedView(feed.key, feed.name, feed.type, _Domain(feed.domain))


def pipe_view(pipe: PipeRec) -> PipeView:
    return PipeView(pipe.key, pipe.owner, _Domain(pipe.domain))


@dataclass(frozen=True, slots=True)
class Held:
    """A message in a pipe as :mod:`feeds.mirroring` reads it
    (:class:`feeds.mirroring.HeldLike`). Its feed is known by name only (the stored
    record's), so ``source`` is None."""

    spec: MessageSpec
    feed_name: str | None
    size: int
    arrived: float
    source: None = None

    @classmethod
    def of_message(cls, message: Message) -> Held:
        return cls(message.spec, message.feed, message.size, message.arrived)

    @classmethod
    def of_record(cls, data: bytes) -> Held:
        """From a stored record (:func:`feeds.store.record`): its size as the engine
        counted it when it was placed."""
        fields = loads(data)
        spec = message_spec(fields)
        return cls(spec, fields[3], message_size(spec, decode_parts(fields[6])), fields[4])


# ---------------------------------------------------------------- calls that remove messages
def heads(reply: Sequence[Any], start: int = 0) -> list[Held]:
    """The messages a call removed, as its answer gives them from ``start`` (the function
    ``head`` of ``library.lua``: three items each)."""
    found: list[Held] = []
    for i in range(start, len(reply), 3):
        fields = loads(reply[i + 1])
        found.append(Held(message_spec(fields), fields[3], int(reply[i]), float(reply[i + 2])))
    return found


async def ack(
    engine: RedisEngine, pipe: str, command: tuple[Any, ...], durable: bool, via: str | None
) -> int:
    """``command``, a pipe's ``ack`` in its slot, sent asking for what it removes; how
    many it removed. Each message it removed is a "bridge_out" event first when a
    bridge's cursor (``via``) acknowledges it, then an "ack" event."""
    _stream, _state, tag = engine.keys.pipe(pipe)
    reply = await engine.link.call(tag, *command, 1, write=True, durable=durable)
    removed = int(reply[0])
    sink, found = engine._mirror, engine.cache.pipes.get(pipe)
    if removed and sink is not None and found is not None:
        gone = heads(reply, 1)
        now, view, feeds = time.time(), pipe_view(found), engine.cache.feeds
        if via is not None:
            for held in gone:
                emit_pipe(sink, "bridge_out", now, view, held, feeds, bridge=via)
        for held in gone:
            emit_pipe(sink, "ack", now, view, held, feeds, latency=True)
    return removed


async def ranged(engine: RedisEngine, pipe: str, command: tuple[Any, ...]) -> list[Any]:
    """``command``, a pipe's ``range`` in its slot, sent asking for what expired; its
    answer without that. Each message it dropped as expired is an "expire" event."""
    _stream, _state, tag = engine.keys.pipe(pipe)
    reply: list[Any]
    *reply, expired = await engine.link.call(tag, *command, 1, write=True)
    sink, found = engine._mirror, engine.cache.pipes.get(pipe)
    if reply[1] and sink is not None and found is not None:
        wall, view, feeds = time.time(), pipe_view(found), engine.cache.feeds
        for held in heads(expired):
            emit_pipe(sink, "expire", wall, view, held, feeds, "expired")
    return reply


def dropped(engine: RedisEngine, pipe: PipeRec, removed: Sequence[Any]) -> None:
    """A "drop-oldest" pipe's ``place`` dropped messages for room, the oldest first,
    copies the same call had just placed among them: ``removed``, their heads as its
    answer gave them. Each is a "drop" event."""
    sink = engine._mirror
    if sink is None:
        return
    now, view, feeds = time.time(), pipe_view(pipe), engine.cache.feeds
    for held in heads(removed):
        emit_pipe(sink, "drop", now, view, held, feeds, "dropped-oldest")


# ---------------------------------------------------------------- events about one message
def pipe_event(
    engine: RedisEngine,
    kind: str,
    pipe: PipeRec,
    held: Held,
    outcome: str = OK,
    *,
    latency: bool = False,
    bridge: str | None = None,
) -> None:
    """An event about a message in a pipe (:func:`feeds.mirroring.emit_pipe`): deliver,
    redeliver, dead letter, drop, bridge out, webhook attempt."""
    sink = engine._mirror
    if sink is not None:
        emit_pipe(
            sink,
            kind,
            time.time(),
            pipe_view(pipe),
            held,
            engine.cache.feeds,
            outcome,
            latency=latency,
            bridge=bridge,
        )


def delivered(engine: RedisEngine, pipe: PipeRec, message: Message, outcome: str = OK) -> None:
    """A copy handed to a reader (a lease taken, a webhook's 2xx): "deliver"."""
    pipe_event(engine, "deliver", pipe, Held.of_message(message), outcome, latency=True)


def hook_delivered(engine: RedisEngine, pipe: PipeRec, message: Message, status: str) -> None:
    """A webhook receiver took the message (2xx): its delivery and its acknowledgement."""
    held = Held.of_message(message)
    pipe_event(engine, "deliver", pipe, held, status, latency=True)
    pipe_event(engine, "ack", pipe, held, latency=True)


# ---------------------------------------------------------------- a publish and its copies
def _copies(
    sink: Sink, feed: FeedRec, spec: MessageSpec, size: int, copies: Sequence[Copy]
) -> None:
    now, view = time.time(), feed_view(feed)
    for pipe, took, _joins in copies:
        if took:
            emit_feed(sink, "route", now, view, spec, size, None, pipe=pipe)
        else:
            emit_feed(sink, "drop", now, view, spec, size, None, "full", pipe)


def copied(
    engine: RedisEngine, feed: FeedRec, spec: MessageSpec, size: int, copies: Sequence[Copy]
) -> None:
    """The copies of a message routed on its own, not published (a system event's, one
    handed out of a queue): a "route" event for each pipe that took it, a "drop"
    (outcome "full") for each that skipped it."""
    sink = engine._mirror
    if sink is not None:
        _copies(sink, feed, spec, size, copies)


def dead_lettered(
    engine: RedisEngine,
    pipe: PipeRec,
    data: bytes,
    reason: str,
    target: FeedRec,
    spec: MessageSpec,
    size: int,
    copies: Sequence[Copy],
) -> None:
    """A message taken out of ``pipe`` (its record ``data``) went to a dead-letter feed:
    a "dead_letter" event (outcome ``reason``), then the copies of the letter (``spec``,
    ``size`` bytes) there."""
    sink = engine._mirror
    if sink is not None:
        pipe_event(engine, "dead_letter", pipe, Held.of_record(data), reason)
        _copies(sink, target, spec, size, copies)


def published(
    engine: RedisEngine,
    feed: FeedRec,
    messages: Sequence[MessageSpec],
    counts: Sequence[int],
    principal: str | None,
    sizes: list[int],
    copies: dict[int, Sequence[Copy]],
    linked: bool,
    now: float,
) -> None:
    """An accepted publish, offered as the embedded engine offers it
    (:class:`feeds.publishing.Publishing`): one message whose one join's pipe took it,
    as one routed record; any other one message as its events (its copies' routes and
    skips, then its publish); several as one request record. ``copies``: each routed
    message's pipes, in the order of its joins; ``sizes``: each message's bytes, the
    staged contents it ``linked`` included."""
    sink = engine._mirror
    if sink is None or not messages:
        return
    view = feed_view(feed)
    if len(messages) == 1:
        spec, size = messages[0], sizes[0]
        published = embedded(spec) if linked else size
        if type(counts[0]) is Duplicate:
            emit_feed(sink, "publish", now, view, spec, published, principal, "duplicate")
            return
        went = copies.get(0, [])
        if len(went) == 1 and went[0][1] and went[0][2] == 1:
            emit_routed(sink, now, view, spec, went[0][0], size, principal, published)
            return
        _copies(sink, feed, spec, size, went)
        emit_feed(sink, "publish", now, view, spec, published, principal, OK)
        return
    routes = _Routes()
    for index, spec in enumerate(messages):
        before = len(routes.pipes)
        for pipe, took, _joins in copies.get(index, ()):
            if took:
                routes.pipes.append(pipe)
            else:
                routes.skipped.append((spec, pipe, sizes[index]))
        count, placed = counts[index], len(routes.pipes) - before
        if type(count) is not Duplicate and count > placed:  # a pipe's joins: one copy
            routes.extra.append((before, count - placed))
    ids = message_ids(messages)  # (None: no message has one, so none is a repeat)
    emit_request(
        sink,
        now,
        view,
        messages,
        counts,
        principal,
        ids,
        [(None, size) for size in sizes],
        linked,
        routes,
        ids is not None and any(type(count) is Duplicate for count in counts),
    )


class _Routes:
    """What a publish of several messages did with its copies
    (:class:`feeds.mirroring.Routes`)."""

    __slots__ = ("extra", "pipes", "skipped")

    def __init__(self) -> None:
        self.pipes: list[Keyed] = []
        self.extra: list[tuple[int, int]] = []
        self.skipped: list[tuple[MessageSpec, Keyed, int]] = []


def refused(
    engine: RedisEngine, feed: FeedRec, messages: Sequence[MessageSpec], principal: str | None
) -> None:
    """A publish refused whole (a full "reject" pipe, a full feed queue): a "drop"
    event (outcome "refused") for each message."""
    sink = engine._mirror
    if sink is not None:
        emit_publish(sink, time.time(), feed_view(feed), messages, None, principal)


def bridged_in(
    engine: RedisEngine,
    feed: FeedRec,
    messages: Sequence[MessageSpec],
    counts: Sequence[int],
    principal: str | None,
    via: str,
) -> None:
    """Messages a bridge published (once kept): a "bridge_in" event each."""
    sink = engine._mirror
    if sink is not None:
        emit_bridge_in(sink, time.time(), feed_view(feed), messages, counts, principal, via)
