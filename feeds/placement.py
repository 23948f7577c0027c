"""Placing messages in pipes and rotator/service queues, with the journal records the
store commits (a base of :class:`feeds.core.Core`; theory of operation in
:mod:`feeds.engine`).
"""

from __future__ import annotations

from restms.specs import MessageSpec

from .config import OVERHEAD, Counters, EngineConfig
from .mirroring import Copies, Sink, emit_feed
from .model import Clock, Feed, Message, Parts, Pipe, Queued, content_size
from .selection import eligible
from .store import Op, persistent, record


class Placement:
    """Message placement; the state it uses is set up by :class:`feeds.core.Core`."""

    config: EngineConfig
    counters: Counters
    journal: list[Op] | None
    held: int
    epoch: int
    mirror: Sink | None
    _copies: Copies | None
    _placed: list[Pipe] | None
    _moved: set[Pipe]
    _wall: Clock
    _mono: Clock

    # ------------------------------------------------------------ placing messages
    def _deliver(
        self,
        pipe: Pipe,
        spec: MessageSpec,
        parts: Parts,
        feed: Feed,
        now: float,
        durable: bool,
        size: int,
        redeliveries: int = 0,
    ) -> None:
        source = feed if feed.queueing else None
        message = Message(0, spec, parts, feed.name, source, now, size, durable, redeliveries)
        if spec.props:  # (most messages have none: then no lookup of their ``expiration``)
            ttl = spec.prop("expiration")
            if ttl is not None:
                message.expires = self._mono() + int(ttl) / 1000
        self.counters.routed += 1
        # The mirror's record of the copy: while a publish routes with the mirror on
        # (the commonest), its pipe, for the publish's one record (a list's append, which
        # the interpreter runs without a call).
        if self._placed is not None:
            self._placed.append(pipe)
        elif self.mirror is not None:
            emit_feed(self.mirror, "route", now, feed, spec, size, None, pipe=pipe)
        self._place(pipe, message, now)

    def _place(self, pipe: Pipe, message: Message, now: float) -> None:
        """Give the message the pipe's next position: held in memory, or on disk past
        the memory budget. New messages and redelivered ones both come through here."""
        message.seq = pipe.next_seq
        pipe.next_seq += 1
        if pipe.durable:  # a durable pipe stores every message; else as the message asks
            message.durable = True
        if self.journal is not None:
            self._moved.add(pipe)
            budget = self.config.memory_budget
            if budget and (pipe.spilled or self.held + message.size + OVERHEAD > budget):
                self._spill(pipe, message)
                pipe.touch(now)
                return
            if message.durable:
                self._log_message(pipe, message)
        # _hold, inline: placing is the commonest hold, one a message routed (a call less)
        pipe.messages[message.seq] = message
        pipe.bytes += message.size
        self.held += message.size + OVERHEAD
        if message.expires is not None:
            pipe.expiring += 1
        pipe.touch(now)

    def _hold(self, pipe: Pipe, message: Message) -> None:
        """Keep the message in the pipe's memory (as :meth:`_place` does inline)."""
        pipe.messages[message.seq] = message
        pipe.bytes += message.size
        self.held += message.size + OVERHEAD
        if message.expires is not None:
            pipe.expiring += 1

    def _unhold(self, pipe: Pipe, seq: int) -> Message:
        message = pipe.messages.pop(seq)
        pipe.bytes -= message.size
        self.held -= message.size + OVERHEAD
        return message

    def _spill(self, pipe: Pipe, message: Message) -> None:
        """Past the memory budget: the message waits on disk, behind every message of
        the pipe in memory, until readers get that far (:meth:`page_in`)."""
        self._log_message(pipe, message)
        if not pipe.spilled:
            pipe.spill_lo = message.seq
        pipe.spill_hi = message.seq + 1
        pipe.spilled += 1
        pipe.spilled_bytes += message.size
        self.counters.spilled += 1

    def _log_message(self, pipe: Pipe, message: Message) -> None:
        assert self.journal is not None
        source = message.source.key if message.source is not None else None
        data = record(
            message.spec,
            message.parts,
            message.feed_name,
            message.arrived,
            self._expires_at(message.expires),
            message.redeliveries,
            None if message.durable else self.epoch,
        )
        self.journal.append(("msg", pipe.key, message.seq, source, data))

    def _expires_at(self, deadline: float | None) -> float | None:
        """A monotonic deadline as wall-clock time, which survives a restart."""
        return None if deadline is None else self._wall() + (deadline - self._mono())

    def _drop(self, pipe: Pipe, seq: int) -> Message:
        """Take one message out of its pipe (expired, overflowed or redelivered)."""
        message = self._unhold(pipe, seq)
        if self.journal is not None:  # durable, or read back from disk: a row to delete
            self.journal.append(("drop", pipe.key, seq))
        return message

    # ------------------------------------------------------------ rotator and service queues
    def _enqueue(self, feed: Feed, entry: Queued, durable: bool, *, front: bool) -> None:
        spec, parts, _, redelivered = entry
        qid: int | None = None
        if self.journal is not None and durable:
            if front:
                qid = feed.qfront
                feed.qfront -= 1
            else:
                feed.qback += 1
                qid = feed.qback
            data = record(spec, parts, feed.name, 0.0, None, redelivered)
            self.journal.append(("queue+", feed.key, qid, data))
        entry = (spec, parts, qid, redelivered)
        if front:
            feed.queue.appendleft(entry)
        else:
            feed.queue.append(entry)

    def _requeue(self, feed: Feed, message: Message) -> None:
        """Q1: an unacknowledged message goes back to the front of its feed's queue."""
        entry = (message.spec, message.parts, None, message.redeliveries)
        self._enqueue(feed, entry, message.durable, front=True)

    def _hand_out(self, feed: Feed, pipe: Pipe) -> None:
        """Give the pipe the message at the front of the feed's queue."""
        spec, parts, qid, redelivered = feed.queue.popleft()
        if qid is not None and self.journal is not None:
            self.journal.append(("queue-", feed.key, qid))
        durable = qid is not None or persistent(spec)
        self._deliver(
            pipe, spec, parts, feed, self._wall(), durable, content_size(parts), redelivered
        )

    def _drain(self, feed: Feed) -> None:
        """F8: hand queued messages to eligible pipes, in order."""
        while feed.queue and not feed.deleted:
            join = eligible(feed)
            if join is None:
                return
            self._hand_out(feed, join.pipe)
