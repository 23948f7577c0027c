"""The embedded engine: feeds, pipes, joins, routing and delivery (2/RestMS, 3/Defaults, 4/AMQP9).

Theory of operation
-------------------
All state lives in memory on the event loop's thread and every mutating call is
synchronous, so a publish is routed completely, and the message is in every pipe,
before the reply goes out (L27). Only waiting is asynchronous: asynclets and evented
GETs await a resource's next change (:class:`~feeds.model.Watchable`), never poll.

* A **pipe** holds messages at positions that only grow (A3). Position ``next_seq``
  is the asynclet; a message routed into the pipe takes it. Acknowledging position
  ``n`` removes ``n`` and everything older (D4).
* A **publish** first checks every content reference of every message (M8-M10) and
  the rotator queue bound, so a request is all-or-nothing; then it routes message
  by message, in order (D9).
* **Fanout-style feeds** (default, direct, fanout, topic, headers, regexp) copy the
  message to every matching join. A pipe gets one copy even if several of its joins
  match; ``count`` is the number of matching joins whose pipe took it. A full pipe is
  skipped and not counted (Q2), unless its overflow policy rejects the publish or
  drops its oldest messages.
* **Rotator and service feeds** give each message to at most one join, round robin
  among eligible pipes: a default or stream pipe that is not full, or an ondemand pipe
  that is empty and has a GET waiting (P3). With none eligible, the message waits in
  the feed's bounded queue (F8) and is handed out when a pipe joins, asks or drains.
  Messages a deleted pipe never acknowledged go back to the front of their queue (Q1).
* A **service feed** deletes itself when its last join goes (F8).
* **Durability.** After :meth:`Engine.restore` the engine keeps a journal of what it
  changes (:mod:`feeds.store`): resources, and persistent messages (``delivery_mode``
  2) delivered to a pipe or queued in a feed, acknowledgements and expiries. The
  gateway commits the journal before it replies. Non-persistent messages stay in
  memory only; each pipe's next position is written lazily so positions never repeat.

The engine knows nothing of HTTP; it raises :mod:`restms.errors` exceptions.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import logging
from typing import Any

from restms.specs import JoinSpec, PipeOptions

from .config import EngineConfig, Latency
from .delivery import Delivery
from .events import Events, feed_label
from .mirroring import address as shown_address
from .mirroring import emit_pipe
from .model import Clock, Feed, Join, Message, Pipe, content_size
from .routing import QUEUEING_TYPES
from .selection import eligible
from .store import Snapshot, decode_parts, epoch_of, loads, message_spec, redeliveries
from .webhook import Hook

log = logging.getLogger(__name__)


class Engine(Delivery):
    """The embedded engine. One instance per gateway, used from the event loop's thread.

    Layers: :class:`feeds.core.Core` (resources, placing messages),
    :class:`feeds.delivery.Delivery` (publishing, reading) and this class (recovery
    from the store, leases and dead letters, idle pipe collection).
    """

    def __init__(self, config: EngineConfig | None = None, **clocks: Clock) -> None:
        super().__init__(config, **clocks)
        # Leases running (end, tie-break, pipe, message), soonest first; stale entries
        # (acknowledged or moved messages) are skipped when they come up.
        self._leases: list[tuple[float, int, Pipe, Message]] = []
        self._tick = itertools.count()
        self.latency = Latency()  # from arrival in a pipe to each delivery (GET /metrics)
        name = self.config.system_feed
        if name:
            self.events = Events(
                self.public_feeds[name],
                self._route,
                interval=self.config.events_interval,
                wall=self._wall,
                mono=self._mono,
            )

    # ------------------------------------------------------------ recovery
    def restore(self, snapshot: Snapshot) -> None:
        """Rebuild what the store holds, then keep a journal from here on.

        Feeds, pipes and joins come back under their keys (so their URIs), each pipe's
        messages at their positions, each feed's queue in order. Rows that no longer
        fit the configuration (a domain or feed it dropped) are skipped and logged.
        """
        now, mono = self._wall(), self._mono()
        for key, name, type_, title, license_, domain_name, owner in snapshot.feeds:
            domain = self.domains.get(domain_name)
            if domain is None or (name is not None and name in self.public_feeds):
                log.warning("stored feed %s no longer fits the configuration; skipped", key)
                continue
            feed = Feed(
                key=key,
                name=name,
                type=type_,
                title=title,
                license=license_,
                domain=domain,
                owner=owner,
                configured=False,
                now=now,
            )
            self._register(feed, now)
        for key, type_, title, domain_name, owner, next_seq, options in snapshot.pipes:
            domain = self.domains.get(domain_name) or self.default_feed.domain
            settings = self._settings(PipeOptions.stored(loads(options)), check=False)
            pipe = Pipe(key, type_, title, domain, owner, now, settings)
            pipe.next_seq = next_seq
            pipe.accessed = mono
            self._private[key] = pipe
            self._pipes_of[owner] += 1
            self._rejecting += pipe.overflow == "reject"
            if pipe.hook is not None:
                self.hooks[key] = pipe
        for key, pipe_key, feed_key, type_, address, headers, is_default in snapshot.joins:
            owner_pipe, target = self._private.get(pipe_key), self._feed_by_key(feed_key)
            if not isinstance(owner_pipe, Pipe) or target is None:
                log.warning("stored join %s has lost its pipe or feed; skipped", key)
                continue
            pairs = tuple((k, v) for k, v in loads(headers))
            spec = JoinSpec(feed_path="", address=address, type=type_, headers=pairs)
            self._link(owner_pipe, target, spec, bool(is_default), now, key=key)
        self.epoch = snapshot.epoch
        self.journal = []  # stale rows found below are deleted
        seen: list[tuple[float, Feed, str]] = []  # message ids, to refill dedup windows
        for pipe_key, seq, source_key, data in snapshot.messages:
            holder = self._private.get(pipe_key)
            if not isinstance(holder, Pipe):
                continue
            message = self._revive(holder, seq, source_key, data, now, mono)
            holder.next_seq = max(holder.next_seq, seq + 1)
            if message is None:
                continue
            self._hold(holder, message)
            origin = message.source or self.public_feeds.get(message.feed_name or "")
            message_id = message.spec.prop("message_id")
            if origin is not None and message_id:
                seen.append((message.arrived, origin, message_id))
        for pipe_key, low, high, count, size in snapshot.spills:
            holder = self._private.get(pipe_key)
            if isinstance(holder, Pipe):
                holder.spill_lo, holder.spill_hi = low, high
                holder.spilled, holder.spilled_bytes = count, size
                holder.next_seq = max(holder.next_seq, high)
        for feed_key, qid, data in snapshot.queued:
            queue_feed = self._feed_by_key(feed_key)
            if queue_feed is None:
                continue
            fields = loads(data)
            entry = (message_spec(fields), decode_parts(fields[6]), qid, redeliveries(fields))
            queue_feed.queue.append(entry)
            queue_feed.qfront = min(queue_feed.qfront, qid - 1)
            queue_feed.qback = max(queue_feed.qback, qid)
        self._refill_windows(seen, now, mono)
        self._restore_hooks(snapshot.webhooks)
        for found in [*self.public_feeds.values(), *self._private.values()]:
            if isinstance(found, Feed) and found.queue:
                self._drain(found)  # pipes that can take queued work get it now

    def _restore_hooks(self, rows: list[tuple[Any, ...]]) -> None:
        """Webhook pipes' delivery state, without attempts at messages that are gone."""
        for key, data in rows:
            pipe = self.hooks.get(key)
            if pipe is None or pipe.hook is None:
                if self.journal is not None:
                    self.journal.append(("pipe-", key))  # what is left of a deleted pipe
                continue
            pipe.hook.restore(loads(data))
            pipe.hook.keep_only({seq for seq in pipe.hook.attempts if self._holds(pipe, seq)})

    @staticmethod
    def _holds(pipe: Pipe, seq: int) -> bool:
        return seq in pipe.messages or pipe.on_disk(seq)

    def _revive(
        self, pipe: Pipe, seq: int, source_key: str | None, data: bytes, now: float, mono: float
    ) -> Message | None:
        """A stored message as the engine holds it; None (and the row deleted) when it
        is a non-persistent message an earlier run put on disk."""
        fields = loads(data)
        epoch = epoch_of(fields)
        if epoch is not None and epoch != self.epoch:
            if self.journal is not None:
                self.journal.append(("drop", pipe.key, seq))
            return None
        stored, parts = message_spec(fields), decode_parts(fields[6])
        source = self._feed_by_key(source_key) if source_key else None
        message = Message(seq, stored, parts, fields[3], source, fields[4])
        message.durable = epoch is None
        message.size = content_size(parts)
        message.redeliveries = redeliveries(fields)
        if fields[5] is not None:
            message.expires = mono + (fields[5] - now)
        return message

    def page_in(self, pipe: Pipe, low: int, rows: list[tuple[int, Any, bytes]]) -> int:
        """Hold the next page of a pipe's messages from disk (read from ``low`` on, the
        pipe's first position on disk when the read began); returns how many."""
        if pipe.deleted or not pipe.spilled or pipe.spill_lo != low:
            return 0  # the pipe changed meanwhile: the caller reads again
        now, mono = self._wall(), self._mono()
        taken = 0
        for seq, source_key, data in rows:
            if seq >= pipe.spill_hi:
                break
            message = self._revive(pipe, seq, source_key, data, now, mono)
            pipe.spill_lo = seq + 1
            pipe.spilled -= 1
            if message is None:
                continue
            pipe.spilled_bytes = max(0, pipe.spilled_bytes - message.size)
            self._hold(pipe, message)
            taken += 1
        if not rows or pipe.spill_lo >= pipe.spill_hi or pipe.spilled <= 0:
            pipe.spilled = pipe.spilled_bytes = pipe.spill_lo = pipe.spill_hi = 0
        self.counters.paged_in += taken
        pipe.touch(now)
        return taken

    def _refill_windows(self, seen: list[tuple[float, Feed, str]], now: float, mono: float) -> None:
        """Dedup windows from the stored messages: a publish retried across a restart is
        still a duplicate while a copy of it is held (its count: the copies held)."""
        if not self.config.dedup_window:
            return
        copies: dict[tuple[Feed, str], int] = {}
        for _, feed, message_id in seen:
            copies[feed, message_id] = copies.get((feed, message_id), 0) + 1
        for arrived, feed, message_id in sorted(seen, key=lambda item: item[0]):
            age = max(0.0, now - arrived)
            window = self._window(feed)
            if window.get(message_id, mono) is None and age < window.window:
                window.add(message_id, copies[feed, message_id], mono - age)

    # ------------------------------------------------------------ leases and dead letters
    def delivered(self, pipe: Pipe, message: Message, outcome: str = "ok") -> None:
        """A copy of the message was handed to a reader: counted, and mirrored as
        "deliver" when the mirror is on."""
        self.counters.delivered += 1
        self.latency.observe(max(0.0, self._wall() - message.arrived))
        if self.mirror is not None:
            self.mirrored("deliver", pipe, message, outcome, latency=True)

    def lease(self, pipe: Pipe, message: Message) -> None:
        """A reader fetched this message: unless it is acknowledged within the pipe's
        lease, it is delivered again (or dead-lettered after ``max_deliveries``).
        Every call is a delivery (:meth:`delivered`)."""
        self.delivered(pipe, message)
        if pipe.lease <= 0 or message.leased is not None or pipe.deleted or pipe.hook:
            return  # a webhook pipe's messages are the gateway's to deliver, not leased
        if pipe.messages.get(message.seq) is not message:
            return
        message.leased = self._mono() + pipe.lease
        heapq.heappush(self._leases, (message.leased, next(self._tick), pipe, message))

    def sweep_leases(self) -> int:
        """Redeliver every message whose lease ran out; returns how many."""
        now, leases, ran_out = self._mono(), self._leases, 0
        while leases and leases[0][0] <= now:
            _, _, pipe, message = heapq.heappop(leases)
            if pipe.deleted or pipe.messages.get(message.seq) is not message:
                continue  # acknowledged, expired or moved meanwhile
            ran_out += 1
            self._lease_ran_out(pipe, message)
        return ran_out

    def _lease_ran_out(self, pipe: Pipe, message: Message) -> None:
        """At-least-once: the message leaves its position and is delivered again, to a
        pipe of its rotator or service feed (so another worker may get it) or at the end
        of this pipe; after ``max_deliveries`` fetches it goes to the dead-letter feed."""
        self._drop(pipe, message.seq)
        message.leased = None
        message.redeliveries += 1
        self.counters.redelivered += 1
        now = self._wall()
        if self.mirror is not None:
            emit_pipe(self.mirror, "redeliver", now, pipe, message, self.public_feeds)
        source = message.source
        if message.redeliveries >= pipe.max_deliveries:
            self.dead_letter(
                pipe, message, "max-deliveries", (("x-delivery-count", str(message.redeliveries)),)
            )
        elif source is not None and not source.deleted:
            other = eligible(source, avoid=pipe)  # another worker, if one can take it
            if other is not None:
                self._place(other.pipe, message, now)
            else:
                self._requeue(source, message)
                self._drain(source)
        else:
            self._place(pipe, message, now)  # at the end, with its names and times
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
            target = self.public_feeds.get(feed)
        elif pipe.dead_letter is None:
            target = self.public_feeds.get(self.config.dead_letter_feed)
        else:
            target = self._feed_at(pipe.dead_letter) if pipe.dead_letter else None
        spec = dataclasses.replace(
            message.spec,
            headers=(
                *message.spec.headers,
                ("x-death-reason", reason),
                *why,
                ("x-original-feed", message.feed_name or ""),
            ),
        )
        full = (
            target is not None
            and target.type in QUEUEING_TYPES
            and eligible(target) is None
            and len(target.queue) >= self.config.max_feed_queue
        )
        now = self._wall()
        if self.mirror is not None:
            nowhere = target is None or target.deleted or full
            kind, outcome = ("drop", "discarded") if nowhere else ("dead_letter", reason)
            emit_pipe(self.mirror, kind, now, pipe, message, self.public_feeds, outcome)
        if self.events is not None:
            nowhere = target is None or target.deleted or full
            self.events.dead_letter(
                pipe,
                message.feed_name,
                shown_address(message.feed_name, message.spec),
                message.spec.prop("message_id") if message.spec.props else None,
                reason,
                None if nowhere or target is None else feed_label(target),
            )
        if target is None or target.deleted or full:
            self.counters.dead_discarded += 1
            log.warning("a dead letter had nowhere to go and was discarded")
            return False
        self._route(target, spec, message.parts, now, message.durable, message.size)
        self.counters.dead_lettered += 1
        return True

    # ------------------------------------------------------------ webhook pipes
    def hook_verified(self, pipe: Pipe, ok: bool, status: str, error: str) -> None:
        """The receiver answered the verification GET with its challenge, or did not."""
        hook = self._hook(pipe)
        hook.outcome(status, error, self._wall())
        hook.fire("verified" if ok else "refused")
        if not ok and self.events is not None:
            self.events.webhook_failing(pipe, status, f"verification failed: {error}", 0)
        self.hook_moved(pipe)

    def hook_delivered(self, pipe: Pipe, message: Message, status: str) -> None:
        """The receiver took the message (2xx): it leaves the pipe."""
        hook = self._hook(pipe)
        hook.outcome(status, "", self._wall())
        hook.delivered += 1
        hook.done(message.seq)
        self.counters.hook_delivered += 1
        self.delivered(pipe, message, status)  # the receiver's 2xx: delivery and ack
        if self.mirror is not None:
            self.mirrored("ack", pipe, message, latency=True)
        self._settle(pipe, message)
        self.hook_moved(pipe)

    def hook_failed(
        self, pipe: Pipe, message: Message, attempt: int, status: str, error: str, retry_at: float
    ) -> None:
        """Attempt ``attempt`` at the message failed; the next is due at ``retry_at``."""
        hook = self._hook(pipe)
        hook.outcome(status, error, self._wall())
        hook.failed(message.seq, attempt, retry_at)
        if self.events is not None:
            self.events.webhook_failing(pipe, status, error, attempt)
        self.counters.hook_failed += 1
        self.hook_moved(pipe)

    def hook_give_up(self, pipe: Pipe, message: Message, reason: str) -> None:
        """After ``max_attempts`` attempts, or ``max_age`` seconds: the message goes to
        the pipe's dead-letter feed (counted there when it has none) and leaves the pipe."""
        hook = self._hook(pipe)
        attempts = hook.attempts.get(message.seq, 0)
        why = (("x-delivery-count", str(attempts)), ("x-webhook-status", hook.last_status))
        if pipe.messages.get(message.seq) is message:
            self.dead_letter(pipe, message, reason, why)
        hook.dead += 1
        self.counters.hook_dead += 1
        hook.done(message.seq)
        self._settle(pipe, message)
        self.hook_moved(pipe)

    def hook_gone(self, pipe: Pipe, message: Message, status: str) -> None:
        """The receiver answered 410: the subscription ends; messages stay in the pipe."""
        hook = self._hook(pipe)
        hook.outcome(status, "the receiver ended the subscription", self._wall())
        hook.done(message.seq)
        hook.fire("gone")
        self.hook_moved(pipe)

    def hook_forget(self, pipe: Pipe, seq: int) -> None:
        """The message was removed by other means (a DELETE) while being delivered."""
        self._hook(pipe).done(seq)
        self.hook_moved(pipe)

    @staticmethod
    def _hook(pipe: Pipe) -> Hook:
        if pipe.hook is None:
            raise TypeError("not a webhook pipe")
        return pipe.hook

    def _settle(self, pipe: Pipe, message: Message) -> None:
        """Remove this one message (an acknowledgement of it alone: concurrent
        deliveries finish in any order)."""
        if pipe.deleted or pipe.messages.get(message.seq) is not message:
            return
        self._drop(pipe, message.seq)
        self.counters.acknowledged += 1
        self._refill(pipe)

    # ------------------------------------------------------------ background upkeep
    def collect_idle(self) -> int:
        """Q1: delete private pipes no request touched for ``pipe_idle_timeout`` seconds
        and nobody waits on; their unacknowledged rotator/service work goes back."""
        timeout = self.config.pipe_idle_timeout
        if not timeout:
            return 0
        cutoff = self._mono() - timeout
        idle = [
            found
            for found in self._private.values()
            if isinstance(found, Pipe)
            and not found.pinned
            and found.accessed <= cutoff
            and not found.waiting
            and not found.demand
        ]
        for pipe in idle:
            log.info("idle pipe collected", extra={"messages": len(pipe.messages)})
            self.delete_pipe(pipe, "idle")
        self.counters.collected += len(idle)
        return len(idle)

    def sweep(self) -> int:
        """Background upkeep: leases that ran out, idle pipes (Q1), coalesced events and
        staged contents past their TTL (M4); returns how many staged contents went."""
        self.sweep_leases()
        self.collect_idle()
        if self.events is not None:
            self.events.flush()  # coalesced events whose interval has passed
        return self.expire_staged()

    # ------------------------------------------------------------ what there is now
    def census(self) -> Census:
        """How many resources there are and how much they hold, right now: one scan of
        every resource (for a metrics scrape, never the hot path)."""
        pipes: dict[str, int] = {}
        feeds = len(self.public_feeds)
        joins = messages = on_disk = deepest = 0
        queued = sum(len(feed.queue) for feed in self.public_feeds.values())
        for found in self._private.values():
            if type(found) is Pipe:  # exact classes: twice as fast as isinstance chains
                pipes[found.type] = pipes.get(found.type, 0) + 1
                held = len(found.messages)
                messages += held
                on_disk += found.spilled
                deepest = max(deepest, held + found.spilled)
            elif type(found) is Join:
                joins += 1
            elif type(found) is Feed:
                feeds += 1
                queued += len(found.queue)
        return Census(
            feeds=feeds,
            pipes=pipes,
            joins=joins,
            messages=messages,
            on_disk=on_disk,
            deepest=deepest,
            queued=queued,
            staged_bytes=self._staged_bytes,
            held_bytes=self.held,
        )


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Census:
    """What :meth:`Engine.census` counted."""

    feeds: int  # public and private
    pipes: dict[str, int]  # by pipe type
    joins: int  # default joins included
    messages: int  # held in pipes, in memory
    on_disk: int  # held in pipes, waiting on disk past the memory budget
    deepest: int  # the most messages one pipe holds (memory and disk)
    queued: int  # waiting in rotator and service feeds' queues
    staged_bytes: int  # staged contents not yet referenced
    held_bytes: int  # estimated bytes of the messages pipes hold in memory
