"""A stream draining a backlog lets the gateway's other work run between its batches.

Decided behaviour under test: an SSE stream and a stream pipe's multipart reply take a
backlog from the pipe a batch at a time, and between two batches every other task on
the gateway's event loop gets a turn, even when the client reads as fast as the
gateway writes: otherwise one reader catching up would hold every other request until
it had written the whole backlog. A WebSocket sends at most a window, then waits for
the client's acknowledgement: other tasks run while it waits.

The gateway runs on the test's own loop. A watcher task there looks, each time it gets
a turn, at how many of the pipe's messages the stream has written (leased, or gone once
acknowledged) and notes each new count. It can only note a count partway through the
backlog if it ran while the stream was between two batches. The backlog is small
enough (a few hundred kilobytes) for the loopback socket to take all of it at once, so
no write ever waits for the client: without the turns the watcher would see nothing
written, then everything.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from feeds.model import Pipe
from gateway.restms.streams import BATCH
from gateway.restms.websocket import PROTOCOL
from tests.app.jsonapi import AJ, get, new_pipe, publish
from tests.conftest import Gateway, MakeGateway

pytestmark = pytest.mark.app

BATCHES = 3
TOTAL = BATCHES * BATCH
DEFAULT_FEED = "/restms/feed/default"


async def backlog(gw: Gateway, kind: str | None = None) -> tuple[dict[str, Any], Pipe]:
    """A pipe (of ``kind``) holding TOTAL small messages, and the engine's pipe behind it."""
    pipe = await new_pipe(gw, kind)
    messages = [
        {"address": pipe["name"], "content": [{"type": "text/plain", "value": str(n)}]}
        for n in range(TOTAL)
    ]
    assert await publish(gw, DEFAULT_FEED, *messages) == [1] * TOTAL
    held = gw.engine.peek(pipe["uri"].rsplit("/", 1)[1])
    assert isinstance(held, Pipe)
    return pipe, held


async def watch(held: Pipe) -> list[int]:
    """Each count of written messages seen at a turn of this task, until all were."""
    seen: list[int] = []
    while not seen or seen[-1] < TOTAL:
        waiting = sum(message.leased is None for message in held.messages.values())
        if not seen or seen[-1] != TOTAL - waiting:
            seen.append(TOTAL - waiting)
        await asyncio.sleep(0)  # it waits for nothing: it runs at every turn the loop gives
    return seen


@contextlib.asynccontextmanager
async def watching(held: Pipe) -> AsyncIterator[asyncio.Task[list[int]]]:
    """:func:`watch` in a task of its own, cancelled if the test ends first."""
    task = asyncio.create_task(watch(held))
    try:
        yield task
    finally:
        task.cancel()


async def drain(r: aiohttp.ClientResponse, marker: bytes, count: int) -> None:
    """Read the stream until ``marker`` came ``count`` times."""
    data = b""
    while data.count(marker) < count:
        chunk = await r.content.readany()
        assert chunk, "the stream ended early"
        data += chunk


def assert_turns_between_batches(seen: list[int]) -> None:
    partway = [n for n in seen if 0 < n < TOTAL]
    assert seen[0] == 0, seen
    assert seen[-1] == TOTAL, seen
    # A turn after each batch but the last: at least one count partway per boundary.
    assert len(partway) >= BATCHES - 1, seen


async def test_SSE_backlog_lets_other_tasks_run_between_batches(
    make_gateway: MakeGateway,
) -> None:
    gw = await make_gateway()
    pipe, held = await backlog(gw)
    async with (
        asyncio.timeout(30),
        watching(held) as watcher,
        gw.http.get(pipe["uri"], headers={"Accept": "text/event-stream"}) as r,
    ):
        assert r.status == 200
        await drain(r, b"event: message\n", TOTAL)
        seen = await watcher
    assert_turns_between_batches(seen)


async def test_P6_stream_backlog_lets_other_tasks_run_between_batches(
    make_gateway: MakeGateway,
) -> None:
    gw = await make_gateway()
    pipe, held = await backlog(gw, "stream")
    status, reply = await get(gw, pipe["uri"])
    assert status == 200, reply
    [asynclet] = [m["href"] for m in reply["restms"]["pipe"][0]["message"] if m.get("async")]
    async with (
        asyncio.timeout(30),
        watching(held) as watcher,
        gw.http.get(asynclet, headers=AJ) as r,
    ):
        assert r.status == 200
        boundary = r.headers["Content-Type"].partition("boundary=")[2]
        await drain(r, b"--" + boundary.encode(), TOTAL + 1)  # one before each part, one after
        seen = await watcher
    assert_turns_between_batches(seen)


async def test_WebSocket_backlog_lets_other_tasks_run_between_windows(
    make_gateway: MakeGateway,
) -> None:
    """A socket sends at most a window before it waits for the client's
    acknowledgement, and other tasks run while it waits."""
    gw = await make_gateway(websocket_window=BATCH)
    pipe, held = await backlog(gw)
    async with (
        asyncio.timeout(30),
        watching(held) as watcher,
        gw.http.ws_connect(pipe["uri"], protocols=(PROTOCOL,)) as ws,
    ):
        for _ in range(BATCHES):  # a window's messages, then one acknowledgement for all
            frames = [json.loads(await ws.receive_str()) for _ in range(BATCH)]
            assert {frame["type"] for frame in frames} == {"message"}
            await ws.send_json({"type": "ack", "position": frames[-1]["position"]})
        seen = await watcher
    assert_turns_between_batches(seen)
