"""Publishing and reading: routing with deduplication and overflow policies (F18-F21,
Q2), then listings, asynclets, acknowledgement and contents (A2-A9, D1-D8).

The theory of operation is in :mod:`feeds.engine`.
"""

from __future__ import annotations

import hashlib
import operator
from collections.abc import Iterator, Sequence
from collections.abc import Set as AbstractSet

from restms.errors import Forbidden, NotFound, PayloadTooLarge, ServiceUnavailable
from restms.specs import Duplicate, EmbeddedContent, LinkedContent, MessageSpec
from restms.uris import split_path

from .core import Core
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
from .model import (
    Blob,
    Feed,
    Message,
    OnDisk,
    Part,
    PartRef,
    Parts,
    Pipe,
    Slot,
    StagedContent,
    alive,
    content_size,
)
from .selection import capacity, eligible, matching
from .store import persistent


class Delivery(Core):
    """Publishing into pipes and feeds, and reading from pipes."""

    # ------------------------------------------------------------ publish
    def publish(
        self, feed: Feed, messages: Sequence[MessageSpec], owner: str | None = None
    ) -> list[int]:
        """Route messages in order; returns the join count for each (F18, F20).

        With ``owner``, staged contents the messages link must be that principal's: any
        other is treated as absent (Q7).

        A message whose ``message_id`` the feed routed within the dedup window is not
        routed again: its count is a :class:`Duplicate` of the first one's.
        """
        if feed.deleted:
            alive(feed)
        ids = _message_ids(messages) if self.config.dedup_window else None
        window: DedupWindow | None = None
        repeats: AbstractSet[int] = _NONE
        if ids:
            window = self._window(feed)
            repeats = self._repeats(window, ids)
        if feed.queueing:
            would_queue = len(messages) - len(repeats) - capacity(feed)
            if would_queue > 0 and len(feed.queue) + would_queue > self.config.max_feed_queue:
                if self.mirror is not None:
                    emit_publish(self.mirror, self._wall(), feed, messages, None, owner)
                raise ServiceUnavailable(
                    f"feed {feed.name or '(private)'} has {len(feed.queue)} of "
                    f"{self.config.max_feed_queue} messages queued and no pipe to take "
                    f"{would_queue} more; retry later",
                    1,
                )
        elif self._rejecting:
            self._check_room(feed, messages, repeats)
        claimed, linked = self._claim_contents(feed, messages, repeats, owner)
        now, mono = self._wall(), self._mono() if ids else 0.0
        if self.mirror is not None and len(messages) == 1 and not repeats:
            count = self._publish_alone(feed, messages[0], claimed[0], linked, owner, now)
            if ids:  # (only when its message_id is set: _message_ids)
                assert window is not None
                assert ids[0]
                window.add(ids[0], count, mono)
            return [count]
        counts: list[int] = []
        route = self._route
        # With the mirror on, the copies of a batch are collected (``_deliver``, the
        # pipe of each) and mirrored with the publish as one request record
        # (feeds.mirroring): nothing is noted a message, its count says its copies.
        copies: Copies | None = None
        if self.mirror is not None and len(messages) > 1:
            copies = self._copies = Copies()
            self._placed = copies.pipes
        try:
            if not ids:  # no message_id to remember, so no repeat either (most batches)
                counts = [
                    route(feed, spec, parts, now, persistent(spec) if spec.props else False, size)
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
                    count = route(feed, spec, parts, now, durable, size)
                    counts.append(count)
                    message_id = ids[index]
                    if message_id:
                        window.add(message_id, count, mono)
        finally:
            self._copies = self._placed = None
        counters = self.counters
        if repeats:
            counters.published += len(messages) - len(repeats)
            counters.duplicates += len(repeats)
        else:
            counters.published += len(messages)
        if self.mirror is not None and messages:  # (a bridge may hand over none)
            if copies is None:  # one message, a repeat: emit_publish's event, without its loop
                spec = messages[0]
                published = embedded(spec) if linked else claimed[0][1]
                emit_feed(self.mirror, "publish", now, feed, spec, published, owner, "duplicate")
            else:
                known = ids if self.config.dedup_window else _message_ids(messages)
                emit_request(
                    self.mirror,
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
        return counts

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
        one shorter record (its route event is held until then, ``_deliver``); otherwise
        its events are tuples, as :func:`emit_publish` makes them."""
        assert self.mirror is not None
        parts, size = claimed
        durable = persistent(spec) if spec.props else False
        held: list[Pipe] = []  # the pipe of its copy, when it has one
        self._placed = held
        try:
            count = self._route(feed, spec, parts, now, durable, size)
        except BaseException:  # its copy was placed: the route event held, as it was
            if held:
                emit_feed(self.mirror, "route", now, feed, spec, size, None, pipe=held[0])
            raise
        finally:
            self._placed = None
        self.counters.published += 1
        published = embedded(spec) if linked else size  # staged parts: not here
        if held:  # its one copy's route event, then its publish event
            emit_routed(self.mirror, now, feed, spec, held[0], size, owner, published)
        else:
            emit_feed(self.mirror, "publish", now, feed, spec, published, owner, OK)
        return count

    def forget(self, feed: Feed, messages: Sequence[MessageSpec]) -> None:
        """A publish whose commit failed was not accepted: its ids leave the window, so a
        retry is routed again instead of being answered as a duplicate."""
        window = feed.seen
        if window is None:
            return
        for spec in messages:
            message_id = spec.prop("message_id")
            if message_id:
                window.discard(message_id)

    def _window(self, feed: Feed) -> DedupWindow:
        if feed.seen is None:
            feed.seen = DedupWindow(self.config.dedup_window, self.config.dedup_max)
        return feed.seen

    def _repeats(self, window: DedupWindow | None, ids: list[str | None]) -> set[int]:
        """Positions of messages whose ``message_id`` is in the window or earlier in
        this same request: they are answered, not routed."""
        if window is None:
            return set()
        mono = self._mono()
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
                    size = self._spec_size(spec)
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
                self.counters.rejected_full += 1
                if self.events is not None:
                    self.events.pipe_full(pipe, feed, size)
                if self.mirror is not None:
                    emit_publish(self.mirror, self._wall(), feed, messages, None, None)
                raise ServiceUnavailable(
                    f"pipe {label(pipe)} is full ({held} of {pipe.max_messages} "
                    f"messages, {held_bytes} of {pipe.max_bytes} bytes) and rejects more; "
                    "retry later",
                    5,
                )

    def _spec_size(self, spec: MessageSpec) -> int:
        total = 0
        for content in spec.contents:
            if isinstance(content, EmbeddedContent):
                total += len(content.value)
            else:
                staged = self._staged_at(content.path)
                total += len(staged.blob.data) if staged is not None else 0
        return total

    def _claim_contents(
        self,
        feed: Feed,
        messages: Sequence[MessageSpec],
        skip: AbstractSet[int],
        owner: str | None,
    ) -> tuple[list[tuple[Parts, int]], bool]:
        """M8-M10: check every reference first; only then use the staged contents up.
        Each message's parts and their size in bytes, as pipe limits count them, and
        whether any staged content was used (then some sizes count more than the
        message's embedded contents).

        A message that links no staged content delivers its spec's own contents.
        Repeated messages (``skip``) are not routed, so their references are not used.
        """
        claimed: dict[str, StagedContent] = {}
        out: list[tuple[Parts, int]] = []
        for index, spec in enumerate(messages):
            size = 0
            for content in spec.contents:
                if type(content) is not EmbeddedContent:
                    break
                size += len(content.value)
            else:  # all embedded (most messages)
                out.append((spec.contents, size))  # type: ignore[arg-type]
                continue
            if skip and index in skip:
                out.append((spec.contents, embedded(spec)))  # type: ignore[arg-type]
                continue
            parts: list[Part | None] = []
            for content in spec.contents:
                if not isinstance(content, LinkedContent):
                    parts.append(content)
                    continue
                staged = self._staged_at(content.path)
                if staged is not None and owner is not None and staged.owner != owner:
                    staged = None  # another principal's: not there for this one
                if staged is None or staged.key in claimed:
                    raise NotFound(f"staged content {content.path} does not exist or was used")
                if staged.feed is not feed:
                    raise Forbidden(f"staged content {content.path} belongs to another feed")
                claimed[staged.key] = staged
                parts.append(staged.blob)
            out.append((tuple(parts), content_size(parts)))
        if not claimed:
            return out, False
        for staged in claimed.values():
            self.delete_staged(staged)
        return out, True

    def _staged_at(self, path: str) -> StagedContent | None:
        where = split_path(path)
        if where is None or where[0] != "resource":
            return None
        found = self._private.get(where[1])
        return found if isinstance(found, StagedContent) else None

    def _route(
        self,
        feed: Feed,
        spec: MessageSpec,
        parts: Parts,
        now: float,
        durable: bool,
        size: int,
        redeliveries: int = 0,
    ) -> int:
        if feed.queueing:
            join = eligible(feed)
            if join is None:
                self._enqueue(feed, (spec, parts, None, redeliveries), durable, front=False)
                self.counters.queued += 1
                return 0
            self._deliver(join.pipe, spec, parts, feed, now, durable, size, redeliveries)
            return 1
        # A fanout feed's joins, as matching() gives them, without its call (the commonest)
        joins = feed.joined if feed.type == "fanout" else matching(feed, spec)
        if len(joins) == 1:  # the common case: one matching join, so one pipe
            pipe = joins[0].pipe
            if pipe.full(size) and not self._room(feed, spec, pipe, now, size):
                return 0
            self._deliver(pipe, spec, parts, feed, now, durable, size, redeliveries)
            return 1
        if not joins:
            return 0
        copies = self._copies  # a publish of several messages, mirrored: in its record
        if copies is None:  # one message: the copies' events as tuples, in order
            self._placed = None
        else:
            placed = len(copies.pipes)
        count = 0
        # A pipe gets one copy however many of its joins match; each matching join counts.
        took: set[Pipe] | None = None if len(joins) == 1 else set()
        for join in joins:
            pipe = join.pipe
            if took is not None and pipe in took:
                count += 1
                continue
            if pipe.full(size) and not self._room(feed, spec, pipe, now, size):
                continue
            count += 1
            if took is not None:
                took.add(pipe)
            self._deliver(pipe, spec, parts, feed, now, durable, size, redeliveries)
        if copies is not None and count > len(copies.pipes) - placed:  # a pipe's joins
            copies.extra.append((placed, count - len(copies.pipes) + placed))
        return count

    def _room(self, feed: Feed, spec: MessageSpec, pipe: Pipe, now: float, size: int) -> bool:
        """A full pipe (Q2): room made by dropping its oldest messages ("drop-oldest"),
        or False when it skips the message (counted and mirrored)."""
        if pipe.overflow == "drop-oldest" and self._make_room(pipe, size):
            if self.events is not None:
                self._tell_full(pipe, feed, size)
            return True
        self.counters.skipped_full += 1
        if self.mirror is not None:
            copies = self._copies
            if copies is not None:  # a publish: one record with it
                copies.skipped.append((spec, pipe, size))
            else:
                emit_feed(self.mirror, "drop", now, feed, spec, size, None, "full", pipe)
        if self.events is not None:
            self._tell_full(pipe, feed, size)
        return False

    def _tell_full(self, pipe: Pipe, feed: Feed, size: int) -> None:
        """The system feed's "pipe.full" event (feeds.events), routed at once: while a
        publish collects its copies or holds its route event, the event's own copy is
        mirrored as itself, not as one of the publish's."""
        assert self.events is not None
        copies, placed = self._copies, self._placed
        self._copies = self._placed = None
        try:
            self.events.pipe_full(pipe, feed, size)
        finally:
            self._copies, self._placed = copies, placed

    def _make_room(self, pipe: Pipe, size: int) -> bool:
        """Overflow policy "drop-oldest": drop the oldest messages (counted) until one of
        ``size`` bytes fits; False when it never could."""
        if size > pipe.max_bytes:
            return False
        while pipe.messages and pipe.full(size):  # the oldest are in memory, never on disk
            dropped = self._drop(pipe, next(iter(pipe.messages)))
            self.counters.dropped_oldest += 1
            if self.mirror is not None:
                self.mirrored("drop", pipe, dropped, "dropped-oldest")
        return not pipe.full(size)

    # ------------------------------------------------------------ reading
    def listing(self, pipe: Pipe) -> tuple[list[Message], int | None]:
        """A8: the oldest messages (capped) and the asynclet position, or None when capped."""
        self._expire(pipe)
        cap = self.config.listing_cap
        if len(pipe.messages) <= cap and not pipe.spilled:
            return list(pipe.messages.values()), pipe.next_seq
        out = []
        for message in pipe.messages.values():
            out.append(message)
            if len(out) == cap:
                break
        return out, None

    def message(self, slot: Slot) -> Message | None:
        if slot.pipe.deleted:
            return None
        self._expire(slot.pipe)
        return slot.pipe.messages.get(slot.seq)

    def _expire(self, pipe: Pipe) -> None:
        """Q30: drop messages whose ``expiration`` has passed, unread (counted)."""
        if not pipe.expiring:
            return
        now = self._mono()
        expired = [
            seq for seq, m in pipe.messages.items() if m.expires is not None and m.expires <= now
        ]
        for seq in expired:
            gone = self._drop(pipe, seq)
            if self.mirror is not None:
                self.mirrored("expire", pipe, gone, "expired")
        pipe.expiring = sum(m.expires is not None for m in pipe.messages.values())
        if expired:
            self.counters.expired += len(expired)
            pipe.touch(self._wall())

    def pending(self, slot: Slot) -> bool:
        """True when the slot is the asynclet: the next position of a live pipe (A3, A5)."""
        return not slot.pipe.deleted and slot.seq == slot.pipe.next_seq

    async def wait_message(self, slot: Slot, timeout: float) -> Message | None:
        """A2, A5, A6, P3: the message at this slot, waiting while it is the asynclet.

        Returns None when ``timeout`` runs out (A9). Raises 404 for positions that are
        gone, never issued, beyond the asynclet, or whose pipe is deleted meanwhile.
        """
        pipe, seq = slot.pipe, slot.seq
        deadline = self._mono() + timeout
        while True:
            if pipe.deleted:
                raise NotFound("the pipe was deleted")
            self._expire(pipe)
            message = pipe.messages.get(seq)
            if message is not None:
                return message
            if pipe.on_disk(seq):
                raise OnDisk(seq)
            if seq != pipe.next_seq:
                raise NotFound("no message at this position")
            self.check_open()
            ondemand = pipe.type == "ondemand"
            if ondemand and not pipe.messages and self._pull(pipe):
                continue
            remaining = deadline - self._mono()
            if remaining <= 0:
                return None
            # pipe.changed, inline and with a shared timer: for each waiting asynclet a
            # coroutine frame and a loop timer less (feeds/deadlines.py).
            future = self.deadlines.watch(pipe, remaining)
            if ondemand:
                pipe.demand += 1
            try:
                if not await future:
                    return None
            finally:
                self.deadlines.unwatch(pipe, future)
                if ondemand:
                    pipe.demand -= 1

    def _pull(self, pipe: Pipe) -> bool:
        """P3: an ondemand pipe asks its queueing feeds for one message."""
        for join in pipe.joins.values():
            feed = join.feed
            if feed.queue:
                self._hand_out(feed, pipe)
                return True
        return False

    def ack(self, slot: Slot) -> int:
        """D4, A7: delete this message and all older ones; a pending slot is a no-op."""
        pipe = slot.pipe
        if pipe.deleted or slot.seq >= pipe.next_seq:
            return 0
        # One pass over the positions, then the removals: looking up the oldest again
        # after each removal walks the dict's deleted slots each time (quadratic).
        gone = []
        for seq in pipe.messages:
            if seq > slot.seq:
                break
            gone.append(seq)
        for seq in gone:
            acked = self._unhold(pipe, seq)
            if self.mirror is not None:
                self.mirrored("ack", pipe, acked, latency=True)
        removed = len(gone)
        if removed:
            self.counters.acknowledged += removed
            if self.journal is not None:
                self.journal.append(("ack", pipe.key, slot.seq))
            pipe.touch(self._wall())
            self._refill(pipe)
        return removed

    def _refill(self, pipe: Pipe) -> None:
        """The pipe has room again: queueing feeds it joins hand it their work (F8)."""
        for join in list(pipe.joins.values()):
            if join.feed.queue:
                self._drain(join.feed)

    def part(self, ref: PartRef) -> Blob:
        """D2, D6: the bytes of one delivered content, or 404."""
        message = self.message(Slot(ref.pipe, ref.seq))
        if message is None or ref.index >= len(message.parts):
            raise NotFound("no such content")
        part = message.parts[ref.index]
        if not isinstance(part, Blob):
            raise NotFound("no such content")
        return part

    def delete_part(self, ref: PartRef) -> None:
        message = self.message(Slot(ref.pipe, ref.seq))
        part = message.parts[ref.index] if message and ref.index < len(message.parts) else None
        if message is not None and part is not None:
            parts = list(message.parts)  # shared with other copies: this one gets its own
            parts[ref.index] = None
            message.parts = tuple(parts)
            gone = content_size((part,))
            message.size -= gone
            ref.pipe.bytes -= gone
            self.held -= gone
            if message.durable and self.journal is not None:
                self._log_message(ref.pipe, message)
            ref.pipe.touch(self._wall())

    def stream(self, pipe: Pipe, after: int) -> Iterator[Message]:
        """Messages held in the pipe at positions after ``after``, oldest first."""
        pipe.accessed = self._mono()
        self._expire(pipe)
        for seq, message in pipe.messages.items():
            if seq > after:
                yield message


_NONE: frozenset[int] = frozenset()


def _message_ids(messages: Sequence[MessageSpec]) -> list[str | None] | None:
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
