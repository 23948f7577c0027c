"""Engine configuration and counters."""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field

from restms.errors import BadRequest
from restms.names import check_name
from restms.specs import OVERFLOW_POLICIES, FeedSpec, check_text
from restms.webhook import WebhookLimits

DEFAULT_FEED = "default"
DEFAULT_DOMAIN = "default"
DEAD_LETTER_FEED = "dead-letter"
SYSTEM_FEED = "restms.system"  # management events (docs/EVENTS.md)
# What a message held in memory costs beyond its content bytes (objects, the pipe's
# index), as the memory budget counts it: measured, see docs/DURABILITY.md.
OVERHEAD = 1000


@dataclass(frozen=True, slots=True, kw_only=True)
class FeedConfig:
    """A feed the configuration declares: it always exists and clients cannot change it."""

    name: str
    type: str = ""
    title: str | None = None
    license: str | None = None
    domain: str = DEFAULT_DOMAIN

    def __post_init__(self) -> None:
        try:
            FeedSpec(name=self.name, type=self.type, title=self.title, license=self.license)
        except BadRequest as exc:
            raise ValueError(f"configured feed {self.name!r}: {exc.reason}") from exc


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineConfig:
    domains: tuple[tuple[str, str], ...] = ((DEFAULT_DOMAIN, "Default domain"),)
    feeds: tuple[FeedConfig, ...] = ()
    default_feed_type: str = ""  # "direct" for older clients (L4)
    # Per-pipe limits (Q2) and what a full pipe does: the defaults, and the most a pipe
    # may ask for. "skip" leaves a full pipe out, "reject" fails the publish (503),
    # "drop-oldest" makes room.
    max_pipe_messages: int = 10_000
    max_pipe_bytes: int = 64 * 1024 * 1024
    overflow: str = "skip"
    max_feed_queue: int = 10_000  # F8, Q22
    max_feed_queue_bytes: int = 64 * 1024 * 1024  # the sizes of a feed's queued messages
    listing_cap: int = 1_000  # A8
    staged_ttl: float = 300.0  # M4
    max_staged_bytes: int = 256 * 1024 * 1024
    max_staged_bytes_per_principal: int = 64 * 1024 * 1024  # one principal's share of it
    # Acknowledgement leases: seconds a fetched message may stay unacknowledged before
    # it is delivered again (0: never), and how many deliveries before dead-lettering.
    lease: float = 300.0
    max_deliveries: int = 5
    dead_letter_feed: str = DEAD_LETTER_FEED  # "": dead letters are discarded (counted)
    # The feed management events are published on ("": none), its type ("topic":
    # joins select on the address; "headers": on the event's headers), and the seconds
    # within which repeated events about one object are coalesced into one.
    system_feed: str = SYSTEM_FEED
    system_feed_type: str = "topic"
    events_interval: float = 10.0
    pipe_idle_timeout: float = 600.0  # Q1: idle private pipes are collected (0: never)
    # Deduplication per feed on message_id: seconds and ids remembered (0 seconds: off).
    dedup_window: float = 600.0
    dedup_max: int = 10_000
    # Bytes of pipe and feed-queue messages to hold in memory (their size plus OVERHEAD
    # each); past it, new pipe and feed-queue messages wait on disk (0: no budget; only
    # with a store).
    memory_budget: int = 64 * 1024 * 1024
    webhooks: WebhookLimits = field(default_factory=WebhookLimits)  # webhook pipes

    def __post_init__(self) -> None:
        if not self.domains:
            raise ValueError("at least one domain is needed")
        positive = "max_pipe_messages max_pipe_bytes max_feed_queue listing_cap max_deliveries"
        for key in (*positive.split(), "dedup_max", "max_feed_queue_bytes"):
            if getattr(self, key) < 1:
                raise ValueError(f"{key} must be positive")
        for key in (
            "lease",
            "pipe_idle_timeout",
            "dedup_window",
            "max_staged_bytes",
            "max_staged_bytes_per_principal",
            "memory_budget",
        ):
            if getattr(self, key) < 0:
                raise ValueError(f"{key} must not be negative")
        if self.staged_ttl <= 0:
            raise ValueError("staged_ttl must be positive")
        if self.dead_letter_feed:
            if self.dead_letter_feed == DEFAULT_FEED:
                raise ValueError("dead_letter_feed cannot be the default feed")
            try:
                check_name(self.dead_letter_feed, "feed")
            except BadRequest as exc:
                raise ValueError(f"dead_letter_feed: {exc.reason}") from exc
        if self.system_feed:
            if self.system_feed in (DEFAULT_FEED, self.dead_letter_feed):
                raise ValueError("system_feed must be a feed of its own")
            try:
                check_name(self.system_feed, "feed")
            except BadRequest as exc:
                raise ValueError(f"system_feed: {exc.reason}") from exc
            if any(feed.name == self.system_feed for feed in self.feeds):
                raise ValueError(f"feed {self.system_feed!r} is the system feed: configure it so")
        if self.system_feed_type not in ("topic", "headers"):
            raise ValueError('system_feed_type must be "topic" or "headers"')
        if self.events_interval <= 0:
            raise ValueError("events_interval must be positive")
        if self.overflow not in OVERFLOW_POLICIES:
            raise ValueError(f"overflow must be one of {', '.join(sorted(OVERFLOW_POLICIES))}")
        names = [name for name, _ in self.domains]
        if len(set(names)) != len(names):
            raise ValueError("a domain is declared twice")
        for name, title in self.domains:
            try:
                check_text(title, "domain", "title")
            except BadRequest as exc:
                raise ValueError(f"domain {name!r}: {exc.reason}") from exc
        seen = {DEFAULT_FEED}
        for feed in self.feeds:
            if feed.name in seen:
                raise ValueError(f"feed {feed.name!r} is configured twice (or is the default feed)")
            if feed.domain not in names:
                raise ValueError(f"feed {feed.name!r} names unknown domain {feed.domain!r}")
            seen.add(feed.name)


