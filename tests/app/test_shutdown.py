"""Graceful shutdown: the real server, sent SIGTERM (or SIGINT) while clients are busy.

Decided behaviour under test (docs/ARCHITECTURE.md, "Graceful shutdown"):

* waiting asynclets and evented GETs are answered at once with a retriable 503 (``Retry-After``,
  ``text/plain``, ``Connection: close``) instead of waiting out ``max_wait``;
* publishes in flight are answered, and every one answered 200 is there after a
  restart;
* the listening socket closes at once: a new connection is refused while a request
  in flight is still being finished;
* SSE and stream-pipe responses end instead of hanging;
* the process exits 0 within ``shutdown_grace`` seconds even when a request never
  finishes (it is cancelled), and at once on a second signal.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from multidict import CIMultiDict

from tests.app.jsonapi import AJ, DOMAIN, HJ, JSON, body, get, new_pipe
from tests.app.process import listening_port, start

GRACE = 2.0  # RESTMS_SHUTDOWN_GRACE in these tests
PROMPT = 2.0  # seconds within which a wait or a stream ends, and an idle gateway exits
FEED = "/restms/feed/default"  # routes on the address: the pipe's name


class Running:
    """A gateway process, a client session bound to it, and what it logs.

    It has the ``http`` attribute the helpers of :mod:`tests.app.jsonapi` use.
    """

    def __init__(self, proc: asyncio.subprocess.Process, port: int) -> None:
        assert proc.stderr is not None
        self.proc = proc
        self.port = port
        self.http = aiohttp.ClientSession(
            base_url=f"http://127.0.0.1:{port}", timeout=aiohttp.ClientTimeout(total=30)
        )
        self.log: list[str] = []
        self._reader = asyncio.create_task(self._read(proc.stderr))

    async def _read(self, stream: asyncio.StreamReader) -> None:
        while line := await stream.readline():
            self.log.append(line.decode(errors="replace"))

    def signal(self, sig: signal.Signals = signal.SIGTERM) -> float:
        """Send ``sig``; the monotonic time it was sent."""
        self.proc.send_signal(sig)
        return time.monotonic()

    async def exited(self, since: float, within: float) -> float:
        """Assert the process exits 0 within ``within`` seconds of ``since``; the time it took."""
        async with asyncio.timeout(within):
            code = await self.proc.wait()
            await self._reader
        took = time.monotonic() - since
        assert code == 0, "".join(self.log)
        assert "stopped" in self.log[-1], "".join(self.log)
        return took

    def logged(self, text: str) -> bool:
        return any(text in line for line in self.log)


@contextlib.asynccontextmanager
async def gateway(data: Path) -> AsyncIterator[Running]:
    env = {"RESTMS_SHUTDOWN_GRACE": str(GRACE)}
    proc = await start("--port", "0", "--data-dir", str(data), env=env)
    try:
        running = Running(proc, await listening_port(proc))
        try:
            yield running
        finally:
            await running.http.close()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def persistent(pipe: dict[str, Any], mid: str) -> dict[str, Any]:
    return {
        "address": pipe["name"],
        "message_id": mid,
        "delivery_mode": "2",
        "content": [{"type": "text/plain", "value": mid}],
    }


async def listing(gw: Running, pipe: dict[str, Any]) -> list[dict[str, str]]:
    """The pipe's messages; by path, as a restarted gateway listens on another port."""
    status, reply = await get(gw, urlsplit(pipe["uri"]).path)
    assert status == 200, reply
    return list(reply["restms"]["pipe"][0].get("message", []))


async def held(gw: Running, pipe: dict[str, Any]) -> list[str]:
    """The ids of the messages the pipe holds."""
    return [m["message_id"] for m in await listing(gw, pipe) if m.get("async") != "1"]


async def asynclet(gw: Running, pipe: dict[str, Any]) -> str:
    (href,) = [m["href"] for m in await listing(gw, pipe) if m.get("async") == "1"]
    return href


def assert_retriable(status: int, headers: Any, text: str) -> None:
    assert status == 503, (status, text)
    assert int(headers["Retry-After"]) >= 0
    assert headers["Content-Type"].startswith("text/plain")
    assert "shutting down" in text
    assert headers["Connection"] == "close"


