"""Real ZeroMQ peers in their own processes, driven from async tests.

``Peer.start(role, *args)`` runs ``python -m tests.integration.zmq_peer`` (see that
module for the roles, options, commands and events) and waits for its ``ready``
event; ``send`` writes a command, ``event`` waits for the next event of a kind, and
``received`` gathers ``recv`` frames. Everything runs on asyncio subprocess pipes,
so nothing blocks the loop (blockbuster), and every wait is bounded: a timeout or a
peer that exits early fails the test with the peer's stderr tail.

``Peers`` holds every peer a test starts and kills those still running when it is
closed, pass or fail: use it as an async context manager or from a fixture.

``settle`` publishes probes until each subscriber has had one, so a test knows its
subscriptions have reached the publisher (a SUB that joins late just misses
messages). The subscribers then drop those probe messages silently.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import sys
from collections import defaultdict, deque
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
LINE_LIMIT = 64 * 1024 * 1024  # one event line: a recv of large frames, base64
STDERR_TAIL = 40


def b64(frames: Sequence[bytes]) -> list[str]:
    """Frames as the peers' JSON carries them."""
    return [base64.b64encode(f).decode("ascii") for f in frames]


def unb64(frames: Sequence[str]) -> list[bytes]:
    return [base64.b64decode(f, validate=True) for f in frames]


