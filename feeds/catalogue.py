"""The embedded engine's state: one object that owns every piece of data the engine
keeps (theory of operation in :mod:`feeds.engine`).

The engine's collaborators (:mod:`feeds.resources`, :mod:`feeds.publishing`,
:mod:`feeds.placement`, :mod:`feeds.reading`, :mod:`feeds.staging`,
:mod:`feeds.leasing`, :mod:`feeds.settling`, :mod:`feeds.recovery`) each do one thing
over this catalogue; none keeps state of its own that another reads. It holds data and
answers look-ups (a reader's look-up marks its pipe as used, Q1); it changes nothing
else.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING

from restms.errors import BadRequest, NotFound
from restms.uris import split_path

from .config import Counters, EngineConfig, Latency
from .deadlines import Deadlines
from .events import Events
from .mirroring import Sink, emit_pipe
from .model import Clock, Domain, Feed, Join, Message, PartRef, Pipe, Resource, Slot, StagedContent
from .store import Op

if TYPE_CHECKING:
    from .settling import Unsettled


class Catalogue:
    """Domains, feeds, pipes, joins and staged contents, their indexes and counters,
    the journal the store commits, and the engine's outlets (mirror, system feed,
    webhook and paging news). Used from the event loop's thread only."""

    def __init__(
        self,
        config: EngineConfig | None = None,
        *,
        wall: Clock = time.time,
        mono: Clock = time.monotonic,
    ) -> None:
        self.config = config or EngineConfig()
        self.wall = wall  # UTC, for what is shown or stored
        self.mono = mono  # for timeouts, leases and idle times
        self.counters = Counters()
        self.latency = Latency()  # from arrival in a pipe to each delivery (GET /metrics)
        now = wall()
        self.domains: dict[str, Domain] = {
            name: Domain(name, title, now) for name, title in self.config.domains
        }
        self.public_feeds: dict[str, Feed] = {}
        # Private feeds, pipes, joins and staged contents, by key (their URIs' names).
        self.private: dict[str, Feed | Pipe | Join | StagedContent] = {}
        self.default_feed: Feed  # set once the configured feeds are made (Resources)
        self.staged_bytes = 0
        # Feeds, pipes, joins and staged bytes each principal holds, for the
        # per-principal quotas.
        self.feeds_of: Counter[str] = Counter()
        self.pipes_of: Counter[str] = Counter()
        self.joins_of: Counter[str] = Counter()
        self.staged_of: Counter[str] = Counter()
        self.rejecting = 0  # live pipes whose overflow policy is "reject"
        self.held = 0  # estimated bytes of the messages pipes and queues hold in memory
        self.epoch = 0  # this run's number; non-persistent rows of other runs are stale
        # Durability (None until restore): records of changes, and pipes whose next
        # position has moved since the last look (with the first position placed since).
        self.journal: list[Op] | None = None
        self.moved: dict[Pipe, int] = {}
        # Leases running (end, tie-break, pipe, message), soonest first; stale entries
        # (acknowledged or moved messages) are skipped when they come up. An entry
        # holds its pipe and message alive until then (the whole lease, 300 s by
        # default), so stale entries are counted as they arise and the heap rebuilt
        # once they are more than half of it (feeds.leasing).
        self.leases: list[tuple[float, int, Pipe, Message]] = []
        self.stale_leases = 0
        self.lease_tick = itertools.count()  # ties between leases that end at once
        # Publishes held back until their commit (feeds.settling): the journal not
        # handed over yet, and those whose transaction is under way; the pipes and
        # feeds a transaction settled, shown again once every batch of it is settled.
        self.unsettled: list[Unsettled] = []
        self.committing: list[Unsettled] = []
        self.settled: tuple[set[Pipe], set[Feed]] | None = None
        self.closing = False  # set by shutdown(): waits end with a retriable 503
        self.deadlines = Deadlines()  # when the asynclets waiting now stop waiting
        # Webhook pipes, and whoever delivers them: told when one is made, changed or
        # deleted. Their delivery state changed since the last journal is written lazily.
        self.hooks: dict[str, Pipe] = {}
        self.hooks_moved: set[Pipe] = set()
        # Pipes whose acknowledged or lost position moved since the last journal
        # (written lazily, as positions are).
        self.marked: set[Pipe] = set()
        self.on_hook: Callable[[Pipe], None] | None = None
        # Whoever reads feed queues' pages back from disk (gateway/restms/spill.py): told
        # when a feed's queue runs empty in memory while messages of it wait on disk.
        self.on_queue_page: Callable[[Feed], None] | None = None
        # The traffic mirror's sink (feeds.mirroring), or None: the mirror is off.
        self.mirror: Sink | None = None
        # The system feed's publisher (feeds.events), or None: management events are off.
        self.events: Events | None = None

    # ------------------------------------------------------------ look-ups
    def domain(self, name: str) -> Domain:
        try:
            return self.domains[name]
        except KeyError:
            raise NotFound(f"no domain named {name!r}") from None

    def public_feed(self, name: str) -> Feed:
        try:
            return self.public_feeds[name]
        except KeyError:
            raise NotFound(f"no feed named {name!r}") from None

    def feed_by_key(self, key: str) -> Feed | None:
        found = self.public_feeds.get(key) or self.private.get(key)
        return found if isinstance(found, Feed) else None

    def feed_at(self, path: str) -> Feed:
        """The feed a URI path names (join ``feed=``, U5); 400 when there is none (G14)."""
        where = split_path(path)
        feed: object = None
        if where is not None:
            kind, key = where
            if kind == "feed":
                feed = self.public_feeds.get(key)
            elif kind == "resource":
                feed = self.private.get(key)
        if not isinstance(feed, Feed):
            raise BadRequest(f"join names no existing feed: {path}")
        return feed

    def find_feed(self, path: str) -> Feed | None:
        """:meth:`feed_at`, or None when the path names no feed."""
        try:
            return self.feed_at(path)
        except BadRequest:
            return None

    def staged_at(self, path: str) -> StagedContent | None:
        """The staged content a URI path names, or None."""
        where = split_path(path)
        if where is None or where[0] != "resource":
            return None
        found = self.private.get(where[1])
        return found if isinstance(found, StagedContent) else None

    def resolve(self, key: str) -> Resource:
        """The private resource ``/restms/resource/{key}`` names, or 404."""
        found = self.private.get(key)
        if found is not None:
            if isinstance(found, Pipe):
                found.accessed = self.mono()
            elif isinstance(found, Join):
                found.pipe.accessed = self.mono()
            return found
        pipe_key, dot, rest = key.partition(".")
        pipe = self.private.get(pipe_key) if dot else None
        if isinstance(pipe, Pipe):
            pipe.accessed = self.mono()
            seq_text, dot, index_text = rest.partition(".")
            if seq_text.isdigit() and (not dot or index_text.isdigit()):
                seq = int(seq_text)
                return PartRef(pipe, seq, int(index_text)) if dot else Slot(pipe, seq)
        raise NotFound("no such resource")

    def owned_feeds(self, owner: str) -> int:
        """How many feeds ``owner`` created, public and private (for its quota)."""
        return self.feeds_of[owner]

    def owned_pipes(self, owner: str) -> int:
        """How many pipes ``owner`` has (for its quota)."""
        return self.pipes_of[owner]

    def pipes_owned_by(self, owner: str) -> list[Pipe]:
        """The pipes ``owner`` has (a scan: for start-up, never the hot path)."""
        if not self.pipes_of[owner]:
            return []
        return [p for p in self.private.values() if isinstance(p, Pipe) and p.owner == owner]

    def private_resources(self) -> list[Feed | Pipe | Join | StagedContent]:
        """Every private feed, pipe, join and staged content (a scan: for the admin
        resource, never the hot path)."""
        return list(self.private.values())

    def peek(self, key: str) -> Feed | Pipe | Join | StagedContent | None:
        """The private resource named ``key``, or None; unlike :meth:`resolve`, an
        admin's look does not count as use, so an idle pipe stays idle (Q1)."""
        return self.private.get(key)

    def owned_joins(self, owner: str) -> int:
        """How many joins ``owner``'s pipes have, default joins included."""
        return self.joins_of[owner]

    # ------------------------------------------------------------ what there is now
    def census(self) -> Census:
        """How many resources there are and how much they hold, right now: one scan of
        every resource (for a metrics scrape, never the hot path)."""
        pipes: dict[str, int] = {}
        feeds = len(self.public_feeds)
        joins = messages = on_disk = deepest = 0
        queued = queued_bytes = queued_on_disk = 0
        for feed in self.public_feeds.values():
            queued += len(feed.queue) + feed.qspilled
            queued_bytes += feed.queue_bytes + feed.qspilled_bytes
            queued_on_disk += feed.qspilled
        for found in self.private.values():
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
                queued += len(found.queue) + found.qspilled
                queued_bytes += found.queue_bytes + found.qspilled_bytes
                queued_on_disk += found.qspilled
        return Census(
            feeds=feeds,
            pipes=pipes,
            joins=joins,
            messages=messages,
            on_disk=on_disk,
            deepest=deepest,
            queued=queued,
            queued_bytes=queued_bytes,
            queued_on_disk=queued_on_disk,
            staged_bytes=self.staged_bytes,
            held_bytes=self.held,
        )

    # ------------------------------------------------------------ outlets
    def mirrored(
        self,
        kind: str,
        pipe: Pipe,
        message: Message,
        outcome: str = "ok",
        *,
        latency: bool = False,
        bridge: str | None = None,
    ) -> None:
        """Offer the mirror an event about a message in a pipe (:mod:`feeds.mirroring`),
        when it is on."""
        if self.mirror is not None:
            emit_pipe(
                self.mirror,
                kind,
                self.wall(),
                pipe,
                message,
                self.public_feeds,
                outcome,
                latency=latency,
                bridge=bridge,
            )

    def hook_moved(self, pipe: Pipe) -> None:
        """A webhook pipe's delivery state changed: its document (H7) and its record."""
        if self.journal is not None and not pipe.deleted:
            self.hooks_moved.add(pipe)
        pipe.touch(self.wall())

    def acked(self, pipe: Pipe, seq: int) -> None:
        """Position ``seq`` and everything older were acknowledged (D4)."""
        if seq > pipe.acked:
            pipe.acked = seq
            if self.journal is not None:
                self.marked.add(pipe)

    def lost(self, pipe: Pipe, seq: int) -> None:
        """The message at ``seq`` left the pipe unacknowledged, never to be delivered
        again (expired, dropped by overflow, dead-lettered): a reader that resumes
        before it is told (:class:`feeds.values.Gap`)."""
        if seq > pipe.lost:
            pipe.lost = seq
            if self.journal is not None:
                self.marked.add(pipe)

    def hook_news(self, pipe: Pipe) -> None:
        """Tell whoever delivers webhook pipes that this one was made, changed or went."""
        if pipe.hook is not None and self.on_hook is not None:
            self.on_hook(pipe)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Census:
    """What :meth:`Catalogue.census` counted."""

    feeds: int  # public and private
    pipes: dict[str, int]  # by pipe type
    joins: int  # default joins included
    messages: int  # held in pipes, in memory
    on_disk: int  # held in pipes, waiting on disk past the memory budget
    deepest: int  # the most messages one pipe holds (memory and disk)
    queued: int  # waiting in rotator and service feeds' queues, memory and disk
    queued_bytes: int  # their sizes (those in memory part of held_bytes, with their overhead)
    queued_on_disk: int  # of them, waiting on disk past the memory budget
    staged_bytes: int  # staged contents not yet referenced
    held_bytes: int  # estimated bytes of the messages pipes and feed queues hold in memory
