"""Resources: creating, changing and deleting feeds, pipes and joins (RestMS C1-C9,
R2-R5, F10-F16, P4-P5), with the journal records the store commits and the quotas'
counts. Over the engine's
:class:`~feeds.catalogue.Catalogue`; theory of operation in :mod:`feeds.engine`.
"""

from __future__ import annotations

import dataclasses
import logging
import secrets

from restms import names
from restms.errors import BadRequest, Forbidden
from restms.specs import FeedSpec, JoinSpec, PipeOptions, PipeSpec, Update

from .catalogue import Catalogue
from .config import DEFAULT_FEED, OVERHEAD, FeedConfig
from .model import (
    Domain,
    Feed,
    Join,
    Pipe,
    PipeSettings,
    alive,
)
from .placement import Placement
from .routing import INDEXED_TYPES, QUEUEING_TYPES, matcher
from .staging import Staging, release
from .store import dumps
from .webhook import apply_change

log = logging.getLogger(__name__)


class Resources:
    """The catalogue's feeds, pipes and joins, changed as RestMS says."""

    def __init__(self, state: Catalogue, placement: Placement, staging: Staging) -> None:
        self.state = state
        self.placement = placement
        self.staging = staging
        config = state.config
        first = next(iter(state.domains))
        default = FeedConfig(
            name=DEFAULT_FEED, type=config.default_feed_type, title="Default feed", domain=first
        )
        configured = [default, *config.feeds]
        dead_letter = config.dead_letter_feed
        if dead_letter and all(feed.name != dead_letter for feed in configured):
            configured.append(
                FeedConfig(name=dead_letter, type="rotator", title="Dead letters", domain=first)
            )
        if config.system_feed:  # management events (feeds.events), the gateway's
            system = FeedConfig(
                name=config.system_feed,
                type=config.system_feed_type,
                title="System events",
                domain=first,
            )
            configured.append(system)
        for feed in configured:
            self.configure(feed)
        state.default_feed = state.public_feeds[DEFAULT_FEED]

    def configure(self, cfg: FeedConfig) -> None:
        domain = self.state.domain(cfg.domain)
        spec = FeedSpec(name=cfg.name, type=cfg.type, title=cfg.title, license=cfg.license)
        if cfg.name in self.state.public_feeds:
            raise ValueError(f"feed {cfg.name!r} is configured twice")
        feed = self._new_feed(domain, spec, owner="", configured=True)
        log.debug("configured feed %s type=%r", feed.key, feed.type)

    def pin(self, pipe: Pipe, pinned: bool) -> None:
        """A reader that makes no requests (a bridge) holds the pipe: while pinned it is
        never collected as idle (Q1); unpinned, its idle time starts now."""
        pipe.pinned = pinned
        pipe.accessed = self.state.mono()

    # ------------------------------------------------------------ feeds
    def create_feed(self, domain: Domain, spec: FeedSpec, owner: str) -> tuple[Feed, bool]:
        """C1-C5: a public feed is idempotent (existing -> created False, C3, C4)."""
        if spec.name is not None:
            existing = self.state.public_feeds.get(spec.name)
            if existing is not None:
                return existing, False
        feed = self._new_feed(domain, spec, owner, configured=False)
        if self.state.events is not None:
            self.state.events.feed_event("created", feed)
        return feed, True

    def _new_feed(self, domain: Domain, spec: FeedSpec, owner: str, configured: bool) -> Feed:
        now = self.state.wall()
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
        self.register(feed, now)
        if not configured:
            self._log_feed(feed)
        return feed

    def register(self, feed: Feed, now: float) -> None:
        if not feed.configured:  # created by a principal, now or before a restart
            self.state.feeds_of[feed.owner] += 1
        if feed.public:
            self.state.public_feeds[feed.key] = feed
            feed.domain.feeds[feed.key] = feed
            feed.domain.touch(now)
        else:
            self.state.private[feed.key] = feed

    def _log_feed(self, feed: Feed) -> None:
        if self.state.journal is not None:
            self.state.journal.append(
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
        feed.touch(self.state.wall())
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
        now = self.state.wall()
        feed.deleted = True
        if not feed.configured:
            release(self.state.feeds_of, feed.owner)
        if self.state.events is not None:
            self.state.events.feed_event("deleted", feed, reason)
        if self.state.journal is not None and not feed.configured:
            self.state.journal.append(("feed-", feed.key))
        for join in list(feed.joins.values()):
            self._unlink(join, now, cascade=False, reason="feed-deleted")
        for staged in list(feed.staged.values()):
            self.staging.delete_staged(staged)
        self.state.counters.discarded += len(feed.queue) + feed.qspilled
        self.state.held -= feed.queue_bytes + OVERHEAD * len(feed.queue)
        feed.queue.clear()
        feed.queue_bytes = feed.qspilled = feed.qspilled_bytes = 0
        if feed.public:
            self.state.public_feeds.pop(feed.key, None)
            feed.domain.feeds.pop(feed.key, None)
            feed.domain.touch(now)
        else:
            self.state.private.pop(feed.key, None)
        feed.wake()

    # ------------------------------------------------------------ pipes
    def create_pipe(self, domain: Domain, spec: PipeSpec, owner: str) -> Pipe:
        """C5, C9, F15, P5: a new private pipe; default and stream pipes join ``default``."""
        now = self.state.wall()
        key = names.new_hash()
        pipe = Pipe(key, spec.type, spec.title, domain, owner, now, self.settings(spec.options))
        pipe.accessed = self.state.mono()
        self.state.private[key] = pipe
        self.state.pipes_of[owner] += 1
        self.state.rejecting += pipe.overflow == "reject"
        self._log_pipe(pipe)
        if spec.type != "ondemand":
            self.link(pipe, self.state.default_feed, JoinSpec(feed_path="", address=key), True, now)
        if pipe.hook is not None:
            self.state.hooks[key] = pipe
            self.state.hook_news(pipe)
        if self.state.events is not None:
            self.state.events.pipe_event("created", pipe)
        return pipe

    def settings(self, options: PipeOptions, *, check: bool = True) -> PipeSettings:
        """A pipe's options with the defaults filled in; 400 for more than the maximums.

        Stored pipes are restored unchecked: a dead-letter feed that has gone since is
        looked for again when a message needs it.
        """
        config = self.state.config
        limits = (
            ("max_messages", options.max_messages, config.max_pipe_messages),
            ("max_bytes", options.max_bytes, config.max_pipe_bytes),
        )
        for name, asked, most in limits:
            if check and asked is not None and asked > most:
                raise BadRequest(f"pipe {name} may be at most {most}, not {asked}")
        if check and options.dead_letter and self.state.find_feed(options.dead_letter) is None:
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
            given = apply_change(pipe.hook, pipe.options.get("webhook"), change, self.state.config)
            if given is not None:
                pipe.options = {**pipe.options, "webhook": given}
                self.state.hook_moved(pipe)
                self.state.hook_news(pipe)
        pipe.title = update.title or None
        pipe.touch(self.state.wall())
        self._log_pipe(pipe)
        return pipe

    def _log_pipe(self, pipe: Pipe) -> None:
        if self.state.journal is not None:
            self.state.journal.append(
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
        now = self.state.wall()
        # its leased messages' entries are stale from now (feeds.leasing)
        self.state.stale_leases += sum(m.leased is not None for m in pipe.messages.values())
        pipe.deleted = True
        self.state.private.pop(pipe.key, None)
        release(self.state.pipes_of, pipe.owner)
        self.state.moved.pop(pipe, None)
        self.state.hooks_moved.discard(pipe)
        self.state.rejecting -= pipe.overflow == "reject"
        if self.state.journal is not None:
            self.state.journal.append(("pipe-", pipe.key))
        # Q1: work a queueing feed gave this pipe and nobody acknowledged goes back.
        requeued: set[Feed] = set()
        for message in reversed(pipe.messages.values()):
            source = message.source
            if source is not None and not source.deleted:
                self.placement.requeue(source, message)
                requeued.add(source)
                self.state.counters.requeued += 1
        self.state.held -= pipe.bytes + OVERHEAD * len(pipe.messages)
        pipe.messages.clear()
        pipe.bytes = pipe.spilled = pipe.spilled_bytes = 0
        for join in list(pipe.joins.values()):
            self._unlink(join, now, cascade=True, reason="pipe-deleted")
        for feed in requeued:
            self.placement.drain(feed)
        pipe.wake()
        if self.state.hooks.pop(pipe.key, None) is not None:
            self.state.hook_news(pipe)
        if self.state.events is not None:
            self.state.events.pipe_event("deleted", pipe, reason)

    # ------------------------------------------------------------ joins
    def create_join(self, pipe: Pipe, spec: JoinSpec) -> tuple[Join, bool]:
        """F10, F16, P4: a new join, or the identical one that exists (created False)."""
        alive(pipe)
        feed = self.state.feed_at(spec.feed_path)
        if feed is self.state.default_feed:
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
        join = self.link(pipe, feed, spec, False, self.state.wall())
        if self.state.events is not None:
            self.state.events.join_event("created", join)
        if feed.type in QUEUEING_TYPES:
            self.placement.drain(feed)
        return join, True

    def link(
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
        if self.state.journal is not None:
            headers = dumps(spec.headers).decode()
            self.state.journal.append(
                ("join", key, pipe.key, feed.key, spec.type, spec.address, headers, is_default)
            )
        feed.joins[key] = join
        feed.joined = tuple(feed.joins.values())
        if feed.type in INDEXED_TYPES:
            feed.by_address.setdefault(spec.address, []).append(join)
        feed.topic_cache.clear()
        feed.had_join = True
        pipe.joins[key] = join
        self.state.private[key] = join
        self.state.joins_of[pipe.owner] += 1
        pipe.touch(now)
        return join

    def delete_join(self, join: Join) -> None:
        """F16: the default join cannot go; a service feed may go with its last join (F8)."""
        if join.is_default:
            raise Forbidden("a pipe's default join cannot be deleted")
        self._unlink(join, self.state.wall(), cascade=True, reason="deleted")

    def _unlink(self, join: Join, now: float, *, cascade: bool, reason: str) -> None:
        if join.deleted:
            return
        join.deleted = True
        feed, pipe = join.feed, join.pipe
        if self.state.journal is not None:
            self.state.journal.append(("join-", join.key))
        feed.joins.pop(join.key, None)
        feed.joined = tuple(feed.joins.values())
        peers = feed.by_address.get(join.spec.address)
        if peers is not None and join in peers:
            peers.remove(join)
            if not peers:
                del feed.by_address[join.spec.address]
        feed.topic_cache.clear()
        pipe.joins.pop(join.key, None)
        self.state.private.pop(join.key, None)
        release(self.state.joins_of, pipe.owner)
        pipe.touch(now)
        join.wake()
        if self.state.events is not None:  # once gone, so the event does not reach its own pipe
            self.state.events.join_event("deleted", join, reason)
        if (
            cascade
            and feed.type == "service"
            and not feed.joins
            and not feed.deleted
            and not feed.configured
        ):
            self._drop_feed(feed, "last-join")