class Connection:
    """One HTTP/1.1 connection written by hand, so that a request can be left half sent."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.rest = b""  # what :meth:`send` held back of the last body

    def send(self, method: str, path: str, payload: bytes = b"", *, stall: bool = False) -> None:
        """Write a request; with ``stall``, only its head and the body's first bytes."""
        host, port = self.writer.get_extra_info("peername")[:2]  # a Host served there
        head = f"{method} {path} HTTP/1.1\r\nHost: {host}:{port}\r\nAccept: {JSON}\r\n"
        if payload:
            head += f"Content-Type: {JSON}\r\nContent-Length: {len(payload)}\r\n"
        if stall:  # the 100 goes out just before the handler starts: then it is in flight
            head += "Expect: 100-continue\r\n"
        cut = 10 if stall else len(payload)
        self.writer.write(head.encode() + b"\r\n" + payload[:cut])
        self.rest = payload[cut:]

    def resume(self) -> None:
        """Send the rest of a stalled body."""
        self.writer.write(self.rest)

    async def reply(self) -> tuple[int, CIMultiDict[str], str]:
        async with asyncio.timeout(PROMPT):
            head = (await self.reader.readuntil(b"\r\n\r\n")).decode()
            status_line, *lines = head.rstrip("\r\n").split("\r\n")
            headers = CIMultiDict(line.split(": ", 1) for line in lines)
            length = int(headers.get("Content-Length", "0"))
            text = (await self.reader.readexactly(length)).decode()
        return int(status_line.split()[1]), headers, text

    async def closed_by_server(self) -> bool:
        async with asyncio.timeout(PROMPT):
            return await self.reader.read() == b""


@contextlib.asynccontextmanager
async def connection(port: int) -> AsyncIterator[Connection]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        yield Connection(reader, writer)
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


@contextlib.asynccontextmanager
async def busy(data: Path, mid: str) -> AsyncIterator[tuple[Running, dict[str, Any], Connection]]:
    """A gateway, a pipe, and a persistent publish to it in flight until ``resume()``."""
    async with gateway(data) as gw:
        pipe = await new_pipe(gw)
        async with connection(gw.port) as slow:
            slow.send("POST", FEED, body(message=[persistent(pipe, mid)]), stall=True)
            assert (await slow.reply())[0] == 100
            yield gw, pipe, slow


async def refused(port: int) -> None:
    """Connect until the connection is refused (bounded)."""
    async with asyncio.timeout(PROMPT):
        while True:
            try:
                async with connection(port):
                    pass
            except ConnectionRefusedError:
                return
            except ConnectionResetError:
                pass  # it was queued when the listening socket closed: try again
            await asyncio.sleep(0.01)


# ---------------------------------------------------------------- tests
async def test_waiting_asynclets_and_evented_gets_get_a_retriable_503_at_once(
    tmp_path: Path,
) -> None:
    async with gateway(tmp_path) as gw:
        pipes = [await new_pipe(gw) for _ in range(3)]
        hrefs = [await asynclet(gw, pipe) for pipe in pipes]
        async with gw.http.get(pipes[0]["uri"], headers=AJ) as r:
            unchanged = {**AJ, "When-None-Match": r.headers["ETag"]}  # H9: wait for a change

        async def wait(href: str, headers: dict[str, str]) -> tuple[int, Any, str]:
            async with gw.http.get(href, headers=headers) as r:
                return r.status, r.headers, await r.text()

        waits = [asyncio.create_task(wait(href, AJ)) for href in hrefs * 2]  # two on each pipe
        waits.append(asyncio.create_task(wait(pipes[0]["uri"], unchanged)))
        await asyncio.sleep(0.3)  # long enough to be waiting; max_wait is 300 s
        assert not any(w.done() for w in waits)
        sent = gw.signal()
        async with asyncio.timeout(PROMPT):
            replies = await asyncio.gather(*waits)
        for reply in replies:
            assert_retriable(*reply)
        await gw.exited(sent, within=PROMPT)
        assert gw.logged("shutting down: 7 requests in flight")


