"""What becomes of a message once a reader has it: deliveries counted (and mirrored),
leases that run out (at-least-once redelivery), dead letters, and the outcomes of
webhook deliveries. Over the engine's :class:`~feeds.catalogue.Catalogue`; theory of
operation in :mod:`feeds.engine`.
"""

from __future__ import annotations

import dataclasses
import heapq
import logging

from .catalogue import Catalogue
from .events import feed_label
from .mirroring import address as shown_address
from .mirroring import emit_pipe
from .model import Feed, Message, Pipe
from .placement import Placement
from .publishing import Publishing
from .routing import QUEUEING_TYPES
from .selection import eligible
from .webhook import Hook

log = logging.getLogger(__name__)


class Leasing:
    """Deliveries, leases, dead letters and webhook outcomes."""

    def __init__(self, state: Catalogue, placement: Placement, publishing: Publishing) -> None:
        self.state = state
        self.placement = placement
        self.publishing = publishing

    def delivered(self, pipe: Pipe, message: Message, outcome: str = "ok") -> None:
        """A copy of the message was handed to a reader: counted, and mirrored as
        "deliver" when the mirror is on."""
        state = self.state
        state.counters.delivered += 1
        state.latency.observe(max(0.0, state.wall() - message.arrived))
        if state.mirror is not None:
            state.mirrored("deliver", pipe, message, outcome, latency=True)

    def lease(self, pipe: Pipe, message: Message) -> None:
        """A reader fetched this message: unless it is acknowledged within the pipe's
        lease, it is delivered again (or dead-lettered after ``max_deliveries``).
        Every call is a delivery (:meth:`delivered`)."""
        self.delivered(pipe, message)
        if pipe.lease <= 0 or message.leased is not None or pipe.deleted or pipe.hook:
            return  # a webhook pipe's messages are the gateway's to deliver, not leased
        if pipe.messages.get(message.seq) is not message:
            return
        state = self.state
        message.leased = state.mono() + pipe.lease
        heapq.heappush(state.leases, (message.leased, next(state.lease_tick), pipe, message))

    def sweep(self) -> int:
        """Redeliver every message whose lease ran out; returns how many."""
        state = self.state
        now, leases, ran_out = state.mono(), state.leases, 0
        while leases and leases[0][0] <= now:
            _, _, pipe, message = heapq.heappop(leases)
            if _stale(pipe, message):
                state.stale_leases -= state.stale_leases > 0
                continue  # acknowledged, expired or moved meanwhile
            ran_out += 1
            self._ran_out(pipe, message)
        if state.stale_leases * 2 > len(leases):
            leases[:] = [entry for entry in leases if not _stale(entry[2], entry[3])]
            heapq.heapify(leases)
            state.stale_leases = 0
        return ran_out

    def _ran_out(self, pipe: Pipe, message: Message) -> None:
        """At-least-once: the message leaves its position and is delivered again, to a
        pipe of its rotator or service feed (so another worker may get it) or at the end
        of this pipe; after ``max_deliveries`` fetches it goes to the dead-letter feed."""
        message.leased = None  # its entry has left the heap: not a stale one
        self.placement.drop(pipe, message.seq)
        message.redeliveries += 1
        self.state.counters.redelivered += 1
        now = self.state.wall()
        if self.state.mirror is not None:
            emit_pipe(self.state.mirror, "redeliver", now, pipe, message, self.state.public_feeds)
        source = message.source
        if message.redeliveries >= pipe.max_deliveries:
            self.dead_letter(
                pipe, message, "max-deliveries", (("x-delivery-count", str(message.redeliveries)),)
            )
        elif source is not None and not source.deleted:
            other = eligible(source, avoid=pipe)  # another worker, if one can take it
            if other is not None:
                self.placement.place(other.pipe, message, now)
            else:
                self.placement.requeue(source, message)
                self.placement.drain(source)
        else:
            self.placement.place(pipe, message, now)  # at the end, with its names and times
        pipe.touch(now)

    def dead_letter(
        self,
        pipe: Pipe,
        message: Message,
        reason: str,
        why: tuple[tuple[str, str], ...] = (),
        *,
        feed: str | None = None,
    ) -> bool:
        """Publish a copy of the message to a dead-letter feed (``feed`` by name, else
        the pipe's, else the configured one) with headers saying why. False (counted
        and logged) when that feed is missing or its queue is full."""
        target: Feed | None
        if feed:
            target = self.state.public_feeds.get(feed)
        elif pipe.dead_letter is None:
            target = self.state.public_feeds.get(self.state.config.dead_letter_feed)
        else:
            target = self.state.find_feed(pipe.dead_letter) if pipe.dead_letter else None
        spec = dataclasses.replace(
            message.spec,
            headers=(
                *message.spec.headers,
                ("x-death-reason", reason),
                *why,
                ("x-original-feed", message.feed_name or ""),
            ),
        )
        self.state.lost(pipe, message.seq)  # (its position in this pipe: not moved yet)
        # The copy's size: its contents (some may have been deleted) and its new head.
        size = message.size - message.spec.head_size + spec.head_size
        full = (
            target is not None
            and target.type in QUEUEING_TYPES
            and (target.qspilled or eligible(target) is None)  # queued, as Publishing.route does
            and self.placement.queue_full(target, 1, size) is not None
        )
        now = self.state.wall()
        if self.state.mirror is not None:
            nowhere = target is None or target.deleted or full
            kind, outcome = ("drop", "discarded") if nowhere else ("dead_letter", reason)
            emit_pipe(self.state.mirror, kind, now, pipe, message, self.state.public_feeds, outcome)
        if self.state.events is not None:
            nowhere = target is None or target.deleted or full
            self.state.events.dead_letter(
                pipe,
                message.feed_name,
                shown_address(message.feed_name, message.spec),
                message.spec.prop("message_id") if message.spec.props else None,
                reason,
                None if nowhere or target is None else feed_label(target),
            )
        if target is None or target.deleted or full:
            self.state.counters.dead_discarded += 1
            log.warning("a dead letter had nowhere to go and was discarded")
            return False
        # The copy keeps the message's origin stamp: it is the same message, gone elsewhere.
        parts, durable = message.parts, message.durable
        self.publishing.route(target, spec, parts, now, durable, size, stamp=message.stamp)
        self.state.counters.dead_lettered += 1
        return True

    # ------------------------------------------------------------ webhook pipes
    def hook_verified(self, pipe: Pipe, ok: bool, status: str, error: str) -> None:
        """The receiver answered the verification GET with its challenge, or did not."""
        hook = self._hook(pipe)
        hook.outcome(status, error, self.state.wall())
        hook.fire("verified" if ok else "refused")
        if not ok and self.state.events is not None:
            self.state.events.webhook_failing(pipe, status, f"verification failed: {error}", 0)
        self.state.hook_moved(pipe)

    def hook_delivered(self, pipe: Pipe, message: Message, status: str) -> None:
        """The receiver took the message (2xx): it leaves the pipe."""
        hook = self._hook(pipe)
        hook.outcome(status, "", self.state.wall())
        hook.delivered += 1
        hook.done(message.seq)
        self.state.counters.hook_delivered += 1
        self.delivered(pipe, message, status)  # the receiver's 2xx: delivery and ack
        if self.state.mirror is not None:
            self.state.mirrored("ack", pipe, message, latency=True)
        self.settle(pipe, message)
        self.state.hook_moved(pipe)

    def hook_failed(
        self, pipe: Pipe, message: Message, attempt: int, status: str, error: str, retry_at: float
    ) -> None:
        """Attempt ``attempt`` at the message failed; the next is due at ``retry_at``."""
        hook = self._hook(pipe)
        hook.outcome(status, error, self.state.wall())
        hook.failed(message.seq, attempt, retry_at)
        if self.state.events is not None:
            self.state.events.webhook_failing(pipe, status, error, attempt)
        self.state.counters.hook_failed += 1
        self.state.hook_moved(pipe)

    def hook_give_up(self, pipe: Pipe, message: Message, reason: str) -> None:
        """After ``max_attempts`` attempts, or ``max_age`` seconds: the message goes to
        the pipe's dead-letter feed (counted there when it has none) and leaves the pipe."""
        hook = self._hook(pipe)
        attempts = hook.attempts.get(message.seq, 0)
        why = (("x-delivery-count", str(attempts)), ("x-webhook-status", hook.last_status))
        if pipe.messages.get(message.seq) is message:
            self.dead_letter(pipe, message, reason, why)
        hook.dead += 1
        self.state.counters.hook_dead += 1
        hook.done(message.seq)
        self.settle(pipe, message)
        self.state.hook_moved(pipe)

    def hook_gone(self, pipe: Pipe, message: Message, status: str) -> None:
        """The receiver answered 410: the subscription ends; messages stay in the pipe."""
        hook = self._hook(pipe)
        hook.outcome(status, "the receiver ended the subscription", self.state.wall())
        hook.done(message.seq)
        hook.fire("gone")
        self.state.hook_moved(pipe)

    def hook_forget(self, pipe: Pipe, seq: int) -> None:
        """The message was removed by other means (a DELETE) while being delivered."""
        self._hook(pipe).done(seq)
        self.state.hook_moved(pipe)

    @staticmethod
    def _hook(pipe: Pipe) -> Hook:
        if pipe.hook is None:
            raise TypeError("not a webhook pipe")
        return pipe.hook

    def settle(self, pipe: Pipe, message: Message) -> None:
        """Remove this one message (an acknowledgement of it alone: concurrent
        deliveries finish in any order)."""
        if pipe.deleted or pipe.messages.get(message.seq) is not message:
            return
        self.placement.drop(pipe, message.seq)
        self.state.counters.acknowledged += 1
        self.placement.refill(pipe)


def _stale(pipe: Pipe, message: Message) -> bool:
    """A lease entry whose message is no longer where it was leased."""
    return pipe.deleted or pipe.messages.get(message.seq) is not message
