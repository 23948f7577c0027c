"""Traffic events for the mirror (docs/ANALYTICS.md, "Event schema"), built by the engine.

The engine has one optional sink, ``engine.mirror``: a callable taking one plain
tuple per event in the column order of :mod:`spark_sink.schema` (this package does
not import it: the tuple is the whole contract). Each emission point is written as::

    if self.mirror is not None:
        emit_...(self.mirror, ...)

so a gateway with the mirror off pays one ``is None`` test per point, and one with
it on builds one tuple per event and never waits: the sink only queues (or drops).

An accepted publish is the exception, because it is the hot path: its publish and
route events go as one request record (``spark_sink.schema.Request``, with the
number of rows it stands for), lists of what differs between its messages, which
the writer process expands into the same rows (:func:`emit_request`). The commonest,
one message whose one copy went to one pipe, goes as one shorter record of its route
and publish events (``spark_sink.schema.Routed``, :func:`emit_routed`).

A pipe is named by a digest of its key, the same one :func:`feeds.publishing.label`
shows, never by its name (a capability); a private feed by a digest of its key too.

Both engines emit through these functions, so the lake has the same rows whichever
runs. They read only a few attributes of what they are given (:class:`FeedLike`,
:class:`PipeLike`, :class:`HeldLike`, :class:`Routes`): the embedded engine hands
over its model's objects, the Redis engine small views of its records and entries
(:mod:`feeds.redis.mirror`).
"""

from __future__ import annotations

import functools
import hashlib
import operator
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from restms.specs import Duplicate, EmbeddedContent, MessageSpec

from .config import DEFAULT_FEED
from .model import Pipe


class Sink(Protocol):
    """Where events go: one event tuple (``rows`` 1) or one request record."""

    def __call__(self, item: tuple[Any, ...], rows: int = 1, /) -> None: ...


class Named(Protocol):
    """A domain, as events name it."""

    @property
    def name(self) -> str: ...


class Keyed(Protocol):
    """A pipe, as a route or drop event names it (by a digest of its key)."""

    @property
    def key(self) -> str: ...


class Typed(Protocol):
    """A public feed looked up by name, for its type (:func:`emit_pipe`)."""

    @property
    def type(self) -> str: ...


class FeedLike(Protocol):
    """What an event reads of a feed (:class:`feeds.model.Feed` has it all)."""

    @property
    def key(self) -> str: ...
    @property
    def name(self) -> str | None: ...
    @property
    def type(self) -> str: ...
    @property
    def domain(self) -> Named: ...


class PipeLike(Protocol):
    """What an event reads of a pipe (:class:`feeds.model.Pipe` has it all)."""

    @property
    def key(self) -> str: ...
    @property
    def domain(self) -> Named: ...
    @property
    def owner(self) -> str: ...


class HeldLike(Protocol):
    """What an event reads of a message in a pipe (:class:`feeds.model.Message` has it
    all): ``source``, the rotator or service feed it was handed out of, if known."""

    @property
    def source(self) -> FeedLike | None: ...
    @property
    def spec(self) -> MessageSpec: ...
    @property
    def feed_name(self) -> str | None: ...
    @property
    def size(self) -> int: ...
    @property
    def arrived(self) -> float: ...


class Routes(Protocol):
    """What a publish of several messages did with its copies (:class:`Copies`)."""

    @property
    def pipes(self) -> Sequence[Keyed]: ...
    @property
    def extra(self) -> Sequence[tuple[int, int]]: ...
    @property
    def skipped(self) -> Sequence[tuple[MessageSpec, Keyed, int]]: ...


class Copies:
    """What a publish of several messages did with its copies, collected while it
    routes (``Publishing.publish`` creates it and hands it down ``route``, ``_room``
    and ``Placement.deliver``: it is that publish's alone) for its request
    record. Nothing is noted a message: how many copies each message had is its count
    (the joins it matched, ``Engine.publish``'s answer), less what ``extra`` says."""

    __slots__ = ("extra", "pipes", "skipped")

    def __init__(self) -> None:
        self.pipes: list[Pipe] = []  # the pipe of each copy placed, in order
        # (copies placed before the message, joins it counted with no copy of their
        # own): a message that several joins of one pipe matched (one copy, each join
        # counted); it had a copy, so the first number tells it from other messages
        self.extra: list[tuple[int, int]] = []
        # (message, pipe, size) of each copy a full pipe skipped
        self.skipped: list[tuple[MessageSpec, Pipe, int]] = []