async def test_publishes_in_flight_are_answered_and_survive_a_restart(tmp_path: Path) -> None:
    answered: list[str] = []
    enough = asyncio.Event()
    async with gateway(tmp_path) as gw:
        pipe = await new_pipe(gw)

        async def publisher(p: int) -> None:
            for i in itertools.count():
                data = body(message=[persistent(pipe, f"{p}-{i}")])
                try:
                    async with gw.http.post(FEED, data=data, headers=HJ) as r:
                        reply = r.status, r.headers, await r.text()
                except aiohttp.ClientConnectionError:
                    return  # refused: the gateway no longer listens
                if reply[0] != 200:
                    assert_retriable(*reply)  # arrived after shutdown began
                    return
                answered.append(f"{p}-{i}")
                if len(answered) >= 40:
                    enough.set()

        publishers = [asyncio.create_task(publisher(p)) for p in range(4)]
        async with asyncio.timeout(PROMPT):
            await enough.wait()
        sent = gw.signal()
        async with asyncio.timeout(GRACE):
            await asyncio.gather(*publishers)
        await gw.exited(sent, within=GRACE)

    async with gateway(tmp_path) as gw:
        found = await held(gw, pipe)
        assert len(found) == len(set(found))
        assert set(answered) <= set(found), sorted(set(answered) - set(found))
        sent = gw.signal()
        await gw.exited(sent, within=PROMPT)


async def test_new_connections_are_refused_while_a_publish_in_flight_finishes(
    tmp_path: Path,
) -> None:
    async with busy(tmp_path, "slow") as (gw, pipe, slow):
        sent = gw.signal()
        await refused(gw.port)
        slow.resume()
        status, headers, text = await slow.reply()
        assert status == 200, text
        assert json.loads(text)["restms"]["message"][0]["count"] == "1"
        assert headers["Connection"] == "close"
        assert await slow.closed_by_server()
        await gw.exited(sent, within=GRACE)
        assert gw.logged("shutting down: 1 requests in flight")
        assert not gw.logged("cancelled")

    async with gateway(tmp_path) as gw:
        assert await held(gw, pipe) == ["slow"]
        await gw.exited(gw.signal(), within=PROMPT)


async def test_a_request_on_a_connection_opened_before_gets_a_retriable_503(
    tmp_path: Path,
) -> None:
    async with busy(tmp_path, "slow") as (gw, pipe, slow), connection(gw.port) as idle:
        idle.send("GET", DOMAIN)
        status, headers, _ = await idle.reply()
        assert status == 200
        assert "Connection" not in headers  # kept alive
        sent = gw.signal()
        await refused(gw.port)  # shutdown has begun
        idle.send("POST", FEED, body(message=[persistent(pipe, "late")]))
        assert_retriable(*await idle.reply())
        assert await idle.closed_by_server()
        slow.resume()
        assert (await slow.reply())[0] == 200
        await gw.exited(sent, within=GRACE)


async def test_sse_and_stream_pipe_responses_end(tmp_path: Path) -> None:
    async with gateway(tmp_path) as gw:
        pipe = await new_pipe(gw)
        stream = await new_pipe(gw, "stream")
        async with (
            gw.http.get(pipe["uri"], headers={"Accept": "text/event-stream"}) as sse,
            gw.http.get(await asynclet(gw, stream), headers=AJ) as parts,
        ):
            assert sse.status == 200
            assert parts.status == 200
            assert parts.content_type == "multipart/mixed"
            async with asyncio.timeout(PROMPT):
                assert await sse.content.readline() == b"retry: 2000\n"
                assert (await parts.content.readany()).startswith(b"--")
            sent = gw.signal()
            async with asyncio.timeout(PROMPT):  # both end, cleanly
                assert await sse.content.read() == b"\n"
                assert (await parts.content.read()).endswith(b"--\r\n")
        await gw.exited(sent, within=PROMPT)


async def test_a_request_that_never_finishes_is_cancelled_at_the_grace_bound(
    tmp_path: Path,
) -> None:
    async with busy(tmp_path, "never") as (gw, _, _):
        took = await gw.exited(gw.signal(), within=GRACE + 1.0)
        assert took >= GRACE - 0.1  # it was given its grace
        assert gw.logged("cancelled 1 requests still in flight")


async def test_a_second_signal_stops_waiting(tmp_path: Path) -> None:
    async with busy(tmp_path, "never") as (gw, _, _):
        sent = gw.signal(signal.SIGINT)
        await refused(gw.port)  # the first signal is being handled
        gw.signal(signal.SIGTERM)
        took = await gw.exited(sent, within=GRACE)
        assert took < GRACE - 0.5
        assert gw.logged("second signal")
        assert gw.logged("cancelled 1 requests still in flight")
