"""The values that cross the engine service (:mod:`feeds.service`): immutable
snapshots, never live engine objects. Holding one keeps nothing alive in the engine;
the engine never changes one after handing it out.
"""

from __future__ import annotations

from dataclasses import dataclass

from restms.specs import Duplicate, EmbeddedContent, MessageSpec
from restms.webhook import WebhookOptions


# ---------------------------------------------------------------- resources
@dataclass(frozen=True, slots=True, kw_only=True)
class DomainInfo:
    name: str
    title: str
    feeds: tuple[str, ...]  # the public feeds listed in it (G13), by name
    version: int  # grows whenever its document would change (H7)
    modified: float  # wall-clock seconds (H2)


@dataclass(frozen=True, slots=True, kw_only=True)
class FeedInfo:
    key: str  # the public name, or the private hash
    name: str | None  # None: a private feed
    type: str
    title: str | None
    license: str | None
    domain: str
    owner: str  # "" for a configured feed
    configured: bool  # PUT and DELETE are refused (F17)
    default: bool  # the default feed, in every domain (F14, F15)
    system: bool  # the gateway's management events (docs/EVENTS.md): nobody publishes
    joins: int
    queued: int  # messages waiting in a rotator or service feed's queue (F8)
    version: int
    modified: float


@dataclass(frozen=True, slots=True, kw_only=True)
class JoinInfo:
    key: str
    pipe: str  # the pipe's key
    domain: str  # the pipe's domain
    feed: str  # the feed's key
    feed_public: bool  # whether ``feed`` is a public name (else a private hash)
    type: str
    address: str
    headers: tuple[tuple[str, str], ...]
    is_default: bool  # the pipe's join on the default feed (F15, F16)
    version: int
    modified: float


@dataclass(frozen=True, slots=True, kw_only=True)
class PipeInfo:
    key: str  # the pipe's name and the hash of its URI (U6)
    type: str
    title: str | None
    domain: str
    owner: str
    joins: tuple[JoinInfo, ...]
    held: int  # messages readers may see, in memory and on disk
    oldest: int | None  # the oldest position held, None when empty
    asynclet: int  # the position the next message takes (A3)
    # What a reader that resumes is told of (gap): the highest position acknowledged
    # (D4), and the highest whose message left the pipe unacknowledged and is never
    # delivered again (expired, dropped by overflow, dead-lettered, kept in memory
    # across a restart); 0 for none. Both only grow. (An engine that tracks no losses
    # leaves them 0: its readers are never told.)
    acked: int = 0
    lost: int = 0
    durable: bool
    lease: float  # seconds a read message may stay unacknowledged (0: forever)
    max_deliveries: int
    overflow: str  # "skip", "reject" or "drop-oldest" (Q2)
    max_messages: int
    max_bytes: int
    options: tuple[tuple[str, str], ...]  # what the client asked for, as text
    dead_letter: str  # the path of the feed its dead letters go to ("" for none)
    webhook: Webhook | None  # a webhook pipe's options and delivery state, else None
    progress: WebhookProgress | None  # and how its deliveries go
    version: int
    modified: float

    @property
    def earliest(self) -> int:
        """The oldest position a reader can be sent now: the oldest held, else the
        asynclet."""
        return self.asynclet if self.oldest is None else self.oldest

    def gap(self, position: int) -> Gap | None:
        """What a reader resuming at ``position`` (the next it wants: one past the last
        it was sent) lost, or None when no message at or after it left the pipe
        unacknowledged. Losses at or before the highest acknowledged position do not
        count: whoever acknowledged went past them. A message delivered again at a new
        position (a lease ran out) is not lost."""
        if position > self.lost or self.lost <= self.acked:
            return None
        return Gap(first=max(position, self.acked + 1), last=self.lost, earliest=self.earliest)