OK = "ok"
REQUEST = "+request"  # a request record's mark (spark_sink.schema.REQUEST)
ROUTED = "+route+publish"  # a routed publish's mark (spark_sink.schema.ROUTED)
ORIGIN = "x-original-feed"  # the header a dead letter names its feed in
PRIVATE = "(private)"  # a message's feed when it came from a private feed of another kind


# Memoised for the pipes in use now; a larger table kept up to that many names of
# deleted pipes (about 18 MB for 65,536: benchmark 16, docs/BENCHMARKS.md).
@functools.lru_cache(maxsize=1024)
def digest(key: str) -> str:
    """The twelve hex digits of SHA-256 that name a pipe (or a private feed) in events."""
    return hashlib.sha256(key.encode()).hexdigest()[:12]


def feed_name(feed: FeedLike) -> str:
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
    feed: FeedLike,
    spec: MessageSpec,
    size: int,
    principal: str | None,
    outcome: str = OK,
    pipe: Keyed | None = None,
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


def emit_bridge_in(
    sink: Sink,
    now: float,
    feed: FeedLike,
    messages: Sequence[MessageSpec],
    counts: Sequence[int],
    principal: str | None,
    bridge: str,
) -> None:
    """A bridge_in event for each message a bridge published into ``feed`` (its
    outcome: duplicate, or ok)."""
    for spec, count in zip(messages, counts, strict=True):
        outcome = "duplicate" if isinstance(count, Duplicate) else OK
        emit_feed(
            sink, "bridge_in", now, feed, spec, embedded(spec), principal, outcome, bridge=bridge
        )


def emit_routed(
    sink: Sink,
    now: float,
    feed: FeedLike,
    spec: MessageSpec,
    pipe: Keyed,
    size: int,
    principal: str | None,
    published: int,
) -> None:
    """A publish of one message whose one copy went to ``pipe``, as one record
    (``spark_sink.schema.Routed``) of its two events: "route" (``size``, the copy's
    bytes, no principal), then "publish" (``principal``; ``published``, the bytes of
    its embedded contents), both outcome "ok", as :func:`emit_feed` would make them.
    The commonest publish: one tuple instead of two (and less than a request record)."""
    name = feed.name
    record = (
        now,
        ROUTED,
        feed.domain.name,
        name if name is not None else digest(feed.key),
        feed.type,
        address(name, spec) if name == DEFAULT_FEED or spec.headers else spec.address or None,
        digest(pipe.key),
        spec.prop("message_id") if spec.props else None,
        size,
        principal,
        published,
    )
    sink(record, 2)


