"""SSE resume with ``Last-Event-ID``: exactly what the client missed, no gap, no repeat.

Decided behaviour under test (docs/BROWSER.md, "Resuming an event stream"):

* Reconnecting with ``Last-Event-ID: n`` sends every message the pipe still holds at
  positions after ``n``, each once, oldest first, then what arrives; nothing at or
  before ``n`` is sent again. This holds while messages keep arriving, across
  disconnects in the middle of the stream, and across acknowledged messages (which are
  gone for good, so they are not a gap).
* A message whose lease ran out while the client was away is held again at a new
  position, so the resumed stream sends it once more, with ``delivery_count``.
* Messages waiting on disk past the memory budget are read back and sent in order.
* An id the pipe never issued (ahead of it, absurdly long, not a number) starts from
  the oldest message held: at worst repeats, never a silent gap.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from tests.app.jsonapi import AJ, HJ, body, get, new_pipe
from tests.app.test_streams import SSE, event, message_of, send
from tests.conftest import Gateway, MakeGateway

pytestmark = pytest.mark.app

FEED = "/restms/feed/default"
ROUNDS = 5  # disconnects while the publisher runs
TOTAL = 300  # messages it publishes


@contextlib.asynccontextmanager
async def stream(gw: Gateway, pipe: dict[str, Any], last: str | None) -> AsyncIterator[Any]:
    headers = SSE if last is None else {**SSE, "Last-Event-ID": last}
    async with gw.http.get(pipe["uri"], headers=headers) as r:
        assert r.status == 200, await r.text()
        yield r


async def read(r: aiohttp.ClientResponse, count: int) -> list[tuple[int, dict[str, Any]]]:
    """``count`` message events: (id, message) each."""
    out = []
    for _ in range(count):
        found = await event(r)
        out.append((int(found["id"]), message_of(found)))
    return out


async def nothing_more(r: aiohttp.ClientResponse) -> None:
    """The next event is a heartbeat comment: nothing else was due."""
    for _ in range(3):
        raw = await asyncio.wait_for(r.content.readline(), 2.0)
        line = raw.decode().strip()
        if line:
            assert line.startswith(":"), line
            return
    raise AssertionError("no heartbeat")


def mids(events: list[tuple[int, dict[str, Any]]]) -> list[str]:
    return [m["message_id"] for _, m in events]


async def test_resume_while_messages_keep_arriving_loses_and_repeats_nothing(
    make_gateway: MakeGateway,
) -> None:
    gw = await make_gateway(heartbeat=0.2)
    pipe = await new_pipe(gw)
    published: list[str] = []

    async def publisher() -> None:
        for n in range(TOTAL):
            await send(gw, pipe, f"m{n:03d}")
            published.append(f"m{n:03d}")
            if n % 10 == 0:
                await asyncio.sleep(0.01)  # let the reader in between

    task = asyncio.create_task(publisher())
    received: list[tuple[int, dict[str, Any]]] = []
    last: str | None = None
    try:
        async with asyncio.timeout(60):
            for round_ in range(ROUNDS):
                async with stream(gw, pipe, last) as r:
                    got = await read(r, 20 + 7 * round_)
                    # Closed in the middle of the stream: more was on its way.
                received += got
                last = str(got[-1][0])
            await task
            async with stream(gw, pipe, last) as r:
                received += await read(r, TOTAL - len(received))
                await nothing_more(r)
    finally:
        task.cancel()
    positions = [seq for seq, _ in received]
    assert positions == sorted(set(positions))  # each once, in order
    assert mids(received) == published  # none missing, none twice


async def test_resume_after_acknowledging_some_messages(make_gateway: MakeGateway) -> None:
    gw = await make_gateway(heartbeat=0.2)
    pipe = await new_pipe(gw)
    await send(gw, pipe, *[f"a{n}" for n in range(10)])
    async with stream(gw, pipe, None) as r:
        first = await read(r, 6)
    # Acknowledge up to the 4th, then resume after the 6th: 7 to 10, and what comes.
    async with gw.http.delete(first[3][1]["href"]) as d:
        assert d.status == 200
    await send(gw, pipe, "a10")
    async with stream(gw, pipe, str(first[-1][0])) as r:
        assert mids(await read(r, 5)) == ["a6", "a7", "a8", "a9", "a10"]
        await nothing_more(r)
    # Acknowledged past the resume point (another reader did): those are gone, the
    # rest comes, nothing acknowledged comes back.
    async with stream(gw, pipe, None) as r:
        everything = await read(r, 7)
    async with gw.http.delete(everything[4][1]["href"]) as d:  # up to a8
        assert d.status == 200
    async with stream(gw, pipe, str(first[1][0])) as r:  # resume after a1
        assert mids(await read(r, 2)) == ["a9", "a10"]
        await nothing_more(r)
    status, reply = await get(gw, pipe["uri"])
    assert status == 200
    listed = [m for m in reply["restms"]["pipe"][0]["message"] if not m.get("async")]
    assert [m["message_id"] for m in listed] == ["a9", "a10"]


async def test_a_lease_that_ran_out_while_away_sends_the_message_again_once(
    make_gateway: MakeGateway,
) -> None:
    gw = await make_gateway(heartbeat=0.2, sweep_interval=0.05)
    async with gw.http.post(
        "/restms/domain/default", data=body(pipe=[{"lease": "0.3"}]), headers=HJ
    ) as r:
        assert r.status == 201
        pipe = {
            **(await r.json(content_type=None))["restms"]["pipe"][0],
            "uri": r.headers["Location"],
        }
    await send(gw, pipe, "l1", "l2")
    async with stream(gw, pipe, None) as r:
        seen = await read(r, 2)
    async with gw.http.delete(seen[0][1]["href"]) as d:  # l1 only
        assert d.status == 200
    await asyncio.sleep(0.6)  # l2's lease runs out: it moves to a new position
    async with stream(gw, pipe, str(seen[-1][0])) as r:
        ((seq, again),) = await read(r, 1)
        await nothing_more(r)
    assert again["message_id"] == "l2"
    assert again["delivery_count"] == "1"
    assert seq > seen[-1][0]


async def test_messages_on_disk_are_read_back_and_resumed_in_order(
    make_gateway: MakeGateway,
) -> None:
    gw = await make_gateway(heartbeat=0.2, memory_budget=200_000)
    pipe = await new_pipe(gw)
    values = [f"d{n:04d}" for n in range(900)]
    messages = [{"address": pipe["name"], "message_id": v, "delivery_mode": "2"} for v in values]
    async with gw.http.post(FEED, data=body(message=messages), headers=HJ) as r:
        assert r.status == 200
    assert gw.engine.resolve(pipe["name"]).spilled  # type: ignore[union-attr]
    async with stream(gw, pipe, None) as r:
        first = await read(r, 400)  # past what memory held
    async with stream(gw, pipe, str(first[-1][0])) as r:
        rest = await read(r, 500)
        await nothing_more(r)
    assert mids(first + rest) == values


@pytest.mark.parametrize("last", ["999999", "9" * 5000, "x12", "-3", "", "1.5"])
async def test_an_id_never_issued_starts_from_the_oldest(gw: Gateway, last: str) -> None:
    pipe = await new_pipe(gw)
    await send(gw, pipe, "o1", "o2")
    async with stream(gw, pipe, last) as r:
        assert mids(await read(r, 2)) == ["o1", "o2"]
    async with gw.http.get(pipe["uri"], headers=AJ) as r:
        assert r.status == 200
