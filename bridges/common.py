"""What the AMQP and ZeroMQ bridges share on the engine side.

:class:`BridgeCore` is the part every bridge has (name, health, the stop flag and the
wake-up event). Two sides build on it, and a bridge takes the ones it needs:

- :class:`PipeSide` reads an internal pipe the bridge owns (owner ``#bridge/<name>``),
  joined to the bridge's feed. Messages leave the pipe only when the bridge says they
  are done, and since an acknowledgement removes every older message too (D4), only
  the longest run of done positions is acknowledged.
- :class:`PublishSide` publishes what arrives from outside into a feed: only as many
  leading messages as every pipe they reach can hold (``backpressure = "wait"``), and
  reports them done only once they are committed to the store, so a crash before
  that leaves them with the far side.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Generic, TypeVar

from feeds.config import DEFAULT_DOMAIN
from feeds.mirroring import emit_feed
from feeds.model import Feed, Join, Pipe, Slot
from feeds.selection import matching
from restms.errors import RestMSError, ServiceUnavailable
from restms.specs import Duplicate, EmbeddedContent, JoinSpec, MessageSpec, PipeOptions, PipeSpec

from .base import CoreCounters, Health, Port, backoff

log = logging.getLogger(__name__)

OWNER_PREFIX = "#bridge/"  # principal names never start with "#" (auth.principals.NAME)
IDLE = 2.0  # seconds between looks at an idle pipe or socket
FEW_JOINS = 64  # feeds with at most this many joins get the cheap room check first

K = TypeVar("K")


def owner_of(name: str) -> str:
    """The principal an internal bridge pipe belongs to."""
    return OWNER_PREFIX + name


class NoFeed(Exception):
    def __init__(self, name: str) -> None:
        super().__init__(f"no feed named {name!r} to bridge")


async def first(*waits: Awaitable[Any]) -> None:
    """Wait until the first of these is done, or ``IDLE`` seconds; cancel the others."""
    futures = [asyncio.ensure_future(w) for w in waits]
    _, undone = await asyncio.wait(futures, timeout=IDLE, return_when=asyncio.FIRST_COMPLETED)
    for future in undone:
        future.cancel()


class BridgeCore:
    """Name, health and the stop/wake signals of one bridge."""

    def __init__(self, name: str, port: Port, *, configured: bool, counters: CoreCounters) -> None:
        self._name = name
        self._port = port
        self._configured = configured
        self.health = Health(counters=counters)
        self.health.state.watch = self._link_moved
        self.health.watch_error = self._link_error
        self._reported = ""  # the last link event told: "", "up" or "down"
        self._stopping = False
        self._wake = asyncio.Event()
        self._stopped = asyncio.Event()

    @property
    def name(self) -> str:
        return self._name

    @property
    def configured(self) -> bool:
        return self._configured

    @property
    def kind(self) -> str:
        """``amqp`` or ``zeromq``: the middle word of this bridge's event addresses."""
        raise NotImplementedError

    def _link_moved(self, old: str, new: str) -> None:
        """``bridge.<kind>.up`` when the link comes up; ``.down`` when it starts
        retrying, once until it is up again (a link that never came up is down too)."""
        events = self._port.engine.events
        if events is None:
            return
        health = self.health
        if new == "up" and self._reported != "up":
            self._reported = "up"
            events.bridge(self.kind, self._name, "up", {"state": new, "url": health.url})
        elif new == "retrying" and self._reported != "down":
            self._reported = "down"
            details = {"state": new, "was": old, "url": health.url, "error": health.last_error}
            events.bridge(self.kind, self._name, "down", details)
        elif new == "stopped":
            self._reported = ""

    def _link_error(self, text: str) -> None:
        """``bridge.<kind>.error``, coalesced per bridge (the text is the status's
        ``last_error``: URLs in it are redacted)."""
        events = self._port.engine.events
        if events is not None:
            details = {"state": self.health.state.name, "error": text}
            events.bridge(self.kind, self._name, "error", details)

    async def _sleep(self, seconds: float) -> None:
        """Sleep, but wake up at once when the bridge stops."""
        deadline = time.monotonic() + seconds
        while not self._stopping and time.monotonic() < deadline:
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(deadline - time.monotonic()):
                    await self._wake.wait()