@dataclass(frozen=True, slots=True, kw_only=True)
class Gap:
    """Messages a resuming reader would have been sent that are gone unacknowledged
    (:meth:`PipeInfo.gap`): told as SSE's ``gap`` event and the WebSocket's ``gap``
    frame (docs/EXTENSIONS.md §3, Gaps). Only the positions that were lost are missing from
    ``first`` to ``last``; any still held there are sent as usual."""

    first: int  # the first position that may be missing
    last: int  # the last position lost
    earliest: int  # the oldest position the pipe holds now (its asynclet when none)


@dataclass(frozen=True, slots=True, kw_only=True)
class StagedInfo:
    key: str
    feed: str  # the feed's key
    feed_public: bool  # whether ``feed`` is a public name (else a private hash)
    domain: str  # the feed's domain
    content_type: str
    size: int
    owner: str
    modified: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Slot:
    """A message position, named by ``/restms/resource/{pipe}.{position}``."""

    pipe: str
    position: int
    domain: str = ""  # the pipe's (for the gateway's scope checks)
    pipe_type: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class ContentRef:
    """One delivered content, named by ``/restms/resource/{pipe}.{position}.{index}``."""

    pipe: str
    position: int
    index: int
    domain: str = ""  # the pipe's (for the gateway's scope checks)


Resource = FeedInfo | PipeInfo | JoinInfo | StagedInfo | Slot | ContentRef


# ---------------------------------------------------------------- messages
@dataclass(frozen=True, slots=True, kw_only=True)
class Blob:
    """The bytes of a staged or delivered content, with the publisher's type (D2)."""

    data: bytes
    content_type: str


# One content of a delivered message; None where the reader deleted it (D6).
Part = EmbeddedContent | Blob | None


@dataclass(frozen=True, slots=True, kw_only=True)
class Message:
    """A message held in a pipe at one position."""

    pipe: str
    position: int
    spec: MessageSpec  # address, properties, headers as published
    parts: tuple[Part, ...]
    feed: str | None  # the public feed it was published to (D8), None for a private one
    arrived: float  # wall-clock seconds
    redeliveries: int  # leases that ran out before it was acknowledged
    size: int  # what pipe byte limits count
    version: int  # grows as its contents are deleted
    # Its origin stamp: given once when it was published, the same in every pipe's copy
    # of that publish, never the same for two published messages (on any node, in any
    # run), kept across restarts, redeliveries and dead letters. Opaque, 20-22 URL-safe
    # characters. Never in a RestMS document: federation names a message that has no
    # message_id by it, so that one that comes by two paths is known again.
    stamp: str

    @property
    def modified(self) -> float:
        """When it last changed (H2): a message never does but for its contents."""
        return self.arrived


@dataclass(frozen=True, slots=True, kw_only=True)
class Listing:
    """A pipe's oldest messages (A8) and the asynclet, None when the listing is capped."""

    messages: tuple[Message, ...]
    asynclet: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class Placed:
    """Positions a publish gave messages in one pipe, first to last (the mirror's
    record of each copy)."""

    pipe: str
    first: int
    last: int


@dataclass(frozen=True, slots=True, kw_only=True)
class PublishResult:
    """What one publish did, message by message in the order posted."""

    # Joins matched whose pipe took it (F18); 0 when queued. A repeated message_id's
    # (not routed, its count the first's) is a restms.specs.Duplicate, an int.
    counts: tuple[int, ...]
    placed: tuple[Placed, ...]  # every pipe it placed copies in
    queued: int  # messages left waiting in a rotator or service feed's queue
    committed: bool  # whether it waited for a commit (it held persistent messages)

    @property
    def duplicates(self) -> tuple[bool, ...]:
        """Which messages repeated a message_id (made when asked: a reply to a client
        reads its counts alone)."""
        return tuple([isinstance(count, Duplicate) for count in self.counts])


