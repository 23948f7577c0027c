"""A pull link's reading of its remote pipe's event stream (HttpRemote.stream and
EventStream, gateway/federation/client.py) against a small aiohttp server of the
test's own on 127.0.0.1, which writes event streams no healthy gateway writes on
demand: other line endings, comments, gaps, linked contents, garbage, silence.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

import orjson
import pytest
from aiohttp import web
from blockbuster import BlockBuster

from bridges.federation.remote import Auth, PipeGone, Unavailable
from tests.integration.test_federation_remote import Fake, Handler, fake, fixed, remote

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]
__all__ = ["fake"]  # the fixture, used by name

PIPE = "/restms/resource/p"


def message(n: int, **more: Any) -> dict[str, Any]:
    return {
        "href": f"http://elsewhere/restms/resource/p.{n}",  # the remote's own: not kept
        "feed": "http://elsewhere/restms/feed/f",
        "address": f"a{n}",
        "message_id": f"id:{n}",  # (a colon in a string)
        "delivery_count": "1",
        "header": [{"name": "h", "value": f"v{n}"}],
        "content": [{"type": "text/plain", "encoding": "plain", "value": f"m{n}"}],
        **more,
    }


def event(n: int, document: Any = None, newline: bytes = b"\n") -> bytes:
    data = orjson.dumps(document or {"restms": {"message": [message(n)]}})
    lines = [b"id: %d" % n, b"event: message", b"data: " + data, b""]
    return newline.join(lines) + newline


def streaming(*chunks: bytes, then: float = 5.0, seen: list[str] | None = None) -> Handler:
    """A pipe whose event stream writes ``chunks`` (each a write), then stays open
    ``then`` seconds; a GET of ``PIPE.n`` answers message ``n`` (for the general
    reading), of ``PIPE.c`` a content's bytes."""

    async def answer(request: web.Request) -> web.StreamResponse:
        if request.path == f"{PIPE}.c":
            return web.Response(body=b"linked bytes", content_type="application/octet-stream")
        assert request.path == PIPE
        assert request.headers["Accept"] == "text/event-stream"
        if seen is not None:
            seen.append(request.headers["Last-Event-ID"])
        reply = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
        await reply.prepare(request)
        for chunk in chunks:
            await reply.write(chunk)
            await asyncio.sleep(0.01)
        await asyncio.sleep(then)
        return reply

    return answer


async def taken(events: Any, want: int, wait: float = 3.0) -> list[tuple[int, Any]]:
    """What ``events`` hands over until ``want`` came (or it stops handing any)."""
    got: list[tuple[int, Any]] = []
    while len(got) < want:
        more = await events.take(100, wait)
        if not more:
            break
        got += more
    return got


async def read(client: Any, pipe: str, start: int, want: int) -> list[tuple[int, Any]]:
    """``want`` messages of ``pipe``'s event stream from ``start``; the stream closed."""
    events = await client.stream(pipe, start, room=10, idle=5.0)
    assert events is not None
    try:
        return await taken(events, want)
    finally:
        await events.close()


def shown(got: Sequence[tuple[int, Any]]) -> list[tuple[int, str, str]]:
    return [(p, spec.address, spec.contents[0].value) for p, spec in got]


async def test_messages_come_in_order_whatever_the_line_endings(
    fake: Fake, blockbuster: BlockBuster
) -> None:
    """CR LF and CR line ends, comments, a retry, a gap event and a chunk boundary in
    the middle of an event (and of a CR LF) are read as the HTML standard says; each
    message keeps its properties and headers, not the remote's href and feed."""
    whole = (
        b"retry: 2000\r\n\r\n: keep-alive\r\n\r\n"
        + b'event: gap\r\ndata: {"first":1,"last":1,"earliest":2}\r\n\r\n'
        + event(2, newline=b"\r\n")
        + event(3, newline=b"\r")
        + event(4)
    )
    cut = whole.index(b"\r\n", whole.index(b"id: 3") - 10) + 1  # between CR and LF
    fake.answer = streaming(whole[:cut], whole[cut:])
    async with remote(Auth(bearer="b")) as client:
        got = await read(client, f"{fake.url}{PIPE}", 1, 3)
    assert shown(got) == [(n, f"a{n}", f"m{n}") for n in (2, 3, 4)]
    spec = got[0][1]
    # A stream that starts before the position asked for (a pipe that never issued it
    # starts from the oldest message it holds) is taken from there.
    fake.answer = streaming(event(1) + event(2))
    async with remote(Auth(bearer="b")) as client:
        assert [p for p, _ in await read(client, f"{fake.url}{PIPE}", 57, 2)] == [1, 2]
    assert spec.props == (("message_id", "id:2"),)
    assert spec.headers == (("h", "v2"),)


