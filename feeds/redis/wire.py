"""One connection to one master of the Redis Cluster (:class:`Wire`): many callers'
commands written together, their replies parsed by hiredis and matched in order, a
silent master detected by a watchdog. :mod:`.link` routes commands onto these
connections; its subscriber's connections are wires too, every reply a push.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, cast

import hiredis
from redis import exceptions as rex

# A batch on a connection: its callers' futures, how many replies it waits for, those
# come so far, when it was sent.
_Batch = tuple[list[asyncio.Future[list[Any]]], int, list[Any], float]


def pack(commands: Sequence[tuple[Any, ...]]) -> bytes:
    """Commands in the protocol's form (hiredis packs them)."""
    if len(commands) == 1:
        return cast("bytes", hiredis.pack_command(commands[0]))
    return b"".join(map(hiredis.pack_command, commands))


class Wire(asyncio.Protocol):
    """One connection to one master, carrying many callers' commands at once: each
    batch is written whole as it comes, its replies are parsed by hiredis and matched
    to it in order. A reply later than ``timeout`` (a silent master) ends the
    connection, and every batch waiting on it fails with a timeout; a lost connection
    fails them with a connection error."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.transport: asyncio.Transport | None = None
        self.reader = hiredis.Reader(replyError=rex.ResponseError)
        # Per batch sent and not yet answered: its callers' futures, how many replies it
        # waits for, those come so far, and when it was sent.
        self.waiting: deque[_Batch] = deque()
        self._unsent: dict[bytes, _Batch] = {}  # reads not written yet, that callers share
        self.broken: BaseException | None = None
        # A subscriber's connection hands every reply to this instead (pushed messages
        # and confirmations alike), and is told when it breaks.
        self.on_push: Callable[[Any], None] | None = None
        self.on_broken: Callable[[], None] | None = None
        self._watchdog: asyncio.TimerHandle | None = None
        self._loop = asyncio.get_running_loop()
        self._out: list[bytes] = []  # written once the callers of this turn of the loop sent

    @classmethod
    async def open(cls, host: str, port: int, credentials: dict[str, Any], timeout: float) -> Wire:
        loop = asyncio.get_running_loop()
        tls = ssl.create_default_context() if credentials.get("connection_class") else None
        try:
            async with asyncio.timeout(timeout):
                _transport, wire = await loop.create_connection(
                    lambda: cls(timeout), host, port, ssl=tls
                )
                password = credentials.get("password")
                if password is not None:
                    user = credentials.get("username") or "default"
                    (reply,) = await wire.send(pack([("AUTH", user, password)]), 1)
                    if isinstance(reply, Exception):
                        wire.close()
                        raise reply
        except (OSError, TimeoutError) as exc:
            raise rex.ConnectionError(f"{host}:{port}: {exc}") from exc
        return wire

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast("asyncio.Transport", transport)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def send(self, data: bytes, count: int, share: bool = False) -> asyncio.Future[list[Any]]:
        """Write ``count`` packed commands (:func:`pack`); the future of their replies,
        in order (an error reply is a :class:`redis.exceptions.ResponseError` in its
        place). ``share``: a read that callers asking for the same before it is
        written share (its answer is as of a moment after each of them asked)."""
        future: asyncio.Future[list[Any]] = self._loop.create_future()
        if self.broken is not None or self.transport is None:
            future.set_exception(rex.ConnectionError("the connection to the master is gone"))
            return future
        if share:
            joined = self._unsent.get(data)
            if joined is not None:
                joined[0].append(future)
                return future
        now = self._loop.time()
        batch: _Batch = ([future], count, [], now)
        self.waiting.append(batch)
        if share:
            self._unsent[data] = batch
        if self._watchdog is None:
            self._watchdog = self._loop.call_at(now + self.timeout, self._watch)
        if not self._out:
            self._loop.call_soon(self._flush)
        self._out.append(data)
        return future

    def write(self, command: tuple[Any, ...]) -> None:
        """Write a command whose answer ``on_push`` takes (a subscriber's)."""
        if self.broken is None and self.transport is not None:
            self.transport.write(hiredis.pack_command(command))

    def _flush(self) -> None:
        """One write (and one read on the server's side) for the batches of many
        callers: under load, a system call a batch was most of a command's cost."""
        out, self._out = self._out, []
        self._unsent.clear()
        if self.transport is not None and self.broken is None:
            self.transport.write(out[0] if len(out) == 1 else b"".join(out))

    def data_received(self, data: bytes) -> None:
        reader = self.reader
        reader.feed(data)
        waiting = self.waiting
        while (reply := reader.gets()) is not False:
            if self.on_push is not None:
                self.on_push(reply)
                continue
            if not waiting:
                self._fail(rex.ConnectionError("a reply nothing was sent for"))
                return
            futures, count, replies, _sent = waiting[0]
            replies.append(reply)
            if len(replies) == count:
                waiting.popleft()
                for future in futures:
                    if not future.done():  # (its caller may have given up)
                        future.set_result(replies if len(futures) == 1 else list(replies))

    def _watch(self) -> None:
        self._watchdog = None
        if not self.waiting or self.broken is not None:
            return
        due = self.waiting[0][3] + self.timeout
        if self._loop.time() >= due:
            self._fail(rex.TimeoutError(f"no answer from the master in {self.timeout} s"))
        else:
            self._watchdog = self._loop.call_at(due, self._watch)

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(rex.ConnectionError(f"the connection to the master was lost: {exc}"))

    def _fail(self, error: BaseException) -> None:
        first = self.broken is None
        if first:
            self.broken = error
        if self.transport is not None:
            self.transport.abort()
        broken = self.broken or error
        waiting, self.waiting = self.waiting, deque()
        for futures, _count, _replies, _sent in waiting:
            for future in futures:
                if not future.done():
                    future.set_exception(broken)
        if first and self.on_broken is not None:
            self.on_broken()

    def close(self) -> None:
        self._fail(rex.ConnectionError("closed"))
