"""Request/reply over ZeroMQ bridges, both ways (docs/ZEROMQ.md).

``router``: ZeroMQ requesters (REQ, or DEALER with or without the empty delimiter)
ask, the gateway's HTTP services answer. Each request is published to the bridge's
feed with a fresh ``message_id`` and ``reply_to`` naming the bridge's reply pipe; a
service answers as RestMS services do (Housecat): it publishes to the default feed
at that ``reply_to`` with ``correlation_id`` = the request's ``message_id``. The
bridge sends the reply back to the peer that asked, with ``correlation_id`` set to
the peer's own ``message_id``. A request nobody answers within ``timeout`` gets an
error reply (envelope ``"e"``), as does one no service could take.

``dealer``: gateway requesters ask, ZeroMQ workers (REP, or DEALER workers that keep
the routing frames) answer. Requests the feed routes to the bridge's pipe go to the
workers as ``[request id, "", address, envelope, body]``; a reply is published to
``reply_feed`` at the request's ``reply_to``, with ``correlation_id`` = the request's
``message_id``. No reply within ``timeout`` (no worker, or a worker that died) gives
the requester an error message instead: headers ``x-bridge`` and
``x-bridge-error``. A request leaves the pipe only when its reply or error is
committed; requests still out when the gateway stops are sent again after it starts
(at-least-once: workers should tolerate a repeat).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import errno
import logging
import secrets
from collections.abc import Coroutine
from typing import Any

import zmq

from feeds.service import Message
from restms.specs import MESSAGE_PROPERTIES, EmbeddedContent, MessageSpec, PipeSpec

from .amqp_map import Unmappable
from .common import bridge_pipe_spec, first
from .zeromq import ZmqBridge, nothing, send_now
from .zmq_wire import Malformed, encode, error_frames

log = logging.getLogger(__name__)

MAX_ROUTE = 8  # frames a request's routing envelope may have (REQ ids, proxies)
REMEMBERED = 10_000  # timed-out request ids kept to tell late replies from strays
_ORDER = {name: index for index, name in enumerate(MESSAGE_PROPERTIES)}


def with_props(spec: MessageSpec, address: str, **changes: str) -> MessageSpec:
    """``spec`` at ``address`` with properties set ("" removes one), in §6.6 order."""
    props = dict(spec.props)
    for name, value in changes.items():
        if value:
            props[name] = value
        else:
            props.pop(name, None)
    ordered = tuple(sorted(props.items(), key=lambda pair: _ORDER[pair[0]]))
    return dataclasses.replace(spec, address=address, props=ordered)


class _Timeouts:
    """Request ids whose time ran out, the most recent :data:`REMEMBERED`."""

    def __init__(self) -> None:
        self._ids: collections.OrderedDict[Any, None] = collections.OrderedDict()

    def add(self, key: Any) -> None:
        self._ids[key] = None
        if len(self._ids) > REMEMBERED:
            self._ids.popitem(last=False)

    def __contains__(self, key: Any) -> bool:
        return key in self._ids


# ---------------------------------------------------------------- router
@dataclasses.dataclass(slots=True)
class _Asked:
    route: list[bytes]  # the frames before a reply: the peer's identity (and "")
    client_id: str  # the requester's own message_id
    address: str
    timer: asyncio.TimerHandle | None = None


class RouterBridge(ZmqBridge):
    """ZeroMQ requesters, gateway services (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._pending: dict[str, _Asked] = {}
        self._expired = _Timeouts()
        self._room = asyncio.Event()
        self._ids = secrets.token_hex(8)
        self._asked = 0

    def _workers(self) -> list[Coroutine[Any, Any, None]]:
        return [self._request_loop(), self._reply_loop()]

    def _in_flight(self) -> int:
        return len(self._pending)

    def backlog(self) -> int:
        return self._pipe_backlog()

    def _stop_work(self) -> None:
        for asked in self._pending.values():
            if asked.timer is not None:
                asked.timer.cancel()
        self._pending.clear()

    def _pipe_spec(self) -> PipeSpec:
        return bridge_pipe_spec(self.name, durable=False, max_messages=0, max_bytes=0)

    def _pipe_join(self) -> None:
        return None  # replies come by the pipe's name, on the default feed

    def _pipe_home(self) -> str:
        return self.config.feed  # the reply pipe lives in the requests feed's domain

    async def _request_loop(self) -> None:
        counters = self.counters
        while not self._stopping:
            if len(self._pending) >= self.config.window:
                counters.throttled += 1
                self._room.clear()
                await first(self._room.wait(), self._stopped.wait())
                continue
            if await self._ready_pipe() is None or self.pipe is None:
                continue
            batch: list[tuple[str, MessageSpec]] = []
            for frames in await self._receive():
                request = self._request(frames, self.pipe.key)
                if request is not None:
                    batch.append(request)
            if batch:
                await self._absorb(batch, self._published, self._refused_request)

    def _request(self, frames: list[bytes], reply_pipe: str) -> tuple[str, MessageSpec] | None:
        """The request a peer sent, now pending; or None (an error reply went back)."""
        cut = 1  # the peer's identity; with a REQ peer, its envelope up to the "" too
        for index in range(1, min(len(frames) - 1, MAX_ROUTE + 1)):
            if not frames[index]:
                cut = index + 1
                break
        route, rest = frames[:cut], frames[cut:]
        try:
            spec = self._parse(rest)
        except Malformed as exc:
            self._malformed(str(exc), len(rest))
            self._reply(route, error_frames("", "", f"malformed request: {exc}"))
            return None
        self._asked += 1
        request_id = f"zmq-{self._ids}-{self._asked}"
        asked = _Asked(route, spec.prop("message_id") or "", spec.address)
        loop = asyncio.get_running_loop()
        asked.timer = loop.call_later(self.config.timeout, self._timed_out, request_id)
        self._pending[request_id] = asked
        self.counters.requests += 1
        return request_id, with_props(
            spec, spec.address, message_id=request_id, reply_to=reply_pipe
        )

    def _published(self, keys: list[str], counts: list[int]) -> None:
        queueing = self._queued > 0  # a queueing feed keeps what no join took yet
        for key, count in zip(keys, counts, strict=True):
            if count == 0 and not queueing:
                self._fail(
                    key,
                    f"no service took the request: feed {self._feed_name!r} routed it to no pipe",
                )

    def _refused_request(self, key: str, reason: str) -> None:
        self._fail(key, f"the gateway refused the request: {reason}")

    def _timed_out(self, key: str) -> None:
        if key in self._pending:
            self.counters.timeouts += 1
            self._expired.add(key)
            self._fail(key, f"no reply within {self.config.timeout:g} s")

    def _take(self, key: str) -> _Asked | None:
        """The pending request ``key``, no longer pending (None if it is not)."""
        asked = self._pending.pop(key, None)
        if asked is not None:
            if asked.timer is not None:
                asked.timer.cancel()
            self._room.set()
        return asked

    def _fail(self, key: str, error: str) -> None:
        asked = self._take(key)
        if asked is None:
            return
        self._reply(asked.route, error_frames(asked.address, asked.client_id, error))
        self._touched()

    def _reply(self, route: list[bytes], frames: list[bytes]) -> None:
        """Send to the peer behind ``route``; a gone peer or a full queue is counted."""
        sync = self._sync
        if sync is None:
            return
        try:
            send_now(sync, [*route, *frames])
        except zmq.Again:
            self.counters.dropped += 1
            self.health.error("a requester's queue was full (sndhwm): its reply was dropped")
        except zmq.ZMQError as exc:
            if exc.errno != errno.EHOSTUNREACH:
                raise
            self.counters.lost_peers += 1
            self.health.error("a requester went away before its reply came")

    async def _reply_loop(self) -> None:
        """Send the replies services put in the reply pipe to their requesters."""
        counters = self.counters
        while not self._stopping:
            cursor = await self._ready_pipe()
            if cursor is None:
                continue
            batch = await self._batch(cursor, self.config.window)
            for message in batch:
                self._after = message.position
                key = message.spec.prop("correlation_id") or ""
                asked = self._take(key)
                if asked is None:
                    if key in self._expired:
                        counters.late += 1
                    else:
                        counters.uncorrelated += 1
                    continue
                spec = with_props(
                    self._traced_out(message), message.spec.address, correlation_id=asked.client_id
                )
                try:
                    frames = encode(spec, message.parts)
                except (Unmappable, ValueError) as exc:
                    counters.unmappable += 1
                    error = f"the reply cannot be sent over ZeroMQ: {exc}"
                    frames = error_frames(asked.address, asked.client_id, error)
                self._reply(asked.route, frames)
                counters.replies += 1
            self._touched()
            await self._ack_upto(self._after)
            if not batch and not self._stopping:
                await self._idle(cursor, self.config.window)


# ---------------------------------------------------------------- dealer
@dataclasses.dataclass(slots=True)
class _Job:
    message: Message
    request_id: bytes
    timer: asyncio.TimerHandle | None = None
    sent: bool = False


class DealerBridge(ZmqBridge):
    """Gateway requesters, ZeroMQ workers (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._feed_name = self.config.reply_feed
        self._backpressure = "skip"  # a requester's full pipe must not stop every reply
        self._jobs: dict[int, _Job] = {}  # by position in the pipe
        self._by_id: dict[bytes, int] = {}
        self._unsent: collections.deque[int] = collections.deque()
        self._outbox: list[tuple[int, MessageSpec | None]] = []
        self._answers = asyncio.Event()
        self._expired = _Timeouts()
        self._ids = secrets.token_hex(6)

    def _workers(self) -> list[Coroutine[Any, Any, None]]:
        return [self._request_loop(), self._reply_loop(), self._answer_loop()]

    def _in_flight(self) -> int:
        return len(self._jobs)

    def _stop_work(self) -> None:
        for job in self._jobs.values():
            if job.timer is not None:
                job.timer.cancel()
        self._jobs.clear()
        self._by_id.clear()
        self._unsent.clear()
        self._outbox.clear()

    def _pipe_changed(self) -> None:
        self._stop_work()

    async def _request_loop(self) -> None:
        """Send requests to the workers, at most ``window`` waiting for replies."""
        loop = asyncio.get_running_loop()
        while not self._stopping:
            cursor = await self._ready_pipe()
            if cursor is None:
                continue
            room = self.config.window - len(self._jobs)
            taken = await self._batch(cursor, max(room, 0))
            for message in taken:
                seq = message.position
                self._after = seq
                request_id = f"{self._ids}-{seq}".encode()
                job = _Job(message, request_id)
                job.timer = loop.call_later(self.config.timeout, self._timed_out, seq)
                self._jobs[seq] = job
                self._by_id[request_id] = seq
                self._unsent.append(seq)
                self.counters.requests += 1
            await self._send_waiting()
            if self._unsent and not self._stopping:
                if self.config.at_hwm == "block":
                    self.counters.blocked += 1
                await self._writable()
            elif not taken and not self._stopping:
                await self._idle(cursor, max(self.config.window - len(self._jobs), 0))

    async def _send_waiting(self) -> None:
        while self._unsent:
            seq = self._unsent[0]
            job = self._jobs.get(seq)
            if job is None or job.sent:
                self._unsent.popleft()
                continue
            try:
                frames = encode(self._traced_out(job.message), job.message.parts)
            except (Unmappable, ValueError) as exc:
                self.counters.unmappable += 1
                self._unsent.popleft()
                await self._dead_letter(job.message, f"cannot be sent over ZeroMQ: {exc}", "")
                self._finish(seq, None, "")
                continue
            if not self._send([job.request_id, b"", *frames]):
                if self.config.at_hwm == "drop":
                    self.counters.dropped += 1
                    self._unsent.popleft()
                    self._finish(seq, None, "no ZeroMQ worker could take the request (dropped)")
                    continue
                break  # the high-water mark, or no worker: wait for room
            self._unsent.popleft()
            job.sent = True
            self.counters.sent += 1
        self._touched()

    async def _reply_loop(self) -> None:
        """Take the workers' replies and queue them for their requesters."""
        counters = self.counters
        while not self._stopping:
            for frames in await self._receive():
                if len(frames) < 3 or frames[1]:
                    self._malformed("a reply without [request id, empty frame] in front", 0)
                    continue
                seq = self._by_id.get(frames[0])
                if seq is None:
                    if frames[0] in self._expired:
                        counters.late += 1
                    else:
                        counters.uncorrelated += 1
                    continue
                try:
                    reply = self._parse(frames[2:])
                except Malformed as exc:
                    self._malformed(str(exc), len(frames) - 2)
                    self._finish(seq, None, f"the worker's reply was malformed: {exc}")
                    continue
                counters.replies += 1
                self._finish(seq, reply, "")

    def _timed_out(self, seq: int) -> None:
        job = self._jobs.get(seq)
        if job is None or job.timer is None:
            return
        self.counters.timeouts += 1
        self._expired.add(job.request_id)
        where = "no ZeroMQ worker replied" if job.sent else "no ZeroMQ worker took the request"
        self._finish(seq, None, f"{where} within {self.config.timeout:g} s")

    def _finish(self, seq: int, reply: MessageSpec | None, error: str) -> None:
        """The request at ``seq`` is answered (``reply``), failed (``error``) or gone:
        queue what its requester gets."""
        job = self._jobs.get(seq)
        if job is None:
            return
        if job.timer is not None:
            job.timer.cancel()
            job.timer = None
        job.sent = True  # answered or given up: never sent (again) from now
        self._by_id.pop(job.request_id, None)
        request = job.message.spec
        reply_to = request.prop("reply_to") or ""
        answer: MessageSpec | None = None
        if reply_to and reply is not None:
            answer = with_props(reply, reply_to, correlation_id=request.prop("message_id") or "")
        elif reply_to and error:
            answer = MessageSpec(
                address=reply_to,
                props=(("correlation_id", c),) if (c := request.prop("message_id")) else (),
                headers=(("x-bridge", self.name), ("x-bridge-error", error)),
                contents=(EmbeddedContent(type="text/plain", value=error),),
            )
        elif reply is not None or error:
            self.counters.discarded += 1  # the request had no reply_to
        self._outbox.append((seq, answer))
        self._answers.set()

    async def _answer_loop(self) -> None:
        """Publish replies and errors, then let their requests leave the pipe."""
        while not self._stopping:
            if not self._outbox:
                self._answers.clear()
                await first(self._answers.wait(), self._stopped.wait())
                continue
            batch, self._outbox = self._outbox, []
            publish = [(seq, answer) for seq, answer in batch if answer is not None]
            left = await self._absorb(publish, nothing, self._unanswerable)
            if left:
                return  # stopping: those requests stay in the pipe
            for seq, _ in batch:
                self._jobs.pop(seq, None)
            await self._ack_upto((min(self._jobs) - 1) if self._jobs else self._after)
            self._wake.set()

    def _unanswerable(self, seq: int, reason: str) -> None:
        log.info("bridge %s: a reply could not be published: %s", self.name, reason)
