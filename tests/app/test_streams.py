"""Continuous readers of a pipe (our extension, F12/P6): Server-Sent Events and stream pipes.

Decided behaviour under test:

* SSE is a GET on a pipe URI with ``Accept: text/event-stream``. Every message held
  is an event ``id: <position>``, ``event: message`` whose data is the RestMS JSON
  message document with its ``href``. Messages stay until DELETEd, ``Last-Event-ID: n``
  resumes after position ``n``, idle streams carry heartbeat comments, and deleting
  the pipe sends ``event: deleted``.
* A stream pipe answers a GET on its asynclet with ``multipart/mixed``, one message
  document per part, and deletes each message once its part is written.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import logging
from typing import Any

import aiohttp
import pytest

from tests.app.gauges import until
from tests.app.jsonapi import AJ, DOMAIN, HJ, JSON, body, get, new_pipe
from tests.conftest import Gateway, MakeGateway

SSE = {"Accept": "text/event-stream"}
DEFAULT_FEED = "/restms/feed/default"
STEP = 1.0  # seconds any single event or part may take to arrive


# ---------------------------------------------------------------- helpers


async def send(gw: Gateway, pipe: dict[str, Any], *values: str) -> None:
    messages = [
        {"address": pipe["name"], "message_id": v, "content": [{"type": "text/plain", "value": v}]}
        for v in values
    ]
    async with gw.http.post(DEFAULT_FEED, data=body(message=messages), headers=HJ) as r:
        assert r.status == 200
        assert [m["count"] for m in (await r.json(content_type=JSON))["restms"]["message"]] == [
            "1"
        ] * len(values)


async def held(gw: Gateway, pipe: dict[str, Any]) -> list[dict[str, Any]]:
    status, reply = await get(gw, pipe["uri"])
    assert status == 200, reply
    return [m for m in reply["restms"]["pipe"][0].get("message", []) if m.get("async") != "1"]


async def current_asynclet(gw: Gateway, pipe: dict[str, Any]) -> str:
    status, reply = await get(gw, pipe["uri"])
    assert status == 200, reply
    (href,) = [m["href"] for m in reply["restms"]["pipe"][0]["message"] if m.get("async")]
    return str(href)


async def block(r: aiohttp.ClientResponse) -> list[str]:
    """The next SSE block: its lines up to the blank line; [] at the end of the stream."""
    lines: list[str] = []
    async with asyncio.timeout(STEP):
        for _ in range(100):
            raw = await r.content.readline()
            if not raw:
                return lines
            line = raw.decode().rstrip("\r\n")
            if not line:
                if lines:
                    return lines
                continue
            lines.append(line)
    raise AssertionError(f"SSE block too long: {lines}")


def fields(lines: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in lines:
        if line.startswith(":"):
            continue
        name, _, val = line.partition(":")
        out[name] = val.removeprefix(" ")
    return out


async def event(r: aiohttp.ClientResponse) -> dict[str, str]:
    """The next event, skipping ``retry`` and comment-only blocks."""
    for _ in range(20):
        lines = await block(r)
        assert lines, "the stream ended"
        found = fields(lines)
        if "event" in found or "data" in found or "id" in found:
            return found
    raise AssertionError("no event arrived")


def message_of(found: dict[str, str]) -> dict[str, Any]:
    assert found["event"] == "message"
    return dict(json.loads(found["data"])["restms"]["message"][0])


# ---------------------------------------------------------------- SSE
async def test_SSE_held_and_new_messages_arrive_as_events(make_gateway: MakeGateway) -> None:
    gw = await make_gateway(heartbeat=0.2)
    pipe = await new_pipe(gw)
    await send(gw, pipe, "one", "two")
    listed = await held(gw, pipe)
    async with gw.http.get(pipe["uri"], headers=SSE) as r:
        assert r.status == 200
        assert r.content_type == "text/event-stream"
        first, second = await event(r), await event(r)
        await send(gw, pipe, "three")
        third = await event(r)
    received = [message_of(e) for e in (first, second, third)]
    assert [m["message_id"] for m in received] == ["one", "two", "three"]
    assert [m["content"][0]["value"] for m in received] == ["one", "two", "three"]
    assert [m["address"] for m in received] == [pipe["name"]] * 3
    after = await held(gw, pipe)
    # Every event carries the message's href, and its id is the position.
    assert [m["href"] for m in received] == [m["href"] for m in after]
    assert [m["href"] for m in received[:2]] == [m["href"] for m in listed]
    ids = [int(e["id"]) for e in (first, second, third)]
    assert ids == sorted(ids)
    assert len(set(ids)) == 3
    for found, message in zip((first, second, third), received, strict=True):
        assert message["href"].endswith("." + found["id"])
    # Messages stay in the pipe until they are deleted.
    assert len(after) == 3
    for message in received:
        status, reply = await get(gw, message["href"])
        assert status == 200
        assert reply["restms"]["message"][0]["message_id"] == message["message_id"]


async def test_SSE_accept_list_with_event_stream_first(make_gateway: MakeGateway) -> None:
    gw = await make_gateway(heartbeat=0.2)
    pipe = await new_pipe(gw)
    await send(gw, pipe, "x")
    accept = {"Accept": "text/event-stream, application/restms+json;q=0.5"}
    async with gw.http.get(pipe["uri"], headers=accept) as r:
        assert r.content_type == "text/event-stream"
        assert message_of(await event(r))["message_id"] == "x"


async def test_SSE_last_event_id_resumes_without_loss_or_duplicate(
    make_gateway: MakeGateway,
) -> None:
    gw = await make_gateway(heartbeat=0.2)
    pipe = await new_pipe(gw)
    await send(gw, pipe, "m1", "m2")
    async with gw.http.get(pipe["uri"], headers=SSE) as r:
        first = [await event(r), await event(r)]
    last = first[-1]["id"]
    # Published while the client is away.
    await send(gw, pipe, "m3", "m4")
    got: list[str] = []
    async with gw.http.get(pipe["uri"], headers={**SSE, "Last-Event-ID": last}) as r:
        for _ in range(2):
            got.append(message_of(await event(r))["message_id"])
        # Nothing else is sent again: the next block is a heartbeat comment.
        lines = await block(r)
        assert lines
        assert all(line.startswith(":") for line in lines), lines
        await send(gw, pipe, "m5")
        got.append(message_of(await event(r))["message_id"])
    assert [message_of(e)["message_id"] for e in first] + got == ["m1", "m2", "m3", "m4", "m5"]


async def test_SSE_resume_after_acknowledged_messages(make_gateway: MakeGateway) -> None:
    gw = await make_gateway(heartbeat=0.2)
    pipe = await new_pipe(gw)
    await send(gw, pipe, "a", "b", "c")
    async with gw.http.get(pipe["uri"], headers=SSE) as r:
        events = [await event(r) for _ in range(2)]
    # The client acknowledges what it processed, then resumes.
    async with gw.http.delete(message_of(events[-1])["href"]) as d:
        assert d.status == 200
    async with gw.http.get(pipe["uri"], headers={**SSE, "Last-Event-ID": events[-1]["id"]}) as r:
        assert message_of(await event(r))["message_id"] == "c"
    assert [m["message_id"] for m in await held(gw, pipe)] == ["c"]


async def test_SSE_heartbeat_comment_on_an_idle_stream(make_gateway: MakeGateway) -> None:
    gw = await make_gateway(heartbeat=0.2)
    pipe = await new_pipe(gw)
    async with gw.http.get(pipe["uri"], headers=SSE) as r:
        assert r.status == 200
        comments = 0
        for _ in range(5):
            lines = await block(r)
            assert lines
            if all(line.startswith(":") for line in lines):
                comments += 1
            else:
                assert "data" not in fields(lines), lines
            if comments == 2:
                break
        assert comments == 2


async def test_SSE_deleted_event_when_the_pipe_is_deleted(make_gateway: MakeGateway) -> None:
    gw = await make_gateway(heartbeat=0.2)
    pipe = await new_pipe(gw)
    await send(gw, pipe, "only")
    async with gw.http.get(pipe["uri"], headers=SSE) as r:
        assert message_of(await event(r))["message_id"] == "only"
        async with gw.http.delete(pipe["uri"]) as d:
            assert d.status == 200
        assert (await event(r))["event"] == "deleted"
        assert await block(r) == []  # and the stream ends


async def test_SSE_stream_ends_after_stream_max(make_gateway: MakeGateway) -> None:
    gw = await make_gateway(heartbeat=0.2, stream_max=0.4)
    pipe = await new_pipe(gw)
    async with asyncio.timeout(2), gw.http.get(pipe["uri"], headers=SSE) as r:
        assert r.status == 200
        await r.read()


async def test_SSE_unknown_pipe_is_404(gw: Gateway) -> None:
    async with gw.http.get("/restms/resource/nosuchpipe", headers=SSE) as r:
        assert r.status == 404


# ---------------------------------------------------------------- stream pipes (P6)
class Multipart:
    """A small streaming reader of a ``multipart/mixed`` body (RFC 2046 framing).

    A part ends where the next delimiter (CRLF ``--boundary``) begins, so a part is
    complete as soon as the delimiter after it has arrived, whatever follows.
    """

    def __init__(self, r: aiohttp.ClientResponse) -> None:
        media, _, params = r.headers["Content-Type"].partition(";")
        assert media.strip() == "multipart/mixed"
        boundary = params.strip().removeprefix("boundary=").strip('"')
        assert boundary
        self.r = r
        self.delimiter = b"\r\n--" + boundary.encode()
        self.buffer = b"\r\n"  # so the first boundary line looks like any delimiter

    async def _more(self) -> None:
        chunk = await self.r.content.read(1 << 16)
        assert chunk, "the body ended inside a part"
        self.buffer += chunk

    async def next(self) -> tuple[str, bytes] | None:
        """The next part's (Content-Type, body), or None at the close delimiter."""
        size = len(self.delimiter)
        async with asyncio.timeout(STEP):
            for _ in range(10_000):
                if len(self.buffer) >= size + 2:
                    assert self.buffer.startswith(self.delimiter), self.buffer[:80]
                    if self.buffer[size : size + 2] == b"--":
                        return None
                    end = self.buffer.find(self.delimiter, size)
                    if end >= 0:
                        part, self.buffer = self.buffer[size:end], self.buffer[end:]
                        head, _, data = part.removeprefix(b"\r\n").partition(b"\r\n\r\n")
                        headers = dict(
                            line.split(": ", 1) for line in head.decode().split("\r\n") if line
                        )
                        return headers["Content-Type"], data
                await self._more()
        raise AssertionError("bounded loop ran out")


