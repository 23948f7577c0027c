"""AMQP 1.0 bridges: the asyncio side (engine) of a bridge whose proton side is
:mod:`bridges.amqp_link`.

Theory of operation
-------------------
**Outbound** (feed -> broker). The bridge owns a durable internal pipe joined to its
feed with the configured address pattern (DESIGN.md: an outbound bridge is an engine
client). It reads the pipe in order, at most ``window`` messages in flight, and hands
them to the proton thread. A message leaves the pipe (is acknowledged, D4) only when
the broker has settled it ``accepted`` -- and since an acknowledgement removes every
older message too, only the longest run of settled positions is acknowledged.
``released`` and ``modified`` are sent again after a capped, jittered backoff;
``rejected`` goes to the dead-letter feed with the broker's error in its headers.
While the broker is away the messages simply stay in the pipe (bounded by its
limits); after a gateway restart the pipe is found again by its owner and whatever
was not acknowledged is sent again (at-least-once).

**Inbound** (broker -> feed). The receiver has only the credit the gateway grants:
``window`` at first, then one for each message the gateway has absorbed. A batch of
arrivals is published only when every pipe it would reach has room (``backpressure =
"wait"``); otherwise the bridge waits for those pipes to change and grants nothing,
so the broker's queue grows instead of the gateway's memory. A delivery is accepted
at the broker only after the publish is routed and committed to the store, so a
gateway crash before that leaves it with the broker, which delivers it again.
Repeats are absorbed by the feed's ``message_id`` window.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Awaitable, Sequence
from typing import Any

from feeds.model import Feed, Join, Message, Pipe, Slot
from feeds.selection import matching
from restms.errors import RestMSError, ServiceUnavailable
from restms.specs import Duplicate, EmbeddedContent, JoinSpec, MessageSpec, PipeOptions, PipeSpec

from .amqp_link import Link
from .amqp_map import Unmappable, render_target, to_amqp
from .base import Health, Port, backoff
from .config import AmqpBridgeConfig

log = logging.getLogger(__name__)

OWNER_PREFIX = "#bridge/"  # principal names never start with "#" (auth.principals.NAME)
IDLE = 2.0  # seconds between looks at an idle pipe (keeps it from idle collection)


def owner_of(name: str) -> str:
    """The principal an internal bridge pipe belongs to."""
    return OWNER_PREFIX + name


@dataclasses.dataclass(slots=True)
class _Flight:
    message: Message
    attempts: int = 0
    retry: asyncio.TimerHandle | None = None


class AmqpBridge:
    """One AMQP 1.0 bridge (either direction); see the module docstring."""

    def __init__(
        self, config: AmqpBridgeConfig, port: Port, *, configured: bool, max_body: int
    ) -> None:
        self.config = config
        self._port = port
        self._configured = configured
        self.health = Health()
        self._max_size = config.max_message_size or max_body
        self._link: Link | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._wake = asyncio.Event()
        self._stopped = asyncio.Event()
        self._restarts = 0
        # outbound
        self.pipe: Pipe | None = None
        self._join: Join | None = None  # the internal join, once made or found
        self._after = 0  # highest position handed to the proton thread
        self._acked = 0  # highest position acknowledged
        self._flight: dict[int, _Flight] = {}
        self._resend: list[int] = []
        self._rejected: list[tuple[int, str]] = []
        # inbound
        self._arrivals: list[tuple[int, int, MessageSpec]] = []
        self._holding = 0  # arrivals of the batch being published, not yet settled

    # ------------------------------------------------------------ Bridge interface
    @property
    def name(self) -> str:
        return self.config.name

    @property
    def configured(self) -> bool:
        return self._configured

    async def start(self) -> None:
        self._stopping = False
        self._stopped.clear()
        self._start_link()
        body = self._outbound() if self.config.direction == "out" else self._inbound()
        self._task = asyncio.create_task(body, name=f"bridge-{self.name}")

    async def stop(self) -> None:
        """Stop the link and the loop; unsettled work stays where it is safe (the pipe,
        or the broker)."""
        self._stopping = True
        self._stopped.set()
        self._wake.set()
        self._forget_flight()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self.pipe is not None and not self.pipe.deleted:
            self._port.engine.pin(self.pipe, False)  # idle from now, unless we come back
        self.pipe = self._join = None
        link, self._link = self._link, None
        if link is not None:
            link.command("stop")
            if not await asyncio.to_thread(link.join, 10.0):
                log.error("bridge %s: the proton thread did not stop in 10 s", self.name)
        if self.health.state.name != "stopped":
            if self.health.state.name != "stopping":
                self.health.state.move("stopping")
            self.health.state.move("stopped")
        self._arrivals.clear()
        self._after = self._acked  # what was in flight is sent again after a restart

    def backlog(self) -> int:
        if self.config.direction == "out":
            pipe = self.pipe
            return len(pipe.messages) + pipe.spilled if pipe is not None else 0
        return len(self._arrivals) + self._holding

    def status(self) -> dict[str, Any]:
        document = {
            "name": self.name,
            "kind": self.config.kind,
            "direction": self.config.direction,
            "configured": self._configured,
            "backlog": self.backlog(),
            "in_flight": len(self._flight) if self.config.direction == "out" else 0,
            **self.health.document(),
            "definition": self.config.document(),
        }
        return document

    # ------------------------------------------------------------ the proton link
    def _start_link(self) -> None:
        loop = asyncio.get_running_loop()
        self._link = Link(self.config, loop, self._events, max_message_size=self._max_size)
        if self.health.state.name == "stopped":
            self.health.state.move("connecting")  # from now: the thread says so a bit later
        self._link.start()
        if self.config.direction == "in":
            self._link.command("credit", self.config.window)

    def _events(self, batch: list[tuple[Any, ...]]) -> None:
        """Events from the proton thread (called on the loop)."""
        counters = self.health.counters
        for event in batch:
            kind = event[0]
            if kind == "outcome":
                self._outcome(event[1], event[2], event[3])
            elif kind == "arrived":
                counters.received += 1
                self._arrivals.append((event[1], event[2], event[3]))
            elif kind == "sent":
                counters.sent += event[1]
            elif kind == "state":
                if not self._stopping:  # stop() moves the state itself
                    self._state(event[1], event[2], event[3])
            elif kind == "refused":
                counters.refused += 1
                self.health.error(f"refused a broker message: {event[1]}")
            elif kind == "error":
                self.health.error(event[1])
            elif kind == "crashed":
                self.health.error(f"the proton thread failed: {event[1]}")
                if not self._stopping:
                    asyncio.get_running_loop().call_later(
                        backoff(self._restarts, 1.0, 30.0), self._restart
                    )
        self._wake.set()

    def _state(self, state: str, url: str, error: str) -> None:
        health = self.health
        if state == "stopped" and health.state.name not in ("stopping", "stopped"):
            health.state.move("stopping")
        if state == "up":
            health.counters.connects += 1
        if state == "retrying" and health.state.name == "up":
            health.counters.disconnects += 1
        health.state.move(state)
        if url:
            health.url = url
        if error:
            health.error(error)

    def _restart(self) -> None:
        """The proton thread died of a bug: start a fresh one (what was in flight is
        sent again)."""
        if self._stopping:
            return
        self._restarts += 1
        for seq in list(self._flight):
            self._resend.append(seq)
        if self.health.state.name == "stopping":
            self.health.state.move("stopped")
        self._start_link()
        self._wake.set()

    # ------------------------------------------------------------ outbound
    def _open_pipe(self) -> None:
        """Find the bridge's pipe (after a restart) or make it, and keep exactly the
        configured join on it (a definition edited between runs takes effect)."""
        join = self._join
        if join is not None and not join.deleted and join.pipe is self.pipe:
            return  # the usual case: nothing changed since the last look
        engine = self._port.engine
        owner = owner_of(self.name)
        pipe = self.pipe if self.pipe is not None and not self.pipe.deleted else None
        if pipe is None:
            pipe = next(iter(engine.pipes_of(owner)), None)
        feed = engine.public_feeds.get(self.config.feed)
        if pipe is None:
            if feed is None:
                raise _NoFeed(self.config.feed)
            options = PipeOptions(
                durable=True,
                lease=0,
                max_messages=self.config.max_messages or None,
                max_bytes=self.config.max_bytes or None,
            )
            pipe = engine.create_pipe(
                feed.domain, PipeSpec(title=f"bridge {self.name}", options=options), owner
            )
        if pipe is not self.pipe:  # a new pipe: positions start again
            self._forget_flight()
            self._after = self._acked = 0
            self.pipe = pipe
            engine.pin(pipe, True)  # read by this bridge, even while it waits (Q1)
        wanted = (feed, self.config.address, tuple(sorted(self.config.headers)))
        self._join = None
        for join in list(pipe.joins.values()):
            if join.is_default:
                continue
            if (join.feed, join.spec.address, tuple(sorted(join.spec.headers))) == wanted:
                self._join = join
            else:
                engine.delete_join(join)  # of an earlier definition
        if feed is not None and (self._join is None or self._join.pipe is not pipe):
            spec = JoinSpec(
                feed_path=f"/restms/feed/{feed.name}",
                address=self.config.address,
                headers=self.config.headers,
            )
            self._join, _ = engine.create_join(pipe, spec)

    def _forget_flight(self) -> None:
        for flight in self._flight.values():
            if flight.retry is not None:
                flight.retry.cancel()
        self._flight.clear()
        self._resend.clear()
        self._rejected.clear()

    async def _outbound(self) -> None:
        engine = self._port.engine
        while not self._stopping:
            try:
                self._open_pipe()
            except (_NoFeed, RestMSError) as exc:
                self.health.error(str(exc))
                await self._sleep(IDLE)
                continue
            pipe = self.pipe
            assert pipe is not None
            await self._port.ensure(pipe)
            self._wake.clear()
            seen = pipe.version
            batch = self._take_resends()
            room = self.config.window - len(self._flight)
            if room > 0:
                for message in engine.stream(pipe, self._after):
                    if len(batch) >= room:
                        break
                    self._after = message.seq
                    item = self._prepare(message)
                    if item is not None:
                        self._flight[message.seq] = _Flight(message)
                        batch.append(item)
            if batch and self._link is not None:
                self._link.command("send", batch)
            before = pipe.version
            await self._settle_outbound(pipe)
            if seen == before and pipe.version == before + 1:
                seen = pipe.version  # only our own acknowledgement touched it: no news
            if self._stopping:
                break
            more = pipe.version != seen or self._wake.is_set()
            if not more and not self._resend:
                room_left = len(self._flight) < self.config.window
                await _first(self._wake.wait(), *([pipe.changed(IDLE, seen)] if room_left else []))

    def _prepare(self, message: Message) -> tuple[int, str, Any] | None:
        """The proton message for a pipe message; unmappable ones go to dead letters."""
        try:
            amqp = to_amqp(message.spec, message.parts)
            target = render_target(self.config.target, message.spec.address)
        except (Unmappable, ValueError) as exc:
            self.health.counters.unmappable += 1
            self._rejected.append((message.seq, f"cannot be sent over AMQP 1.0: {exc}"))
            self._flight[message.seq] = _Flight(message)
            return None
        return (message.seq, target, amqp)

    def _take_resends(self) -> list[tuple[int, str, Any]]:
        batch = []
        for seq in self._resend:
            flight = self._flight.get(seq)
            if flight is not None:
                item = self._prepare(flight.message)
                if item is not None:
                    batch.append(item)
        self._resend.clear()
        return batch

    def _outcome(self, seq: int, outcome: str, error: str) -> None:
        flight = self._flight.get(seq)
        if flight is None:
            return
        counters = self.health.counters
        if outcome == "accepted":
            counters.accepted += 1
            del self._flight[seq]
        elif outcome == "rejected":
            counters.rejected += 1
            self.health.error(error)
            self._rejected.append((seq, error))
        else:
            if outcome == "modified":
                counters.modified += 1
            else:
                counters.released += 1
            if error:
                self.health.error(error)
            flight.attempts += 1
            delay = backoff(flight.attempts, self.config.retry_min, self.config.retry_max)
            flight.retry = asyncio.get_running_loop().call_later(delay, self._retry, seq)

    def _retry(self, seq: int) -> None:
        flight = self._flight.get(seq)
        if flight is None or self._stopping:
            return
        flight.retry = None
        self.health.counters.retried += 1
        self._resend.append(seq)
        self._wake.set()

    async def _settle_outbound(self, pipe: Pipe) -> None:
        """Dead-letter what the broker rejected, then acknowledge the settled run."""
        if self._rejected:
            rejected, self._rejected = self._rejected, []
            for seq, error in rejected:
                flight = self._flight.pop(seq, None)
                if flight is not None:
                    self._dead_letter(pipe, flight.message, error)
        upto = (min(self._flight) - 1) if self._flight else self._after
        if upto > self._acked:
            await self._port.ack(Slot(pipe, upto))
            self._acked = upto

    def _dead_letter(self, pipe: Pipe, message: Message, error: str) -> None:
        why = (("x-bridge", self.name), ("x-bridge-error", error[:1000]))
        engine = self._port.engine
        if engine.dead_letter(pipe, message, "rejected", why, feed=self.config.dead_letter):
            self.health.counters.dead_lettered += 1
        else:
            self.health.counters.discarded += 1
            self.health.error(f"a rejected message was discarded, no dead-letter feed: {error}")

    # ------------------------------------------------------------ inbound
    async def _inbound(self) -> None:
        while not self._stopping:
            if not self._arrivals:
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(IDLE):
                        await self._wake.wait()
                continue
            batch, self._arrivals = self._arrivals, []
            await self._absorb(batch)

    async def _absorb(self, batch: list[tuple[int, int, MessageSpec]]) -> None:
        """Publish a batch of arrivals, then settle them and grant their credit back."""
        link = self._link
        current = link.generation if link is not None else -1
        stale = [number for generation, number, _ in batch if generation != current]
        if stale:  # their connection is gone: the broker gives them to us again
            self._settle([(number, "release", "") for number in stale], len(stale))
            batch = [item for item in batch if item[0] == current]
        attempt = 0
        while batch and not self._stopping:
            self._holding = len(batch)
            feed = self._port.engine.public_feeds.get(self.config.feed)
            if feed is None:
                self.health.error(f"no feed named {self.config.feed!r} to publish into")
                attempt += 1
                await self._sleep(backoff(attempt, 0.05, 2.0))
                continue
            fits, full = self._fitting(feed, batch)
            if not fits:
                self.health.counters.throttled += 1
                # wait (bounded) for a full pipe to change, or for the bridge to stop
                await _first(self._stopped.wait(), *(p.changed(IDLE, v) for p, v in full.items()))
                continue
            part = batch[:fits]
            try:
                counts = self._publish(feed, part)
            except ServiceUnavailable as exc:
                self.health.error(f"the gateway cannot take messages now: {exc}")
                attempt += 1
                await self._sleep(backoff(attempt, 0.05, 2.0))
                continue
            if not await self._commit():  # routed, but not yet on disk: never publish twice
                break
            attempt = 0
            self._count(counts)
            self._settle([(n, "accept", "") for _, n, _ in part], len(part))
            batch = batch[fits:]
        self._holding = 0
        if batch:  # stopping: give them back (those routed but not committed may repeat)
            self._settle([(n, "release", "") for _, n, _ in batch], 0)

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

    def _publish(self, feed: Feed, batch: list[tuple[int, int, MessageSpec]]) -> list[int]:
        """Publish the batch; a message the engine refuses (not a full gateway) is
        rejected at the broker alone, the others go on."""
        engine = self._port.engine
        owner = owner_of(self.name)
        try:
            return engine.publish(feed, [spec for _, _, spec in batch], owner)
        except ServiceUnavailable:
            raise
        except RestMSError:
            if len(batch) == 1:
                raise
        counts: list[int] = []
        keep: list[tuple[int, int, MessageSpec]] = []
        for item in batch:
            try:
                counts.extend(engine.publish(feed, [item[2]], owner))
                keep.append(item)
            except ServiceUnavailable:
                raise
            except RestMSError as exc:
                self.health.counters.refused += 1
                self.health.error(f"the gateway refused a broker message: {exc}")
                self._settle([(item[1], "reject", str(exc))], 1)
        batch[:] = keep
        return counts

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
        self, feed: Feed, batch: list[tuple[int, int, MessageSpec]]
    ) -> tuple[int, dict[Pipe, int]]:
        """With ``backpressure = "wait"``: how many leading messages of the batch every
        pipe they reach can hold together (Q2 would skip a full pipe: a lost message),
        and, when it is none, the full pipes to wait for."""
        if self.config.backpressure != "wait" or feed.type in ("rotator", "service"):
            return len(batch), {}  # queueing feeds answer 503 themselves when full
        used: dict[Pipe, list[int]] = {}
        for index, (_, _, spec) in enumerate(batch):
            size = sum(len(c.value) for c in spec.contents if isinstance(c, EmbeddedContent))
            pipes = {join.pipe for join in matching(feed, spec)}
            for pipe in pipes:
                if pipe.overflow != "skip" or size > pipe.max_bytes:
                    continue  # reject answers 503; drop-oldest and too big are policy
                count, total = used.get(pipe, (0, 0))
                if (
                    len(pipe.messages) + pipe.spilled + count + 1 > pipe.max_messages
                    or pipe.bytes + pipe.spilled_bytes + total + size > pipe.max_bytes
                ):
                    return index, ({} if index else {pipe: pipe.version})
            for pipe in pipes:
                count, total = used.get(pipe, (0, 0))
                used[pipe] = [count + 1, total + size]
        return len(batch), {}

    def _settle(self, decisions: list[tuple[int, str, str]], credit: int) -> None:
        link = self._link
        if link is None:
            return
        if any(outcome == "release" for _, outcome, _ in decisions):
            self.health.counters.given_back += sum(o == "release" for _, o, _ in decisions)
        link.command("settle", decisions)
        if credit:
            link.command("credit", credit)

    # ------------------------------------------------------------ helpers
    async def _sleep(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not self._stopping and time.monotonic() < deadline:
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(deadline - time.monotonic()):
                    await self._wake.wait()


class _NoFeed(Exception):
    def __init__(self, name: str) -> None:
        super().__init__(f"no feed named {name!r} to bridge")


async def _first(*waits: Awaitable[Any]) -> None:
    """Wait until the first of these is done, or ``IDLE`` seconds; cancel the others."""
    futures = [asyncio.ensure_future(w) for w in waits]
    _, undone = await asyncio.wait(futures, timeout=IDLE, return_when=asyncio.FIRST_COMPLETED)
    for future in undone:
        future.cancel()
