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
import hashlib
import heapq
import itertools
import logging
import time
from collections.abc import Iterator, Sequence
from typing import Any

from restms import names
from restms.errors import BadRequest, Forbidden, NotFound, PayloadTooLarge, ServiceUnavailable
from restms.specs import (
    Duplicate,
    EmbeddedContent,
    FeedSpec,
    JoinSpec,
    LinkedContent,
    MessageSpec,
    PipeOptions,
    PipeSpec,
    Update,
)
from restms.uris import split_path

from .config import DEFAULT_FEED, OVERHEAD, Counters, EngineConfig, FeedConfig
from .dedup import DedupWindow
from .model import (
    Blob,
    Clock,
    Domain,
    Feed,
    Join,
    Message,
    OnDisk,
    Part,
    PartRef,
    Pipe,
    PipeSettings,
    Queued,
    Resource,
    Slot,
    StagedContent,
    Watchable,
)
from .routing import INDEXED_TYPES, QUEUEING_TYPES, matcher
from .selection import capacity, eligible, matching
from .store import (
    Op,
    Snapshot,
    decode_parts,
    dumps,
    epoch_of,
    loads,
    message_spec,
    persistent,
    record,
    redeliveries,
)

log = logging.getLogger(__name__)


class Engine:
    """The embedded engine. One instance per gateway, used from the event loop's thread."""

    def __init__(
        self,
        config: EngineConfig | None = None,
        *,
        wall: Clock = time.time,
        mono: Clock = time.monotonic,
    ) -> None:
        self.config = config or EngineConfig()
        self._wall = wall
        self._mono = mono
        self.counters = Counters()
        now = wall()
        self.domains: dict[str, Domain] = {
            name: Domain(name, title, now) for name, title in self.config.domains
        }
        self.public_feeds: dict[str, Feed] = {}
        self._private: dict[str, Feed | Pipe | Join | StagedContent] = {}
        self._staged_bytes = 0
        first = next(iter(self.domains))
        default = FeedConfig(
            name=DEFAULT_FEED,
            type=self.config.default_feed_type,
            title="Default feed",
            domain=first,
        )
        configured = [default, *self.config.feeds]
        dead_letter = self.config.dead_letter_feed
        if dead_letter and all(feed.name != dead_letter for feed in configured):
            configured.append(
                FeedConfig(name=dead_letter, type="rotator", title="Dead letters", domain=first)
            )
        for feed in configured:
            self._configure(feed)
        self.default_feed = self.public_feeds[DEFAULT_FEED]
        # Leases running (end, tie-break, pipe, message), soonest first; stale entries
        # (acknowledged or moved messages) are skipped when they come up.
        self._leases: list[tuple[float, int, Pipe, Message]] = []
        self._tick = itertools.count()
        self._rejecting = 0  # live pipes whose overflow policy is "reject"
        self.held = 0  # estimated bytes of the messages pipes hold in memory
        self.epoch = 0  # this run's number; non-persistent rows of other runs are stale
        # Durability (None until restore): records of changes, and pipes whose next
        # position has moved since the last look.
        self.journal: list[Op] | None = None
        self._moved: set[Pipe] = set()
        self.closing = False  # set by shutdown(): waits end with a retriable 503

    def _configure(self, cfg: FeedConfig) -> None:
        domain = self.domain(cfg.domain)
        spec = FeedSpec(name=cfg.name, type=cfg.type, title=cfg.title, license=cfg.license)
        if cfg.name in self.public_feeds:
            raise ValueError(f"feed {cfg.name!r} is configured twice")
        feed = self._new_feed(domain, spec, owner="", configured=True)
        log.debug("configured feed %s type=%r", feed.key, feed.type)

    # ------------------------------------------------------------ durability
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
            settings = self._settings(PipeOptions(**loads(options)), check=False)
            pipe = Pipe(key, type_, title, domain, owner, now, settings)
            pipe.next_seq = next_seq
            pipe.accessed = mono
            self._private[key] = pipe
            self._rejecting += pipe.overflow == "reject"
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
        for found in [*self.public_feeds.values(), *self._private.values()]:
            if isinstance(found, Feed) and found.queue:
                self._drain(found)  # pipes that can take queued work get it now

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
        message.size = _size(parts)
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

    def _feed_by_key(self, key: str) -> Feed | None:
        found = self.public_feeds.get(key) or self._private.get(key)
        return found if isinstance(found, Feed) else None

    def take_journal(self) -> list[Op]:
        """The records since the last call, with each moved pipe's next position."""
        ops, self.journal = self.journal or [], []
        if self._moved:
            ops.extend(("seq", pipe.next_seq, pipe.key) for pipe in self._moved)
            self._moved.clear()
        return ops

    def shutdown(self) -> None:
        """End every wait: asynclets and evented GETs answer 503 (retry), streams end."""
        self.closing = True
        for domain in self.domains.values():
            domain.wake()
        for resource in [*self.public_feeds.values(), *self._private.values()]:
            resource.wake()

    def check_open(self) -> None:
        """Raise the retriable 503 a wait answers once :meth:`shutdown` has begun."""
        if self.closing:
            raise ServiceUnavailable("the gateway is shutting down; retry", 1)

    # ------------------------------------------------------------ lookup
    def domain(self, name: str) -> Domain:
        try:
            return self.domains[name]
        except KeyError:
            raise NotFound(f"no domain named {name!r}") from None

    def public_feed(self, name: str) -> Feed:
        feed = self.public_feeds.get(name)
        if feed is None:
            raise NotFound(f"no feed named {name!r}")
        return feed

    def resolve(self, key: str) -> Resource:
        """The private resource ``/restms/resource/{key}`` names, or 404."""
        found = self._private.get(key)
        if found is not None:
            if isinstance(found, Pipe):
                found.accessed = self._mono()
            elif isinstance(found, Join):
                found.pipe.accessed = self._mono()
            return found
        pipe_key, dot, rest = key.partition(".")
        pipe = self._private.get(pipe_key) if dot else None
        if isinstance(pipe, Pipe):
            pipe.accessed = self._mono()
            seq_text, dot, index_text = rest.partition(".")
            if seq_text.isdigit() and (not dot or index_text.isdigit()):
                seq = int(seq_text)
                return PartRef(pipe, seq, int(index_text)) if dot else Slot(pipe, seq)
        raise NotFound("no such resource")

    def feed_at(self, path: str) -> Feed:
        """The feed a URI path names (join ``feed=``, U5); 400 when there is none (G14)."""
        where = split_path(path)
        feed: object = None
        if where is not None:
            kind, key = where
            if kind == "feed":
                feed = self.public_feeds.get(key)
            elif kind == "resource":
                feed = self._private.get(key)
        if not isinstance(feed, Feed):
            raise BadRequest(f"join names no existing feed: {path}")
        return feed

    # ------------------------------------------------------------ feeds
    def create_feed(self, domain: Domain, spec: FeedSpec, owner: str) -> tuple[Feed, bool]:
        """C1-C5: a public feed is idempotent (existing -> created False, C3, C4)."""
        if spec.name is not None:
            existing = self.public_feeds.get(spec.name)
            if existing is not None:
                return existing, False
        feed = self._new_feed(domain, spec, owner, configured=False)
        return feed, True

    def _new_feed(self, domain: Domain, spec: FeedSpec, owner: str, configured: bool) -> Feed:
        now = self._wall()
        key = spec.name if spec.name is not None else names.new_hash()
        feed = Feed(
            key=key,
            name=spec.name,
            type=spec.type,
            title=spec.title,
            license=spec.license,
            domain=domain,
            owner=owner,
            configured=configured,
            now=now,
        )
        self._register(feed, now)
        if not configured:
            self._log_feed(feed)
        return feed

    def _register(self, feed: Feed, now: float) -> None:
        if feed.public:
            self.public_feeds[feed.key] = feed
            feed.domain.feeds[feed.key] = feed
            feed.domain.touch(now)
        else:
            self._private[feed.key] = feed

    def _log_feed(self, feed: Feed) -> None:
        if self.journal is not None:
            self.journal.append(
                (
                    "feed",
                    feed.key,
                    feed.name,
                    feed.type,
                    feed.title,
                    feed.license,
                    feed.domain.name,
                    feed.owner,
                )
            )

    def update_feed(self, feed: Feed, update: Update) -> Feed:
        """R2, R3: title and license change; name and type may only be repeated."""
        _alive(feed)
        if feed.configured:
            raise Forbidden("configured feeds cannot be changed")
        if update.name and update.name != (feed.name or ""):
            raise Forbidden("a feed's name cannot be changed")
        if update.type and update.type != feed.type:
            raise Forbidden("a feed's type cannot be changed")
        feed.title = update.title or None
        feed.license = update.license or None
        feed.touch(self._wall())
        self._log_feed(feed)
        return feed

    def delete_feed(self, feed: Feed) -> None:
        """R5, Q29: joins and staged contents go; messages already in pipes stay."""
        if feed.configured:
            raise Forbidden("configured feeds cannot be deleted")
        self._drop_feed(feed)

    def _drop_feed(self, feed: Feed) -> None:
        if feed.deleted:
            return
        now = self._wall()
        feed.deleted = True
        if self.journal is not None and not feed.configured:
            self.journal.append(("feed-", feed.key))
        for join in list(feed.joins.values()):
            self._unlink(join, now, cascade=False)
        for staged in list(feed.staged.values()):
            self.delete_staged(staged)
        self.counters.discarded += len(feed.queue)
        feed.queue.clear()
        if feed.public:
            self.public_feeds.pop(feed.key, None)
            feed.domain.feeds.pop(feed.key, None)
            feed.domain.touch(now)
        else:
            self._private.pop(feed.key, None)
        feed.wake()

    # ------------------------------------------------------------ pipes
    def create_pipe(self, domain: Domain, spec: PipeSpec, owner: str) -> Pipe:
        """C5, C9, F15, P5: a new private pipe; default and stream pipes join ``default``."""
        now = self._wall()
        key = names.new_hash()
        pipe = Pipe(key, spec.type, spec.title, domain, owner, now, self._settings(spec.options))
        pipe.accessed = self._mono()
        self._private[key] = pipe
        self._rejecting += pipe.overflow == "reject"
        self._log_pipe(pipe)
        if spec.type != "ondemand":
            self._link(pipe, self.default_feed, JoinSpec(feed_path="", address=key), True, now)
        return pipe

    def _settings(self, options: PipeOptions, *, check: bool = True) -> PipeSettings:
        """A pipe's options with the defaults filled in; 400 for more than the maximums.

        Stored pipes are restored unchecked: a dead-letter feed that has gone since is
        looked for again when a message needs it.
        """
        config = self.config
        limits = (
            ("max_messages", options.max_messages, config.max_pipe_messages),
            ("max_bytes", options.max_bytes, config.max_pipe_bytes),
        )
        for name, asked, most in limits:
            if check and asked is not None and asked > most:
                raise BadRequest(f"pipe {name} may be at most {most}, not {asked}")
        if check and options.dead_letter and self._feed_at(options.dead_letter) is None:
            raise BadRequest(f"pipe dead_letter names no existing feed: {options.dead_letter}")
        return PipeSettings(
            durable=bool(options.durable),
            lease=config.lease if options.lease is None else options.lease,
            max_deliveries=options.max_deliveries or config.max_deliveries,
            dead_letter=options.dead_letter,
            max_messages=options.max_messages or config.max_pipe_messages,
            max_bytes=options.max_bytes or config.max_pipe_bytes,
            overflow=options.overflow or config.overflow,
            given=options.given(),
        )

    def update_pipe(self, pipe: Pipe, update: Update) -> Pipe:
        """L8: a PUT on a pipe may change its title, nothing else."""
        _alive(pipe)
        if update.type is not None and update.type not in ("", pipe.type, "fifo"):
            raise Forbidden("a pipe's type cannot be changed")
        pipe.title = update.title or None
        pipe.touch(self._wall())
        self._log_pipe(pipe)
        return pipe

    def _log_pipe(self, pipe: Pipe) -> None:
        if self.journal is not None:
            self.journal.append(
                (
                    "pipe",
                    pipe.key,
                    pipe.type,
                    pipe.title,
                    pipe.domain.name,
                    pipe.owner,
                    dumps(pipe.options).decode(),
                )
            )

    def delete_pipe(self, pipe: Pipe) -> None:
        """R5: joins, messages and contents go; waiting GETs get 404 (A6)."""
        if pipe.deleted:
            return
        now = self._wall()
        pipe.deleted = True
        self._private.pop(pipe.key, None)
        self._moved.discard(pipe)
        self._rejecting -= pipe.overflow == "reject"
        if self.journal is not None:
            self.journal.append(("pipe-", pipe.key))
        # Q1: work a queueing feed gave this pipe and nobody acknowledged goes back.
        requeued: set[Feed] = set()
        for message in reversed(pipe.messages.values()):
            source = message.source
            if source is not None and not source.deleted:
                self._requeue(source, message)
                requeued.add(source)
                self.counters.requeued += 1
        self.held -= pipe.bytes + OVERHEAD * len(pipe.messages)
        pipe.messages.clear()
        pipe.bytes = pipe.spilled = pipe.spilled_bytes = 0
        for join in list(pipe.joins.values()):
            self._unlink(join, now, cascade=True)
        for feed in requeued:
            self._drain(feed)
        pipe.wake()

    # ------------------------------------------------------------ joins
    def create_join(self, pipe: Pipe, spec: JoinSpec) -> tuple[Join, bool]:
        """F10, F16, P4: a new join, or the identical one that exists (created False)."""
        _alive(pipe)
        feed = self.feed_at(spec.feed_path)
        if feed is self.default_feed:
            default = next((j for j in pipe.joins.values() if j.is_default), None)
            if default is not None and spec.address == pipe.key and not spec.headers:
                return default, False
            raise Forbidden("the default feed takes no joins besides each pipe's default join")
        if pipe.type == "ondemand" and feed.type not in QUEUEING_TYPES:
            raise Forbidden("ondemand pipes may only join rotator or service feeds")
        identity = (feed.key, spec.type, spec.address, tuple(sorted(spec.headers)))
        for join in pipe.joins.values():
            if join.feed is feed and (feed.key, *join.spec.identity[1:]) == identity:
                return join, False
        join = self._link(pipe, feed, spec, False, self._wall())
        if feed.type in QUEUEING_TYPES:
            self._drain(feed)
        return join, True

    def _link(
        self,
        pipe: Pipe,
        feed: Feed,
        spec: JoinSpec,
        is_default: bool,
        now: float,
        key: str | None = None,
    ) -> Join:
        match = matcher(feed.type, spec.address, spec.headers)
        key = key or names.new_hash()
        join = Join(key, pipe, feed, spec, match, is_default, now)
        if self.journal is not None:
            headers = dumps(spec.headers).decode()
            self.journal.append(
                ("join", key, pipe.key, feed.key, spec.type, spec.address, headers, is_default)
            )
        feed.joins[key] = join
        if feed.type in INDEXED_TYPES:
            feed.by_address.setdefault(spec.address, []).append(join)
        feed.topic_cache.clear()
        feed.had_join = True
        pipe.joins[key] = join
        self._private[key] = join
        pipe.touch(now)
        return join

    def delete_join(self, join: Join) -> None:
        """F16: the default join cannot go; a service feed may go with its last join (F8)."""
        if join.is_default:
            raise Forbidden("a pipe's default join cannot be deleted")
        self._unlink(join, self._wall(), cascade=True)

    def _unlink(self, join: Join, now: float, *, cascade: bool) -> None:
        if join.deleted:
            return
        join.deleted = True
        feed, pipe = join.feed, join.pipe
        if self.journal is not None:
            self.journal.append(("join-", join.key))
        feed.joins.pop(join.key, None)
        peers = feed.by_address.get(join.spec.address)
        if peers is not None and join in peers:
            peers.remove(join)
            if not peers:
                del feed.by_address[join.spec.address]
        feed.topic_cache.clear()
        pipe.joins.pop(join.key, None)
        self._private.pop(join.key, None)
        pipe.touch(now)
        join.wake()
        if (
            cascade
            and feed.type == "service"
            and not feed.joins
            and not feed.deleted
            and not feed.configured
        ):
            self._drop_feed(feed)

    # ------------------------------------------------------------ contents
    def stage(self, feed: Feed, data: bytes, content_type: str, owner: str) -> StagedContent:
        """M1: keep an opaque body until a message references it, or its TTL ends (M4)."""
        _alive(feed)
        if self._staged_bytes + len(data) > self.config.max_staged_bytes:
            raise ServiceUnavailable("too many staged contents are waiting; retry later", 5)
        key = names.new_hash()
        staged = StagedContent(
            key,
            feed,
            Blob(data, content_type),
            owner,
            self._wall(),
            self._mono() + self.config.staged_ttl,
        )
        feed.staged[key] = staged
        self._private[key] = staged
        self._staged_bytes += len(data)
        self.counters.staged += 1
        return staged

    def delete_staged(self, staged: StagedContent) -> None:
        if staged.deleted:
            return
        staged.deleted = True
        staged.feed.staged.pop(staged.key, None)
        self._private.pop(staged.key, None)
        self._staged_bytes -= len(staged.blob.data)
        staged.wake()

    def sweep(self) -> int:
        """Background upkeep: leases that ran out, idle pipes (Q1) and staged contents
        past their TTL (M4); returns how many staged contents went."""
        self.sweep_leases()
        self.collect_idle()
        now = self._mono()
        expired = [
            s for s in self._private.values() if isinstance(s, StagedContent) and s.expires <= now
        ]
        for staged in expired:
            self.delete_staged(staged)
        self.counters.staged_expired += len(expired)
        return len(expired)

    # ------------------------------------------------------------ publish
    def publish(self, feed: Feed, messages: Sequence[MessageSpec]) -> list[int]:
        """Route messages in order; returns the join count for each (F18, F20).

        A message whose ``message_id`` the feed routed within the dedup window is not
        routed again: its count is a :class:`Duplicate` of the first one's.
        """
        _alive(feed)
        window = self._window(feed) if self.config.dedup_window else None
        ids = [spec.prop("message_id") for spec in messages] if window is not None else []
        repeats = self._repeats(window, ids)
        if feed.type in QUEUEING_TYPES:
            would_queue = len(messages) - len(repeats) - capacity(feed)
            if would_queue > 0 and len(feed.queue) + would_queue > self.config.max_feed_queue:
                raise ServiceUnavailable(
                    f"feed {feed.name or '(private)'} has {len(feed.queue)} of "
                    f"{self.config.max_feed_queue} messages queued and no pipe to take "
                    f"{would_queue} more; retry later",
                    1,
                )
        elif self._rejecting:
            self._check_room(feed, messages, repeats)
        parts = self._claim_contents(feed, messages, repeats)
        now, mono = self._wall(), self._mono()
        counts: list[int] = []
        for index, (spec, part) in enumerate(zip(messages, parts, strict=True)):
            message_id = ids[index] if ids else None
            if index in repeats:
                assert window is not None
                assert message_id
                counts.append(Duplicate(window.get(message_id, mono) or 0))
                continue
            count = self._route(feed, spec, part, now, persistent(spec), _size(part))
            counts.append(count)
            if message_id:
                assert window is not None
                window.add(message_id, count, mono)
        self.counters.published += len(messages) - len(repeats)
        self.counters.duplicates += len(repeats)
        return counts

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

    def _check_room(self, feed: Feed, messages: Sequence[MessageSpec], skip: set[int]) -> None:
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
                        f"a message of {size} bytes is larger than pipe {_label(pipe)} "
                        f"accepts ({pipe.max_bytes} bytes)"
                    )
                wanted = need.setdefault(pipe, [0, 0])
                wanted[0] += 1
                wanted[1] += size
        for pipe, (count, size) in need.items():
            held, held_bytes = len(pipe.messages) + pipe.spilled, pipe.bytes + pipe.spilled_bytes
            if held + count > pipe.max_messages or held_bytes + size > pipe.max_bytes:
                self.counters.rejected_full += 1
                raise ServiceUnavailable(
                    f"pipe {_label(pipe)} is full ({held} of {pipe.max_messages} "
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
        self, feed: Feed, messages: Sequence[MessageSpec], skip: set[int]
    ) -> list[list[Part | None]]:
        """M8-M10: check every reference first; only then use the staged contents up.

        Repeated messages (``skip``) are not routed, so their references are not used.
        """
        claimed: dict[str, StagedContent] = {}
        out: list[list[Part | None]] = []
        for index, spec in enumerate(messages):
            parts: list[Part | None] = []
            out.append(parts)
            if skip and index in skip:
                continue
            for content in spec.contents:
                if not isinstance(content, LinkedContent):
                    parts.append(content)
                    continue
                staged = self._staged_at(content.path)
                if staged is None or staged.key in claimed:
                    raise NotFound(f"staged content {content.path} does not exist or was used")
                if staged.feed is not feed:
                    raise Forbidden(f"staged content {content.path} belongs to another feed")
                claimed[staged.key] = staged
                parts.append(staged.blob)
        for staged in claimed.values():
            self.delete_staged(staged)
        return out

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
        parts: list[Part | None],
        now: float,
        durable: bool,
        size: int,
        redeliveries: int = 0,
    ) -> int:
        if feed.type in QUEUEING_TYPES:
            join = eligible(feed)
            if join is None:
                self._enqueue(feed, (spec, parts, None, redeliveries), durable, front=False)
                self.counters.queued += 1
                return 0
            self._deliver(join.pipe, spec, parts, feed, now, durable, size, redeliveries)
            return 1
        joins = matching(feed, spec)
        if not joins:
            return 0
        count = 0
        # A pipe gets one copy however many of its joins match; each matching join counts.
        took: set[Pipe] | None = None if len(joins) == 1 else set()
        for join in joins:
            pipe = join.pipe
            if took is not None and pipe in took:
                count += 1
                continue
            if pipe.full(size) and (
                pipe.overflow != "drop-oldest" or not self._make_room(pipe, size)
            ):
                self.counters.skipped_full += 1
                continue
            count += 1
            if took is not None:
                took.add(pipe)
            self._deliver(pipe, spec, parts, feed, now, durable, size, redeliveries)
        return count

    def _make_room(self, pipe: Pipe, size: int) -> bool:
        """Overflow policy "drop-oldest": drop the oldest messages (counted) until one of
        ``size`` bytes fits; False when it never could."""
        if size > pipe.max_bytes:
            return False
        while pipe.messages and pipe.full(size):  # the oldest are in memory, never on disk
            self._drop(pipe, next(iter(pipe.messages)))
            self.counters.dropped_oldest += 1
        return not pipe.full(size)

    def _deliver(
        self,
        pipe: Pipe,
        spec: MessageSpec,
        parts: list[Part | None],
        feed: Feed,
        now: float,
        durable: bool,
        size: int,
        redeliveries: int = 0,
    ) -> None:
        source = feed if feed.type in QUEUEING_TYPES else None
        message = Message(0, spec, list(parts), feed.name, source, now)
        message.size = size
        message.durable = durable
        message.redeliveries = redeliveries
        ttl = spec.prop("expiration")
        if ttl is not None:
            message.expires = self._mono() + int(ttl) / 1000
        self.counters.routed += 1
        self._place(pipe, message, now)

    def _place(self, pipe: Pipe, message: Message, now: float) -> None:
        """Give the message the pipe's next position: held in memory, or on disk past
        the memory budget. New messages and redelivered ones both come through here."""
        message.seq = pipe.next_seq
        pipe.next_seq += 1
        message.durable = message.durable or pipe.durable
        if self.journal is not None:
            self._moved.add(pipe)
            budget = self.config.memory_budget
            if budget and (pipe.spilled or self.held + message.size + OVERHEAD > budget):
                self._spill(pipe, message)
                pipe.touch(now)
                return
            if message.durable:
                self._log_message(pipe, message)
        self._hold(pipe, message)
        pipe.touch(now)

    def _hold(self, pipe: Pipe, message: Message) -> None:
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
        self._deliver(pipe, spec, parts, feed, self._wall(), durable, _size(parts), redelivered)

    def _drain(self, feed: Feed) -> None:
        """F8: hand queued messages to eligible pipes, in order."""
        while feed.queue and not feed.deleted:
            join = eligible(feed)
            if join is None:
                return
            self._hand_out(feed, join.pipe)

    # ------------------------------------------------------------ delivery
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
            self._drop(pipe, seq)
        pipe.expiring = sum(m.expires is not None for m in pipe.messages.values())
        if expired:
            self.counters.expired += len(expired)
            pipe.touch(self._wall())

    def _drop(self, pipe: Pipe, seq: int) -> Message:
        """Take one message out of its pipe (expired, overflowed or redelivered)."""
        message = self._unhold(pipe, seq)
        if self.journal is not None:  # durable, or read back from disk: a row to delete
            self.journal.append(("drop", pipe.key, seq))
        return message

    # ------------------------------------------------------------ leases
    def lease(self, pipe: Pipe, message: Message) -> None:
        """A reader fetched this message: unless it is acknowledged within the pipe's
        lease, it is delivered again (or dead-lettered after ``max_deliveries``)."""
        if pipe.lease <= 0 or message.leased is not None or pipe.deleted:
            return
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
        source = message.source
        if message.redeliveries >= pipe.max_deliveries:
            self._dead_letter(pipe, message, now)
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

    def _dead_letter(self, pipe: Pipe, message: Message, now: float) -> None:
        """Publish the message to the pipe's dead-letter feed, with headers saying why."""
        path = pipe.dead_letter
        target: Feed | None
        if path is None:
            target = self.public_feeds.get(self.config.dead_letter_feed)
        else:
            target = self._feed_at(path) if path else None
        spec = dataclasses.replace(
            message.spec,
            headers=(
                *message.spec.headers,
                ("x-death-reason", "max-deliveries"),
                ("x-delivery-count", str(message.redeliveries)),
                ("x-original-feed", message.feed_name or ""),
            ),
        )
        full = (
            target is not None
            and target.type in QUEUEING_TYPES
            and eligible(target) is None
            and len(target.queue) >= self.config.max_feed_queue
        )
        if target is None or target.deleted or full:
            self.counters.dead_discarded += 1
            log.warning("a dead letter had nowhere to go and was discarded")
            return
        self._route(target, spec, message.parts, now, message.durable, message.size)
        self.counters.dead_lettered += 1

    def _feed_at(self, path: str) -> Feed | None:
        try:
            return self.feed_at(path)
        except BadRequest:
            return None

    # ------------------------------------------------------------ idle pipes
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
            and found.accessed <= cutoff
            and not found.waiting
            and not found.demand
        ]
        for pipe in idle:
            log.info("idle pipe collected", extra={"messages": len(pipe.messages)})
            self.delete_pipe(pipe)
        self.counters.collected += len(idle)
        return len(idle)

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
            if ondemand:
                pipe.demand += 1
            try:
                if not await pipe.changed(deadline - self._mono()):
                    return None
            finally:
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
        removed = 0
        messages = pipe.messages
        while messages:
            oldest = next(iter(messages))
            if oldest > slot.seq:
                break
            self._unhold(pipe, oldest)
            removed += 1
        if removed:
            self.counters.acknowledged += removed
            if self.journal is not None:
                self.journal.append(("ack", pipe.key, slot.seq))
            pipe.touch(self._wall())
            for join in list(pipe.joins.values()):
                if join.feed.queue:
                    self._drain(join.feed)
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
            message.parts[ref.index] = None
            gone = _size([part])
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


def _alive(resource: Watchable) -> None:
    """Requests that awaited their body may find the resource deleted meanwhile (Q29)."""
    if resource.deleted:
        raise NotFound("the resource was deleted")


def _size(parts: Sequence[Part | None]) -> int:
    """Content bytes of a message, as pipe byte limits count them."""
    total = 0
    for part in parts:
        if part is None:
            continue
        total += len(part.data) if isinstance(part, Blob) else len(part.value)
    return total


def _label(pipe: Pipe) -> str:
    """How replies to others name a pipe: its title and a digest of its name, never the
    name itself, which is the pipe's capability."""
    digest = hashlib.sha256(pipe.key.encode()).hexdigest()[:12]
    return f"{pipe.title!r} (sha256 {digest})" if pipe.title else f"sha256 {digest}"