async def parts(reader: Multipart, want: int) -> list[tuple[str, dict[str, Any]]]:
    """Read ``want`` parts: (Content-Type, parsed JSON document) each."""
    out = []
    for _ in range(want):
        found = await reader.next()
        assert found is not None, "the stream closed early"
        out.append((found[0], json.loads(found[1])))
    return out


async def test_P6_stream_pipe_answers_multipart_and_deletes_what_it_wrote(
    make_gateway: MakeGateway,
) -> None:
    gw = await make_gateway(stream_max=0.6)
    pipe = await new_pipe(gw, "stream")
    await send(gw, pipe, "s1", "s2")
    listed = await held(gw, pipe)
    asynclet = await current_asynclet(gw, pipe)
    async with asyncio.timeout(3), gw.http.get(asynclet, headers=AJ) as r:
        assert r.status == 200
        assert r.content_type == "multipart/mixed"

        async def drained() -> bool:
            return await held(gw, pipe) == []

        # Written parts leave the pipe while the response is still open.
        await until(drained, "the written parts to leave the pipe")
        for message in listed:
            assert (await get(gw, message["href"]))[0] == 404
        await send(gw, pipe, "s3")
        await until(drained, "s3 to be written and leave the pipe")
        # The response ends at stream_max, with every part in it.
        reader = Multipart(r)
        got = await parts(reader, 3)
        assert await reader.next() is None
    assert [ctype for ctype, _ in got] == [JSON] * 3
    messages = [doc["restms"]["message"][0] for _, doc in got]
    assert [m["message_id"] for m in messages] == ["s1", "s2", "s3"]
    assert [m["content"][0]["value"] for m in messages] == ["s1", "s2", "s3"]
    assert [m["address"] for m in messages] == [pipe["name"]] * 3


