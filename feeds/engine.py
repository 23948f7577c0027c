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
  Past the memory budget, the queue's newer messages wait on disk, behind those in
  memory, and are read back a page at a time (:meth:`Engine.queue_page_in`).
  Messages a deleted pipe never acknowledged go back to the front of their queue (Q1).
* A **service feed** deletes itself when its last join goes (F8).
* **Durability.** After :meth:`Engine.restore` the engine keeps a journal of what it
  changes (:mod:`feeds.store`): resources, and persistent messages (``delivery_mode``
  2) delivered to a pipe or queued in a feed, acknowledgements and expiries. The
  gateway commits the journal before it replies. Non-persistent messages stay in
  memory only; each pipe's next position is written lazily so positions never repeat.

Composition
-----------
:class:`Engine` is a facade over one state and the collaborators that work on it,
each a module about one thing:

* :class:`~feeds.catalogue.Catalogue` owns every piece of data: domains, feeds, pipes,
  joins, staged contents, the per-principal counts, counters, the journal, the leases,
  the publishes held back for their commit and the outlets (mirror, system feed,
  webhook and paging news), and answers look-ups and the census.
* :class:`~feeds.resources.Resources` creates, changes and deletes feeds, pipes and
  joins; :class:`~feeds.staging.Staging` keeps staged contents and lets a publish
  claim them.
* :class:`~feeds.publishing.Publishing` checks and routes a publish;
  :class:`~feeds.placement.Placement` puts messages in pipes and queues (memory or
  disk) and takes them out; :class:`~feeds.settling.Settling` holds a publish back
  until its commit.
* :class:`~feeds.reading.Reading` serves readers (listings, asynclets, acks,
  contents); :class:`~feeds.leasing.Leasing` what follows a delivery (leases,
  redelivery, dead letters, webhook outcomes).
* :class:`~feeds.recovery.Recovery` rebuilds the catalogue from the store's snapshot
  and reads pages back from disk.

What one publish carries (the mirror's record of its copies, the repeats it answered,
the staged contents it used) is handed from call to call, never kept on an object.

The engine knows nothing of HTTP; it raises :mod:`restms.errors` exceptions.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Iterator, Sequence
from typing import Any

from restms.specs import FeedSpec, JoinSpec, MessageSpec, PipeSpec, Update

from .catalogue import Catalogue, Census
from .config import Counters, EngineConfig, Latency
from .deadlines import Deadlines
from .events import Events
from .leasing import Leasing
from .mirroring import Sink
from .model import (
    Blob,
    Clock,
    Domain,
    Feed,
    Join,
    Message,
    PartRef,
    Pipe,
    Resource,
    Slot,
    StagedContent,
)
from .placement import Placement
from .publishing import Publishing
from .reading import Reading
from .recovery import Recovery
from .resources import Resources
from .settling import Settling, Submit, Unsettled, take_journal
from .staging import Staging
from .store import Op, Snapshot

log = logging.getLogger(__name__)