class PipeSide(BridgeCore):
    """An internal pipe read in order by the bridge (outbound bridges, reply pipes).

    ``join`` is what the pipe is joined to: ``(feed, address, headers)``, or None for a
    pipe that only has its default join (a reply pipe, read by its name).
    """

    def __init__(self, name: str, port: Port, *, configured: bool, counters: CoreCounters) -> None:
        super().__init__(name, port, configured=configured, counters=counters)
        self.pipe: Pipe | None = None
        self._join: Join | None = None  # the internal join, once made or found
        self._after = 0  # highest position taken from the pipe
        self._acked = 0  # highest position acknowledged

    def _pipe_spec(self) -> PipeSpec:
        raise NotImplementedError

    def _pipe_join(self) -> tuple[str, str, tuple[tuple[str, str], ...]] | None:
        raise NotImplementedError

    def _pipe_home(self) -> str:
        """The feed whose domain a pipe without a join is made in ("": the default)."""
        return ""

    def _pipe_changed(self) -> None:
        """Called when the bridge's pipe is a different one: positions start again."""

    def _open_pipe(self) -> Pipe:
        """Find the bridge's pipe (after a restart) or make it, and keep exactly the
        wanted join on it (a definition edited between runs takes effect). Raises
        :class:`NoFeed` or a RestMS error when it cannot."""
        pipe, join = self.pipe, self._join
        wanted_join = self._pipe_join()
        settled = wanted_join is None or (
            join is not None and not join.deleted and join.pipe is pipe
        )
        if pipe is not None and not pipe.deleted and settled:
            return pipe  # the usual case: nothing changed since the last look
        engine = self._port.engine
        feed = engine.public_feeds.get(wanted_join[0]) if wanted_join is not None else None
        if pipe is None or pipe.deleted:
            pipe = next(iter(engine.pipes_of(owner_of(self.name))), None)
        if pipe is None:
            if wanted_join is not None and feed is None:
                raise NoFeed(wanted_join[0])
            home = feed or engine.public_feeds.get(self._pipe_home())
            domain = home.domain if home is not None else engine.domain(DEFAULT_DOMAIN)
            pipe = engine.create_pipe(domain, self._pipe_spec(), owner_of(self.name))
        if pipe is not self.pipe:
            self._pipe_changed()
            self._after = self._acked = 0
            self.pipe = pipe
            engine.pin(pipe, True)  # read by this bridge, even while it waits (Q1)
        wanted = None
        if wanted_join is not None:
            wanted = (feed, wanted_join[1], tuple(sorted(wanted_join[2])))
        self._join = None
        for join in list(pipe.joins.values()):
            if join.is_default:
                continue
            if (join.feed, join.spec.address, tuple(sorted(join.spec.headers))) == wanted:
                self._join = join
            else:
                engine.delete_join(join)  # of an earlier definition
        if wanted_join is not None and feed is not None and self._join is None:
            spec = JoinSpec(
                feed_path=f"/restms/feed/{feed.name}",
                address=wanted_join[1],
                headers=wanted_join[2],
            )
            self._join, _ = engine.create_join(pipe, spec)
        return pipe

    async def _ready_pipe(self) -> Pipe | None:
        """The pipe, opened and with its spilled messages read back; None (after a
        pause, the reason in the status) when it cannot be had now."""
        try:
            pipe = self._open_pipe()
        except (NoFeed, RestMSError) as exc:
            self.health.error(str(exc))
            await self._sleep(IDLE)
            return None
        await self._port.ensure(pipe)
        return pipe

    def _close_pipe(self) -> None:
        """Unpin the pipe (idle from now, unless the bridge comes back) and forget it;
        whatever was taken but not acknowledged is taken again next time."""
        if self.pipe is not None and not self.pipe.deleted:
            self._port.engine.pin(self.pipe, False)
        self.pipe = self._join = None
        self._after = self._acked

    async def _ack_upto(self, pipe: Pipe, upto: int) -> None:
        """Acknowledge every position up to ``upto`` (D4), on disk too."""
        if upto > self._acked:
            engine = self._port.engine
            if engine.mirror is not None:
                for seq, message in list(pipe.messages.items()):
                    if seq > upto:
                        break
                    if seq > self._acked:
                        engine.mirrored("bridge_out", pipe, message, bridge=self.name)
            await self._port.ack(Slot(pipe, upto))
            self._acked = upto

    async def _ack_seen(self, pipe: Pipe, upto: int, seen: int) -> int:
        """:meth:`_ack_upto`, then the pipe version to wait for news from: ``seen``, or
        the new version when only this acknowledgement changed the pipe (no news)."""
        before = pipe.version
        await self._ack_upto(pipe, upto)
        if seen == before and pipe.version == before + 1:
            return pipe.version
        return seen

    async def _wait_news(self, pipe: Pipe, seen: int) -> None:
        """Wait (bounded) until the pipe changes after ``seen``, or the bridge is woken."""
        await first(self._wake.wait(), pipe.changed(IDLE, seen))
        self._wake.clear()

    def _pipe_backlog(self) -> int:
        pipe = self.pipe
        return len(pipe.messages) + pipe.spilled if pipe is not None else 0

    def _dead_letter(self, pipe: Pipe, message: Any, error: str, dead_letter: str) -> None:
        why = (("x-bridge", self.name), ("x-bridge-error", error[:1000]))
        engine = self._port.engine
        if engine.dead_letter(pipe, message, "rejected", why, feed=dead_letter):
            self.health.counters.dead_lettered += 1
        else:
            self.health.counters.discarded += 1
            self.health.error(f"a rejected message was discarded, no dead-letter feed: {error}")