async def test_P6_each_part_can_be_read_as_soon_as_it_is_written(
    make_gateway: MakeGateway,
) -> None:
    """A streaming client must not need the next message to finish reading this one."""
    gw = await make_gateway(stream_max=5)
    pipe = await new_pipe(gw, "stream")
    await send(gw, pipe, "first")
    asynclet = await current_asynclet(gw, pipe)
    async with gw.http.get(asynclet, headers=AJ) as r:
        assert r.status == 200
        reader = Multipart(r)
        ((_, doc),) = await parts(reader, 1)
        assert doc["restms"]["message"][0]["message_id"] == "first"
        await send(gw, pipe, "second")
        ((_, doc),) = await parts(reader, 1)
        assert doc["restms"]["message"][0]["message_id"] == "second"
        async with gw.http.delete(pipe["uri"]) as d:
            assert d.status == 200


async def test_P6_stream_pipe_part_embeds_staged_content(make_gateway: MakeGateway) -> None:
    """P6: parts carry embedded contents, since the message is gone once written."""
    gw = await make_gateway(stream_max=0.3)
    pipe = await new_pipe(gw, "stream")
    data = bytes(range(200))
    async with gw.http.post(
        DEFAULT_FEED, data=data, headers={"Content-Type": "application/x-bin"}
    ) as r:
        assert r.status == 201
        staged = r.headers["Location"]
    message = {"address": pipe["name"], "content": [{"href": staged}]}
    async with gw.http.post(DEFAULT_FEED, data=body(message=[message]), headers=HJ) as r:
        assert r.status == 200
    async with asyncio.timeout(3), gw.http.get(pipe["message"][0]["href"], headers=AJ) as r:
        assert r.status == 200
    # Position 1 is held, so its GET is an ordinary message; the asynclet streams.
    asynclet = await current_asynclet(gw, pipe)
    async with asyncio.timeout(3), gw.http.get(asynclet, headers=AJ) as r:
        ((_, doc),) = await parts(Multipart(r), 1)
        await r.read()
    (content,) = doc["restms"]["message"][0]["content"]
    assert content["type"] == "application/x-bin"
    assert content.get("encoding") == "base64", content
    assert base64.b64decode(content["value"]) == data


