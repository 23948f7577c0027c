"""The engine's link to its Redis Cluster: commands routed by hash slot, the function
library, a write made durable with ``WAIT``, and sharded pub/sub.

Every command the engine sends names the key (or hash tag) whose slot it runs in, and
goes to that slot's master on one pooled connection, with any ``WAIT`` after it on
the same connection: ``WAIT`` counts the replicas that have this connection's writes,
so sent on another connection it would confirm nothing. Redis errors become the
engine's: a connection lost, a failover, a refused write (``NOREPLICAS``,
``READONLY``, ``CLUSTERDOWN``) is :class:`~restms.errors.ServiceUnavailable` (or, for
a write the caller must not report, :class:`~restms.errors.NotCommitted`), never a
success.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from importlib import resources
from typing import Any

import redis
from redis import exceptions as rex
from redis.asyncio import Redis
from redis.asyncio.client import PubSub
from redis.asyncio.cluster import ClusterNode, PipelineCommand, RedisCluster
from redis.asyncio.connection import parse_url
from redis.driver_info import DriverInfo

from restms.errors import NotCommitted, ServiceUnavailable

log = logging.getLogger(__name__)
LIBRARY = "restms_v5"  # the name library.lua declares: bump both together
FUNCTIONS = LIBRARY + "_"  # the prefix of every function the library registers
# Errors after which the command surely did not run: asked again once the slot map is
# read again.
_MOVED = (rex.MovedError, rex.AskError, rex.TryAgainError, rex.ClusterDownError)
_DOWN = (rex.ConnectionError, rex.TimeoutError, rex.ClusterError, rex.RedisClusterException)
_LOST = (rex.ConnectionError, rex.TimeoutError, OSError)  # no answer: the command's fate unknown
RETRY_AFTER = 1
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
    """One engine's connections to the cluster."""

    def __init__(self, url: str, replicas: int = 1, wait_ms: int = 1000):
        self.cluster = RedisCluster.from_url(
            url,
            decode_responses=False,
            driver_info=DRIVER,
            socket_timeout=5.0,
            socket_connect_timeout=5.0,
        )
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
        with contextlib.suppress(rex.RedisError):
            await self.cluster.aclose()

    def node(self, key: str) -> ClusterNode:
        node = self.cluster.get_node_from_key(key)
        if node is None:
            raise ServiceUnavailable("no node serves that slot now", retry_after=RETRY_AFTER)
        return node

    async def call(self, key: str, *args: Any, write: bool = False, durable: bool = False) -> Any:
        """One command in ``key``'s slot; with ``durable``, answered once a replica has
        it too (``WAIT``), else NotCommitted."""
        return (await self.batch(key, [args], write=write, durable=durable))[0]

    async def batch(
        self, key: str, commands: list[tuple[Any, ...]], *, write: bool, durable: bool = False
    ) -> list[Any]:
        """Commands in ``key``'s slot, on one connection, in order."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        for attempt in (0, 1):
            node = self.node(key)
            sent = [PipelineCommand(i, *args) for i, args in enumerate(commands)]
            if durable:
                sent.append(PipelineCommand(len(sent), "WAIT", self.replicas, self.wait_ms))
            try:
                await node.execute_pipeline(sent)
            except _DOWN as exc:
                await self._refresh()
                if write or attempt:
                    self._failed(durable)
                    raise unavailable(exc, write) from exc
                continue
            results = [command.result for command in sent]
            if write and any(isinstance(r, _LOST) for r in results):
                # Sent, and the connection failed before every answer came (redis-py
                # keeps a read's failure as the command's result): the master may have
                # run the writes, or may run them yet (a stopped one, once resumed).
                await self._refresh()
                self._failed(durable)
                raise Unconfirmed(None)
            error = next((r for r in results if isinstance(r, Exception)), None)
            if isinstance(error, _MOVED) and not attempt:
                await self._refresh()
                continue
            if durable and error is not None and error is results[-1]:
                # The writes were made, their WAIT failed (a stopped master resumed and
                # turned replica answers a blocked WAIT "UNBLOCKED"): made, unconfirmed.
                self._failed(durable)
                raise Unconfirmed(results[:-1])
            if error is not None:
                self._failed(durable)
                # Still moving after the slot map was read again (a failover under way:
                # CLUSTERDOWN, TRYAGAIN) is the store unavailable, as a refusal is.
                moving = isinstance(error, _MOVED)
                if isinstance(error, rex.ResponseError) and not moving and not _refused(error):
                    raise error  # a bug of ours (a script error): not the store's fault
                raise unavailable(error, write) from error
            if durable:
                acked = results.pop()
                if int(str(acked)) < self.replicas:
                    self._failed(durable)
                    raise Unconfirmed(results)
                self.commits += 1
                self.commit_seconds += loop.time() - started
                self.failing = False
            return results
        raise AssertionError("unreachable")

    def _failed(self, durable: bool) -> None:
        if durable:
            self.failures += 1
            self.failing = True

    async def _refresh(self) -> None:
        with contextlib.suppress(rex.RedisError, OSError):
            await self.cluster.nodes_manager.initialize()

    async def ping(self) -> None:
        for node in self.cluster.get_primaries():
            await self.cluster.execute_command("PING", target_nodes=node)


def _refused(error: rex.ResponseError) -> bool:
    text = str(error)
    return text.startswith(
        ("NOREPLICAS", "READONLY", "MASTERDOWN", "LOADING", "BUSY", "OOM", "SETTLED")
    )


class Subscriber:
    """Sharded pub/sub: the channels this engine listens on, each on a connection to
    its slot's master, and one reader task per master calling ``deliver(channel,
    data)`` for each message. On a lost connection every channel is subscribed again
    where its slot now lives, and ``lost()`` is called (a message may have been missed:
    the waiters look again)."""

    def __init__(self, link: Link, deliver: Callable[[str, bytes], None], lost: Callable[[], None]):
        self.link = link
        self.deliver = deliver
        self.lost = lost
        self.channels: dict[str, str] = {}  # channel -> node name
        self._pubsubs: dict[str, PubSub] = {}
        self._clients: dict[str, Redis] = {}
        self._readers: dict[str, asyncio.Task[None]] = {}
        self._lock = asyncio.Lock()
        self.closed = False

    async def subscribe(self, channel: str) -> None:
        async with self._lock:
            if channel in self.channels:
                return
            node = self.link.node(channel)
            pubsub = self._pubsub(node)
            await pubsub.ssubscribe(channel)
            self.channels[channel] = node.name

    async def unsubscribe(self, channel: str) -> None:
        async with self._lock:
            name = self.channels.pop(channel, None)
            pubsub = self._pubsubs.get(name or "")
            if pubsub is not None:
                with contextlib.suppress(rex.RedisError, OSError):
                    await pubsub.sunsubscribe(channel)

    def _pubsub(self, node: ClusterNode) -> PubSub:
        pubsub = self._pubsubs.get(node.name)
        if pubsub is None:
            client = self._clients[node.name] = Redis(
                host=node.host, port=int(node.port), driver_info=DRIVER, **self.link.credentials
            )
            pubsub = client.pubsub()
            self._pubsubs[node.name] = pubsub
            self._readers[node.name] = asyncio.create_task(
                self._read(node.name, pubsub), name=f"redis-pubsub-{node.name}"
            )
        return pubsub

    async def _read(self, name: str, pubsub: PubSub) -> None:
        while not self.closed:
            try:
                if not pubsub.subscribed:
                    await asyncio.sleep(0.05)
                    continue
                message = await pubsub.get_message(timeout=1.0)
            except (rex.RedisError, OSError):
                if not self.closed:
                    await self._resubscribe(name)
                return
            if message is None or message["type"] not in (b"smessage", "smessage"):
                continue
            channel = message["channel"]
            if isinstance(channel, bytes):
                channel = channel.decode()
            self.deliver(channel, message["data"])

    async def _resubscribe(self, name: str) -> None:
        """Its master went: every channel it carried is subscribed again."""
        async with self._lock:
            pubsub = self._pubsubs.pop(name, None)
            client = self._clients.pop(name, None)
            self._readers.pop(name, None)
            if pubsub is not None:
                with contextlib.suppress(rex.RedisError, OSError):
                    await pubsub.aclose()  # type: ignore[no-untyped-call]
            if client is not None:
                with contextlib.suppress(rex.RedisError, OSError):
                    await client.aclose()
            moved = [c for c, n in self.channels.items() if n == name]
            for channel in moved:
                del self.channels[channel]
        await self.link._refresh()
        for channel in moved:
            for _ in range(50):
                try:
                    await self.subscribe(channel)
                    break
                except (rex.RedisError, OSError):
                    await asyncio.sleep(0.1)
        self.lost()

    async def close(self) -> None:
        self.closed = True
        readers, self._readers = list(self._readers.values()), {}
        for task in readers:
            task.cancel()
        await asyncio.gather(*readers, return_exceptions=True)
        for pubsub in self._pubsubs.values():
            with contextlib.suppress(rex.RedisError, OSError):
                await pubsub.aclose()  # type: ignore[no-untyped-call]
        for client in self._clients.values():
            with contextlib.suppress(rex.RedisError, OSError):
                await client.aclose()
        self._pubsubs.clear()
        self._clients.clear()
        self.channels.clear()
