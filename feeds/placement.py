"""Placing messages in pipes and rotator/service queues, with the journal records the
store commits. Over the engine's :class:`~feeds.catalogue.Catalogue`; theory of
operation in :mod:`feeds.engine`.
"""

from __future__ import annotations

from restms.specs import MessageSpec

from .catalogue import Catalogue
from .config import OVERHEAD
from .mirroring import emit_feed
from .model import Feed, Message, Parts, Pipe, Queued
from .selection import eligible
from .store import persistent, record


class Placement:
    """Messages into pipes (at their next position, in memory or on disk) and into
    feeds' queues; out of them again."""

    def __init__(self, state: Catalogue) -> None:
        self.state = state

    # ------------------------------------------------------------ placing messages
    def deliver(
        self,
        pipe: Pipe,
        spec: MessageSpec,
        parts: Parts,
        feed: Feed,
        now: float,
        durable: bool,
        size: int,
        stamp: str,
        redeliveries: int = 0,
        placed: list[Pipe] | None = None,
    ) -> None:
        """Place a new copy of a message in the pipe. ``placed``: the pipes a publish
        mirrored as one record collects (see :class:`feeds.mirroring.Copies`); without
        it, the copy's route event is mirrored as a tuple of its own."""
        source = feed if feed.queueing else None
        message = Message(
            0, spec, parts, feed.name, source, now, stamp, size, durable, redeliveries
        )
        if spec.props:  # (most messages have none: then no lookup of their ``expiration``)
            ttl = spec.prop("expiration")
            if ttl is not None:
                message.expires = self.state.mono() + int(ttl) / 1000
        self.state.counters.routed += 1
        # The mirror's record of the copy: while a publish routes with the mirror on
        # (the commonest), its pipe, for the publish's one record (a list's append, which
        # the interpreter runs without a call).
        if placed is not None:
            placed.append(pipe)
        elif self.state.mirror is not None:
            emit_feed(self.state.mirror, "route", now, feed, spec, size, None, pipe=pipe)
        self.place(pipe, message, now)

    def place(self, pipe: Pipe, message: Message, now: float) -> None:
        """Give the message the pipe's next position: held in memory, or on disk past
        the memory budget. New messages and redelivered ones both come through here."""
        state = self.state
        message.seq = pipe.next_seq
        pipe.next_seq += 1
        if pipe.durable:  # a durable pipe stores every message; else as the message asks
            message.durable = True
        if state.journal is not None:
            state.moved.setdefault(pipe, message.seq)  # first placed since (feeds.settling)
            budget = state.config.memory_budget
            if budget and (pipe.spilled or state.held + message.size + OVERHEAD > budget):
                self.spill(pipe, message)
                pipe.touch(now)
                return
            if message.durable:
                self.log_message(pipe, message)
        # What hold does, inline: this runs for every message routed to a pipe.
        pipe.messages[message.seq] = message
        pipe.bytes += message.size
        state.held += message.size + OVERHEAD
        if message.expires is not None:
            pipe.expiring += 1
        pipe.touch(now)

    def hold(self, pipe: Pipe, message: Message) -> None:
        """Keep the message in the pipe's memory (as :meth:`place` does inline)."""
        pipe.messages[message.seq] = message
        pipe.bytes += message.size
        self.state.held += message.size + OVERHEAD
        if message.expires is not None:
            pipe.expiring += 1

    def unhold(self, pipe: Pipe, seq: int) -> Message:
        """Take the message out of the pipe's memory (acknowledged, dropped, moved)."""
        state = self.state
        message = pipe.messages.pop(seq)
        pipe.bytes -= message.size
        state.held -= message.size + OVERHEAD
        if message.leased is not None:  # its lease's entry is stale now (feeds.leasing)
            state.stale_leases += 1
        return message

    def spill(self, pipe: Pipe, message: Message) -> None:
        """Past the memory budget: the message waits on disk, behind every message of
        the pipe in memory, until readers get that far (``Recovery.page_in``)."""
        self.log_message(pipe, message)
        if not pipe.spilled:
            pipe.spill_lo = message.seq
        pipe.spill_hi = message.seq + 1
        pipe.spilled += 1
        pipe.spilled_bytes += message.size
        self.state.counters.spilled += 1

    def log_message(self, pipe: Pipe, message: Message) -> None:
        state = self.state
        assert state.journal is not None
        source = message.source.key if message.source is not None else None
        data = record(
            message.spec,
            message.parts,
            message.feed_name,
            message.arrived,
            self._expires_at(message.expires),
            message.redeliveries,
            None if message.durable else state.epoch,
            stamp=message.stamp,
        )
        state.journal.append(("msg", pipe.key, message.seq, source, data))

    def _expires_at(self, deadline: float | None) -> float | None:
        """A monotonic deadline as wall-clock time, which survives a restart."""
        state = self.state
        return None if deadline is None else state.wall() + (deadline - state.mono())

    def drop(self, pipe: Pipe, seq: int) -> Message:
        """Take one message out of its pipe (expired, overflowed or redelivered)."""
        message = self.unhold(pipe, seq)
        journal = self.state.journal
        if journal is not None:  # durable, or read back from disk: a row to delete
            journal.append(("drop", pipe.key, seq))
        return message

    # ------------------------------------------------------------ rotator and service queues
    def enqueue(self, feed: Feed, entry: Queued, durable: bool, *, front: bool) -> None:
        """Queue a message in the feed: held in memory, so the memory budget counts it
        as it counts a pipe's, or, with a store, on disk past the budget (the publish
        checked the queue's own bounds: ``Publishing.check_queue``). Messages that come
        back to the front stay in memory: they were held until now."""
        state = self.state
        spec, parts, _, redelivered, size, stamp = entry
        qid: int | None = None
        if state.journal is not None:
            budget = state.config.memory_budget
            if not front and budget and (feed.qspilled or state.held + size + OVERHEAD > budget):
                self._spill_queued(feed, entry, durable)
                return
            if durable:
                if front:
                    qid = feed.qfront
                    feed.qfront -= 1
                else:
                    feed.qback += 1
                    qid = feed.qback
                data = record(spec, parts, feed.name, 0.0, None, redelivered, stamp=stamp)
                state.journal.append(("queue+", feed.key, qid, data))
        entry = (spec, parts, qid, redelivered, size, stamp)
        feed.queue_bytes += size
        state.held += size + OVERHEAD
        if front:
            feed.queue.appendleft(entry)
        else:
            feed.queue.append(entry)

    def _spill_queued(self, feed: Feed, entry: Queued, durable: bool) -> None:
        """Past the memory budget: the message waits on disk, behind every message of
        the queue in memory, until the queue runs empty there (``queue_page_in``). A
        non-persistent one carries the run's epoch, as a pipe's does: a restart drops it."""
        state = self.state
        assert state.journal is not None
        spec, parts, _, redelivered, size, stamp = entry
        feed.qback += 1
        qid = feed.qback
        epoch = None if durable else state.epoch
        data = record(spec, parts, feed.name, 0.0, None, redelivered, epoch, stamp=stamp)
        state.journal.append(("queue+", feed.key, qid, data))
        if not feed.qspilled:
            feed.qspill_lo = qid
        feed.qspill_hi = qid + 1
        feed.qspilled += 1
        feed.qspilled_bytes += size
        state.counters.spilled += 1

    def queue_full(self, feed: Feed, count: int, size: int) -> str | None:
        """Why the feed's queue cannot take ``count`` more messages of ``size`` bytes in
        all (F8, Q22): its message or byte bound, counting what waits on disk (past the
        memory budget queued messages are paged to disk, not refused). None: it can."""
        config = self.state.config
        held = len(feed.queue) + feed.qspilled
        if held + count > config.max_feed_queue:
            return f"has {held} of {config.max_feed_queue} messages queued"
        held = feed.queue_bytes + feed.qspilled_bytes
        if held + size > config.max_feed_queue_bytes:
            return f"has {held} of {config.max_feed_queue_bytes} bytes queued"
        return None

    def requeue(self, feed: Feed, message: Message) -> None:
        """Q1: an unacknowledged message goes back to the front of its feed's queue."""
        entry = (
            message.spec,
            message.parts,
            None,
            message.redeliveries,
            message.size,
            message.stamp,
        )
        self.enqueue(feed, entry, message.durable, front=True)

    def hand_out(self, feed: Feed, pipe: Pipe) -> None:
        """Give the pipe the message at the front of the feed's queue."""
        state = self.state
        spec, parts, qid, redelivered, size, stamp = feed.queue.popleft()
        feed.queue_bytes -= size
        state.held -= size + OVERHEAD
        if qid is not None and state.journal is not None:
            state.journal.append(("queue-", feed.key, qid))
        durable = qid is not None or persistent(spec)
        self.deliver(pipe, spec, parts, feed, state.wall(), durable, size, stamp, redelivered)
        if feed.qspilled and not feed.queue:
            self._want_page(feed)

    def drain(self, feed: Feed) -> None:
        """F8: hand queued messages to eligible pipes, in order."""
        if not feed.queue and feed.qspilled and not feed.deleted:
            self._want_page(feed)  # the oldest wait on disk
        while feed.queue and not feed.deleted and feed.queue[0] is not feed.hidden:
            join = eligible(feed)
            if join is None:
                return
            self.hand_out(feed, join.pipe)

    def refill(self, pipe: Pipe) -> None:
        """The pipe has room again: queueing feeds it joins hand it their work (F8)."""
        for join in list(pipe.joins.values()):
            if join.feed.queue:
                self.drain(join.feed)

    def _want_page(self, feed: Feed) -> None:
        """The feed's queue ran empty in memory while messages wait on disk: whoever
        reads pages back (the gateway: ``on_queue_page``) reads its next one."""
        if self.state.on_queue_page is not None:
            self.state.on_queue_page(feed)