async def test_P6_stream_pipe_honours_accept_multipart(make_gateway: MakeGateway) -> None:
    gw = await make_gateway(stream_max=0.3)
    pipe = await new_pipe(gw, "stream")
    await send(gw, pipe, "m")
    asynclet = await current_asynclet(gw, pipe)
    async with (
        asyncio.timeout(3),
        gw.http.get(asynclet, headers={"Accept": "multipart/mixed"}) as r,
    ):
        assert r.status == 200, await r.text()
        assert r.content_type == "multipart/mixed"
        await r.read()
    assert await held(gw, pipe) == []


async def test_P6_stream_ends_when_the_pipe_is_deleted(make_gateway: MakeGateway) -> None:
    gw = await make_gateway(stream_max=30)
    pipe = await new_pipe(gw, "stream")
    async with asyncio.timeout(3), gw.http.get(pipe["message"][0]["href"], headers=AJ) as r:
        assert r.status == 200
        assert r.content_type == "multipart/mixed"
        await asyncio.sleep(0.1)
        async with gw.http.delete(pipe["uri"]) as d:
            assert d.status == 200
        reader = Multipart(r)
        assert await reader.next() is None  # closing boundary, no part


async def test_P6_stream_pipe_on_a_rotator_takes_its_share(make_gateway: MakeGateway) -> None:
    gw = await make_gateway(stream_max=0.3)
    async with gw.http.post(
        DOMAIN, data=body(feed=[{"name": "work", "type": "rotator"}]), headers=HJ
    ) as r:
        assert r.status == 201
        feed = r.headers["Location"]
    pipe = await new_pipe(gw, "stream")
    async with gw.http.post(pipe["uri"], data=body(join=[{"feed": feed}]), headers=HJ) as r:
        assert r.status == 201
    jobs = [{"message_id": f"J{i}"} for i in range(3)]
    async with gw.http.post(feed, data=body(message=jobs), headers=HJ) as r:
        assert r.status == 200
    async with asyncio.timeout(3), gw.http.get(pipe["message"][0]["href"], headers=AJ) as r:
        assert r.status == 200
    asynclet = await current_asynclet(gw, pipe)
    async with asyncio.timeout(3), gw.http.get(asynclet, headers=AJ) as r:
        got = await parts(Multipart(r), 3)
        await r.read()
    assert [doc["restms"]["message"][0]["message_id"] for _, doc in got] == ["J0", "J1", "J2"]