class Peer:
    """One zmq_peer process: its pipes, its events by kind, its stderr tail."""

    def __init__(self, role: str, proc: asyncio.subprocess.Process) -> None:
        self.role = role
        self.proc = proc
        self.pid = proc.pid
        self.endpoints: list[str] = []
        self.probes_seen = 0
        self._probes: set[tuple[bytes, ...]] = set()
        self._events: defaultdict[str, deque[dict[str, Any]]] = defaultdict(deque)
        self._arrived = asyncio.Event()
        self._eof = False
        self._stderr: deque[str] = deque(maxlen=STDERR_TAIL)
        self._readers = (
            asyncio.create_task(self._read_events()),
            asyncio.create_task(self._read_stderr()),
        )

    def __repr__(self) -> str:
        return f"<zmq peer {self.role} pid {self.pid}>"

    @classmethod
    async def start(cls, role: str, *args: str, timeout: float = 10.0) -> Peer:
        """Start a peer and wait (bounded) until it has bound or connected."""
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.integration.zmq_peer",
            role,
            *args,
            cwd=ROOT,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            limit=LINE_LIMIT,
        )
        peer = cls(role, proc)
        try:
            ready = await peer.event("ready", timeout)
        except BaseException:
            await peer.kill()
            raise
        peer.endpoints = list(ready["endpoints"])
        return peer

    @property
    def endpoint(self) -> str:
        """The first (usually the only) endpoint."""
        return self.endpoints[0]

    # -- talking to it

    async def send(self, op: dict[str, Any]) -> None:
        """Write one command line."""
        stdin = self.proc.stdin
        assert stdin is not None
        if self._eof or self.proc.returncode is not None:
            raise await self._failure(f"cannot send {op.get('op')!r}: it has exited")
        try:
            stdin.write(json.dumps(op).encode() + b"\n")
            async with asyncio.timeout(10.0):
                await stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            raise await self._failure(f"cannot send {op.get('op')!r}: its stdin is gone") from None
        except TimeoutError:
            raise await self._failure(f"{op.get('op')!r} not taken within 10 s") from None

    async def event(self, kind: str, timeout: float = 10.0) -> dict[str, Any]:
        """The next event of ``kind`` (others stay queued for their own waiters)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            queued = self._events[kind]
            if queued:
                return queued.popleft()
            if self._eof:
                raise await self._failure(f"exited before a {kind!r} event")
            self._arrived.clear()
            try:
                async with asyncio.timeout_at(deadline):
                    await self._arrived.wait()
            except TimeoutError:
                raise await self._failure(f"no {kind!r} event within {timeout:.3g} s") from None

    async def received(self, count: int, timeout: float = 10.0) -> list[list[bytes]]:
        """The frames of the next ``count`` messages it receives, within ``timeout`` in all."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        got: list[list[bytes]] = []
        while len(got) < count:
            try:
                ev = await self.event("recv", max(deadline - loop.time(), 0.0))
            except AssertionError as exc:
                raise AssertionError(f"{len(got)} of {count} messages: {exc}") from None
            got.append(unb64(ev["frames"]))
        return got

    async def stats(self) -> dict[str, Any]:
        await self.send({"op": "stats"})
        return await self.event("stats")

    async def stop(self, timeout: float = 10.0) -> dict[str, Any]:
        """Ask it to stop; return its ``stopped`` event once it has exited."""
        try:
            await self.send({"op": "stop"})
            stopped = await self.event("stopped", timeout)
            await self.exited(timeout)
        except BaseException:
            await self.kill()
            raise
        return stopped

    async def exited(self, timeout: float = 10.0) -> int:
        """Wait (bounded) for it to exit; return its exit code."""
        try:
            async with asyncio.timeout(timeout):
                code = await self.proc.wait()
                await asyncio.gather(*self._readers)
        except TimeoutError:
            raise await self._failure(f"still running after {timeout} s") from None
        return code

    async def kill(self) -> None:
        """SIGKILL it (if it still runs) and reap it."""
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
        await self.exited()

    def ignore(self, *messages: Sequence[bytes]) -> None:
        """Drop received messages equal to one of these (``settle``'s probes), counting them."""
        self._probes.update(tuple(m) for m in messages)

    # -- internals

    async def _read_events(self) -> None:
        assert self.proc.stdout is not None
        try:
            while line := await self.proc.stdout.readline():
                try:
                    ev = json.loads(line)
                except ValueError:
                    self._stderr.append(f"(stdout) {line.decode(errors='replace').rstrip()}")
                    continue
                if ev.get("ev") == "recv" and tuple(unb64(ev["frames"])) in self._probes:
                    self.probes_seen += 1
                else:
                    self._events[ev.get("ev")].append(ev)
                self._arrived.set()
        finally:
            self._eof = True
            self._arrived.set()

    async def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        while line := await self.proc.stderr.readline():
            self._stderr.append(line.decode(errors="replace").rstrip())

    async def _failure(self, what: str) -> AssertionError:
        if self._eof:
            # It has gone: give its stderr and exit code a moment to arrive.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(2.0):
                    await self.proc.wait()
                    await self._readers[1]
        code = self.proc.returncode
        state = "running" if code is None else f"exit code {code}"
        errors = [e["error"] for e in self._events.get("error", ())]
        lines = [f"{self!r} ({state}): {what}"]
        if errors:
            lines.append("its error events: " + "; ".join(errors))
        lines.append("stderr tail:" if self._stderr else "stderr: (empty)")
        lines.extend(f"  {line}" for line in self._stderr)
        return AssertionError("\n".join(lines))


class Peers:
    """The peers of one test: each one started here is killed on ``close``."""

    def __init__(self) -> None:
        self.started: list[Peer] = []

    async def start(self, role: str, *args: str, timeout: float = 10.0) -> Peer:
        peer = await Peer.start(role, *args, timeout=timeout)
        self.started.append(peer)
        return peer

    async def close(self) -> None:
        started, self.started = self.started, []
        await asyncio.gather(*(peer.kill() for peer in started))

    async def __aenter__(self) -> Peers:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


async def settle(
    pub: Peer, subs: Iterable[Peer], *probes: Sequence[bytes], timeout: float = 10.0
) -> None:
    """Publish ``probes`` until every subscriber has had one of them (bounded).

    Each probe must match some subscriber's prefixes; the subscribers drop probes
    from then on, so they never show in ``received``.
    """
    waiting = list(subs)
    for sub in waiting:
        sub.ignore(*probes)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        await pub.send({"op": "send_many", "messages": [b64(p) for p in probes]})
        await pub.event("sent")
        await asyncio.sleep(0.05)
        waiting = [sub for sub in waiting if sub.probes_seen == 0]
        if not waiting:
            return
        if loop.time() > deadline:
            raise AssertionError(f"{waiting} had no probe from {pub!r} within {timeout} s")
