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

Three function calls of ``library.lua`` remove messages without handing them back:
``ack`` (the cumulative acknowledgement), ``range`` (what expired among the entries it
reads) and ``place`` (the oldest, dropped for room by a "drop-oldest" pipe). With the
mirror on, each is sent after a read-only script, on the same connection in the same
write, so Redis runs the two back to back: the script answers the heads of the entries
the call is about to remove (:func:`heads`: position, size, address, properties,
headers, feed and arrival, never the contents), and the call's own answer says how many
went. One round trip, as without the mirror.
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


# ---------------------------------------------------------------- looks before a call
# The head of each entry given (a list ``entries``, as XRANGE answers them), appended
# to ``out``: its id, its size, its record's address, properties, headers and feed
# (JSON), and its arrival time (exact: seventeen digits). Its contents stay. A record
# that cannot be read is left out: a look never fails the call sent after it.
_HEADS = """#!lua flags=no-writes
local function heads(entries, out)
  for _, entry in ipairs(entries) do
    local fields, record, size = entry[2], nil, nil
    for j = 1, #fields, 2 do
      if fields[j] == 'm' then
        record = fields[j + 1]
      elseif fields[j] == 'z' then
        size = fields[j + 1]
      end
    end
    local ok, r = pcall(cjson.decode, record or '')
    if ok and type(r) == 'table' then
      local done, head = pcall(cjson.encode, {r[1], r[2], r[3], r[4]})
      if done then
        out[#out + 1] = entry[1]
        out[#out + 1] = size or '0'
        out[#out + 1] = head
        out[#out + 1] = string.format('%.17g', tonumber(r[5]) or 0)
      end
    end
  end
  return out
end
"""

# KEYS: s. ARGV: position. What ``ack`` at that position removes: every entry up to it.
UPTO = _HEADS + "return heads(redis.call('XRANGE', KEYS[1], '-', '0-' .. ARGV[1]), {})\n"

# KEYS: s. ARGV: first position (0: the oldest), count, now. What ``range`` with the
# same arguments drops as expired: the entries it reads whose expiry time has come.
EXPIRED = (
    _HEADS
    + """local from, now = tonumber(ARGV[1]) or 0, tonumber(ARGV[3])
local start = from > 0 and ('0-' .. from) or '-'
local gone = {}
for _, entry in ipairs(redis.call('XRANGE', KEYS[1], start, '+', 'COUNT', ARGV[2])) do
  local fields = entry[2]
  for j = 1, #fields, 2 do
    if fields[j] == 'e' and (tonumber(fields[j + 1]) or 0) <= now then
      gone[#gone + 1] = entry
    end
  end
end
return heads(gone, {})
"""
)

# KEYS: s, h. ARGV: max messages, max bytes, how many messages ``place`` will add and
# their bytes. At least the oldest entries that ``place`` may drop for them: an entry
# goes only while the pipe (it, those after it, and the new messages before the one
# that needs room) is over a limit, so every entry it drops is among the first ones
# whose removal brings the pipe with all the new messages within both limits.
OLDEST = (
    _HEADS
    + """local maxm, maxb = tonumber(ARGV[1]), tonumber(ARGV[2])
local len = redis.call('XLEN', KEYS[1])
local count = len + tonumber(ARGV[3]) - maxm
local free = tonumber(redis.call('HGET', KEYS[2], 'bytes') or '0') + tonumber(ARGV[4]) - maxb
local out, taken, freed, after = {}, 0, 0, '-'
while taken < len and (taken < count or freed < free) do
  local batch = redis.call('XRANGE', KEYS[1], after, '+', 'COUNT', 100)
  if #batch == 0 then
    break
  end
  for _, entry in ipairs(batch) do
    if taken >= count and freed >= free then
      break
    end
    heads({entry}, out)
    taken = taken + 1
    local fields = entry[2]
    for j = 1, #fields, 2 do
      if fields[j] == 'z' then
        freed = freed + (tonumber(fields[j + 1]) or 0)
      end
    end
    after = '(' .. entry[1]
  end
end
return out
"""
)