# ---------------------------------------------------------------- slow readers
BIG = 24 * 1024 * 1024  # larger than loopback socket buffers: the server's write blocks


async def read_until(r: aiohttp.ClientResponse, needle: bytes, seconds: float) -> None:
    seen = b""
    async with asyncio.timeout(seconds):
        for _ in range(100_000):
            chunk = await r.content.read(1 << 20)
            assert chunk, "the stream ended first"
            seen = seen[-len(needle) :] + chunk
            if needle in seen:
                return
    raise AssertionError("bounded loop ran out")


async def fill_with_big_message(gw: Gateway, pipe: dict[str, Any]) -> None:
    message = {"address": pipe["name"], "content": [{"type": "text/plain", "value": "x" * BIG}]}
    data = io.BytesIO(body(message=[message]))  # aiohttp warns about large raw bytes
    async with gw.http.post(DEFAULT_FEED, data=data, headers=HJ) as r:
        assert r.status == 200


async def test_SSE_message_published_during_a_blocked_write_is_not_delayed(
    make_gateway: MakeGateway,
) -> None:
    """A publish while the server waits on a slow reader must not wait for the heartbeat."""
    gw = await make_gateway(heartbeat=5, max_body=4 * BIG)
    pipe = await new_pipe(gw)
    await fill_with_big_message(gw, pipe)
    async with gw.http.get(pipe["uri"], headers=SSE) as r:
        await asyncio.sleep(0.3)  # the client does not read yet: the server's write blocks
        await send(gw, pipe, "behind-the-big-one")
        await read_until(r, b"behind-the-big-one", 2.5)


async def test_P6_message_published_during_a_blocked_write_is_not_delayed(
    make_gateway: MakeGateway,
) -> None:
    gw = await make_gateway(stream_max=5, max_body=4 * BIG)
    pipe = await new_pipe(gw, "stream")
    await fill_with_big_message(gw, pipe)
    asynclet = await current_asynclet(gw, pipe)
    async with gw.http.get(asynclet, headers=AJ) as r:
        await asyncio.sleep(0.3)
        await send(gw, pipe, "behind-the-big-one")
        await read_until(r, b"behind-the-big-one", 2.5)


async def test_A6_SSE_client_that_goes_mid_write_is_not_a_server_error(
    make_gateway: MakeGateway, caplog: pytest.LogCaptureFixture
) -> None:
    gw = await make_gateway(heartbeat=5, max_body=4 * BIG)
    pipe = await new_pipe(gw)
    await fill_with_big_message(gw, pipe)
    async with gw.http.get(pipe["uri"], headers=SSE) as r:
        assert r.status == 200
        await asyncio.sleep(0.3)  # the server's write is blocked on this reader
        r.close()
    await asyncio.sleep(0.3)
    errors = [rec for rec in caplog.records if rec.levelno >= logging.ERROR]
    assert errors == [], [rec.getMessage() for rec in errors]
    assert len(await held(gw, pipe)) == 1  # SSE never deletes


async def test_P6_stream_client_that_goes_mid_write_keeps_the_message(
    make_gateway: MakeGateway, caplog: pytest.LogCaptureFixture
) -> None:
    gw = await make_gateway(stream_max=5, max_body=4 * BIG)
    pipe = await new_pipe(gw, "stream")
    await fill_with_big_message(gw, pipe)
    asynclet = await current_asynclet(gw, pipe)
    async with gw.http.get(asynclet, headers=AJ) as r:
        assert r.status == 200
        await asyncio.sleep(0.3)
        r.close()
    await asyncio.sleep(0.3)
    errors = [rec for rec in caplog.records if rec.levelno >= logging.ERROR]
    assert errors == [], [rec.getMessage() for rec in errors]
    assert len(await held(gw, pipe)) == 1  # its part was never written whole