# ---------------------------------------------------------------- statistics
@dataclass(frozen=True, slots=True, kw_only=True)
class Census:
    """What the engine holds right now (a scan: for a metrics scrape)."""

    feeds: int
    pipes: tuple[tuple[str, int], ...]  # by pipe type
    joins: int
    messages: int  # held in pipes, in memory and on disk
    on_disk: int
    deepest: int  # the most messages one pipe holds
    queued: int  # in rotator and service feeds' queues, in memory and on disk
    queued_bytes: int  # their sizes
    queued_on_disk: int  # of them, on disk
    staged_bytes: int
    held_bytes: int  # estimated bytes of the messages pipes and queues hold in memory
    webhook_pipes: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Histogram:
    """Observations by bucket: ``counts[i]`` fell under ``bounds[i]`` and above the bound
    before it; the last count, one more than there are bounds, above every bound."""

    bounds: tuple[float, ...]  # ascending upper bounds
    counts: tuple[int, ...]  # monotonic totals since start
    total: float  # the sum of every observation


@dataclass(frozen=True, slots=True, kw_only=True)
class StoreStats:
    """What the engine keeps its durable state in, and how its commits go."""

    kind: str  # "sqlite" for the embedded engine's store
    running: bool  # its writer runs
    failing: bool  # the last commit failed
    commits: int  # transactions committed, since start
    batches: int  # batches of changes committed (batches/commits: the group-commit factor)
    failures: int  # transactions rolled back
    commit_seconds: float  # time in transactions, failed ones included
    waiting: int  # batches waiting for the writer


@dataclass(frozen=True, slots=True, kw_only=True)
class Readiness:
    """Whether the engine can take traffic now (``GET /readyz``): why not, and what it
    looked at and found well (one line each)."""

    problems: tuple[str, ...]
    checked: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Stats:
    counters: tuple[tuple[str, int], ...]  # monotonic totals since start, by name
    census: Census
    latency: Histogram  # seconds from a message's arrival in its pipe to each delivery
    closing: bool  # shutdown has begun
    store: StoreStats | None  # None: an engine that keeps nothing (memory only)

    def counter(self, name: str) -> int:
        return dict(self.counters).get(name, 0)


@dataclass(frozen=True, slots=True, kw_only=True)
class WebhookState:
    """A webhook pipe's delivery state and totals (docs/WEBHOOKS.md)."""

    state: str
    delivered: int
    failures: int
    dead_lettered: int


@dataclass(frozen=True, slots=True, kw_only=True)
class WebhookProgress:
    """What a webhook pipe's document shows of its deliveries (docs/WEBHOOKS.md)."""

    attempts: int  # the most failed attempts at one message it holds
    next_attempt: float | None  # wall-clock seconds of the next retry due
    last_attempt: float | None  # wall-clock seconds
    last_status: str
    last_error: str


@dataclass(frozen=True, slots=True, kw_only=True)
class PipeState:
    """A pipe with what only the gateway's administrators are shown."""

    info: PipeInfo
    on_disk: int  # of ``info.held``, those on disk past the memory budget
    bytes: int  # what ``max_bytes`` counts, in memory and on disk
    waiting: int  # requests waiting on the pipe now (asynclets, streams)
    pinned: bool  # read by a bridge: never collected as idle
    webhook: WebhookState | None  # None for other pipe types


@dataclass(frozen=True, slots=True, kw_only=True)
class Owned:
    """How many resources a principal has, for its quotas."""

    feeds: int  # public and private, that it created
    pipes: int
    joins: int  # of its pipes, default joins included


@dataclass(frozen=True, slots=True, kw_only=True)
class Inventory:
    domains: int
    public_feeds: int
    private_feeds: int
    pipes: int
    joins: int  # default joins included
    staged: int


# webhooks
@dataclass(frozen=True, slots=True, kw_only=True)
class Webhook:
    """A webhook pipe as its delivery worker runs it."""

    pipe: str  # the pipe's key
    title: str | None
    options: WebhookOptions  # defaults filled in
    generation: int  # grows when the options change: a worker runs with one generation
    state: WebhookState

    @property
    def delivering(self) -> bool:
        return self.state.state in ("active", "retrying")


@dataclass(frozen=True, slots=True, kw_only=True)
class WebhookAttempts:
    """The failed attempts at one message, and when the next is due."""

    made: int
    due: float  # wall-clock seconds; 0.0: now
