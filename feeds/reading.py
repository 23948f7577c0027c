"""Reading a pipe: listings, asynclets, acknowledgement and contents (A2-A9, D1-D8),
with expiry (Q30) as readers come by. Over the engine's
:class:`~feeds.catalogue.Catalogue`; theory of operation in :mod:`feeds.engine`.
"""

from __future__ import annotations

from collections.abc import Iterator

from restms.errors import NotFound, ServiceUnavailable

from .catalogue import Catalogue
from .model import Blob, Message, OnDisk, PartRef, Pipe, Slot, content_size
from .placement import Placement


class Reading:
    """What readers of a pipe see and take."""

    def __init__(self, state: Catalogue, placement: Placement) -> None:
        self.state = state
        self.placement = placement

    def check_open(self) -> None:
        """Raise the retriable 503 a wait answers once the engine's shutdown has begun."""
        if self.state.closing:
            raise ServiceUnavailable("the gateway is shutting down; retry", 1)

    def listing(self, pipe: Pipe) -> tuple[list[Message], int | None]:
        """A8: the oldest messages (capped) and the asynclet position, or None when capped.
        Messages held back for a commit are not listed (feeds.settling)."""
        self.expire(pipe)
        cap = self.state.config.listing_cap
        hidden = pipe.hidden
        if len(pipe.messages) <= cap and not pipe.spilled and not hidden:
            return list(pipe.messages.values()), pipe.next_seq
        out: list[Message] = []
        for seq, message in pipe.messages.items():
            if hidden and seq >= hidden:
                break
            if len(out) == cap:
                return out, None
            out.append(message)
        return out, None if pipe.spilled else pipe.asynclet

    def message(self, slot: Slot) -> Message | None:
        if slot.pipe.deleted:
            return None
        self.expire(slot.pipe)
        return slot.pipe.messages.get(slot.seq) if slot.pipe.shown(slot.seq) else None

    def expire(self, pipe: Pipe) -> None:
        """Q30: drop messages whose ``expiration`` has passed, unread (counted)."""
        if not pipe.expiring:
            return
        state = self.state
        now = state.mono()
        expired = [
            seq for seq, m in pipe.messages.items() if m.expires is not None and m.expires <= now
        ]
        for seq in expired:
            gone = self.placement.drop(pipe, seq)
            state.lost(pipe, seq)
            if state.mirror is not None:
                state.mirrored("expire", pipe, gone, "expired")
        pipe.expiring = sum(m.expires is not None for m in pipe.messages.values())
        if expired:
            state.counters.expired += len(expired)
            pipe.touch(state.wall())

    def pending(self, slot: Slot) -> bool:
        """True when the slot is the asynclet: the next position of a live pipe (A3, A5)."""
        return not slot.pipe.deleted and slot.seq == slot.pipe.asynclet

    def present(self, slot: Slot) -> Message | None:
        """A2, A5, A6, P3, without waiting: the message at this slot, or None while the
        slot is the asynclet (an ondemand pipe first asks its feeds for work).

        Raises 404 for positions that are gone, never issued or beyond the asynclet, or
        whose pipe is deleted; :class:`OnDisk` for one that waits on disk; 503 once
        shutting down.
        """
        pipe, seq = slot.pipe, slot.seq
        while True:
            if pipe.deleted:
                raise NotFound("the pipe was deleted")
            self.expire(pipe)
            asynclet = pipe.hidden or pipe.next_seq  # a publish's copies wait for its commit
            if seq < asynclet:
                message = pipe.messages.get(seq)
                if message is not None:
                    return message
                if pipe.on_disk(seq):
                    raise OnDisk(seq)
                raise NotFound("no message at this position")
            if seq != asynclet:
                raise NotFound("no message at this position")
            self.check_open()
            if pipe.type == "ondemand" and not pipe.messages and self.pull(pipe):
                continue
            return None

    async def wait_message(self, slot: Slot, timeout: float) -> Message | None:
        """:meth:`present`, waiting up to ``timeout`` seconds while the slot is the
        asynclet; None when nothing came (A9)."""
        state = self.state
        pipe = slot.pipe
        ondemand = pipe.type == "ondemand"
        deadline = state.mono() + timeout
        while True:
            message = self.present(slot)
            if message is not None:
                return message
            remaining = deadline - state.mono()
            if remaining <= 0:
                return None
            # pipe.changed, inline and with a shared timer: for each waiting asynclet a
            # coroutine frame and a loop timer less (feeds/deadlines.py).
            future = state.deadlines.watch(pipe, remaining)
            if ondemand:
                pipe.demand += 1
            try:
                if not await future:
                    return None
            finally:
                state.deadlines.unwatch(pipe, future)
                if ondemand:
                    pipe.demand -= 1

    def pull(self, pipe: Pipe) -> bool:
        """P3: an ondemand pipe asks its queueing feeds for one message."""
        for join in pipe.joins.values():
            feed = join.feed
            if feed.queue and feed.queue[0] is not feed.hidden:
                self.placement.hand_out(feed, pipe)
                return True
        return False

    def ack(self, slot: Slot) -> int:
        """D4, A7: delete this message and all older ones; a pending slot is a no-op."""
        pipe = slot.pipe
        if pipe.deleted or slot.seq >= pipe.asynclet:  # never what is held back (settling)
            return 0
        # One pass over the positions, then the removals: looking up the oldest again
        # after each removal walks the dict's deleted slots each time (quadratic).
        gone = []
        for seq in pipe.messages:
            if seq > slot.seq:
                break
            gone.append(seq)
        state, unhold = self.state, self.placement.unhold
        state.acked(pipe, slot.seq)  # (a position whose message went already, too)
        for seq in gone:
            acked = unhold(pipe, seq)
            if state.mirror is not None:
                state.mirrored("ack", pipe, acked, latency=True)
        removed = len(gone)
        if removed:
            state.counters.acknowledged += removed
            if state.journal is not None:
                state.journal.append(("ack", pipe.key, slot.seq))
            pipe.touch(state.wall())
            self.placement.refill(pipe)
        return removed

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
            self.state.held -= gone
            if message.durable and self.state.journal is not None:
                self.placement.log_message(ref.pipe, message)
            ref.pipe.touch(self.state.wall())

    def stream(self, pipe: Pipe, after: int) -> Iterator[Message]:
        """Messages held in the pipe at positions after ``after``, oldest first."""
        pipe.accessed = self.state.mono()
        self.expire(pipe)
        hidden = pipe.hidden  # held back for a commit from here on (feeds.settling)
        for seq, message in pipe.messages.items():
            if seq > after:
                if hidden and seq >= hidden:
                    return
                yield message
