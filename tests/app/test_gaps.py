"""A reader that resumes is told when messages it never acknowledged are gone, against
a real gateway on 127.0.0.1 (docs/EXTENSIONS.md §3 and §11, docs/PROTOCOL.md §6).

Decided behaviour under test:

* SSE resuming with ``Last-Event-ID: n`` across messages that left the pipe
  unacknowledged (dropped by overflow, lost in a restart) gets ``event: gap`` first,
  with ``{"first", "last", "earliest"}``, then the messages held after ``n``.
* A WebSocket resuming with ``?after=n`` gets a ``gap`` frame the same way, then only
  the messages after ``n``.
* Every GET of a pipe has ``RestMS-Earliest-Position``; a GET of a message at a position
  before it is a 404 with it.
* Nothing was lost (acknowledged, or resumed past the loss): no gap, no header on the
  404 of a position at or after the earliest.
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest
from yarl import URL

from tests.app.jsonapi import AJ, get, new_pipe
from tests.app.test_streams import SSE, event, message_of, send
from tests.app.test_websocket import connect, deliveries, expect, ids
from tests.conftest import Gateway, MakeGateway

pytestmark = pytest.mark.app

EARLIEST = "RestMS-Earliest-Position"


async def overflowed(gw: Gateway) -> dict[str, Any]:
    """A pipe of two messages, drop-oldest, sent m1 to m5: m1 to m3 dropped, unread."""
    pipe = await new_pipe(gw, max_messages="2", overflow="drop-oldest")
    await send(gw, pipe, "m1", "m2", "m3", "m4", "m5")
    return pipe


async def sse_from(gw: Gateway, pipe: dict[str, Any], last: str | None) -> list[dict[str, str]]:
    """The first events of an SSE stream resumed after ``last``: up to the first
    message, and the one after it when there is a gap before."""
    headers = SSE if last is None else {**SSE, "Last-Event-ID": last}
    async with gw.http.get(pipe["uri"], headers=headers) as r:
        assert r.status == 200, await r.text()
        first = await event(r)
        return [first, await event(r)] if first["event"] == "gap" else [first]


# ---------------------------------------------------------------- SSE
async def test_SSE_resuming_across_an_overflow_is_told_of_the_gap_first(gw: Gateway) -> None:
    pipe = await overflowed(gw)
    gap, first = await sse_from(gw, pipe, "1")  # it had been sent m1
    assert (gap["event"], "id" in gap) == ("gap", False)  # no id: resuming is unchanged
    assert json.loads(gap["data"]) == {"first": 2, "last": 3, "earliest": 4}
    assert (first["id"], message_of(first)["message_id"]) == ("4", "m4")


async def test_SSE_resuming_past_the_loss_or_after_acknowledging_is_no_gap(gw: Gateway) -> None:
    pipe = await overflowed(gw)
    (first,) = await sse_from(gw, pipe, "3")  # it had been sent m1 to m3 before they went
    assert (first["event"], first["id"]) == ("message", "4")
    async with gw.http.delete(f"{pipe['uri']}.4") as r:
        assert r.status == 200
    (first,) = await sse_from(gw, pipe, "1")  # 4 acknowledged: the loss was seen through
    assert (first["event"], first["id"]) == ("message", "5")


async def test_SSE_with_nothing_lost_has_no_gap(gw: Gateway) -> None:
    pipe = await new_pipe(gw)
    await send(gw, pipe, "m1", "m2")
    (first,) = await sse_from(gw, pipe, None)
    assert message_of(first)["message_id"] == "m1"


async def test_SSE_resuming_after_a_restart_is_told_what_went_with_it(
    make_gateway: MakeGateway,
) -> None:
    gw = await make_gateway()
    pipe = await new_pipe(gw)
    await send(gw, pipe, "m1", "m2")  # not persistent: kept in memory only
    await gw.stop()
    gw = await make_gateway()  # the same data directory, on another port
    pipe["uri"] = URL(pipe["uri"]).path
    async with gw.http.get(pipe["uri"], headers={**SSE, "Last-Event-ID": "1"}) as r:
        assert r.status == 200
        gap = await event(r)
        assert gap["event"] == "gap"
        assert json.loads(gap["data"]) == {"first": 2, "last": 2, "earliest": 3}
        await send(gw, pipe, "m3")
        after = await event(r)
    assert (after["id"], message_of(after)["message_id"]) == ("3", "m3")


# ---------------------------------------------------------------- WebSocket
async def test_a_WebSocket_resuming_across_an_overflow_gets_a_gap_frame_first(
    gw: Gateway,
) -> None:
    pipe = await overflowed(gw)
    async with await connect(gw, f"{pipe['uri']}?after=1") as ws:
        gap = await expect(ws, "gap")
        assert gap == {"type": "gap", "first": 2, "last": 3, "earliest": 4}
        assert ids(await deliveries(ws, 2)) == ["m4", "m5"]


async def test_a_WebSocket_resumes_after_a_position_and_with_nothing_lost_has_no_gap(
    gw: Gateway,
) -> None:
    pipe = await new_pipe(gw)
    await send(gw, pipe, "m1", "m2", "m3")
    async with await connect(gw, f"{pipe['uri']}?after=2") as ws:
        frame = await expect(ws, "message")  # the first frame: no gap before it
        assert (frame["position"], ids([frame])) == (3, ["m3"])
    async with await connect(gw, f"{pipe['uri']}?after=99") as ws:  # never issued: all
        assert ids(await deliveries(ws, 3)) == ["m1", "m2", "m3"]


async def test_a_WebSocket_after_that_is_not_a_position_is_refused_before_the_upgrade(
    gw: Gateway,
) -> None:
    pipe = await new_pipe(gw)
    with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
        await connect(gw, f"{pipe['uri']}?after=-1")
    assert refused.value.status == 400


# ---------------------------------------------------------------- GET
async def test_a_pipe_GET_names_the_earliest_position(gw: Gateway) -> None:
    pipe = await new_pipe(gw)
    async with gw.http.get(pipe["uri"], headers=AJ) as r:
        assert (r.status, r.headers[EARLIEST]) == (200, "1")  # empty: the asynclet
    pipe = await overflowed(gw)
    async with gw.http.get(pipe["uri"], headers=AJ) as r:
        assert (r.status, r.headers[EARLIEST]) == (200, "4")


async def test_a_GET_of_a_position_before_the_earliest_is_a_404_naming_it(gw: Gateway) -> None:
    pipe = await overflowed(gw)
    for method in ("GET", "HEAD"):
        async with gw.http.request(method, f"{pipe['uri']}.2", headers=AJ) as r:
            assert (r.status, r.headers.get(EARLIEST)) == (404, "4"), method
    status, _ = await get(gw, f"{pipe['uri']}.4")
    assert status == 200
    async with gw.http.get(f"{pipe['uri']}.9", headers=AJ) as r:  # beyond: no header
        assert (r.status, r.headers.get(EARLIEST)) == (404, None)
