"""Routing a publish: deduplication, queue bounds and overflow policies checked
first (all-or-nothing), then each message routed to the joins that match, in order
(F18-F21, Q2), with the mirror's record of what the publish did. Over the engine's
:class:`~feeds.catalogue.Catalogue`; theory of operation in :mod:`feeds.engine`.

What one publish collects for the mirror (:class:`~feeds.mirroring.Copies`, the pipes
its copies went to) is created by that publish and handed down its routes as
arguments: a publish that runs meanwhile (the system feed's "pipe.full" event, routed
while the publish that found the pipe full is under way) has its own, or none.
"""

from __future__ import annotations

import hashlib
import operator
from collections.abc import Sequence
from collections.abc import Set as AbstractSet

from restms.errors import PayloadTooLarge, ServiceUnavailable
from restms.specs import Duplicate, MessageSpec

from .catalogue import Catalogue
from .dedup import DedupWindow
from .mirroring import (
    OK,
    Copies,
    embedded,
    emit_feed,
    emit_publish,
    emit_request,
    emit_routed,
)
from .model import Feed, Parts, Pipe, StagedContent, alive
from .placement import Placement
from .selection import capacity, eligible, matching
from .staging import Staging
from .store import persistent, stamps


class Publishing:
    """A publish's checks and its routing, message by message."""

    def __init__(self, state: Catalogue, placement: Placement, staging: Staging) -> None:
        self.state = state
        self.placement = placement
        self.staging = staging
        self.stamps = stamps()  # each published message's origin stamp (route)

    def publish(
        self, feed: Feed, messages: Sequence[MessageSpec], owner: str | None = None
    ) -> tuple[list[int], AbstractSet[int], Sequence[StagedContent]]:
        """Route messages in order: the join count for each (F18, F20), with what
        settling needs of this publish (:mod:`feeds.settling`): the positions it
        answered as repeats, and the staged contents it used.

        With ``owner``, staged contents the messages link must be that principal's: any
        other is treated as absent (Q7).

        A message whose ``message_id`` the feed routed within the dedup window is not
        routed again: its count is a :class:`Duplicate` of the first one's.
        """
        if feed.deleted:
            alive(feed)
        state = self.state
        ids = message_ids(messages) if state.config.dedup_window else None
        window: DedupWindow | None = None
        repeats: AbstractSet[int] = _NONE
        if ids:
            window = self.window(feed)
            repeats = self._repeats(window, ids)
        if feed.queueing:
            self._check_queue(feed, messages, repeats, owner)
        elif state.rejecting:
            self._check_room(feed, messages, repeats)
        claimed, staged = self.staging.claim(feed, messages, repeats, owner)
        linked = bool(staged)
        now, mono = state.wall(), state.mono() if ids else 0.0
        if state.mirror is not None and len(messages) == 1 and not repeats:
            count = self._publish_alone(feed, messages[0], claimed[0], linked, owner, now)
            if ids:  # (only when its message_id is set: message_ids)
                assert window is not None
                assert ids[0]
                window.add(ids[0], count, mono)
            return [count], repeats, staged
        counts: list[int] = []
        route = self.route
        # With the mirror on, the copies of a batch are collected (``Placement.deliver``, the
        # pipe of each) and mirrored with the publish as one request record
        # (feeds.mirroring): nothing is noted a message, its count says its copies.
        # The record is this publish's own, handed down each route: a publish that
        # runs meanwhile (the system feed's "pipe.full" event) keeps its own.
        copies: Copies | None = None
        placed: list[Pipe] | None = None
        if state.mirror is not None and len(messages) > 1:
            copies = Copies()
            placed = copies.pipes
        if not ids:  # no message_id to remember, so no repeat either (most batches)
            counts = [
                route(
                    feed,
                    spec,
                    parts,
                    now,
                    persistent(spec) if spec.props else False,
                    size,
                    0,
                    copies,
                    placed,
                )
                for spec, (parts, size) in zip(messages, claimed, strict=True)
            ]
        else:
            assert window is not None
            for index, spec in enumerate(messages):
                if repeats and index in repeats:
                    counts.append(Duplicate(window.get(ids[index] or "", mono) or 0))
                    continue
                parts, size = claimed[index]
                durable = persistent(spec) if spec.props else False
                count = route(feed, spec, parts, now, durable, size, 0, copies, placed)
                counts.append(count)
                message_id = ids[index]
                if message_id:
                    window.add(message_id, count, mono)
        counters = state.counters
        if repeats:
            counters.published += len(messages) - len(repeats)
            counters.duplicates += len(repeats)
        else:
            counters.published += len(messages)
        if state.mirror is not None and messages:  # (a bridge may hand over none)
            if copies is None:  # one message, a repeat: emit_publish's event, without its loop
                spec = messages[0]
                published = embedded(spec) if linked else claimed[0][1]
                emit_feed(state.mirror, "publish", now, feed, spec, published, owner, "duplicate")
            else:
                known = ids if state.config.dedup_window else message_ids(messages)
                emit_request(
                    state.mirror,
                    now,
                    feed,
                    messages,
                    counts,
                    owner,
                    known,
                    claimed,
                    linked,
                    copies,
                    bool(repeats),
                )
        return counts, repeats, staged

    def _publish_alone(
        self,
        feed: Feed,
        spec: MessageSpec,
        claimed: tuple[Parts, int],
        linked: bool,
        owner: str | None,
        now: float,
    ) -> int:
        """A publish of one message that is not a repeat, with the mirror on (the
        commonest publish, so without the batch loop): routed as :meth:`publish` routes
        each message. Placed in one pipe, its route and publish events are mirrored as
        one shorter record (its route event is held until then, ``Placement.deliver``); otherwise
        its events are tuples, as :func:`emit_publish` makes them."""
        state = self.state
        mirror = state.mirror
        assert mirror is not None
        parts, size = claimed
        durable = persistent(spec) if spec.props else False
        held: list[Pipe] = []  # the pipe of its copy, when it has one
        try:
            count = self.route(feed, spec, parts, now, durable, size, 0, None, held)
        except BaseException:  # its copy was placed: the route event held, as it was
            if held:
                emit_feed(mirror, "route", now, feed, spec, size, None, pipe=held[0])
            raise
        state.counters.published += 1
        published = embedded(spec) if linked else size  # staged parts: not here
        if held:  # its one copy's route event, then its publish event
            emit_routed(mirror, now, feed, spec, held[0], size, owner, published)
        else:
            emit_feed(mirror, "publish", now, feed, spec, published, owner, OK)
        return count

    def window(self, feed: Feed) -> DedupWindow:
        if feed.seen is None:
            feed.seen = DedupWindow(self.state.config.dedup_window, self.state.config.dedup_max)
        return feed.seen

    def _repeats(self, window: DedupWindow | None, ids: list[str | None]) -> set[int]:
        """Positions of messages whose ``message_id`` is in the window or earlier in
        this same request: they are answered, not routed."""
        if window is None:
            return set()
        mono = self.state.mono()
        repeats: set[int] = set()
        fresh: set[str] = set()
        for index, message_id in enumerate(ids):
            if not message_id:
                continue
            if message_id in fresh or window.get(message_id, mono) is not None:
                repeats.add(index)
            else:
                fresh.add(message_id)
        return repeats

    def _check_queue(
        self,
        feed: Feed,
        messages: Sequence[MessageSpec],
        skip: AbstractSet[int],
        owner: str | None,
    ) -> None:
        """F8, Q22: a rotator or service feed refuses the whole publish (503) when the
        messages its pipes cannot take now would pass its queue's bounds. Messages are
        routed in order, so those are the ones after what the pipes have room for."""
        fresh = [spec for index, spec in enumerate(messages) if index not in skip]
        queued = fresh[0 if feed.qspilled else capacity(feed) :]  # (FIFO: see route)
        if not queued:
            return
        size = sum(map(self.staging.spec_size, queued))
        why = self.placement.queue_full(feed, len(queued), size)
        if why is None:
            return
        if self.state.mirror is not None:
            emit_publish(self.state.mirror, self.state.wall(), feed, messages, None, owner)
        raise ServiceUnavailable(
            f"feed {feed.name or '(private)'} {why} and no pipe to take {len(queued)} more "
            f"({size} bytes); retry later",
            1,
        )

    def _check_room(
        self, feed: Feed, messages: Sequence[MessageSpec], skip: AbstractSet[int]
    ) -> None:
        """Overflow policy "reject": the whole publish fails, before anything is routed,
        when a matching pipe would pass its limits (503 naming the pipe)."""
        need: dict[Pipe, list[int]] = {}
        for index, spec in enumerate(messages):
            if index in skip:
                continue
            size = -1
            for pipe in {join.pipe for join in matching(feed, spec)}:
                if pipe.overflow != "reject":
                    continue
                if size < 0:
                    size = self.staging.spec_size(spec)
                if size > pipe.max_bytes:
                    raise PayloadTooLarge(
                        f"a message of {size} bytes is larger than pipe {label(pipe)} "
                        f"accepts ({pipe.max_bytes} bytes)"
                    )
                wanted = need.setdefault(pipe, [0, 0])
                wanted[0] += 1
                wanted[1] += size
        for pipe, (count, size) in need.items():
            held, held_bytes = len(pipe.messages) + pipe.spilled, pipe.bytes + pipe.spilled_bytes
            if held + count > pipe.max_messages or held_bytes + size > pipe.max_bytes:
                self.state.counters.rejected_full += 1
                if self.state.events is not None:
                    self.state.events.pipe_full(pipe, feed, size)
                if self.state.mirror is not None:
                    emit_publish(self.state.mirror, self.state.wall(), feed, messages, None, None)
                raise ServiceUnavailable(
                    f"pipe {label(pipe)} is full ({held} of {pipe.max_messages} "
                    f"messages, {held_bytes} of {pipe.max_bytes} bytes) and rejects more; "
                    "retry later",
                    5,
                )

    def route(
        self,
        feed: Feed,
        spec: MessageSpec,
        parts: Parts,
        now: float,
        durable: bool,
        size: int,
        redeliveries: int = 0,
        copies: Copies | None = None,
        placed: list[Pipe] | None = None,
        stamp: str | None = None,
    ) -> int:
        """Route one message; the number of joins that took it. ``copies`` and
        ``placed``: the mirror record of the publish it is part of (:meth:`publish`,
        :meth:`_publish_alone`); without them each copy's events are tuples. Every
        copy carries ``stamp``, a new origin stamp when None (a message published now;
        a dead letter keeps its own)."""
        if stamp is None:
            stamp = next(self.stamps)
        if feed.queueing:
            # Behind messages that wait on disk, a message waits too: a queue is FIFO.
            join = None if feed.qspilled else eligible(feed)
            if join is None:
                entry = (spec, parts, None, redeliveries, size, stamp)
                self.placement.enqueue(feed, entry, durable, front=False)
                self.state.counters.queued += 1
                return 0
            self.placement.deliver(
                join.pipe, spec, parts, feed, now, durable, size, stamp, redeliveries, placed
            )
            return 1
        # A fanout feed's joins, as matching() gives them, without its call (the commonest)
        joins = feed.joined if feed.type == "fanout" else matching(feed, spec)
        if len(joins) == 1:  # the common case: one matching join, so one pipe
            pipe = joins[0].pipe
            if pipe.full(size) and not self._room(feed, spec, pipe, now, size, copies):
                return 0
            self.placement.deliver(
                pipe, spec, parts, feed, now, durable, size, stamp, redeliveries, placed
            )
            return 1
        if not joins:
            return 0
        if copies is None:  # one message: the copies' events as tuples, in order
            placed = None
            before = 0
        else:  # a publish of several messages, mirrored: in its record
            placed = copies.pipes
            before = len(placed)
        count = 0
        # A pipe gets one copy however many of its joins match; each matching join counts.
        took: set[Pipe] | None = None if len(joins) == 1 else set()
        for join in joins:
            pipe = join.pipe
            if took is not None and pipe in took:
                count += 1
                continue
            if pipe.full(size) and not self._room(feed, spec, pipe, now, size, copies):
                continue
            count += 1
            if took is not None:
                took.add(pipe)
            self.placement.deliver(
                pipe, spec, parts, feed, now, durable, size, stamp, redeliveries, placed
            )
        if copies is not None and count > len(copies.pipes) - before:  # a pipe's joins
            copies.extra.append((before, count - len(copies.pipes) + before))
        return count

    def _room(
        self,
        feed: Feed,
        spec: MessageSpec,
        pipe: Pipe,
        now: float,
        size: int,
        copies: Copies | None = None,
    ) -> bool:
        """A full pipe (Q2): room made by dropping its oldest messages ("drop-oldest"),
        or False when it skips the message (counted and mirrored, in ``copies`` when
        the publish is mirrored as one record)."""
        if pipe.overflow == "drop-oldest" and self._make_room(pipe, size):
            if self.state.events is not None:
                self._tell_full(pipe, feed, size)
            return True
        self.state.counters.skipped_full += 1
        if self.state.mirror is not None:
            if copies is not None:  # a publish: one record with it
                copies.skipped.append((spec, pipe, size))
            else:
                emit_feed(self.state.mirror, "drop", now, feed, spec, size, None, "full", pipe)
        if self.state.events is not None:
            self._tell_full(pipe, feed, size)
        return False

    def _tell_full(self, pipe: Pipe, feed: Feed, size: int) -> None:
        """The system feed's "pipe.full" event (feeds.events), routed at once, as a
        publish of its own: its copies are mirrored as themselves, never in the record
        of the publish that found the pipe full (which its routes hold, not the engine)."""
        assert self.state.events is not None
        self.state.events.pipe_full(pipe, feed, size)

    def _make_room(self, pipe: Pipe, size: int) -> bool:
        """Overflow policy "drop-oldest": drop the oldest messages (counted) until one of
        ``size`` bytes fits; False when it never could."""
        if size > pipe.max_bytes:
            return False
        while pipe.messages and pipe.full(size):  # the oldest are in memory, never on disk
            dropped = self.placement.drop(pipe, next(iter(pipe.messages)))
            self.state.lost(pipe, dropped.seq)
            self.state.counters.dropped_oldest += 1
            if self.state.mirror is not None:
                self.state.mirrored("drop", pipe, dropped, "dropped-oldest")
        return not pipe.full(size)


_NONE: frozenset[int] = frozenset()


def message_ids(messages: Sequence[MessageSpec]) -> list[str | None] | None:
    """Each message's ``message_id``, or None when none has one (most carry no
    properties at all: that is found without a Python-level loop)."""
    if not any(map(_PROPS, messages)):
        return None
    ids = [spec.prop("message_id") if spec.props else None for spec in messages]
    return ids if any(ids) else None


_PROPS = operator.attrgetter("props")


def label(pipe: Pipe) -> str:
    """How replies to others name a pipe: its title and a digest of its name, never the
    name itself, which is the pipe's capability."""
    digest = hashlib.sha256(pipe.key.encode()).hexdigest()[:12]
    return f"{pipe.title!r} (sha256 {digest})" if pipe.title else f"sha256 {digest}"
