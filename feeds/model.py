"""Engine state: domains, feeds, pipes, joins, messages and contents.

Every resource is :class:`Watchable`: it has a version that grows whenever its
document would change (H7) and a wall-clock modification time (H2). Waiting for a
change (asynclets A2, evented GETs H9-H11, streams) costs one future per waiter and
no polling: :meth:`Watchable.touch` resolves them all at once.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from restms.errors import NotFound
from restms.specs import EmbeddedContent, JoinSpec, MessageSpec
from restms.webhook import WebhookOptions

from .dedup import DedupWindow
from .routing import QUEUEING_TYPES, Matcher
from .webhook import Hook


class Watchable:
    """A resource whose changes can be awaited."""

    __slots__ = ("_waiters", "deleted", "modified", "version")

    def __init__(self, now: float) -> None:
        self.version = 1
        self.modified = now
        self.deleted = False
        # Who waits for the next touch: nobody, one future (a pipe's one reader, the
        # usual case), or a set of them. A set costs 216 bytes even for one.
        self._waiters: asyncio.Future[bool] | set[asyncio.Future[bool]] | None = None

    def touch(self, now: float) -> None:
        self.version += 1
        self.modified = now
        if self._waiters is not None:  # publishing touches a pipe per message: mostly nobody waits
            self.wake()

    def wake(self) -> None:
        waiters, self._waiters = self._waiters, None
        if isinstance(waiters, set):
            for future in waiters:
                if not future.done():
                    future.set_result(True)
        elif waiters is not None and not waiters.done():
            waiters.set_result(True)

    def watch(self) -> asyncio.Future[bool]:
        """A future the next touch resolves with True.

        Whoever awaits it ends the wait as it likes (a timer of its own, or
        :class:`feeds.deadlines.Deadlines` resolving it with False) and calls
        :meth:`unwatch` once done, however the wait ended (cancelled too). A caller that
        loops around it (the engine's asynclet) awaits the future in its own frame:
        no coroutine of :meth:`changed` for each waiter.
        """
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        waiters = self._waiters
        if waiters is None:
            self._waiters = future
        elif isinstance(waiters, set):
            waiters.add(future)
        else:
            self._waiters = {waiters, future}
        return future

    def unwatch(self, future: asyncio.Future[bool]) -> None:
        """Forget a future :meth:`watch` gave."""
        waiters = self._waiters
        if waiters is future:
            self._waiters = None
        elif isinstance(waiters, set):
            waiters.discard(future)

    async def changed(self, timeout: float, since: int | None = None) -> bool:
        """Wait until the next touch (True) or until ``timeout`` seconds pass (False).

        With ``since`` (a version the caller has seen), a change that happened after it
        returns at once: readers that await other things between looks lose no wake-up.
        """
        if since is not None and since != self.version:
            return True
        if timeout <= 0:
            return False
        future = self.watch()
        timer = future.get_loop().call_later(timeout, _expire, future)
        try:
            return await future
        finally:
            timer.cancel()
            self.unwatch(future)

    @property
    def waiting(self) -> int:
        waiters = self._waiters
        if isinstance(waiters, set):
            return len(waiters)
        return 0 if waiters is None else 1


def _expire(future: asyncio.Future[bool]) -> None:
    """The timer of a wait: its time is up, unless a touch came first."""
    if not future.done():
        future.set_result(False)


@dataclass(frozen=True, slots=True)
class Blob:
    """Bytes of a staged content, shared by every pipe it was delivered to (D6)."""

    data: bytes
    content_type: str


Part = EmbeddedContent | Blob  # one content of a delivered message
# A message's contents, None where one was deleted (D6). Never changed in place: the
# copies of a message in several pipes (and, with no staged content, its spec's own
# contents) share one tuple, and deleting a content gives that message a new one.
Parts = tuple[Part | None, ...]
# A message waiting in a rotator or service feed: its queue id when it is in the store,
# how many of its leases ran out before it came back to the queue, its size
# (:func:`message_size`) and its origin stamp.
Queued = tuple[MessageSpec, Parts, int | None, int, int, str]


class StagedContent(Watchable):
    """An opaque body POSTed to a feed, waiting to be referenced by a message (M1, M4)."""

    __slots__ = ("blob", "expires", "feed", "key", "owner")

    def __init__(self, key: str, feed: Feed, blob: Blob, owner: str, now: float, expires: float):
        super().__init__(now)
        self.key = key
        self.feed = feed
        self.blob = blob
        self.owner = owner
        self.expires = expires  # monotonic deadline (M4 TTL)


class Message:
    """A message held in a pipe at one position (A3)."""

    __slots__ = (
        "arrived",
        "durable",
        "expires",
        "feed_name",
        "leased",
        "parts",
        "redeliveries",
        "seq",
        "size",
        "source",
        "spec",
        "stamp",
    )

    def __init__(
        self,
        seq: int,
        spec: MessageSpec,
        parts: Parts,
        feed_name: str | None,
        source: Feed | None,
        arrived: float,
        stamp: str,
        size: int = 0,
        durable: bool = False,
        redeliveries: int = 0,
    ) -> None:
        self.seq = seq
        self.spec = spec
        self.parts = parts  # None where the content was deleted (D6)
        self.feed_name = feed_name  # D8: kept for older clients
        self.source = source  # the queueing feed it came from, to requeue (Q1)
        self.arrived = arrived
        # Its origin stamp (feeds.values.Message.stamp): given when it was published, the
        # same in each pipe's copy, kept through redelivery, the store and dead letters.
        self.stamp = stamp
        self.expires: float | None = None  # monotonic deadline from ``expiration`` (Q30)
        self.durable = durable  # held in the store too (persistent delivery mode)
        self.size = size  # message_size: what pipe byte limits and the memory budget count
        self.redeliveries = redeliveries  # leases that ran out before it was acknowledged
        self.leased: float | None = None  # monotonic end of the current lease

    @property
    def version(self) -> int:
        """Grows as delivered contents are deleted, the only change a message sees."""
        return 1 + sum(part is None for part in self.parts)

    @property
    def modified(self) -> float:
        return self.arrived


class Domain(Watchable):
    __slots__ = ("feeds", "name", "title")

    def __init__(self, name: str, title: str, now: float) -> None:
        super().__init__(now)
        self.name = name
        self.title = title
        self.feeds: dict[str, Feed] = {}  # public feeds listed here (G13)


class Feed(Watchable):
    __slots__ = (
        "by_address",
        "configured",
        "domain",
        "had_join",
        "hidden",
        "joined",
        "joins",
        "key",
        "license",
        "name",
        "owner",
        "qback",
        "qfront",
        "qspill_hi",
        "qspill_lo",
        "qspilled",
        "qspilled_bytes",
        "queue",
        "queue_bytes",
        "queueing",
        "rr",
        "seen",
        "staged",
        "title",
        "topic_cache",
        "type",
    )

    def __init__(
        self,
        *,
        key: str,
        name: str | None,
        type: str,
        title: str | None,
        license: str | None,
        domain: Domain,
        owner: str,
        configured: bool,
        now: float,
    ) -> None:
        super().__init__(now)
        self.key = key  # public name, or private hash
        self.name = name  # None for a private feed
        self.type = type
        # A rotator or service feed: a queue, each message to one pipe (F8). Known once,
        # not looked up in QUEUEING_TYPES each time a message is routed.
        self.queueing = type in QUEUEING_TYPES
        self.title = title
        self.license = license
        self.domain = domain
        self.owner = owner
        self.configured = configured  # PUT/DELETE give 403 (F17)
        self.joins: dict[str, Join] = {}
        # The joins in order, kept with ``joins`` (feeds.resources): what a fanout feed routes
        # each message to, without a list built per message.
        self.joined: tuple[Join, ...] = ()
        self.by_address: dict[str, list[Join]] = {}  # "" and direct feeds
        self.topic_cache: dict[str, list[Join]] = {}  # topic feeds, cleared on join change
        self.queue: deque[Queued] = deque()  # rotator/service
        self.queue_bytes = 0  # the sizes of the messages in ``queue``
        # The first queue entry held back until a publish's commit (feeds.settling):
        # neither it nor what is behind it is handed out meanwhile. None: none.
        self.hidden: Queued | None = None
        self.qfront = 0  # queue ids: the next one at the front, the last one at the back
        self.qback = 0
        # Past the memory budget, queued messages wait on disk, as a pipe's do: queue ids
        # qspill_lo <= qid < qspill_hi, behind every message of ``queue``, read back a
        # page at a time when ``queue`` runs empty.
        self.qspilled = 0
        self.qspilled_bytes = 0  # bytes (estimated for what a restart found)
        self.qspill_lo = 0
        self.qspill_hi = 0
        self.rr = 0  # round-robin cursor
        self.had_join = False  # a service feed deletes itself after its last join (F8)
        self.staged: dict[str, StagedContent] = {}
        self.seen: DedupWindow | None = None  # message_ids routed recently (made on use)

    @property
    def public(self) -> bool:
        return self.name is not None


class Pipe(Watchable):
    __slots__ = (
        "accessed",
        "acked",
        "bytes",
        "dead_letter",
        "demand",
        "domain",
        "durable",
        "expiring",
        "hidden",
        "hook",
        "joins",
        "key",
        "lease",
        "loading",
        "lost",
        "max_bytes",
        "max_deliveries",
        "max_messages",
        "messages",
        "next_seq",
        "options",
        "overflow",
        "owner",
        "pinned",
        "spill_hi",
        "spill_lo",
        "spilled",
        "spilled_bytes",
        "title",
        "type",
    )

    def __init__(
        self,
        key: str,
        type: str,
        title: str | None,
        domain: Domain,
        owner: str,
        now: float,
        settings: PipeSettings,
    ):
        super().__init__(now)
        self.key = key  # the pipe name is its hash (U6)
        self.type = type
        self.title = title
        self.domain = domain
        self.owner = owner
        self.joins: dict[str, Join] = {}
        self.messages: dict[int, Message] = {}  # in position order
        self.next_seq = 1  # the next position a message takes
        # Positions from here on are held back until a publish's commit (feeds.settling):
        # readers see none of them, and this is the asynclet meanwhile. 0: none.
        self.hidden = 0
        self.demand = 0  # ondemand: GETs waiting on the asynclet (P3)
        # What a reader that resumes is told of (feeds.values.Gap): the highest position
        # acknowledged (D4), and the highest whose message left unacknowledged and is not
        # delivered again (expired, dropped by overflow, dead-lettered, lost in a
        # restart). Both only grow, and are kept with the pipe's next position.
        self.acked = 0
        self.lost = 0
        self.expiring = 0  # messages with an expiration deadline (Q30)
        self.bytes = 0  # bytes (message_size) held in memory
        # Past the memory budget, messages wait on disk: positions spill_lo <= seq <
        # spill_hi, newer than every message in memory, read back a page at a time.
        self.spilled = 0
        self.spilled_bytes = 0  # bytes (estimated for what a restart found)
        self.spill_lo = 0
        self.spill_hi = 0
        self.loading: asyncio.Future[None] | None = None  # a page being read back
        self.accessed = 0.0  # monotonic time of the last request that touched it (Q1)
        self.pinned = False  # read by a bridge: never collected as idle while it runs
        self.options = settings.given  # what the client asked for, as the store keeps it
        self.durable = settings.durable
        self.lease = settings.lease
        self.max_deliveries = settings.max_deliveries
        self.dead_letter = settings.dead_letter
        self.max_messages = settings.max_messages
        self.max_bytes = settings.max_bytes
        self.overflow = settings.overflow
        # A webhook pipe's options and delivery state (None for other types).
        self.hook = Hook(settings.webhook) if settings.webhook is not None else None

    def oldest(self) -> int | None:
        return next(iter(self.messages), None)

    @property
    def asynclet(self) -> int:
        """The position readers wait at (A3): the next one, or the first held back."""
        return self.hidden or self.next_seq

    def shown(self, seq: int) -> bool:
        """Whether readers may see position ``seq`` (not held back for a commit)."""
        return not self.hidden or seq < self.hidden

    def full(self, size: int) -> bool:
        """Whether one more message of ``size`` bytes would pass a limit (Q2)."""
        return (
            len(self.messages) + self.spilled >= self.max_messages
            or self.bytes + self.spilled_bytes + size > self.max_bytes
        )

    def on_disk(self, seq: int) -> bool:
        """Whether position ``seq`` may hold a message that waits on disk."""
        return self.spilled > 0 and self.spill_lo <= seq < self.spill_hi


class OnDisk(Exception):
    """The position asked for waits on disk: read the pipe's next page, then ask again."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PipeSettings:
    """A pipe's options with the configuration's defaults filled in."""

    durable: bool
    lease: float
    max_deliveries: int
    dead_letter: str | None  # a feed URI path; None: the configured dead-letter feed
    max_messages: int
    max_bytes: int
    overflow: str
    webhook: WebhookOptions | None  # every option filled in; None unless a webhook pipe
    given: dict[str, object]


class Join(Watchable):
    __slots__ = ("feed", "is_default", "key", "match", "pipe", "spec")

    def __init__(
        self,
        key: str,
        pipe: Pipe,
        feed: Feed,
        spec: JoinSpec,
        match: Matcher | None,
        is_default: bool,
        now: float,
    ) -> None:
        super().__init__(now)
        self.key = key
        self.pipe = pipe
        self.feed = feed
        self.spec = spec
        self.match = match
        self.is_default = is_default  # the pipe's join on the default feed (F15, F16)


@dataclass(frozen=True, slots=True)
class Slot:
    """A message position in a pipe, whether filled, pending (the asynclet) or gone."""

    pipe: Pipe
    seq: int


@dataclass(frozen=True, slots=True)
class PartRef:
    """One delivered content of a message in a pipe (D6)."""

    pipe: Pipe
    seq: int
    index: int


Resource = Feed | Pipe | Join | StagedContent | Slot | PartRef
Clock = Callable[[], float]


def message_size(spec: MessageSpec, parts: Iterable[Part | None]) -> int:
    """What a message weighs, as pipe and feed-queue byte limits, the memory budget and
    the byte metrics count it: its contents and its address, properties and headers."""
    return spec.head_size + content_size(parts)


def content_size(parts: Iterable[Part | None]) -> int:
    """Content bytes of a message (part of :func:`message_size`)."""
    total = 0
    for part in parts:
        if part is None:
            continue
        total += len(part.data) if isinstance(part, Blob) else len(part.value)
    return total


def alive(resource: Watchable) -> None:
    """Requests that awaited their body may find the resource deleted meanwhile (Q29)."""
    if resource.deleted:
        raise NotFound("the resource was deleted")