def bridge_pipe_spec(name: str, *, durable: bool, max_messages: int, max_bytes: int) -> PipeSpec:
    """The internal pipe of bridge ``name``: never leased (the bridge reads it alone)."""
    options = PipeOptions(
        durable=durable,
        lease=0,
        max_messages=max_messages or None,
        max_bytes=max_bytes or None,
    )
    return PipeSpec(title=f"bridge {name}", options=options)


class PublishSide(BridgeCore, Generic[K]):
    """Publishes messages from the far side into a feed (see the module docstring).

    ``K`` is how the far side names a message (a delivery number, a peer and request).
    """

    _feed_name: str
    _backpressure: str

    async def _absorb(
        self,
        batch: list[tuple[K, MessageSpec]],
        done: Callable[[list[K], list[int]], None],
        refuse: Callable[[K, str], None],
    ) -> list[K]:
        """Publish ``batch`` in order. ``done`` gets each part once it is routed and
        committed, with its join counts; ``refuse`` each message the engine will not
        take (not a full gateway) with the reason. Returns what was not published
        because the bridge is stopping."""
        attempt = 0
        while batch and not self._stopping:
            feed = self._port.engine.public_feeds.get(self._feed_name)
            if feed is None:
                self.health.error(f"no feed named {self._feed_name!r} to publish into")
                attempt += 1
                await self._sleep(backoff(attempt, 0.05, 2.0))
                continue
            fits, full = self._fitting(feed, batch)
            if not fits:
                self.health.counters.throttled += 1
                # wait (bounded) for a full pipe to change, or for the bridge to stop
                await first(self._stopped.wait(), *(p.changed(IDLE, v) for p, v in full.items()))
                continue
            part = batch[:fits]
            try:
                counts = self._publish(feed, part, refuse)
            except ServiceUnavailable as exc:
                self.health.error(f"the gateway cannot take messages now: {exc}")
                attempt += 1
                await self._sleep(backoff(attempt, 0.05, 2.0))
                continue
            if not await self._commit():  # routed, but not yet on disk: never publish twice
                break
            attempt = 0
            self._count(counts)
            self._mirror(feed, part, counts)
            done([key for key, _ in part], counts)
            batch = batch[fits:]
        return [key for key, _ in batch]

    async def _commit(self) -> bool:
        """Commit what was routed, retrying while the store fails; False if stopping."""
        attempt = 0
        while not self._stopping:
            try:
                await self._port.commit()
            except ServiceUnavailable as exc:
                self.health.error(f"cannot commit to the store: {exc}")
                attempt += 1
                await self._sleep(backoff(attempt, 0.1, 5.0))
            else:
                return True
        return False

    def _publish(
        self,
        feed: Feed,
        batch: list[tuple[K, MessageSpec]],
        refuse: Callable[[K, str], None],
    ) -> list[int]:
        """Publish the batch; a message the engine refuses (not a full gateway) is
        refused alone and left out of ``batch``, the others go on."""
        engine = self._port.engine
        owner = owner_of(self.name)
        try:
            return engine.publish(feed, [spec for _, spec in batch], owner)
        except ServiceUnavailable:
            raise
        except RestMSError:
            if len(batch) == 1:
                raise
        counts: list[int] = []
        keep: list[tuple[K, MessageSpec]] = []
        for item in batch:
            try:
                counts.extend(engine.publish(feed, [item[1]], owner))
                keep.append(item)
            except ServiceUnavailable:
                raise
            except RestMSError as exc:
                self.health.counters.refused += 1
                self.health.error(f"the gateway refused a message: {exc}")
                refuse(item[0], str(exc))
        batch[:] = keep
        return counts

    def _mirror(self, feed: Feed, part: list[tuple[K, MessageSpec]], counts: list[int]) -> None:
        """Offer the mirror a bridge_in event per message published from the far side."""
        sink = self._port.engine.mirror
        if sink is None:
            return
        now, owner = time.time(), owner_of(self.name)
        for (_, spec), count in zip(part, counts, strict=True):
            outcome = "duplicate" if isinstance(count, Duplicate) else "ok"
            emit_feed(
                sink, "bridge_in", now, feed, spec, _size(spec), owner, outcome, bridge=self.name
            )

    def _count(self, counts: Sequence[int]) -> None:
        counters = self.health.counters
        for count in counts:
            if isinstance(count, Duplicate):
                counters.duplicates += 1
            else:
                counters.published += 1
                if count == 0:
                    counters.unroutable += 1

    def _fitting(
        self, feed: Feed, batch: list[tuple[K, MessageSpec]]
    ) -> tuple[int, dict[Pipe, int]]:
        """With ``backpressure = "wait"``: how many leading messages of the batch every
        pipe they reach can hold together (Q2 would skip a full pipe: a lost message),
        and, when it is none, the full pipes to wait for."""
        if self._backpressure != "wait" or feed.type in ("rotator", "service"):
            return len(batch), {}  # queueing feeds answer 503 themselves when full
        if len(feed.joins) <= FEW_JOINS and _all_fit(feed, batch):
            return len(batch), {}  # the usual case, without matching each message
        used: dict[Pipe, list[int]] = {}
        for index, (_, spec) in enumerate(batch):
            size = _size(spec)
            pipes = {join.pipe for join in matching(feed, spec)}
            for pipe in pipes:
                if pipe.overflow != "skip" or size > pipe.max_bytes:
                    continue  # reject answers 503; drop-oldest and too big are policy
                count, total = used.get(pipe, (0, 0))
                if not _room(pipe, count + 1, total + size):
                    return index, ({} if index else {pipe: pipe.version})
            for pipe in pipes:
                count, total = used.get(pipe, (0, 0))
                used[pipe] = [count + 1, total + size]
        return len(batch), {}


def _all_fit(feed: Feed, batch: Sequence[tuple[Any, MessageSpec]]) -> bool:
    """Whether every pipe joined to ``feed`` has room for the whole batch: then no
    message of it can meet a full pipe, whichever pipes it reaches."""
    total = sum(_size(spec) for _, spec in batch)
    return all(
        join.pipe.overflow != "skip" or _room(join.pipe, len(batch), total)
        for join in feed.joins.values()
    )


def _size(spec: MessageSpec) -> int:
    """The content bytes a message adds to a pipe (as its byte limit counts them)."""
    return sum(len(c.value) for c in spec.contents if isinstance(c, EmbeddedContent))


def _room(pipe: Pipe, count: int, size: int) -> bool:
    """Whether the pipe can hold ``count`` more messages of ``size`` bytes in all."""
    return (
        len(pipe.messages) + pipe.spilled + count <= pipe.max_messages
        and pipe.bytes + pipe.spilled_bytes + size <= pipe.max_bytes
    )