async def test_a_linked_content_is_fetched_and_an_odd_shape_read_generally(
    fake: Fake, blockbuster: BlockBuster
) -> None:
    linked = message(1, content=[{"href": f"{PIPE}.c", "type": "application/x-test"}])
    spaced = b'{ "restms" : { "message" : [ {"address": "a2", "content": [{"value": "m2"}]} ] } }'
    fake.answer = streaming(
        event(1, {"restms": {"message": [linked]}}),
        b"id: 2\nevent: message\ndata: " + spaced + b"\n\n",
    )
    async with remote(Auth(bearer="b")) as client:
        got = await read(client, f"{fake.url}{PIPE}", 0, 2)
    assert [p for p, _ in got] == [1, 2]
    assert got[0][1].contents[0].type == "application/x-test"
    assert got[0][1].contents[0].data() == b"linked bytes"  # fetched, embedded
    assert got[1][1].contents[0].value == "m2"


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        (b"id: 3\nevent: message\ndata: {not json\n\n", "not a RestMS JSON document"),
        (event(3, {"restms": {"message": [message(3, priority="12")]}}), "priority must be 0 to 9"),
        (event(3, {"restms": {"message": [{"address": "a", "x y": 1}]}}), "not a valid property"),
        (event(3, {"restms": {"pipe": [{}]}}), "holds no message"),
        (event(1), "an event at position '1' after 2"),  # not rising
        (b"id: x\nevent: message\ndata: {}\n\n", "an event at position 'x'"),
    ],
)
async def test_garbage_ends_the_stream_with_a_reason_after_what_came_before(
    fake: Fake, bad: bytes, why: str, blockbuster: BlockBuster
) -> None:
    """What came before the bad event is handed over; then the stream says why it
    ended (Unavailable: the link logs it, waits and reads again from there), and
    nothing after the bad event is taken."""
    fake.answer = streaming(event(1) + event(2), bad + event(4))
    async with remote(Auth(bearer="b")) as client:
        events = await client.stream(f"{fake.url}{PIPE}", 0, room=10, idle=5.0)
        assert events is not None
        try:
            got = await taken(events, 2)
            assert [p for p, _ in got] == [1, 2]
            with pytest.raises(Unavailable) as failed:
                await taken(events, 1)
        finally:
            await events.close()
    assert why in str(failed.value), str(failed.value)
    assert "(event stream)" in str(failed.value)


async def test_the_pipe_deleted_and_a_server_without_streams(
    fake: Fake, blockbuster: BlockBuster
) -> None:
    pipe = f"{fake.url}{PIPE}"
    async with remote(Auth(bearer="b")) as client:
        # A deleted event, after a message: the message first, then PipeGone.
        fake.answer = streaming(event(1), b"event: deleted\ndata: the pipe was deleted\n\n")
        events = await client.stream(pipe, 0, room=10, idle=5.0)
        assert events is not None
        try:
            assert [p for p, _ in await taken(events, 1)] == [1]
            with pytest.raises(PipeGone):
                await events.take(10, 3.0)
        finally:
            await events.close()
        # No such pipe.
        fake.answer = fixed(404, "no such pipe")
        with pytest.raises(PipeGone):
            await client.stream(pipe, 0, room=10, idle=5.0)
        # A RestMS server without the extension answers with the pipe, or 406: None,
        # and the link reads a message at a time.
        fake.answer = fixed(200, '{"restms":{"pipe":[{}]}}')
        assert await client.stream(pipe, 0, room=10, idle=5.0) is None
        fake.answer = fixed(406, "not acceptable")
        assert await client.stream(pipe, 0, room=10, idle=5.0) is None
        # A remote that is away: Unavailable, with its Retry-After.
        fake.answer = fixed(503, "busy", **{"Retry-After": "7"})
        with pytest.raises(Unavailable) as failed:
            await client.stream(pipe, 0, room=10, idle=5.0)
        assert failed.value.retry_after == 7


async def test_a_silent_stream_ends_and_a_slow_taker_holds_the_remote_back(
    fake: Fake, blockbuster: BlockBuster
) -> None:
    """A stream that says nothing for ``idle`` seconds ends (the link opens another:
    bounded waits); one whose reader is behind holds ``room`` messages at most and
    hands over every one in order."""
    pipe = f"{fake.url}{PIPE}"
    seen: list[str] = []
    fake.answer = streaming(b": hello\n\n", then=30.0, seen=seen)
    async with remote(Auth(bearer="b")) as client:
        events = await client.stream(pipe, 41, room=10, idle=0.5)
        assert events is not None
        started = time.monotonic()
        assert await events.take(10, 5.0) == []
        assert events.ended
        assert time.monotonic() - started < 3
        await events.close()
        assert seen == ["41"]  # resumed after the position given

        fake.answer = streaming(b"".join(event(n) for n in range(1, 201)))
        events = await client.stream(pipe, 0, room=5, idle=5.0)
        assert events is not None
        try:
            await asyncio.sleep(0.5)  # the reader stops once room is taken up
            got = []
            while more := await events.take(7, 1.0):
                assert len(more) <= 7
                got += more
        finally:
            await events.close()
    assert [p for p, _ in got] == list(range(1, 201))
