"""The engine's link to its Redis Cluster: commands routed by hash slot, the function
library, a write made durable with ``WAIT``, and sharded pub/sub.

Every command the engine sends names the key (or hash tag) whose slot it runs in, and
goes to that slot's master on the connection all callers share (:mod:`.wire`); a
durable write goes on a connection of its own with its ``WAIT`` right after it:
``WAIT`` counts the replicas that have this connection's writes, so sent on another
connection it would confirm nothing. Redis errors become the engine's: a connection
lost, a failover, a refused write (``NOREPLICAS``,
``READONLY``, ``CLUSTERDOWN``) is :class:`~restms.errors.ServiceUnavailable` (or, for
a write the caller must not report, :class:`~restms.errors.NotCommitted`), never a
success.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections import deque
from collections.abc import Callable, Sequence
from importlib import resources
from typing import Any

import redis
from redis import exceptions as rex
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.connection import parse_url
from redis.driver_info import DriverInfo

from restms.errors import NotCommitted, ServiceUnavailable

from .wire import Wire, pack

log = logging.getLogger(__name__)
LIBRARY = "restms_v8"  # the name library.lua declares: bump both together
FUNCTIONS = LIBRARY + "_"  # the prefix of every function the library registers
# Errors after which the command surely did not run: asked again once the slot map is
# read again.
_MOVED = (rex.MovedError, rex.AskError, rex.TryAgainError, rex.ClusterDownError)
_DOWN = (rex.ConnectionError, rex.TimeoutError, rex.ClusterError, rex.RedisClusterException)
RETRY_AFTER = 1
SOCKET_TIMEOUT = 5.0  # seconds a master may take to answer before it counts as gone
# Bytes past which a batch goes on a connection of its own: Redis reads 16 KiB of a
# connection at a time, so large batches (a 100-message publish) sharing one would be
# read one after the other, a slice a turn of its loop.
ALONE = 16 * 1024
SPARE_KEPT = 32  # idle connections kept per master for batches alone (more are closed)
# An error reply's first word -> the redirection or refusal it is (hiredis gives every
# error reply as a plain ResponseError).
_ERRORS: dict[str, type[rex.ResponseError]] = {
    "MOVED": rex.MovedError,
    "ASK": rex.AskError,
    "TRYAGAIN": rex.TryAgainError,
    "CLUSTERDOWN": rex.ClusterDownError,
}
# Given, so that redis-py does not look its version up in the package metadata (a file
# read) each time a client is made on the event loop.
DRIVER = DriverInfo(name="restms", lib_version=redis.__version__)


# Read once at import: never a file read on the event loop.
SOURCE = resources.files(__package__).joinpath("library.lua").read_text()


def unavailable(exc: BaseException, write: bool) -> ServiceUnavailable:
    """The engine's error for a Redis failure: a write that may not be kept is not
    committed (the caller reports no success); anything else is unavailable."""
    reason = f"the message store is unavailable: {type(exc).__name__}"
    if write:
        return NotCommitted(f"{reason}; nothing was kept, retry", retry_after=RETRY_AFTER)
    return ServiceUnavailable(reason, retry_after=RETRY_AFTER)


class Unconfirmed(NotCommitted):
    """A write that may have been made though it was not confirmed: the master made it
    and no replica confirmed it in time (``results``: the commands' answers), or the
    connection failed once the commands were sent (``results`` None: whether the master
    ran them is unknown; a stopped master runs them when it resumes). Either way the
    write may be there, now or later, so the caller takes it back (or makes sure it is
    not there) and reports no success."""

    def __init__(self, results: list[Any] | None) -> None:
        super().__init__("no replica confirmed the write in time; retry", retry_after=RETRY_AFTER)
        self.results = results


class Link:
    """One engine's connections to the cluster.

    redis-py's cluster client knows the cluster's layout (which master serves which
    slot, read again after a redirection or a lost master) and loads the library; the
    commands themselves go on the engine's own connections (:class:`Wire`): one per
    master that every caller shares, its batches written as they come, and, for a
    batch with ``WAIT`` or a large one, one of its own for as long as the batch takes
    (``WAIT`` holds its connection until a replica answers: on the shared one it
    would hold every other caller's commands too; see ALONE for the large).
    """

    def __init__(
        self,
        url: str,
        replicas: int = 1,
        wait_ms: int = 1000,
        seeds: Sequence[tuple[str, int]] = (),
    ):
        self.cluster = RedisCluster.from_url(
            url,
            startup_nodes=[ClusterNode(host, port) for host, port in seeds],
            decode_responses=False,
            driver_info=DRIVER,
            socket_timeout=SOCKET_TIMEOUT,
            socket_connect_timeout=SOCKET_TIMEOUT,
        )
        self.callbacks = self.cluster.response_callbacks  # (SET's True, XRANGE's dicts)
        self.origin = secrets.token_hex(6)  # names this engine's own wake-ups (library.lua)
        self._shared: dict[str, Wire] = {}  # "host:port" -> the connection all share
        # "host:port" -> idle connections for a batch alone (WAIT, or large)
        self._spare: dict[str, list[Wire]] = {}
        self._opening: dict[str, asyncio.Task[Wire]] = {}
        # How every master is reached besides its address (user, password, TLS): the
        # subscriber's own connections need them too.
        self.credentials: dict[str, Any] = {
            key: value
            for key, value in parse_url(url).items()
            if key not in ("host", "port", "db", "path")
        }
        self.replicas = replicas  # WAIT for this many replicas after a durable write
        self.wait_ms = wait_ms
        self.commits = 0  # durable writes confirmed
        self.failures = 0  # durable writes not confirmed
        self.commit_seconds = 0.0
        self.failing = False

    async def start(self) -> None:
        try:
            await self.cluster.initialize()
            source = SOURCE
            for node in self.cluster.get_primaries():
                await self.cluster.execute_command(
                    "FUNCTION", "LOAD", "REPLACE", source, target_nodes=node
                )
        except rex.RedisError as exc:
            raise unavailable(exc, write=False) from exc

    async def close(self) -> None:
        for task in self._opening.values():
            task.cancel()
        for wire in [*self._shared.values(), *(w for s in self._spare.values() for w in s)]:
            wire.close()
        self._shared.clear()
        self._spare.clear()
        with contextlib.suppress(rex.RedisError):
            await self.cluster.aclose()

    def node(self, key: str) -> ClusterNode:
        try:
            node = self.cluster.get_node_from_key(key)
        except rex.SlotNotCoveredError:
            node = None
        if node is None:
            raise ServiceUnavailable("no node serves that slot now", retry_after=RETRY_AFTER)
        return node

    async def _wire(self, host: str, port: int) -> Wire:
        """The shared connection to a master, opened once however many ask at once."""
        name = f"{host}:{port}"
        wire = self._shared.get(name)
        if wire is not None and wire.broken is None:
            return wire
        task = self._opening.get(name)
        if task is None:
            task = asyncio.ensure_future(Wire.open(host, port, self.credentials, SOCKET_TIMEOUT))
            self._opening[name] = task
            task.add_done_callback(lambda _task: self._opening.pop(name, None))
        wire = await asyncio.shield(task)
        self._shared[name] = wire
        return wire

    async def _send(
        self, host: str, port: int, commands: list[tuple[Any, ...]], durable: bool, share: bool
    ) -> list[Any]:
        if durable:
            commands = [*commands, ("WAIT", self.replicas, self.wait_ms)]
        data = pack(commands)
        if not durable and len(data) <= ALONE:
            wire = self._shared.get(f"{host}:{port}")
            if wire is None or wire.broken is not None:
                wire = await self._wire(host, port)
            return await _answers(wire, data, len(commands), share)
        name = f"{host}:{port}"
        spare = self._spare.get(name, [])
        while spare and spare[-1].broken is not None:  # (closed while it waited)
            spare.pop()
        if spare:
            wire = spare.pop()
        else:
            wire = await Wire.open(host, port, self.credentials, SOCKET_TIMEOUT)
        try:
            return await _answers(wire, data, len(commands))
        finally:
            spare = self._spare.setdefault(name, [])
            if wire.broken is None and not wire.waiting and len(spare) < SPARE_KEPT:
                spare.append(wire)
            else:
                wire.close()  # (one a caller gave up on may yet answer it: not reused)

    async def call(
        self, key: str, *args: Any, write: bool = False, durable: bool = False, share: bool = False
    ) -> Any:
        """One command in ``key``'s slot; with ``durable``, answered once a replica has
        it too (``WAIT``), else NotCommitted; with ``share`` (a read), the answer of
        the same read another caller asked for, if it is not written yet."""
        return (await self.batch(key, [args], write=write, durable=durable, share=share))[0]

    async def batch(
        self,
        key: str,
        commands: list[tuple[Any, ...]],
        *,
        write: bool,
        durable: bool = False,
        share: bool = False,
    ) -> list[Any]:
        """Commands in ``key``'s slot, on one connection, in order."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        asking: tuple[str, int] | None = None
        for attempt in (0, 1):
            if asking is None:
                node = self.node(key)
                host, port, sent = node.host, int(node.port), commands
            else:  # the slot is on its way to another master, which takes this one
                (host, port), sent = asking, [c for args in commands for c in (("ASKING",), args)]
            try:
                results = await self._send(host, port, sent, durable, share)
            except _DOWN as exc:
                await self._refresh()
                if write and isinstance(exc, _Unanswered):
                    # Sent, and the connection failed before every answer came: the
                    # master may have run the writes, or may run them yet (a stopped
                    # one, once resumed).
                    self._failed(durable)
                    raise Unconfirmed(None) from exc
                if write or attempt:
                    self._failed(durable)
                    raise unavailable(exc, write) from exc
                continue
            if asking is not None:
                results = results[1::2] if not durable else [*results[1:-1:2], results[-1]]
            error = next((r for r in results if isinstance(r, Exception)), None)
            if durable and error is not None and error is results[-1]:
                # The writes were made, but their WAIT failed (a master turned replica
                # answers a blocked WAIT "UNBLOCKED"): made and not confirmed.
                self._failed(durable)
                raise Unconfirmed(results[:-1])
            if error is not None:
                error = _error(error)
                if isinstance(error, rex.AskError) and not isinstance(error, rex.MovedError):
                    if not attempt:
                        asking = (error.host, int(error.port))
                        continue
                elif isinstance(error, _MOVED) and not attempt:
                    await self._refresh()
                    continue
                self._failed(durable)
                # Still moving after the slot map was read again (a failover under way:
                # CLUSTERDOWN, TRYAGAIN) is the store unavailable, as a refusal is.
                moving = isinstance(error, _MOVED)
                if isinstance(error, rex.ResponseError) and not moving and not _refused(error):
                    raise error  # a bug of ours (a script error): not the store's fault
                raise unavailable(error, write) from error
            if durable:
                acked = results.pop()
                if int(acked) < self.replicas:
                    self._failed(durable)
                    raise Unconfirmed(results)
                self.commits += 1
                self.commit_seconds += loop.time() - started
                self.failing = False
            callbacks = self.callbacks
            for index, args in enumerate(commands):
                callback = callbacks.get(args[0])
                if callback is not None:
                    results[index] = callback(results[index])
            return results
        raise AssertionError("unreachable")

    def _failed(self, durable: bool) -> None:
        if durable:
            self.failures += 1
            self.failing = True

    async def _refresh(self) -> None:
        with contextlib.suppress(rex.RedisError, OSError):
            await self.cluster.nodes_manager.initialize()
        masters = {node.name for node in self.cluster.get_primaries()}
        for name in [n for n in self._shared if n not in masters]:  # demoted, or gone
            self._shared.pop(name).close()
        for name in [n for n in self._spare if n not in masters]:
            for wire in self._spare.pop(name):
                wire.close()

    async def ping(self) -> None:
        for node in self.cluster.get_primaries():
            await self.cluster.execute_command("PING", target_nodes=node)


class _Unanswered(rex.ConnectionError):
    """Commands were sent and their answers did not come (the connection failed or the
    master was silent past the timeout): whether they ran is unknown."""


async def _answers(wire: Wire, data: bytes, count: int, share: bool = False) -> list[Any]:
    """:meth:`Wire.send`, a failure after the commands were handed to the connection
    being :class:`_Unanswered`."""
    if wire.broken is not None:
        raise rex.ConnectionError("the connection to the master is gone")  # (not sent)
    try:
        return await wire.send(data, count, share)
    except (rex.ConnectionError, rex.TimeoutError) as exc:
        raise _Unanswered(str(exc)) from exc


def _error(error: Exception) -> Exception:
    """An error reply as redis-py's error of its kind (a redirection, CLUSTERDOWN...)."""
    if type(error) is not rex.ResponseError:
        return error
    text = str(error)
    word, _, rest = text.partition(" ")
    kind = _ERRORS.get(word)
    return error if kind is None else kind(rest if kind in (rex.MovedError, rex.AskError) else text)


def _refused(error: rex.ResponseError) -> bool:
    text = str(error)
    return text.startswith(
        ("NOREPLICAS", "READONLY", "MASTERDOWN", "LOADING", "BUSY", "OOM", "SETTLED")
    )


class Subscriber:
    """Sharded pub/sub: the channels this engine listens on, each on a connection to
    its slot's master (a :class:`Wire` whose every reply is a push), each message
    handed to ``deliver(channel, data)`` as it is read, without a task in between. On
    a lost connection, or a channel its master no longer serves (its slot moved, the
    master became a replica: the server unsubscribes it), the channels are subscribed
    again where their slots now live, and ``lost()`` is called (a message may have
    been missed: the waiters look again)."""

    def __init__(self, link: Link, deliver: Callable[[str, bytes], None], lost: Callable[[], None]):
        self.link = link
        self.deliver = deliver
        self.lost = lost
        self.channels: dict[str, str] = {}  # channel -> node name
        self._wires: dict[str, Wire] = {}  # node name -> its subscribed connection
        # Per connection, the subscriptions asked for and not yet confirmed, in order.
        self._asked: dict[Wire, deque[tuple[bytes, asyncio.Future[None]]]] = {}
        self._lock = asyncio.Lock()
        self._moving: set[asyncio.Task[None]] = set()
        self.closed = False

    async def subscribe(self, channel: str) -> None:
        async with self._lock:
            if channel in self.channels:
                return
            node = self.link.node(channel)
            wire = self._wires.get(node.name)
            if wire is None or wire.broken is not None:
                wire = await self._open(node.name, node.host, int(node.port))
            confirmed = asyncio.get_running_loop().create_future()
            self._asked[wire].append((channel.encode(), confirmed))
            wire.write(("SSUBSCRIBE", channel))
            try:
                async with asyncio.timeout(SOCKET_TIMEOUT):
                    await confirmed
            except TimeoutError as exc:
                wire.close()
                raise rex.TimeoutError("no answer to a subscription") from exc
            self.channels[channel] = node.name

    async def unsubscribe(self, channel: str) -> None:
        async with self._lock:
            name = self.channels.pop(channel, None)
            wire = self._wires.get(name or "")
            if wire is not None and wire.broken is None:
                wire.write(("SUNSUBSCRIBE", channel))  # its confirmation is not waited for

    async def _open(self, name: str, host: str, port: int) -> Wire:
        wire = await Wire.open(host, port, self.link.credentials, SOCKET_TIMEOUT)
        self._wires[name] = wire
        self._asked[wire] = deque()
        wire.on_push = lambda reply: self._pushed(wire, name, reply)
        wire.on_broken = lambda: self._broken(wire, name)
        return wire

    def _pushed(self, wire: Wire, name: str, reply: Any) -> None:
        if isinstance(reply, list) and len(reply) == 3:
            kind, channel, data = reply
            if kind == b"smessage":
                self.deliver(channel.decode(), data)
                return
            asked = self._asked.get(wire)
            if kind == b"ssubscribe" and asked:
                for index, (wanted, confirmed) in enumerate(asked):
                    if wanted == channel:
                        del asked[index]
                        if not confirmed.done():
                            confirmed.set_result(None)
                        break
                return
            if kind == b"sunsubscribe":
                text = channel.decode()
                if self.channels.get(text) == name:  # not asked for: its slot moved
                    del self.channels[text]
                    self._move([text])
                return
        elif isinstance(reply, Exception):  # a subscription refused (MOVED, ...)
            asked = self._asked.get(wire)
            if asked:
                _channel, confirmed = asked.popleft()
                if not confirmed.done():
                    confirmed.set_exception(_error(reply))

    def _broken(self, wire: Wire, name: str) -> None:
        """Its master went: every channel it carried is subscribed again."""
        for _channel, confirmed in self._asked.pop(wire, ()):
            if not confirmed.done():
                confirmed.set_exception(wire.broken or rex.ConnectionError("lost"))
        if self._wires.get(name) is wire:
            del self._wires[name]
        if self.closed:
            return
        moved = [c for c, n in self.channels.items() if n == name]
        for channel in moved:
            del self.channels[channel]
        self._move(moved)

    def _move(self, channels: list[str]) -> None:
        task = asyncio.get_running_loop().create_task(self._resubscribe(channels))
        self._moving.add(task)
        task.add_done_callback(self._moving.discard)

    async def _resubscribe(self, channels: list[str]) -> None:
        await self.link._refresh()
        for channel in channels:
            for _ in range(50):
                try:
                    await self.subscribe(channel)
                    break
                except (rex.RedisError, OSError, ServiceUnavailable):
                    if self.closed:
                        return
                    await asyncio.sleep(0.1)
        self.lost()

    async def close(self) -> None:
        self.closed = True
        for task in list(self._moving):
            task.cancel()
        await asyncio.gather(*self._moving, return_exceptions=True)
        for wire in list(self._wires.values()):
            wire.close()
        self._wires.clear()
        self._asked.clear()
        self.channels.clear()