def heads(reply: Sequence[Any]) -> list[Held]:
    """The messages a look answered (:data:`UPTO`, :data:`EXPIRED`, :data:`OLDEST`)."""
    found: list[Held] = []
    for i in range(0, len(reply), 4):
        fields = loads(reply[i + 2])
        found.append(Held(message_spec(fields), fields[3], int(reply[i + 1]), float(reply[i + 3])))
    return found


def oldest(
    stream: str, state: str, most: int, most_bytes: int, sizes: list[int]
) -> tuple[Any, ...]:
    """The look to send before a ``place`` in a "drop-oldest" pipe (:data:`OLDEST`)."""
    return ("EVAL", OLDEST, 2, stream, state, most, most_bytes, len(sizes), sum(sizes))


# ---------------------------------------------------------------- calls that remove messages
async def ack(
    engine: RedisEngine,
    pipe: str,
    command: tuple[Any, ...],
    position: int,
    durable: bool,
    via: str | None,
) -> Any:
    """``command``, a pipe's ``ack`` at ``position`` in its slot, after a look at what
    it removes; its answer. Each message it removed is a "bridge_out" event first when
    a bridge's cursor (``via``) acknowledges it, then an "ack" event."""
    stream, _state, tag = engine.keys.pipe(pipe)
    look = ("EVAL", UPTO, 1, stream, position)
    peeked, removed = await engine.link.batch(tag, [look, command], write=True, durable=durable)
    sink, found = engine._mirror, engine.cache.pipes.get(pipe)
    if removed and sink is not None and found is not None:
        # Others' acknowledgements meanwhile took older ones: this one took the newest.
        gone = heads(peeked)[-int(removed) :]
        now, view, feeds = time.time(), pipe_view(found), engine.cache.feeds
        if via is not None:
            for held in gone:
                emit_pipe(sink, "bridge_out", now, view, held, feeds, bridge=via)
        for held in gone:
            emit_pipe(sink, "ack", now, view, held, feeds, latency=True)
    return removed


async def ranged(
    engine: RedisEngine, pipe: str, command: tuple[Any, ...], first: int, count: int, now: int
) -> list[Any]:
    """``command``, a pipe's ``range`` from ``first`` (``count`` entries, expired at
    ``now`` in milliseconds), after a look at what expired; its answer. Each message
    it dropped as expired is an "expire" event."""
    stream, _state, tag = engine.keys.pipe(pipe)
    look = ("EVAL", EXPIRED, 1, stream, first, count, now)
    peeked, reply = await engine.link.batch(tag, [look, command], write=True)
    sink, found = engine._mirror, engine.cache.pipes.get(pipe)
    if reply[1] and sink is not None and found is not None:
        wall, view, feeds = time.time(), pipe_view(found), engine.cache.feeds
        for held in heads(peeked)[: int(reply[1])]:
            emit_pipe(sink, "expire", wall, view, held, feeds, "expired")
    return list(reply)


def dropped(
    engine: RedisEngine,
    pipe: PipeRec,
    peeked: Sequence[Any],
    count: int,
    placed: Sequence[tuple[MessageSpec, bytes, int, bool]],
) -> None:
    """A "drop-oldest" pipe's ``place`` dropped ``count`` messages for room, the oldest
    first: those the look before it found (``peeked``), then, past them, copies the
    same call had placed (``placed``: spec, record, size, persistent; in order). Each
    is a "drop" event."""
    sink = engine._mirror
    if sink is None:
        return
    gone = heads(peeked)[:count]
    for spec, record, size, _kept in placed[: max(0, count - len(gone))]:
        fields = loads(record)
        gone.append(Held(spec, fields[3], size, fields[4]))
    now, view, feeds = time.time(), pipe_view(pipe), engine.cache.feeds
    for held in gone:
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
    copies: dict[int, list[Copy]],
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
    emit_request(
        sink,
        now,
        view,
        messages,
        counts,
        principal,
        message_ids(messages),
        [(None, size) for size in sizes],
        linked,
        routes,
        any(type(count) is Duplicate for count in counts),
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