class Engine:
    """The embedded engine. One instance per gateway, used from the event loop's thread.

    A facade: its methods are its collaborators' (theory above), its attributes the
    catalogue's."""

    def __init__(self, config: EngineConfig | None = None, **clocks: Clock) -> None:
        """``clocks``: ``wall`` and ``mono``, as :class:`~feeds.catalogue.Catalogue`
        takes them (tests give their own)."""
        state = self.state = Catalogue(config, **clocks)
        self.staging = Staging(state)
        self.placement = Placement(state)
        self.resources = Resources(state, self.placement, self.staging)
        self.publishing = Publishing(state, self.placement, self.staging)
        self.settling = Settling(state, self.publishing, self.placement, self.staging)
        self.reading = Reading(state, self.placement)
        self.leasing = Leasing(state, self.placement, self.publishing)
        self.recovery = Recovery(state, self.resources, self.placement, self.publishing)
        # The catalogue's containers, under the names the engine's users know (the
        # same objects: none of them is ever replaced).
        self.config: EngineConfig = state.config
        self.counters: Counters = state.counters
        self.latency: Latency = state.latency
        self.domains: dict[str, Domain] = state.domains
        self.public_feeds: dict[str, Feed] = state.public_feeds
        self.default_feed: Feed = state.default_feed
        self.deadlines: Deadlines = state.deadlines
        self.hooks: dict[str, Pipe] = state.hooks
        self.unsettled: list[Unsettled] = state.unsettled
        self._private = state.private  # (tests look at it)
        self._staged_of = state.staged_of
        # Called with many arguments by the engine's users: the collaborators' own.
        self.mirrored = state.mirrored
        self.dead_letter = self.leasing.dead_letter
        name = state.config.system_feed
        if name:
            state.events = Events(
                state.public_feeds[name],
                self.publishing.route,
                interval=state.config.events_interval,
                wall=state.wall,
                mono=state.mono,
            )

    # ------------------------------------------------------------ the catalogue's values
    @property
    def held(self) -> int:
        """Estimated bytes of the messages pipes and feed queues hold in memory."""
        return self.state.held

    @property
    def epoch(self) -> int:
        return self.state.epoch

    @property
    def journal(self) -> list[Op] | None:
        """Records of changes for the store (None until :meth:`restore`)."""
        return self.state.journal

    @journal.setter
    def journal(self, journal: list[Op] | None) -> None:
        self.state.journal = journal

    @property
    def closing(self) -> bool:
        return self.state.closing

    @property
    def mirror(self) -> Sink | None:
        """The traffic mirror's sink (feeds.mirroring), or None: the mirror is off."""
        return self.state.mirror

    @mirror.setter
    def mirror(self, sink: Sink | None) -> None:
        self.state.mirror = sink

    @property
    def events(self) -> Events | None:
        """The system feed's publisher (feeds.events), or None: events are off."""
        return self.state.events

    @property
    def on_hook(self) -> Callable[[Pipe], None] | None:
        """Told when a webhook pipe is made, changed or deleted."""
        return self.state.on_hook

    @on_hook.setter
    def on_hook(self, news: Callable[[Pipe], None] | None) -> None:
        self.state.on_hook = news

    @property
    def on_queue_page(self) -> Callable[[Feed], None] | None:
        """Told when a feed's queue runs empty in memory while messages wait on disk."""
        return self.state.on_queue_page

    @on_queue_page.setter
    def on_queue_page(self, want: Callable[[Feed], None] | None) -> None:
        self.state.on_queue_page = want

    # Each method below is its collaborator's (named in it), where its docstring is.

    # ------------------------------------------------------------ publishing and commit
    def publish(
        self, feed: Feed, messages: Sequence[MessageSpec], owner: str | None = None
    ) -> list[int]:
        """Route messages in order; the join count for each (:meth:`Settling.publish`)."""
        return self.settling.publish(feed, messages, owner)

    def commit_journal(self, submit: Submit) -> asyncio.Future[None] | None:
        """Hand the journal to the store (:meth:`Settling.commit_journal`)."""
        return self.settling.commit_journal(submit)

    def take_journal(self) -> list[Op]:
        """The records since the last call, with each moved pipe's next position."""
        return take_journal(self.state)

    # ------------------------------------------------------------ look-ups
    def domain(self, name: str) -> Domain:
        return self.state.domain(name)

    def public_feed(self, name: str) -> Feed:
        return self.state.public_feed(name)

    def feed_at(self, path: str) -> Feed:
        return self.state.feed_at(path)

    def resolve(self, key: str) -> Resource:
        return self.state.resolve(key)

    def peek(self, key: str) -> Feed | Pipe | Join | StagedContent | None:
        return self.state.peek(key)

    def private_resources(self) -> list[Feed | Pipe | Join | StagedContent]:
        return self.state.private_resources()

    def pipes_of(self, owner: str) -> list[Pipe]:
        return self.state.pipes_owned_by(owner)

    def owned_feeds(self, owner: str) -> int:
        return self.state.owned_feeds(owner)

    def owned_pipes(self, owner: str) -> int:
        return self.state.owned_pipes(owner)

    def owned_joins(self, owner: str) -> int:
        return self.state.owned_joins(owner)

    def pin(self, pipe: Pipe, pinned: bool) -> None:
        self.resources.pin(pipe, pinned)

    # ------------------------------------------------------------ resources
    def create_feed(self, domain: Domain, spec: FeedSpec, owner: str) -> tuple[Feed, bool]:
        return self.resources.create_feed(domain, spec, owner)

    def update_feed(self, feed: Feed, update: Update) -> Feed:
        return self.resources.update_feed(feed, update)

    def delete_feed(self, feed: Feed) -> None:
        self.resources.delete_feed(feed)

    def create_pipe(self, domain: Domain, spec: PipeSpec, owner: str) -> Pipe:
        return self.resources.create_pipe(domain, spec, owner)

    def update_pipe(self, pipe: Pipe, update: Update) -> Pipe:
        return self.resources.update_pipe(pipe, update)

    def delete_pipe(self, pipe: Pipe, reason: str = "deleted") -> None:
        self.resources.delete_pipe(pipe, reason)

    def create_join(self, pipe: Pipe, spec: JoinSpec) -> tuple[Join, bool]:
        return self.resources.create_join(pipe, spec)

    def delete_join(self, join: Join) -> None:
        self.resources.delete_join(join)

    def stage(self, feed: Feed, data: bytes, content_type: str, owner: str) -> StagedContent:
        return self.staging.stage(feed, data, content_type, owner)

    def expire_staged(self) -> int:
        return self.staging.expire_staged()

    def delete_staged(self, staged: StagedContent) -> None:
        self.staging.delete_staged(staged)

    # ------------------------------------------------------------ reading
    def listing(self, pipe: Pipe) -> tuple[list[Message], int | None]:
        return self.reading.listing(pipe)

    def message(self, slot: Slot) -> Message | None:
        return self.reading.message(slot)

    def pending(self, slot: Slot) -> bool:
        return self.reading.pending(slot)

    def present(self, slot: Slot) -> Message | None:
        return self.reading.present(slot)

    def wait_message(self, slot: Slot, timeout: float) -> Coroutine[Any, Any, Message | None]:
        # The reader's own coroutine, handed back: a facade's coroutine around it would
        # be one more frame for every read, and held by every waiting one.
        return self.reading.wait_message(slot, timeout)

    def ack(self, slot: Slot) -> int:
        return self.reading.ack(slot)

    def part(self, ref: PartRef) -> Blob:
        return self.reading.part(ref)

    def delete_part(self, ref: PartRef) -> None:
        self.reading.delete_part(ref)

    def stream(self, pipe: Pipe, after: int) -> Iterator[Message]:
        return self.reading.stream(pipe, after)

    def check_open(self) -> None:
        self.reading.check_open()

    # ------------------------------------------------------------ deliveries and leases
    def delivered(self, pipe: Pipe, message: Message, outcome: str = "ok") -> None:
        self.leasing.delivered(pipe, message, outcome)

    def lease(self, pipe: Pipe, message: Message) -> None:
        self.leasing.lease(pipe, message)

    def sweep_leases(self) -> int:
        return self.leasing.sweep()

    def settle(self, pipe: Pipe, message: Message) -> None:
        self.leasing.settle(pipe, message)

    def hook_moved(self, pipe: Pipe) -> None:
        self.state.hook_moved(pipe)

    def hook_verified(self, pipe: Pipe, ok: bool, status: str, error: str) -> None:
        self.leasing.hook_verified(pipe, ok, status, error)

    def hook_delivered(self, pipe: Pipe, message: Message, status: str) -> None:
        self.leasing.hook_delivered(pipe, message, status)

    def hook_failed(
        self, pipe: Pipe, message: Message, attempt: int, status: str, error: str, retry_at: float
    ) -> None:
        self.leasing.hook_failed(pipe, message, attempt, status, error, retry_at)

    def hook_give_up(self, pipe: Pipe, message: Message, reason: str) -> None:
        self.leasing.hook_give_up(pipe, message, reason)

    def hook_gone(self, pipe: Pipe, message: Message, status: str) -> None:
        self.leasing.hook_gone(pipe, message, status)

    def hook_forget(self, pipe: Pipe, seq: int) -> None:
        self.leasing.hook_forget(pipe, seq)

    # ------------------------------------------------------------ recovery
    def restore(self, snapshot: Snapshot) -> None:
        self.recovery.restore(snapshot)

    def page_in(self, pipe: Pipe, low: int, rows: list[tuple[int, Any, bytes]]) -> int:
        return self.recovery.page_in(pipe, low, rows)

    def queue_page_in(self, feed: Feed, low: int, rows: list[tuple[int, bytes]]) -> int:
        return self.recovery.queue_page_in(feed, low, rows)

    def leaving(self) -> None:
        self.recovery.leaving()

    def shutdown(self) -> None:
        """End every wait: asynclets and evented GETs answer 503 (retry), streams end."""
        state = self.state
        state.closing = True
        for domain in state.domains.values():
            domain.wake()
        for resource in [*state.public_feeds.values(), *state.private.values()]:
            resource.wake()

    # ------------------------------------------------------------ background upkeep
    def collect_idle(self) -> int:
        """Q1: delete private pipes no request touched for ``pipe_idle_timeout`` seconds
        and nobody waits on; their unacknowledged rotator/service work goes back."""
        state = self.state
        timeout = state.config.pipe_idle_timeout
        if not timeout:
            return 0
        cutoff = state.mono() - timeout
        idle = [
            found
            for found in state.private.values()
            if isinstance(found, Pipe)
            and not found.pinned
            and found.accessed <= cutoff
            and not found.waiting
            and not found.demand
        ]
        for pipe in idle:
            log.info("idle pipe collected", extra={"messages": len(pipe.messages)})
            self.delete_pipe(pipe, "idle")
        state.counters.collected += len(idle)
        return len(idle)

    def sweep(self) -> int:
        """Background upkeep: leases that ran out, idle pipes (Q1), coalesced events and
        staged contents past their TTL (M4); returns how many staged contents went."""
        self.leasing.sweep()
        self.collect_idle()
        if self.state.events is not None:
            self.state.events.flush()  # coalesced events whose interval has passed
        return self.staging.expire_staged()

    def census(self) -> Census:
        return self.state.census()
