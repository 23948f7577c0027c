"""ZeroMQ bridges: one gateway feed and one ZeroMQ socket, on the gateway's own event
loop (``zmq.asyncio``; docs/ZEROMQ.md).

Theory of operation
-------------------
Every send is non-blocking. The bridge uses a synchronous shadow of its socket for
the sends and the draining receives of a batch (no future per message), and the
``zmq.asyncio`` socket only to wait: for a first message, or for room at the send
high-water mark.

**Outbound** (``pub``, ``push``; ``dealer`` in :mod:`bridges.zmq_rpc`). The bridge owns
a durable internal pipe joined to its feed, as the AMQP bridge does, and sends what
the pipe holds in order, a ``window`` at a time. ZeroMQ has no acknowledgements, so a
message is done when the socket took it; the pipe is acknowledged once per batch. At
the high-water mark (``sndhwm``) the bridge either waits for room, keeping the rest
in the pipe (``at_hwm = "block"``: nothing is lost while the gateway runs), or drops
the message and counts it (``"drop"``). A ``pub`` socket is an XPUB with
``XPUB_NODROP``, so its high-water mark is seen too, and it counts subscriptions.

**Inbound** (``sub``, ``pull``; ``router`` in :mod:`bridges.zmq_rpc`). The bridge
receives a batch (up to ``window``), decodes it (:mod:`bridges.zmq_wire`; a bad
message is counted, logged and dropped) and publishes it with
:class:`bridges.common.PublishSide`: while a pipe it would reach is full, the bridge
stops reading, so the socket's receive queue fills to ``rcvhwm`` and ZeroMQ pushes
back (PUSH peers block, PUB peers drop, as ZeroMQ does).

Link state: ``connecting`` while the endpoints are bound or connected, ``up`` when
they all are, ``retrying`` (backoff, then again) when a bind fails. ZeroMQ
reconnects by itself; the socket monitor counts peers coming and going.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Coroutine, Sequence
from socket import AF_INET
from typing import Any, cast

import zmq
import zmq.asyncio
from zmq.backend import Socket as _Backend
from zmq.utils.monitor import parse_monitor_message

from feeds.service import Message
from restms.specs import MessageSpec, PipeSpec

from .amqp_map import Unmappable
from .base import Host, ZmqCounters, backoff
from .common import IDLE, PipeSide, PublishSide, bridge_pipe_spec, first
from .config import ZmqBridgeConfig
from .zmq_wire import Malformed, decode, encode

log = logging.getLogger(__name__)

RESOLVE_TIMEOUT = 10.0  # seconds a guarded bridge waits for a peer's name to resolve
RECHECK = 30.0  # seconds between a guarded bridge's looks at its peers' names


class Unreachable(Exception):
    """A run-time bridge's endpoint the guard refuses, or a name that does not resolve."""


SOCKET_TYPES = {
    "pub": zmq.XPUB,
    "sub": zmq.SUB,
    "push": zmq.PUSH,
    "pull": zmq.PULL,
    "router": zmq.ROUTER,
    "dealer": zmq.DEALER,
}
# The backend's send/recv with plain int flags: pyzmq's multipart helpers cost three
# times as much per message (flag enums, checks), which shows at these rates.
_SEND, _RECV, _GET = _Backend.send, _Backend.recv, _Backend.get
_MORE, _NOW, _RCVMORE = int(zmq.SNDMORE | zmq.NOBLOCK), int(zmq.NOBLOCK), int(zmq.RCVMORE)
LOG_EVERY = 5.0  # seconds: at most one log line per bridge for bad input, with a count
_MONITORED = (
    zmq.EVENT_CONNECTED
    | zmq.EVENT_ACCEPTED
    | zmq.EVENT_DISCONNECTED
    | zmq.EVENT_BIND_FAILED
    | zmq.EVENT_ACCEPT_FAILED
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
)


class ZapGate:
    """The ZAP handler of one ZeroMQ context: lets CURVE clients into the bridges
    that are CURVE servers, by each bridge's list of client keys (its ZAP domain)."""

    def __init__(self, context: zmq.asyncio.Context) -> None:
        self._context = context
        self._allowed: dict[str, frozenset[str] | None] = {}
        self._auth: Any = None

    def allow(self, domain: str, keys: tuple[str, ...]) -> None:
        """Let ``keys`` (any key when empty) into sockets of ``domain``."""
        if self._auth is None:
            from zmq.auth.asyncio import AsyncioAuthenticator

            self._auth = AsyncioAuthenticator(self._context, log=log.getChild("zap"))
            self._auth.start()
        self._allowed[domain] = frozenset(keys) if keys else None
        self._auth.configure_curve_callback(domain=domain, credentials_provider=self)

    def forget(self, domain: str) -> None:
        self._allowed.pop(domain, None)

    def callback(self, domain: str, key: bytes) -> bool:
        """The authenticator's question: may the client with this public key in?"""
        if domain not in self._allowed:
            return False
        allowed = self._allowed[domain]
        return allowed is None or key.decode("ascii", "replace") in allowed

    def stop(self) -> None:
        if self._auth is not None:
            self._auth.stop()
            self._auth = None


