"""The engine's base: resources (feeds, pipes, joins, staged contents) and their
lookup, with the journal the store commits. Placing messages in pipes and rotator
queues is its own base, :class:`feeds.placement.Placement`.

:class:`feeds.delivery.Delivery` adds publishing and reading on top, and
:class:`feeds.engine.Engine` recovery, leases and idle collection; the theory of
operation is in :mod:`feeds.engine`.
"""

from __future__ import annotations

import dataclasses
import logging
import secrets
import time
from collections import Counter
from collections.abc import Callable

from restms import names
from restms.errors import BadRequest, Forbidden, NotFound, ServiceUnavailable
from restms.specs import FeedSpec, JoinSpec, PipeOptions, PipeSpec, Update
from restms.uris import split_path

from .config import DEFAULT_FEED, OVERHEAD, Counters, EngineConfig, FeedConfig
from .deadlines import Deadlines
from .events import Events
from .mirroring import Copies, Sink, emit_pipe
from .model import (
    Clock,
    Domain,
    Feed,
    Join,
    Message,
    PartRef,
    Pipe,
    PipeSettings,
    Resource,
    Slot,
    StagedContent,
    alive,
)
from .placement import Placement
from .routing import INDEXED_TYPES, QUEUEING_TYPES, matcher
from .staging import Staging
from .store import Op, dumps
from .webhook import apply_change

log = logging.getLogger(__name__)