def emit_pipe(
    sink: Sink,
    kind: str,
    now: float,
    pipe: PipeLike,
    message: HeldLike,
    feeds: Mapping[str, Typed],
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


def embedded(spec: MessageSpec) -> int:
    """The bytes of a message's address, properties, headers and embedded contents (the
    size of its publish event: staged contents are counted where they are delivered)."""
    size = spec.head_size
    for content in spec.contents:
        if type(content) is EmbeddedContent:
            size += len(content.value)
    return size


def emit_publish(
    sink: Sink,
    now: float,
    feed: FeedLike,
    messages: Sequence[MessageSpec],
    counts: Sequence[int] | None,
    principal: str | None,
) -> None:
    """One event per message of a publish: "publish" with outcome "ok" or "duplicate"
    (by its count), or, when the feed refused them all (``counts`` None), "drop" with
    outcome "refused". The size counts the message's head and embedded contents."""
    kind, outcome = ("publish", OK) if counts is not None else ("drop", "refused")
    name = feed.name
    domain, shown, feed_type = feed.domain.name, feed_name(feed), feed.type
    plain = name != DEFAULT_FEED
    for index, spec in enumerate(messages):
        size = embedded(spec)
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


def emit_request(
    sink: Sink,
    now: float,
    feed: FeedLike,
    messages: Sequence[MessageSpec],
    counts: Sequence[int],
    principal: str | None,
    ids: list[str | None] | None,
    claimed: Sequence[tuple[object, int]],
    linked: bool,
    copies: Routes,
    repeated: bool,
) -> None:
    """An accepted publish as one request record: the "publish" event of each message
    (outcome "ok" or, when some were ``repeated``, by its count "duplicate"; the size
    of its embedded contents), a "route" event for each copy placed in a pipe
    (``copies.pipes``, in order; each message had as many as its count, a duplicate
    none, less ``copies.extra``; the size of each copy is its message's in
    ``claimed``, which counts the staged contents it ``linked`` too), and a "drop"
    event (outcome "full") for each copy a full pipe skipped (``copies.skipped``: the
    message, the pipe and the copy's size). Each column is a list only where the
    messages differ: the common publish costs a few passes over its messages, not two
    tuples a message (nor one a skipped copy, which is when the gateway is busiest)."""
    name = feed.name
    n = len(messages)
    if not n:
        return
    pipes, extra, skipped = copies.pipes, copies.extra, copies.skipped
    where: list[str | None] | str | None
    # Comprehensions rather than map(attrgetter(...)): attrgetter looks the attribute
    # up by name on every item, a comprehension reads the slot, and is the faster.
    # Headers matter only to a message with an address (a dead letter's origin).
    found = [spec.address for spec in messages]
    alike = found.count(found[0]) == n  # one address for all: sent once
    if name != DEFAULT_FEED and (
        (alike and not found[0]) or not any([spec.headers for spec in messages])
    ):
        where = (found[0] or None) if alike else [value or None for value in found]
    else:
        where = [address(name, spec) for spec in messages]
        if where.count(where[0]) == n:
            where = where[0]
    outcome: list[str] | str = OK
    each: list[int] | None = None  # copies of each message; None: one each
    if repeated:
        outcome = ["duplicate" if type(count) is Duplicate else OK for count in counts]
        each = _less([0 if type(count) is Duplicate else count for count in counts], extra)
    elif extra or counts.count(1) != n:
        each = _less(list(counts), extra)  # (ints, no Duplicate among them: in C)
    sizes = list(map(_SIZE, claimed))
    route_sizes: list[int] | None = None
    if linked:
        route_sizes, sizes = sizes, [embedded(spec) for spec in messages]
    shown: list[str] | str | None = None
    if pipes:
        first = pipes[0]
        if pipes.count(first) == len(pipes):
            shown = digest(first.key)
        else:
            shown = [digest(pipe.key) for pipe in pipes]
    drops: list[tuple[int, str, int]] | None = None
    if skipped:  # the message's place in the request, by identity: in C
        at = dict(zip(map(id, reversed(messages)), range(n - 1, -1, -1), strict=True))
        drops = [(at[id(spec)], digest(pipe.key), size) for spec, pipe, size in skipped]
    rows = n + len(pipes) + len(skipped)
    sink(
        (
            now,
            REQUEST,
            rows,
            feed.domain.name,
            name if name is not None else digest(feed.key),
            feed.type,
            principal,
            n,
            where,
            ids,
            sizes,
            outcome,
            shown,
            each,
            route_sizes,
            drops,
        ),
        rows,
    )


def _less(each: list[int], extra: Sequence[tuple[int, int]]) -> list[int]:
    """Each message's count (a duplicate's 0) made its number of copies: less the
    joins counted without a copy (:attr:`Copies.extra`)."""
    if not extra:
        return each
    less = dict(extra)
    placed = 0
    for index, count in enumerate(each):
        if count:  # a message with a copy: its first is the next one placed
            copies = count - less.get(placed, 0)
            each[index] = copies
            placed += copies
    return each


_SIZE = operator.itemgetter(1)  # of a (parts, size) pair