class ZmqBridge(PipeSide, PublishSide[Any]):
    """A ``pub``, ``push``, ``sub`` or ``pull`` bridge (see the module docstring); the
    request/reply sockets build on it in :mod:`bridges.zmq_rpc`."""

    def __init__(
        self,
        config: ZmqBridgeConfig,
        host: Host,
        *,
        configured: bool,
        max_body: int,
        context: zmq.asyncio.Context,
        zap: ZapGate,
    ) -> None:
        self.counters = ZmqCounters()
        super().__init__(config.name, host, configured=configured, counters=self.counters)
        self.config = config
        self._feed_name = config.feed
        self._backpressure = config.backpressure
        self._max_size = config.max_message_size or max_body
        self._context = context
        self._zap = zap
        self._socket: zmq.asyncio.Socket | None = None
        self._sync: zmq.Socket[bytes] | None = None  # shadow: sends and draining receives
        self._monitor: zmq.asyncio.Socket | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.bound: list[str] = []  # the endpoints as bound (a wildcard port resolved)
        self.peers = 0
        self.subscriptions: dict[bytes, int] = {}  # pub: topic prefix -> subscribers
        self._bad = 0  # malformed messages not yet logged
        self._bad_logged = 0.0

    # ------------------------------------------------------------ Bridge interface
    async def start(self) -> None:
        self._stopping = False
        self._stopped.clear()
        self.health.state.move("connecting")
        self._spawn(self._run(), "socket")

    async def stop(self) -> None:
        """Close the socket (unsent messages linger up to ``linger``) and stop reading;
        whatever the pipe still holds stays there."""
        self._stopping = True
        self._stopped.set()
        self._wake.set()
        self._stop_work()
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._close_socket()
        await self._close_pipe()
        if self.health.state.name != "stopped":
            if self.health.state.name != "stopping":
                self.health.state.move("stopping")
            self.health.state.move("stopped")

    @property
    def kind(self) -> str:
        return self.config.kind

    def backlog(self) -> int:
        return self._pipe_backlog() if self.config.direction == "out" else 0

    def status(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.config.kind,
            "socket": self.config.socket,
            "direction": self.config.direction,
            "configured": self._configured,
            "backlog": self.backlog(),
            "in_flight": self._in_flight(),
            "endpoints": list(self.bound),
            "peers": self.peers,
            **({"subscriptions": len(self.subscriptions)} if self.config.socket == "pub" else {}),
            **self.health.document(),
            "definition": self.config.document(),
        }

    # ------------------------------------------------------------ for subclasses
    def _in_flight(self) -> int:
        return 0

    def _stop_work(self) -> None:
        """Called first when stopping (request/reply: cancel the timers)."""

    def _workers(self) -> list[Coroutine[Any, Any, None]]:
        """The loops that run while the socket is up."""
        if self.config.socket in ("pub", "push"):
            loops = [self._send_loop()]
            if self.config.socket == "pub":
                loops.append(self._subscription_loop())
            return loops
        return [self._receive_loop()]

    def _spawn(self, work: Coroutine[Any, Any, None], what: str) -> None:
        task = asyncio.create_task(work, name=f"bridge-{self.name}-{what}")
        self._tasks.append(task)
        task.add_done_callback(self._failed)

    def _failed(self, task: asyncio.Task[None]) -> None:
        if task.cancelled() or self._stopping:
            return
        error = task.exception()
        if error is not None:  # a bug: say so, and start the socket again
            log.error("bridge %s: %s failed", self.name, task.get_name(), exc_info=error)
            self.health.error(f"{task.get_name()} failed: {error!r}")
            asyncio.get_running_loop().call_later(1.0, self._restart)

    def _restart(self) -> None:
        if self._stopping:
            return
        for task in self._tasks:
            task.cancel()
        self._tasks = []
        self._close_socket()
        if self.health.state.name == "up":
            self.health.state.move("retrying")
        self._spawn(self._run(), "socket")

    # ------------------------------------------------------------ the socket
    async def _run(self) -> None:
        """Open the socket (retrying a failed bind with backoff), then run the loops."""
        attempt = 0
        while not self._stopping:
            if self.health.state.name == "retrying":
                self.health.state.move("connecting")
            try:
                targets = await self._targets()
                self._open_socket(targets)
            except (zmq.ZMQError, Unreachable) as exc:
                self._close_socket()
                shown = ", ".join(self.config.endpoints)
                self.health.error(
                    str(exc) if isinstance(exc, Unreachable) else f"cannot open {shown}: {exc}"
                )
                self.health.state.move("retrying")
                attempt += 1
                await self._sleep(backoff(attempt, 0.5, 30.0))
                continue
            if self.config.socket not in ("pull", "sub"):  # it reads a pipe
                await self._open()
            self.health.state.move("up")
            break
        if self._stopping:
            return
        self._spawn(self._watch(), "monitor")
        for index, work in enumerate(self._workers()):
            self._spawn(work, f"loop{index}")
        if targets != list(self.config.endpoints):  # host names pinned to addresses
            self._spawn(self._recheck(targets), "recheck")

    async def _targets(self, now: Sequence[str] = ()) -> list[str]:
        """The endpoints to bind or connect: the definition's; for a bridge made at run
        time each one checked by the guard, and a host name to connect to replaced by
        an address the guard allows it now (``now``'s, while it still does), so
        libzmq, which resolves names itself, never looks one up (Unreachable: why not)."""
        reach, config = self._guard, self.config
        if reach is None:
            return list(config.endpoints)
        targets = []
        for index, endpoint in enumerate(config.endpoints):
            reason = reach.endpoint(endpoint, bind=config.bind)
            if reason is not None:
                raise Unreachable(f"cannot open {endpoint}: {reason}")
            if config.bind or not endpoint.startswith("tcp://"):
                targets.append(endpoint)
                continue
            host, port = endpoint.removeprefix("tcp://").rsplit(":", 1)
            try:  # IPv4: the bridges' sockets are, as libzmq's are by default
                async with asyncio.timeout(RESOLVE_TIMEOUT):
                    found = await asyncio.to_thread(reach.addresses, host, int(port), AF_INET)
            except TimeoutError:
                raise Unreachable(f"cannot open {endpoint}: {host} did not resolve") from None
            except OSError as exc:
                raise Unreachable(f"cannot open {endpoint}: {exc}") from None
            pinned = now[index] if now else ""
            address = pinned.removeprefix("tcp://").rsplit(":", 1)[0].strip("[]")
            if address not in found:
                address = found[0]
            targets.append(
                f"tcp://[{address}]:{port}" if ":" in address else f"tcp://{address}:{port}"
            )
        return targets

    async def _recheck(self, targets: list[str]) -> None:
        """Look the names up again every RECHECK seconds; when an address in use is not
        among those the guard allows the name now, open the socket again (the guard
        decides afresh, and while it refuses the bridge retries, saying why)."""
        while True:
            await asyncio.sleep(RECHECK)
            try:
                now = await self._targets(targets)
            except Unreachable:  # opening again says why
                now = []
            if now != targets:
                log.info("bridge %s: its peers' addresses changed: opening again", self.name)
                asyncio.get_running_loop().call_soon(self._restart)
                return

    def _open_socket(self, targets: Sequence[str]) -> None:
        c = self.config
        sock = self._context.socket(SOCKET_TYPES[c.socket])
        self._socket = sock
        sock.setsockopt(zmq.LINGER, int(c.linger * 1000))
        sock.setsockopt(zmq.SNDHWM, c.sndhwm)
        sock.setsockopt(zmq.RCVHWM, c.rcvhwm)
        if c.socket == "pub":
            sock.setsockopt(zmq.XPUB_NODROP, 1)  # the high-water mark shows: at_hwm decides
        elif c.socket == "sub":
            for prefix in c.subscribe:
                sock.setsockopt(zmq.SUBSCRIBE, prefix.encode())
        elif c.socket == "router":
            sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a reply to a gone peer raises
        if c.socket in ("push", "dealer"):
            sock.setsockopt(zmq.IMMEDIATE, 1)  # queue only for peers that are there
        if c.curve_secret_key:
            secret = c.curve_secret_key.encode("ascii")
            sock.curve_secretkey = secret
            sock.curve_publickey = zmq.curve_public(secret)
            if c.curve_server_key:
                sock.curve_serverkey = c.curve_server_key.encode("ascii")
            else:
                sock.curve_server = True
                sock.zap_domain = c.name.encode()
                self._zap.allow(c.name, c.curve_clients)
        self._monitor = sock.get_monitor_socket(_MONITORED)
        self._sync = zmq.Socket.shadow(sock.underlying)
        self.bound = []
        for endpoint, target in zip(c.endpoints, targets, strict=True):
            if c.bind:
                sock.bind(target)
                last = sock.getsockopt(zmq.LAST_ENDPOINT)
                self.bound.append(last.decode() if isinstance(last, bytes) else str(last))
            else:
                sock.connect(target)
                self.bound.append(endpoint)
        self.health.url = ", ".join(self.bound)

    def _close_socket(self) -> None:
        sock, self._socket = self._socket, None
        monitor, self._monitor = self._monitor, None
        self._sync = None
        if sock is not None:
            if monitor is not None:
                with contextlib.suppress(zmq.ZMQError):
                    sock.disable_monitor()
                monitor.close(linger=0)
            sock.close(linger=int(self.config.linger * 1000))
        self._zap.forget(self.config.name)
        self.peers = 0
        self.subscriptions.clear()

    async def _watch(self) -> None:
        """Count peers coming and going, and say why a connection failed."""
        monitor = self._monitor
        assert monitor is not None
        counters = self.counters
        while not self._stopping:
            frames = await monitor.recv_multipart()
            try:
                event = parse_monitor_message(frames)
            except (ValueError, IndexError, zmq.ZMQError):
                continue
            kind, where = event["event"], event.get("endpoint", b"")
            peer = where.decode("utf-8", "replace") if isinstance(where, bytes) else str(where)
            if kind in (zmq.EVENT_CONNECTED, zmq.EVENT_ACCEPTED):
                self.peers += 1
                counters.connects += 1
            elif kind == zmq.EVENT_DISCONNECTED:
                self.peers = max(0, self.peers - 1)
                counters.disconnects += 1
            elif kind in (zmq.EVENT_HANDSHAKE_FAILED_AUTH, zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL):
                counters.handshake_failures += 1
                self.health.error(f"a peer at {peer} failed the ZeroMQ handshake")
            elif kind == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
                counters.handshake_failures += 1
                self.health.error(f"the handshake with a peer at {peer} failed")
            elif kind == zmq.EVENT_ACCEPT_FAILED:
                self.health.error(f"could not accept a connection on {peer}")

    # ------------------------------------------------------------ sending
    def _send(self, frames: list[bytes]) -> bool:
        """Send without waiting; False at the high-water mark (or with no peer)."""
        sync = self._sync
        if sync is None:
            return False
        try:
            send_now(sync, frames)
        except zmq.Again:
            return False
        return True

    def can_send(self) -> bool:
        """Whether the socket would take a message now: a peer is there and its queue
        has room. Reading the socket's events also has ZeroMQ act on what it was told
        meanwhile, such as taking a gone peer's queue down."""
        sync = self._sync
        if sync is None:
            return False
        events = cast(int, sync.getsockopt(zmq.EVENTS))
        self._touched()  # the read may take the edge a waiting future needs
        return bool(events & zmq.POLLOUT)

    def _touched(self) -> None:
        """Call after operations on the shadow socket. ZeroMQ signals readiness on an
        edge-triggered descriptor; an operation that bypasses ``zmq.asyncio`` may take
        the signal a waiting future needs, so have pyzmq look at the socket's events
        again, as its own non-blocking short cut does."""
        sock = self._socket
        if sock is not None and not sock.closed:
            cast(Any, sock)._schedule_remaining_events()  # pyzmq pinned; a test shows it

    async def _writable(self) -> None:
        """Wait (bounded) until the socket can take a message, or the bridge stops."""
        sock = self._socket
        if sock is None or self._stopping:
            return
        # pyzmq's stub for the asyncio socket's poll lacks the flags it takes
        waiting = sock.poll(int(IDLE * 1000), zmq.POLLOUT)  # type: ignore[call-arg]
        await first(waiting, self._stopped.wait())

    def _pipe_spec(self) -> PipeSpec:
        c = self.config
        return bridge_pipe_spec(
            self.name, durable=c.durable, max_messages=c.max_messages, max_bytes=c.max_bytes
        )

    def _pipe_join(self) -> tuple[str, str, tuple[tuple[str, str], ...]] | None:
        return (self.config.feed, self.config.address, self.config.headers)

    async def _send_loop(self) -> None:
        """pub, push: send what the pipe holds, in order (see the module docstring)."""
        while not self._stopping:
            cursor = await self._ready_pipe()
            if cursor is None:
                continue
            done = 0
            for message in await self._batch(cursor, self.config.window):
                if not await self._send_message(message):
                    break  # stopping
                self._after = message.position
                done += 1
            self._touched()
            await self._ack_upto(self._after)
            if not done and not self._stopping:
                await self._idle(cursor, self.config.window)

    async def _send_message(self, message: Message) -> bool:
        """Send one message (dead-letter it if it cannot be one); False if stopping."""
        try:
            frames = encode(self._traced_out(message), message.parts)
        except (Unmappable, ValueError) as exc:
            self.counters.unmappable += 1
            await self._dead_letter(message, f"cannot be sent over ZeroMQ: {exc}", "")
            return True
        while not self._send(frames):
            if self.config.at_hwm == "drop":
                self.counters.dropped += 1
                return True
            self.counters.blocked += 1
            await self._writable()
            if self._stopping:
                return False
        self.counters.sent += 1
        return True

    async def _subscription_loop(self) -> None:
        """pub: keep count of the subscriptions the XPUB socket reports."""
        sock = self._socket
        assert sock is not None
        while not self._stopping:
            frame = await sock.recv()
            if not frame:
                continue
            topic, subscribed = frame[1:], frame[0] == 1
            if subscribed:
                self.subscriptions[topic] = self.subscriptions.get(topic, 0) + 1
            elif topic in self.subscriptions:
                self.subscriptions[topic] -= 1
                if self.subscriptions[topic] <= 0:
                    del self.subscriptions[topic]

    # ------------------------------------------------------------ receiving
    async def _receive(self) -> list[list[bytes]]:
        """Wait for a message, then take what else is there, up to ``window``."""
        sock, sync = self._socket, self._sync
        assert sock is not None
        assert sync is not None
        batch = [await sock.recv_multipart()]
        while len(batch) < self.config.window:
            try:
                batch.append(receive_now(sync))
            except zmq.Again:
                break
        self._touched()
        self.counters.received += len(batch)
        return batch

    def _parse(self, frames: list[bytes]) -> MessageSpec:
        """The message ``frames`` carry, with this bridge's settings; or Malformed."""
        return decode(frames, default_address=self.config.default_address, max_size=self._max_size)

    def _decode(self, frames: list[bytes]) -> MessageSpec | None:
        """The message ``frames`` carry, or None (counted and logged) when malformed."""
        try:
            return self._parse(frames)
        except Malformed as exc:
            self._malformed(str(exc), len(frames))
            return None

    def _malformed(self, reason: str, frames: int) -> None:
        self.counters.malformed += 1
        self._bad += 1
        now = time.monotonic()
        if now - self._bad_logged >= LOG_EVERY:
            log.warning(
                "bridge %s: dropped %d malformed message(s); the last (%d frames): %s",
                self.name,
                self._bad,
                frames,
                reason,
            )
            self._bad, self._bad_logged = 0, now
        self.health.error(f"dropped a malformed message: {reason}")

    async def _receive_loop(self) -> None:
        """sub, pull: publish what arrives (see the module docstring)."""
        while not self._stopping:
            batch = []
            for frames in await self._receive():
                spec = self._decode(frames)
                if spec is not None:
                    batch.append((None, spec))
            if batch:
                await self._absorb(batch, nothing, self._refused)
            await asyncio.sleep(0)  # a busy socket must not starve the loop's other work

    def _refused(self, key: Any, reason: str) -> None:
        """A message the gateway would not take: ZeroMQ cannot say no, so it is gone."""
        log.info("bridge %s: the gateway refused a message: %s", self.name, reason)


def send_now(sock: zmq.Socket[bytes], frames: list[bytes]) -> None:
    """Send a multipart message without waiting; :class:`zmq.Again` when it cannot go
    (ZeroMQ takes all frames once it has taken the first)."""
    last = len(frames) - 1
    for index, frame in enumerate(frames):
        _SEND(sock, frame, _MORE if index < last else _NOW)


def receive_now(sock: zmq.Socket[bytes]) -> list[bytes]:
    """Receive a multipart message without waiting; :class:`zmq.Again` when none."""
    parts = [_RECV(sock, _NOW)]
    while _GET(sock, _RCVMORE):
        parts.append(_RECV(sock, _NOW))
    return parts


def nothing(keys: list[Any], counts: list[int]) -> None:
    """A ``done`` for :meth:`PublishSide._absorb` when nothing is owed to the far side."""