class Core(Staging, Placement):
    """Resources and their lookup, used from the event loop's thread (placing messages
    is :class:`feeds.placement.Placement`)."""

    # ------------------------------------------------------------ set-up
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
        # Pipes and joins each principal holds, for the per-principal quotas.
        self._pipes_of: Counter[str] = Counter()
        self._joins_of: Counter[str] = Counter()
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
        if self.config.system_feed:  # management events (feeds.events), the gateway's
            system = FeedConfig(
                name=self.config.system_feed,
                type=self.config.system_feed_type,
                title="System events",
                domain=first,
            )
            configured.append(system)
        for feed in configured:
            self._configure(feed)
        self.default_feed = self.public_feeds[DEFAULT_FEED]
        self._rejecting = 0  # live pipes whose overflow policy is "reject"
        self.held = 0  # estimated bytes of the messages pipes hold in memory
        self.epoch = 0  # this run's number; non-persistent rows of other runs are stale
        # Durability (None until restore): records of changes, and pipes whose next
        # position has moved since the last look.
        self.journal: list[Op] | None = None
        self._moved: set[Pipe] = set()
        self.closing = False  # set by shutdown(): waits end with a retriable 503
        self.deadlines = Deadlines()  # when the asynclets waiting now stop waiting
        # Webhook pipes, and whoever delivers them: told when one is made, changed or
        # deleted. Their delivery state changed since the last journal is written lazily.
        self.hooks: dict[str, Pipe] = {}
        self.on_hook: Callable[[Pipe], None] | None = None
        # What the publish under way did with its copies, for its request record
        # (feeds.mirroring.Copies), while a publish of several messages is mirrored.
        self._copies: Copies | None = None
        # While a publish routes with the mirror on: the pipe of each copy placed
        # (Placement._deliver), to be mirrored with the publish as one record:
        # ``_copies.pipes``, or a publish of one message's list for its one copy
        # (Delivery._publish_alone, feeds.mirroring.emit_routed). None when each copy's
        # route event is a tuple of its own.
        self._placed: list[Pipe] | None = None
        # The traffic mirror's sink (feeds.mirroring), or None: the mirror is off.
        self.mirror: Sink | None = None
        # The system feed's publisher (feeds.events), or None: management events are off.
        self.events: Events | None = None
        self._hooks_moved: set[Pipe] = set()

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
            now, feeds = self._wall(), self.public_feeds
            emit_pipe(
                self.mirror,
                kind,
                now,
                pipe,
                message,
                feeds,
                outcome,
                latency=latency,
                bridge=bridge,
            )

    def _configure(self, cfg: FeedConfig) -> None:
        domain = self.domain(cfg.domain)
        spec = FeedSpec(name=cfg.name, type=cfg.type, title=cfg.title, license=cfg.license)
        if cfg.name in self.public_feeds:
            raise ValueError(f"feed {cfg.name!r} is configured twice")
        feed = self._new_feed(domain, spec, owner="", configured=True)
        log.debug("configured feed %s type=%r", feed.key, feed.type)

    # ------------------------------------------------------------ durability and shutdown
    def _feed_by_key(self, key: str) -> Feed | None:
        found = self.public_feeds.get(key) or self._private.get(key)
        return found if isinstance(found, Feed) else None

    def take_journal(self) -> list[Op]:
        """The records since the last call, with each moved pipe's next position."""
        ops, self.journal = self.journal or [], []
        if self._moved:
            ops.extend(("seq", pipe.next_seq, pipe.key) for pipe in self._moved)
            self._moved.clear()
        if self._hooks_moved:
            for pipe in self._hooks_moved:
                if pipe.hook is not None:
                    ops.append(("hook", pipe.key, dumps(pipe.hook.record())))
            self._hooks_moved.clear()
        return ops

    def hook_moved(self, pipe: Pipe) -> None:
        """A webhook pipe's delivery state changed: its document (H7) and its record."""
        if self.journal is not None and not pipe.deleted:
            self._hooks_moved.add(pipe)
        pipe.touch(self._wall())

    def _hook_news(self, pipe: Pipe) -> None:
        if pipe.hook is not None and self.on_hook is not None:
            self.on_hook(pipe)

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
        try:
            return self.public_feeds[name]
        except KeyError:
            raise NotFound(f"no feed named {name!r}") from None

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

    def _feed_at(self, path: str) -> Feed | None:
        try:
            return self.feed_at(path)
        except BadRequest:
            return None

    def owned_pipes(self, owner: str) -> int:
        """How many pipes ``owner`` has (for its quota)."""
        return self._pipes_of[owner]

    def pin(self, pipe: Pipe, pinned: bool) -> None:
        """A reader that makes no requests (a bridge) holds the pipe: while pinned it is
        never collected as idle (Q1); unpinned, its idle time starts now."""
        pipe.pinned = pinned
        pipe.accessed = self._mono()

    def pipes_of(self, owner: str) -> list[Pipe]:
        """The pipes ``owner`` has (a scan: for start-up, never the hot path)."""
        if not self._pipes_of[owner]:
            return []
        return [p for p in self._private.values() if isinstance(p, Pipe) and p.owner == owner]

    def private_resources(self) -> list[Feed | Pipe | Join | StagedContent]:
        """Every private feed, pipe, join and staged content (a scan: for the admin
        resource, never the hot path)."""
        return list(self._private.values())

    def peek(self, key: str) -> Feed | Pipe | Join | StagedContent | None:
        """The private resource named ``key``, or None; unlike :meth:`resolve`, an
        admin's look does not count as use, so an idle pipe stays idle (Q1)."""
        return self._private.get(key)

    def owned_joins(self, owner: str) -> int:
        """How many joins ``owner``'s pipes have, default joins included."""
        return self._joins_of[owner]

    @staticmethod
    def _release(counts: Counter[str], owner: str) -> None:
        left = counts[owner] - 1
        if left > 0:
            counts[owner] = left
        else:
            counts.pop(owner, None)

    # ------------------------------------------------------------ feeds
    def create_feed(self, domain: Domain, spec: FeedSpec, owner: str) -> tuple[Feed, bool]:
        """C1-C5: a public feed is idempotent (existing -> created False, C3, C4)."""
        if spec.name is not None:
            existing = self.public_feeds.get(spec.name)
            if existing is not None:
                return existing, False
        feed = self._new_feed(domain, spec, owner, configured=False)
        if self.events is not None:
            self.events.feed_event("created", feed)
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
        alive(feed)
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
        self._drop_feed(feed, "deleted")

    def _drop_feed(self, feed: Feed, reason: str) -> None:
        if feed.deleted:
            return
        now = self._wall()
        feed.deleted = True
        if self.events is not None:
            self.events.feed_event("deleted", feed, reason)
        if self.journal is not None and not feed.configured:
            self.journal.append(("feed-", feed.key))
        for join in list(feed.joins.values()):
            self._unlink(join, now, cascade=False, reason="feed-deleted")
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
        self._pipes_of[owner] += 1
        self._rejecting += pipe.overflow == "reject"
        self._log_pipe(pipe)
        if spec.type != "ondemand":
            self._link(pipe, self.default_feed, JoinSpec(feed_path="", address=key), True, now)
        if pipe.hook is not None:
            self.hooks[key] = pipe
            self._hook_news(pipe)
        if self.events is not None:
            self.events.pipe_event("created", pipe)
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
        webhook = options.webhook
        if webhook is not None and webhook.secret is None:
            # shown once, in the reply to the create; kept with what the client gave
            webhook = dataclasses.replace(webhook, secret=secrets.token_urlsafe(32))
            options = dataclasses.replace(options, webhook=webhook)
        return PipeSettings(
            durable=bool(options.durable),
            lease=config.lease if options.lease is None else options.lease,
            max_deliveries=options.max_deliveries or config.max_deliveries,
            dead_letter=options.dead_letter,
            max_messages=options.max_messages or config.max_pipe_messages,
            max_bytes=options.max_bytes or config.max_pipe_bytes,
            overflow=options.overflow or config.overflow,
            webhook=None if webhook is None else config.webhooks.fill(webhook, clamp=not check),
            given=options.given(),
        )

    def update_pipe(self, pipe: Pipe, update: Update) -> Pipe:
        """L8: a PUT on a pipe may change its title and, on a webhook pipe, its
        callback, secret and delivery options (400 before anything changes)."""
        alive(pipe)
        if update.type is not None and update.type not in ("", pipe.type, "fifo"):
            raise Forbidden("a pipe's type cannot be changed")
        change = update.webhook
        if change is not None:  # 400 before anything changes
            given = apply_change(pipe.hook, pipe.options.get("webhook"), change, self.config)
            if given is not None:
                pipe.options = {**pipe.options, "webhook": given}
                self.hook_moved(pipe)
                self._hook_news(pipe)
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

    def delete_pipe(self, pipe: Pipe, reason: str = "deleted") -> None:
        """R5: joins, messages and contents go; waiting GETs get 404 (A6). ``reason``
        is what the ``pipe.deleted`` event says (an idle pipe is "idle")."""
        if pipe.deleted:
            return
        now = self._wall()
        pipe.deleted = True
        self._private.pop(pipe.key, None)
        self._release(self._pipes_of, pipe.owner)
        self._moved.discard(pipe)
        self._hooks_moved.discard(pipe)
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
            self._unlink(join, now, cascade=True, reason="pipe-deleted")
        for feed in requeued:
            self._drain(feed)
        pipe.wake()
        if self.hooks.pop(pipe.key, None) is not None:
            self._hook_news(pipe)
        if self.events is not None:
            self.events.pipe_event("deleted", pipe, reason)

    # ------------------------------------------------------------ joins
    def create_join(self, pipe: Pipe, spec: JoinSpec) -> tuple[Join, bool]:
        """F10, F16, P4: a new join, or the identical one that exists (created False)."""
        alive(pipe)
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
        if self.events is not None:
            self.events.join_event("created", join)
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
        feed.joined = tuple(feed.joins.values())
        if feed.type in INDEXED_TYPES:
            feed.by_address.setdefault(spec.address, []).append(join)
        feed.topic_cache.clear()
        feed.had_join = True
        pipe.joins[key] = join
        self._private[key] = join
        self._joins_of[pipe.owner] += 1
        pipe.touch(now)
        return join

    def delete_join(self, join: Join) -> None:
        """F16: the default join cannot go; a service feed may go with its last join (F8)."""
        if join.is_default:
            raise Forbidden("a pipe's default join cannot be deleted")
        self._unlink(join, self._wall(), cascade=True, reason="deleted")

    def _unlink(self, join: Join, now: float, *, cascade: bool, reason: str) -> None:
        if join.deleted:
            return
        join.deleted = True
        feed, pipe = join.feed, join.pipe
        if self.journal is not None:
            self.journal.append(("join-", join.key))
        feed.joins.pop(join.key, None)
        feed.joined = tuple(feed.joins.values())
        peers = feed.by_address.get(join.spec.address)
        if peers is not None and join in peers:
            peers.remove(join)
            if not peers:
                del feed.by_address[join.spec.address]
        feed.topic_cache.clear()
        pipe.joins.pop(join.key, None)
        self._private.pop(join.key, None)
        self._release(self._joins_of, pipe.owner)
        pipe.touch(now)
        join.wake()
        if self.events is not None:  # once gone, so the event does not reach its own pipe
            self.events.join_event("deleted", join, reason)
        if (
            cascade
            and feed.type == "service"
            and not feed.joins
            and not feed.deleted
            and not feed.configured
        ):
            self._drop_feed(feed, "last-join")
