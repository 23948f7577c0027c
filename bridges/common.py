"""What the AMQP and ZeroMQ bridges share on the engine side.

:class:`BridgeCore` is the part every bridge has (name, health, the stop flag and the
wake-up event). Two sides build on it, and a bridge takes the ones it needs:

- :class:`PipeSide` reads an internal pipe the bridge owns (owner ``#bridge/<name>``),
  joined to the bridge's feed, through a cursor of the engine service. Messages leave
  the pipe only when the bridge says they are done, and since an acknowledgement
  removes every older message too (D4), only the longest run of done positions is
  acknowledged.
- :class:`PublishSide` publishes what arrives from outside into a feed: only as many
  leading messages as every pipe they reach can hold (``backpressure = "wait"``, the
  service's ``room``), and reports them done only once they are committed to the
  store, so a crash before that leaves them with the far side.

Both speak to the engine through :class:`feeds.service.EngineService` alone, with the
bridge's own principal (:func:`owner_of`): values cross, never the engine's objects.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

from opentelemetry.trace import SpanKind

from feeds.service import Cursor, EngineService, JoinInfo, Message, PipeInfo
from restms.errors import NotCommitted, NotFound, RestMSError, ServiceUnavailable
from restms.specs import JoinSpec, MessageSpec, PipeOptions, PipeSpec

from . import tracing
from .base import CoreCounters, Health, Host, backoff

log = logging.getLogger(__name__)

OWNER_PREFIX = "#bridge/"  # principal names never start with "#" (auth.principals.NAME)
IDLE = 2.0  # seconds between looks at an idle pipe or socket
DEFAULT_FEED = "default"  # in the default domain (F15): where a pipe with no home goes

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

    def __init__(self, name: str, host: Host, *, configured: bool, counters: CoreCounters) -> None:
        self._name = name
        self._host = host
        self._engine: EngineService = host.engine
        self._tracer = host.tracer  # None: tracing is off (bridges.tracing)
        self._owner = owner_of(name)
        self._configured = configured
        # the guard of AMQP and ZeroMQ bridges made at run time (the operator's are not)
        self._guard = None if configured else host.reach
        self.health = Health(counters=counters)
        self.health.state.watch = self._link_moved
        self.health.watch_error = self._link_error
        self._reported = ""  # the last link event told: "", "up" or "down"
        self._stopping = False
        self._wake = asyncio.Event()
        self._stopped = asyncio.Event()

    def _traced_out(self, message: Message) -> MessageSpec:
        """What goes out of ``message``: with tracing on, the send is a span, child of the
        context the message carries, and the message carries the span's onward."""
        if self._tracer is None:
            return message.spec
        name, bridge = f"send {self._name}", {"restms.bridge": self._name}
        return tracing.hop(self._tracer, name, SpanKind.PRODUCER, message.spec, bridge)

    def _traced_in(self, spec: MessageSpec) -> MessageSpec:
        """A message from outside, as :meth:`_traced_out` (a receive span) when tracing is on."""
        if self._tracer is None:
            return spec
        name, bridge = f"receive {self._name}", {"restms.bridge": self._name}
        return tracing.hop(self._tracer, name, SpanKind.CONSUMER, spec, bridge)

    @property
    def name(self) -> str:
        return self._name

    @property
    def configured(self) -> bool:
        return self._configured

    @property
    def kind(self) -> str:
        """``amqp``, ``zeromq`` or ``federation``: the middle word of this bridge's event
        addresses."""
        raise NotImplementedError

    async def forget(self) -> None:
        """Deleted: most bridges keep nothing outside their pipe, which the registry
        deletes."""

    def _link_moved(self, old: str, new: str) -> None:
        """``bridge.<kind>.up`` when the link comes up; ``.down`` when it starts
        retrying, once until it is up again (a link that never came up is down too)."""
        notify = self._host.notify
        if notify is None:
            return
        health = self.health
        if new == "up" and self._reported != "up":
            self._reported = "up"
            notify(self.kind, self._name, "up", {"state": new, "url": health.url})
        elif new == "retrying" and self._reported != "down":
            self._reported = "down"
            details = {"state": new, "was": old, "url": health.url, "error": health.last_error}
            notify(self.kind, self._name, "down", details)
        elif new == "stopped":
            self._reported = ""

    def _link_error(self, text: str) -> None:
        """``bridge.<kind>.error``, coalesced per bridge (the text is the status's
        ``last_error``: URLs in it are redacted)."""
        notify = self._host.notify
        if notify is not None:
            details = {"state": self.health.state.name, "error": text}
            notify(self.kind, self._name, "error", details)

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

    The pipe and its join are looked at again (made again when gone: a deleted feed,
    a definition edited between runs) when the bridge starts and whenever a wait for
    messages ends in vain; in between the bridge only takes and acknowledges.
    """

    def __init__(self, name: str, host: Host, *, configured: bool, counters: CoreCounters) -> None:
        super().__init__(name, host, configured=configured, counters=counters)
        self.pipe: PipeInfo | None = None
        self._join: JoinInfo | None = None  # the internal join, once made or found
        self._cursor: Cursor | None = None  # reads the pipe from the last acknowledged
        self._ahead: list[Message] = []  # taken while waiting, for the next take
        self._look = True  # look at the pipe and its join before the next take
        self._opening = asyncio.Lock()  # two loops of a bridge may open it at once
        self._after = 0  # highest position done with (sent, answered)
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

    async def _feed_domain(self, name: str) -> tuple[str, str] | None:
        """The key and domain of the public feed ``name``, None when there is none."""
        try:
            feed = await self._engine.feed(self._owner, name)
        except NotFound:
            return None
        return feed.key, feed.domain

    async def _open_pipe(self) -> None:
        """Find the bridge's pipe (after a restart) or make it, and keep exactly the
        wanted join on it (a definition edited between runs takes effect). Raises
        :class:`NoFeed` or a RestMS error when it cannot."""
        engine, owner = self._engine, self._owner
        wanted_join = self._pipe_join()
        feed = await self._feed_domain(wanted_join[0]) if wanted_join is not None else None
        pipe: PipeInfo | None = None
        if self.pipe is not None:
            with contextlib.suppress(NotFound):
                pipe = await engine.pipe(owner, self.pipe.key)
        if pipe is None:
            pipe = next(iter(await engine.pipes(owner)), None)
        if pipe is None:
            if wanted_join is not None and feed is None:
                raise NoFeed(wanted_join[0])
            home = feed or await self._feed_domain(self._pipe_home() or DEFAULT_FEED)
            domain = home[1] if home is not None else ""
            pipe = await engine.create_pipe(owner, domain, self._pipe_spec())
        if self.pipe is None or pipe.key != self.pipe.key:
            self._pipe_changed()
            await self._drop_cursor()
            self._after = self._acked = 0
        if self._cursor is None:
            self._cursor = engine.cursor(owner, pipe.key, self._acked, via=self.name)
        self.pipe = pipe
        wanted = None
        if wanted_join is not None and feed is not None:
            wanted = (feed[0], wanted_join[1], tuple(sorted(wanted_join[2])))
        self._join = None
        for join in pipe.joins:
            if join.is_default:
                continue
            if (join.feed, join.address, tuple(sorted(join.headers))) == wanted:
                self._join = join
            else:
                await engine.delete_join(owner, join.key)  # of an earlier definition
        if wanted_join is not None and feed is not None and self._join is None:
            spec = JoinSpec(
                feed_path=f"/restms/feed/{wanted_join[0]}",
                address=wanted_join[1],
                headers=wanted_join[2],
            )
            self._join, _ = await engine.create_join(owner, pipe.key, spec)

    async def _ready_pipe(self) -> Cursor | None:
        """The cursor over the bridge's pipe, the pipe looked at first when due; None
        (after a pause, the reason in the status) when it cannot be had now."""
        cursor = self._cursor
        if cursor is not None and not self._look:
            return cursor
        if not await self._open():
            await self._sleep(IDLE)
            return None
        return self._cursor

    async def _open(self) -> bool:
        """Look at the pipe and its join (made when missing); False, the reason in the
        status, when they cannot be had now. A bridge opens its pipe before it says it
        is up, so its join takes messages from then on."""
        async with self._opening:
            try:
                await self._open_pipe()
            except (NoFeed, RestMSError) as exc:
                self.health.error(str(exc))
                return False
            self._look = False
            return True

    async def _drop_cursor(self) -> None:
        cursor, self._cursor = self._cursor, None
        self._ahead.clear()
        if cursor is not None:
            await cursor.close()

    async def _close_pipe(self) -> None:
        """Close the cursor (the pipe is idle from now, unless the bridge comes back)
        and forget the pipe; whatever was taken but not acknowledged is taken again
        next time."""
        await self._drop_cursor()
        self.pipe = self._join = None
        self._after = self._acked
        self._look = True

    async def _batch(self, cursor: Cursor, limit: int) -> list[Message]:
        """Up to ``limit`` messages of the pipe after those taken, without waiting."""
        taken, self._ahead = self._ahead[:limit], self._ahead[limit:]
        if limit > len(taken):
            taken.extend(await cursor.take(limit - len(taken)))
        return taken

    async def _idle(self, cursor: Cursor, limit: int) -> None:
        """Wait (bounded) until the bridge is woken or, with room for ``limit`` more,
        a message comes (kept for the next :meth:`_batch`). A wait in vain has the
        pipe looked at again."""
        woken = asyncio.ensure_future(self._wake.wait())
        waits: list[asyncio.Future[Any]] = [woken]
        taking = None
        if limit > 0 and not self._ahead:
            taking = asyncio.ensure_future(cursor.take(limit, wait=IDLE))
            waits.append(taking)
        try:
            await asyncio.wait(waits, timeout=IDLE, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiting in waits:
                waiting.cancel()
            done = await asyncio.gather(*waits, return_exceptions=True)
        got = done[1] if taking is not None else ()
        if isinstance(got, tuple):
            self._ahead.extend(got)
        if not self._ahead and not self._wake.is_set():
            self._look = True  # nothing came: is the pipe still there, and joined?
        self._wake.clear()

    async def _ack_upto(self, upto: int) -> None:
        """Acknowledge every position up to ``upto`` (D4), on disk soon after."""
        cursor = self._cursor
        if upto > self._acked and cursor is not None:
            try:
                # Not waiting for the disk: what a crash un-acknowledges is sent again,
                # as anything the far side took before its acceptance came back.
                await cursor.ack(upto, wait=False)
            except NotFound:  # the pipe went: what it held went with it
                self._look = True
            self._acked = upto

    def _pipe_backlog(self) -> int:
        cursor = self._cursor
        return cursor.held if cursor is not None else 0

    async def _dead_letter(self, message: Message, error: str, dead_letter: str) -> None:
        why = (("x-bridge", self.name), ("x-bridge-error", error[:1000]))
        try:
            moved = await self._engine.dead_letter(
                self._owner, message.pipe, message.position, "rejected",
                feed=dead_letter or None, headers=why,
            )  # fmt: skip
        except NotFound:  # gone already, with its pipe
            return
        if moved:
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
    _queued = 0  # messages the last publish left in a rotator or service feed's queue

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
        engine, owner, feed = self._engine, self._owner, self._feed_name
        if self._tracer is not None:  # each arrival a span (bridges.tracing)
            batch = [(key, self._traced_in(spec)) for key, spec in batch]
        while batch and not self._stopping:
            try:
                fits = len(batch)
                if self._backpressure == "wait":
                    fits = await engine.room(owner, feed, [spec for _, spec in batch])
                if not fits:
                    self.health.counters.throttled += 1
                    # wait (bounded) for a full pipe to change, or for the bridge to stop
                    specs = [spec for _, spec in batch]
                    await first(self._stopped.wait(), engine.room(owner, feed, specs, wait=IDLE))
                    continue
                part = batch[:fits]
                counts, duplicates = await self._publish(part, refuse)
            except NotFound:
                self.health.error(f"no feed named {feed!r} to publish into")
                attempt += 1
                await self._sleep(backoff(attempt, 0.05, 2.0))
                continue
            except NotCommitted as exc:  # withdrawn, all of it: published again
                self.health.error(f"cannot commit to the store: {exc}")
                attempt += 1
                await self._sleep(backoff(attempt, 0.1, 5.0))
                continue
            except ServiceUnavailable as exc:
                self.health.error(f"the gateway cannot take messages now: {exc}")
                attempt += 1
                await self._sleep(backoff(attempt, 0.05, 2.0))
                continue
            attempt = 0
            self._count(counts, duplicates)
            done([key for key, _ in part], counts)
            batch = batch[fits:]
        return [key for key, _ in batch]

    async def _publish(
        self, batch: list[tuple[K, MessageSpec]], refuse: Callable[[K, str], None]
    ) -> tuple[list[int], list[bool]]:
        """Publish the batch (committed when it must be); a message the engine refuses
        (not a full gateway, nor a missing feed) is refused alone and left out of
        ``batch``, the others go on. The join counts and which were duplicates."""
        engine, owner, feed = self._engine, self._owner, self._feed_name
        try:
            result = await engine.publish(owner, feed, [spec for _, spec in batch], via=self.name)
        except (ServiceUnavailable, NotFound):
            raise
        except RestMSError:
            pass  # one at a time, to find the one refused
        else:
            self._queued = result.queued
            return list(result.counts), list(result.duplicates)
        counts: list[int] = []
        duplicates: list[bool] = []
        keep: list[tuple[K, MessageSpec]] = []
        self._queued = 0
        for item in batch:
            try:
                one = await engine.publish(owner, feed, [item[1]], via=self.name)
            except (ServiceUnavailable, NotFound):
                raise
            except RestMSError as exc:
                self.health.counters.refused += 1
                self.health.error(f"the gateway refused a message: {exc}")
                refuse(item[0], str(exc))
                continue
            counts.extend(one.counts)
            duplicates.extend(one.duplicates)
            self._queued += one.queued
            keep.append(item)
        batch[:] = keep
        return counts, duplicates

    def _count(self, counts: list[int], duplicates: list[bool]) -> None:
        counters = self.health.counters
        for count, duplicate in zip(counts, duplicates, strict=True):
            if duplicate:
                counters.duplicates += 1
            else:
                counters.published += 1
                if count == 0:
                    counters.unroutable += 1
