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
from typing import Any

from feeds.service import Message
from restms.specs import MessageSpec, PipeSpec

from .amqp_link import Link
from .amqp_map import Unmappable, render_target, to_amqp
from .base import Counters, Host, backoff
from .common import IDLE, PipeSide, PublishSide, bridge_pipe_spec, owner_of
from .config import AmqpBridgeConfig

log = logging.getLogger(__name__)

__all__ = ["AmqpBridge", "owner_of"]

Arrival = tuple[int, int]  # (link generation, delivery number)


@dataclasses.dataclass(slots=True)
class _Flight:
    message: Message
    attempts: int = 0
    retry: asyncio.TimerHandle | None = None


class AmqpBridge(PipeSide, PublishSide[Arrival]):
    """One AMQP 1.0 bridge (either direction); see the module docstring."""

    def __init__(
        self, config: AmqpBridgeConfig, host: Host, *, configured: bool, max_body: int
    ) -> None:
        self.counters = Counters()
        super().__init__(config.name, host, configured=configured, counters=self.counters)
        self.config = config
        self._feed_name = config.feed
        self._backpressure = config.backpressure
        self._max_size = config.max_message_size or max_body
        self._link: Link | None = None
        self._task: asyncio.Task[None] | None = None
        self._restarts = 0
        # outbound (positions: PipeSide)
        self._flight: dict[int, _Flight] = {}
        self._resend: list[int] = []
        self._rejected: list[tuple[int, str]] = []
        # inbound
        self._arrivals: list[tuple[int, int, MessageSpec]] = []
        self._holding = 0  # arrivals of the batch being published, not yet settled

    async def start(self) -> None:
        self._stopping = False
        self._stopped.clear()
        if self.config.direction == "out":
            await self._open()
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
        await self._close_pipe()  # what was in flight is sent again after a restart
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

    @property
    def kind(self) -> str:
        return self.config.kind

    def backlog(self) -> int:
        if self.config.direction == "out":
            return self._pipe_backlog()
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
        self._link = Link(
            self.config, loop, self._events, max_message_size=self._max_size, reach=self._guard
        )
        if self.health.state.name == "stopped":
            self.health.state.move("connecting")  # from now: the thread says so a bit later
        self._link.start()
        if self.config.direction == "in":
            self._link.command("credit", self.config.window)

    def _events(self, batch: list[tuple[Any, ...]]) -> None:
        """Events from the proton thread (called on the loop)."""
        counters = self.counters
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
            self.counters.connects += 1
        if state == "retrying" and health.state.name == "up":
            self.counters.disconnects += 1
        if url:
            health.url = url
        if error:  # before the move, so a "down" event carries it
            health.error(error)
        health.state.move(state)

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
    def _pipe_spec(self) -> PipeSpec:
        c = self.config
        return bridge_pipe_spec(
            self.name, durable=True, max_messages=c.max_messages, max_bytes=c.max_bytes
        )

    def _pipe_join(self) -> tuple[str, str, tuple[tuple[str, str], ...]]:
        return (self.config.feed, self.config.address, self.config.headers)

    def _pipe_changed(self) -> None:
        self._forget_flight()

    def _forget_flight(self) -> None:
        for flight in self._flight.values():
            if flight.retry is not None:
                flight.retry.cancel()
        self._flight.clear()
        self._resend.clear()
        self._rejected.clear()

    async def _outbound(self) -> None:
        while not self._stopping:
            cursor = await self._ready_pipe()
            if cursor is None:
                continue
            self._wake.clear()
            batch = self._take_resends()
            room = self.config.window - len(self._flight)
            taken = await self._batch(cursor, room - len(batch)) if room > len(batch) else []
            for message in taken:
                self._after = message.position
                item = self._prepare(message)
                if item is not None:
                    self._flight[message.position] = _Flight(message)
                    batch.append(item)
            if batch and self._link is not None:
                self._link.command("send", batch)
            await self._settle_outbound()
            if self._stopping:
                break
            if not taken and not self._resend and not self._wake.is_set():
                await self._idle(cursor, self.config.window - len(self._flight))

    def _prepare(self, message: Message) -> tuple[int, str, Any] | None:
        """The proton message for a pipe message; unmappable ones go to dead letters."""
        try:
            amqp = to_amqp(self._traced_out(message), message.parts)
            target = render_target(self.config.target, message.spec.address)
        except (Unmappable, ValueError) as exc:
            self.counters.unmappable += 1
            self._rejected.append((message.position, f"cannot be sent over AMQP 1.0: {exc}"))
            self._flight[message.position] = _Flight(message)
            return None
        return (message.position, target, amqp)

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
        counters = self.counters
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
        self.counters.retried += 1
        self._resend.append(seq)
        self._wake.set()

    async def _settle_outbound(self) -> None:
        """Dead-letter what the broker rejected, then acknowledge the settled run."""
        if self._rejected:
            rejected, self._rejected = self._rejected, []
            for seq, error in rejected:
                flight = self._flight.pop(seq, None)
                if flight is not None:
                    await self._dead_letter(flight.message, error, self.config.dead_letter)
        upto = (min(self._flight) - 1) if self._flight else self._after
        await self._ack_upto(upto)

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
            await self._take_in(batch)

    async def _take_in(self, batch: list[tuple[int, int, MessageSpec]]) -> None:
        """Publish a batch of arrivals, then settle them and grant their credit back."""
        link = self._link
        current = link.generation if link is not None else -1
        stale = [number for generation, number, _ in batch if generation != current]
        if stale:  # their connection is gone: the broker gives them to us again
            self._settle([(number, "release", "") for number in stale], len(stale))
            batch = [item for item in batch if item[0] == current]
        self._holding = len(batch)
        left = await self._absorb(
            [((generation, number), spec) for generation, number, spec in batch],
            self._accept,
            self._refuse,
        )
        self._holding = 0
        if left:  # stopping: give them back (those routed but not committed may repeat)
            self._settle([(number, "release", "") for _, number in left], 0)

    def _accept(self, keys: list[Arrival], counts: list[int]) -> None:
        self._holding -= len(keys)
        self._settle([(number, "accept", "") for _, number in keys], len(keys))

    def _refuse(self, key: Arrival, reason: str) -> None:
        self._holding -= 1
        self._settle([(key[1], "reject", reason)], 1)

    def _settle(self, decisions: list[tuple[int, str, str]], credit: int) -> None:
        link = self._link
        if link is None:
            return
        if any(outcome == "release" for _, outcome, _ in decisions):
            self.counters.given_back += sum(o == "release" for _, o, _ in decisions)
        link.command("settle", decisions)
        if credit:
            link.command("credit", credit)