@dataclass(slots=True)
class Counters:
    published: int = 0
    routed: int = 0
    queued: int = 0
    skipped_full: int = 0
    acknowledged: int = 0
    staged: int = 0
    staged_expired: int = 0
    requeued: int = 0
    discarded: int = 0
    expired: int = 0
    dropped_oldest: int = 0  # overflow "drop-oldest" made room
    rejected_full: int = 0  # publishes refused by a full "reject" pipe
    redelivered: int = 0  # leases that ran out
    dead_lettered: int = 0
    dead_discarded: int = 0  # dead letters with nowhere to go
    duplicates: int = 0  # message_ids seen again within the window
    collected: int = 0  # idle pipes collected (Q1)
    spilled: int = 0  # messages that went to disk past the memory budget
    paged_in: int = 0  # messages read back from disk
    delivered: int = 0  # copies handed to readers and webhook receivers (bridges count their own)
    hook_delivered: int = 0  # webhook deliveries the receiver took (2xx)
    hook_failed: int = 0  # webhook attempts that failed (tried again later)
    hook_dead: int = 0  # webhook messages given up on (dead-lettered or discarded)
    withdrawn: int = 0  # copies of publishes whose commit failed, taken back unread


# Upper bounds (seconds) of the delivery latency histogram: from a message's arrival in
# its pipe to a copy of it handed to a reader.
LATENCY_BOUNDS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 60.0, 300.0, 3600.0)


class Latency:
    """A histogram in plain ints (one thread writes it, a scrape reads it): a bisect and
    two additions an observation, no lock."""

    __slots__ = ("counts", "total")

    def __init__(self) -> None:
        self.counts = [0] * (len(LATENCY_BOUNDS) + 1)  # the last: above every bound
        self.total = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect_left(LATENCY_BOUNDS, seconds)] += 1
        self.total += seconds
