"""Connection hardening against a real gateway, over raw sockets.

Decided behaviour under test (gateway/server/connections.py, gateway/server/run.py):

* A request head past ``max_line_size``, ``max_field_size`` or ``max_headers`` is
  answered ``400`` and the connection closed (aiohttp's parser, our limits); no
  refused head has its bytes echoed in the reply.
* The clock for the first request head starts at the accept, for a later one at its
  first byte: a client that dribbles one gets ``408`` and is closed after
  ``header_timeout``; a connection that sends nothing is closed after
  ``header_timeout`` without a reply (so silent connections cannot hold the
  ``max_connections`` slots); one idle between requests is left alone until
  ``keepalive_timeout``.
* A body that is still arriving when its handler starts has ``body_timeout`` to
  finish; then the connection is closed without a reply.
* Replies are never timed: a long-poll and an SSE stream outlive both deadlines.
* Connections past ``max_connections`` in all or ``max_connections_per_ip`` from one
  address get ``503`` + ``Retry-After`` and are closed; counts return to zero when
  clients go, and new connections are admitted again.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
import re
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest
import yarl
from aiohttp import web
from aiohttp.http_exceptions import LineTooLong

from gateway.server.connections import AIOHTTP_CHECKED, Connection, ConnectionLimits
from tests.app.jsonapi import HJ, body, new_pipe
from tests.conftest import Gateway, MakeGateway

pytestmark = pytest.mark.app

DOMAIN_GET = b"GET /restms/domain/default HTTP/1.1\r\nHost: gw\r\n"


@pytest.fixture
def make_gateway(make_gateway: MakeGateway) -> MakeGateway:
    """Gateways that serve ``Host: gw``, the host the requests written here name."""

    async def start(**overrides: Any) -> Gateway:
        overrides.setdefault("allowed_hosts", "gw")
        return await make_gateway(**overrides)

    return start


# ---------------------------------------------------------------- helpers


Stream = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def connect(gw: Gateway, source: str = "127.0.0.1") -> Stream:
    url = yarl.URL(gw.url)
    assert url.host is not None
    return await asyncio.open_connection(url.host, url.port, local_addr=(source, 0))


async def read_all(reader: asyncio.StreamReader, seconds: float = 2.0) -> bytes:
    """Everything the server sends until it closes (a reset counts as a close)."""
    got = bytearray()
    with contextlib.suppress(ConnectionError):
        async with asyncio.timeout(seconds):
            while chunk := await reader.read(65536):
                got += chunk
    return bytes(got)


async def exchange(gw: Gateway, request: bytes) -> bytes:
    """Send one whole request and read the reply up to the server's close."""
    reader, writer = await connect(gw)
    writer.write(request)
    try:
        return await read_all(reader)
    finally:
        writer.close()


async def read_reply(reader: asyncio.StreamReader, seconds: float = 2.0) -> bytes:
    """One whole reply with a Content-Length, leaving the connection open."""
    async with asyncio.timeout(seconds):
        head = await reader.readuntil(b"\r\n\r\n")
        (length,) = [
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        ]
        return head + await reader.readexactly(length)


def status_of(reply: bytes) -> int:
    return int(reply.split(b" ", 2)[1]) if reply.startswith(b"HTTP/1.") else 0


def limits(gw: Gateway) -> ConnectionLimits:
    assert gw.runner is not None
    return gw.runner.limits


async def eventually(predicate: Callable[[], bool], what: str) -> None:
    """Poll ``predicate`` for up to a second: the server sees a close a moment later."""
    for _ in range(100):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"still not {what} after 1 s")


async def settled(gw: Gateway, open_: int = 0) -> None:
    """Wait until the gateway counts ``open_`` connections."""
    await eventually(lambda: limits(gw).open == open_, f"{open_} open connections")


async def dribble(
    writer: asyncio.StreamWriter, chunks: list[bytes], reader_done: Callable[[], bool]
) -> None:
    """Write a chunk every 0.1 s until the reader has heard from the server."""
    for chunk in chunks:
        if reader_done():
            return
        writer.write(chunk)
        await asyncio.sleep(0.1)


# ---------------------------------------------------------------- request-head size


@pytest.mark.parametrize(
    "request_",
    [
        pytest.param(b"GET /" + b"a" * 2000 + b" HTTP/1.1\r\nHost: gw\r\n\r\n", id="line"),
        pytest.param(DOMAIN_GET + b"X-Big: " + b"b" * 2000 + b"\r\n\r\n", id="field"),
        pytest.param(
            DOMAIN_GET + b"".join(b"X-H%d: 1\r\n" % i for i in range(20)) + b"\r\n", id="count"
        ),
    ],
)
async def test_oversize_request_head_is_400_and_closed(
    make_gateway: MakeGateway, request_: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    gw = await make_gateway(max_line_size=1024, max_field_size=1024, max_headers=10)
    with caplog.at_level(logging.DEBUG, "gateway.server.connections"):
        reply = await exchange(gw, request_)
    assert status_of(reply) == 400, reply[:200]  # and closed: read_all read to the end
    text = reply.split(b"\r\n\r\n", 1)[1]
    assert text in (
        b"Bad Request: the request line or a header is longer than 1024 bytes\n",
        b"Bad Request: Too many headers received\n",
    ), text
    # one debug line, not a traceback at ERROR for every bad request from the internet
    assert [r.levelname for r in caplog.records] == ["DEBUG"]
    await settled(gw)


SECRET = b"s3cr3t-marker"


@pytest.mark.parametrize(
    "request_",
    [
        pytest.param(
            DOMAIN_GET + b"Authorization: Bearer " + SECRET + b"x" * 20_000 + b"\r\n\r\n",
            id="oversized-bearer",
        ),
        pytest.param(b"GET /" + SECRET + b" HTTP/1.1 extra\r\nHost: gw\r\n\r\n", id="request-line"),
        pytest.param(b"G\x01T /" + SECRET + b" HTTP/1.1\r\n\r\n", id="method"),
        pytest.param(DOMAIN_GET + b"X-Bad: " + SECRET + b"\x01\r\n\r\n", id="header-byte"),
        pytest.param(DOMAIN_GET + SECRET + b"\r\n\r\n", id="header-without-colon"),
        pytest.param(DOMAIN_GET + b"Content-Length: 1" + SECRET + b"\r\n\r\n", id="length"),
    ],
)
async def test_a_refused_request_head_is_not_echoed(
    gw: Gateway, request_: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    """aiohttp's reasons quote the bytes refused: a token's start must not come back,
    nor reach the log."""
    with caplog.at_level(logging.DEBUG, "gateway.server.connections"):
        reply = await exchange(gw, request_)
    assert status_of(reply) == 400, reply[:300]
    head, text = reply.split(b"\r\n\r\n", 1)
    assert b"Content-Type: text/plain" in head
    # The gateway's own Server header (no versions), and an id to quote to the operator,
    # whose debug line names it.
    assert b"\r\nServer: restms-gateway\r\n" in head, head
    found = re.search(rb"\r\nX-Request-ID: ([0-9a-f]{32})\r\n", head)
    assert found is not None, head
    assert any(found[1].decode() in r.getMessage() for r in caplog.records)
    assert text.startswith(b"Bad Request"), text
    assert len(text) < 100, text
    assert SECRET not in reply
    assert all(SECRET.decode() not in r.getMessage() for r in caplog.records)


async def test_request_head_within_the_limits_is_served(make_gateway: MakeGateway) -> None:
    gw = await make_gateway(max_line_size=1024, max_field_size=1024, max_headers=10)
    headers = b"".join(b"X-H%d: 1\r\n" % i for i in range(7))  # 10 with Host, X-Big, Connection
    big = b"X-Big: " + b"b" * 1000 + b"\r\n"
    reply = await exchange(gw, DOMAIN_GET + headers + big + b"Connection: close\r\n\r\n")
    assert status_of(reply) == 200, reply[:200]


# ---------------------------------------------------------------- read deadlines


async def cut_slow_head(
    gw: Gateway, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    """Dribble a request head on an open connection: 408 and closed after 0.5 s."""
    started = time.monotonic()
    answer = asyncio.create_task(read_all(reader))
    lines = [DOMAIN_GET] + [b"X-Slow-%d: 1\r\n" % i for i in range(30)]
    await dribble(writer, lines, answer.done)
    reply = await answer
    elapsed = time.monotonic() - started
    writer.close()
    assert status_of(reply) == 408, reply[:200]
    assert b"Connection: close" in reply
    assert b"\r\nServer: restms-gateway\r\n" in reply
    assert 0.45 <= elapsed < 2.5, elapsed  # cut near 0.5 s; the whole head takes 3.1 s
    assert limits(gw).too_slow == 1
    await settled(gw)


async def test_slow_request_head_is_cut_after_header_timeout(make_gateway: MakeGateway) -> None:
    gw = await make_gateway(header_timeout=0.5)
    await cut_slow_head(gw, *await connect(gw))


async def test_slow_head_after_a_reply_on_the_same_connection_is_cut(
    make_gateway: MakeGateway,
) -> None:
    """The first request's reply ends its time in hand: the next head is timed."""
    gw = await make_gateway(header_timeout=0.5, keepalive_timeout=5.0)
    reader, writer = await connect(gw)
    writer.write(DOMAIN_GET + b"\r\n")
    assert status_of(await read_reply(reader)) == 200
    await cut_slow_head(gw, reader, writer)


async def test_idle_between_requests_waits_for_keepalive_not_header_timeout(
    make_gateway: MakeGateway,
) -> None:
    gw = await make_gateway(header_timeout=0.2, keepalive_timeout=1.0)
    reader, writer = await connect(gw)
    writer.write(DOMAIN_GET + b"\r\n")
    assert status_of(await read_reply(reader)) == 200
    await asyncio.sleep(0.4)  # idle between requests: no head has started
    writer.write(DOMAIN_GET + b"\r\n")
    assert status_of(await read_reply(reader)) == 200
    writer.close()
    assert limits(gw).too_slow == 0


async def test_a_connection_that_sends_nothing_is_closed_after_header_timeout(
    make_gateway: MakeGateway,
) -> None:
    """The clock starts at the accept, not at a first byte that never comes."""
    gw = await make_gateway(header_timeout=1.0)  # keepalive_timeout: the default 75 s
    reader, writer = await connect(gw)
    started = time.monotonic()
    reply = await read_all(reader, 5.0)
    elapsed = time.monotonic() - started
    writer.close()
    assert reply == b""  # no reply to a request never sent
    assert 0.9 <= elapsed < 3.0, elapsed
    assert limits(gw).too_slow == 1
    await settled(gw)


async def test_a_first_head_begun_late_has_what_is_left_of_header_timeout(
    make_gateway: MakeGateway,
) -> None:
    gw = await make_gateway(header_timeout=1.0)
    reader, writer = await connect(gw)
    started = time.monotonic()
    await asyncio.sleep(0.6)
    writer.write(DOMAIN_GET)  # a head begun, never ended
    reply = await read_all(reader, 5.0)
    elapsed = time.monotonic() - started
    writer.close()
    assert status_of(reply) == 408, reply[:200]
    assert 0.9 <= elapsed < 1.5, elapsed  # not 0.6 + 1.0


async def test_silent_connections_hold_the_connection_cap_only_for_header_timeout(
    make_gateway: MakeGateway,
) -> None:
    """Eleven addresses opening connections and sending nothing fill max_connections
    (10 here) and are refused past it; after header_timeout they are all cut, and a
    real client is served."""
    gw = await make_gateway(max_connections=10, header_timeout=1.0)
    silent = [await connect(gw, f"127.0.0.{i}") for i in range(1, 12)]
    opened = time.monotonic()
    await settled(gw, 10)
    cut = await asyncio.gather(*(read_all(reader, 5.0) for reader, _ in silent))
    assert sorted(status_of(reply) for reply in cut) == [0] * 10 + [503]
    await settled(gw)
    assert time.monotonic() - opened < 3.0
    reply = await exchange(gw, DOMAIN_GET + b"Connection: close\r\n\r\n")
    assert status_of(reply) == 200, reply[:200]
    for _, writer in silent:
        writer.close()
    assert limits(gw).too_slow == 10


async def test_idle_keepalive_connection_is_closed_after_keepalive_timeout(
    make_gateway: MakeGateway,
) -> None:
    gw = await make_gateway(keepalive_timeout=0.3)
    reader, writer = await connect(gw)
    writer.write(DOMAIN_GET + b"\r\n")
    started = time.monotonic()
    reply = await read_all(reader)
    writer.close()
    assert reply.startswith(b"HTTP/1.1 200")
    assert 0.25 <= time.monotonic() - started < 1.0
    await settled(gw)


async def test_a_wait_outlives_keepalive_and_the_idle_after_its_reply_is_still_timed(
    make_gateway: MakeGateway,
) -> None:
    """A wait stops the keep-alive timer (connections.waits); the reply's end arms it again."""
    gw = await make_gateway(keepalive_timeout=0.3, max_wait=0.8)
    pipe = await new_pipe(gw)
    asynclet = yarl.URL(pipe["message"][-1]["href"]).path
    reader, writer = await connect(gw)
    assert gw.runner is not None
    assert gw.runner.server is not None
    server, ours = gw.runner.server, writer.get_extra_info("sockname")
    await eventually(
        lambda: any(c.peername == ours for c in server.connections), "our connection seen"
    )
    (protocol,) = [c for c in server.connections if c.peername == ours]
    assert protocol._keepalive_handle is not None  # armed when the connection opened
    writer.write(b"GET %s HTTP/1.1\r\nHost: gw\r\n\r\n" % asynclet.encode())
    await eventually(lambda: protocol._keepalive_handle is None, "stopped for the wait")
    reply = await read_reply(reader, 3.0)  # the wait expires: 503, kept alive
    replied = time.monotonic()
    assert status_of(reply) == 503, reply[:200]
    assert await read_all(reader) == b""  # then closed, idle for keepalive_timeout
    writer.close()
    assert 0.2 <= time.monotonic() - replied < 1.5


async def test_slow_request_body_is_cut_after_body_timeout(make_gateway: MakeGateway) -> None:
    gw = await make_gateway(body_timeout=0.5, header_timeout=0.2)
    reader, writer = await connect(gw)
    head = (
        b"POST /restms/feed/default HTTP/1.1\r\nHost: gw\r\n"
        b"Content-Type: application/restms+json\r\nContent-Length: 1000\r\n\r\n"
    )
    started = time.monotonic()
    answer = asyncio.create_task(read_all(reader))
    await dribble(writer, [head] + [b" " * 10] * 30, answer.done)
    reply = await answer
    elapsed = time.monotonic() - started
    writer.close()
    assert reply == b""  # the handler owned the reply; it was cancelled
    assert 0.45 <= elapsed < 1.0  # the body's clock, not the head's
    assert limits(gw).too_slow == 1
    await settled(gw)


async def test_a_whole_body_sent_slowly_within_body_timeout_is_served(
    make_gateway: MakeGateway,
) -> None:
    gw = await make_gateway(body_timeout=1.0)
    pipe = await new_pipe(gw)
    document = body(message=[{"address": pipe["name"], "content": [{"value": "x"}]}])
    head = (
        b"POST /restms/feed/default HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n"
        b"Content-Type: application/restms+json\r\nContent-Length: %d\r\n\r\n" % len(document)
    )
    reader, writer = await connect(gw)
    third = len(document) // 3 + 1
    answer = asyncio.create_task(read_all(reader))
    await dribble(
        writer,
        [head] + [document[i : i + third] for i in range(0, len(document), third)],
        answer.done,
    )
    reply = await answer
    writer.close()
    assert status_of(reply) == 200, reply[:300]


async def test_long_poll_and_sse_outlive_both_deadlines(make_gateway: MakeGateway) -> None:
    gw = await make_gateway(header_timeout=0.3, body_timeout=0.3, heartbeat=0.2)
    pipe = await new_pipe(gw)
    asynclet = yarl.URL(pipe["message"][-1]["href"]).path
    reader, writer = await connect(gw)
    writer.write(
        b"GET %s HTTP/1.1\r\nHost: gw\r\nAccept: application/restms+json\r\n"
        b"Connection: close\r\n\r\n" % asynclet.encode()
    )
    async with gw.http.get(pipe["uri"], headers={"Accept": "text/event-stream"}) as sse:
        assert sse.status == 200
        await asyncio.sleep(1.0)  # both deadlines three times over
        message = {"address": pipe["name"], "content": [{"value": "late"}]}
        async with gw.http.post(
            "/restms/feed/default", data=body(message=[message]), headers=HJ
        ) as r:
            assert r.status == 200
        async with asyncio.timeout(1):
            while b"late" not in await sse.content.readline():
                pass
    reply = await read_all(reader)
    writer.close()
    assert status_of(reply) == 200, reply[:200]
    document = json.loads(reply.split(b"\r\n\r\n", 1)[1])
    assert document["restms"]["message"][0]["content"][0]["value"] == "late"
    assert limits(gw).too_slow == 0


# ---------------------------------------------------------------- connection caps


async def test_per_ip_cap_refuses_with_503_and_releases(make_gateway: MakeGateway) -> None:
    gw = await make_gateway(max_connections_per_ip=2)
    held = [await connect(gw) for _ in range(2)]
    await settled(gw, 2)
    reader, writer = await connect(gw)
    refused = await read_all(reader)
    writer.close()
    assert status_of(refused) == 503
    assert b"Retry-After: 1" in refused
    assert b"\r\nServer: restms-gateway\r\n" in refused
    other = await connect(gw, "127.0.0.2")  # another address has its own allowance
    await settled(gw, 3)
    assert limits(gw).from_peer("127.0.0.1") == 2
    assert limits(gw).refused == 1
    held[0][1].close()
    await settled(gw, 2)
    reply = await exchange(gw, DOMAIN_GET + b"Connection: close\r\n\r\n")
    assert status_of(reply) == 200
    for _, writer in [*held[1:], other]:
        writer.close()
    await settled(gw)
    assert limits(gw).from_peer("127.0.0.1") == 0


async def test_total_cap_refuses_with_503_and_releases(make_gateway: MakeGateway) -> None:
    gw = await make_gateway(max_connections=3, max_connections_per_ip=2)
    held = [await connect(gw, source) for source in ("127.0.0.1", "127.0.0.2", "127.0.0.3")]
    await settled(gw, 3)
    reader, writer = await connect(gw, "127.0.0.4")
    refused = await read_all(reader)
    writer.close()
    assert status_of(refused) == 503
    held.pop()[1].close()
    await settled(gw, 2)
    reader, writer = await connect(gw, "127.0.0.4")
    writer.write(DOMAIN_GET + b"Connection: close\r\n\r\n")
    assert status_of(await read_all(reader)) == 200
    writer.close()
    for _, w in held:
        w.close()
    await settled(gw)


async def test_counts_return_to_zero_after_every_kind_of_close(make_gateway: MakeGateway) -> None:
    gw = await make_gateway(max_connections=4, header_timeout=0.2, max_headers=5)
    for _ in range(3):
        # served and kept alive, then dropped by the client
        async with aiohttp.ClientSession() as http, http.get(gw.uri("/restms/domain/default")) as r:
            assert r.status == 200
        # refused by the parser
        assert status_of(await exchange(gw, DOMAIN_GET + b"X: 1\r\n" * 9 + b"\r\n")) == 400
        # cut by the head deadline
        reader, writer = await connect(gw)
        writer.write(b"GET / HTTP/1.1\r\n")
        assert status_of(await read_all(reader)) == 408
        writer.close()
        await settled(gw)
    assert limits(gw).from_peer("127.0.0.1") == 0
    # and the whole allowance is there again
    held = [await connect(gw) for _ in range(4)]
    await settled(gw, 4)
    for _, writer in held:
        writer.close()
    await settled(gw)


# ---------------------------------------------------------------- the aiohttp surface


async def test_aiohttp_surface_is_what_connections_expect(gw: Gateway) -> None:
    """gateway/server/connections.py and middleware.py rely on these; re-read them when
    this fails."""
    assert aiohttp.__version__.startswith(AIOHTTP_CHECKED + "."), aiohttp.__version__
    assert inspect.iscoroutinefunction(web.AppRunner._make_server)
    assert list(inspect.signature(web.RequestHandler.log_access).parameters) == [
        "self",
        "request",
        "response",
        "time",
    ]
    # called at the reply's end, written or not (the client went away meanwhile)
    finish = await asyncio.to_thread(inspect.getsource, web.RequestHandler.finish_response)
    assert finish.count("self.log_access(request, resp, start_time)") == 2
    assert list(inspect.signature(web.Application._make_request).parameters)[1:6] == [
        "message",
        "payload",
        "protocol",
        "writer",
        "task",
    ]
    # a head parsed whole is queued in _messages by data_received itself
    received = await asyncio.to_thread(inspect.getsource, web.RequestHandler.data_received)
    assert "self._messages.append((msg, payload))" in received
    # the keep-alive timer a wait stops (connections.waits) is armed again at a reply's end
    start = await asyncio.to_thread(inspect.getsource, web.RequestHandler.start)
    assert "if self._keepalive_handle is None:" in start
    server = inspect.signature(web.Server).parameters
    assert {"request_factory", "handler_cancellation"} <= server.keys()
    handler = inspect.signature(web.RequestHandler).parameters
    assert {"keepalive_timeout", "max_line_size", "max_field_size", "max_headers"} <= set(handler)
    assert list(inspect.signature(web.RequestHandler.handle_error).parameters) == [
        "self",
        "request",
        "status",
        "exc",
        "message",
    ]
    assert LineTooLong(b"refused", 1024).args[1] == 1024  # the limit head_fault names
    # gateway/server/middleware.py: a route's handler is its _handler, which the
    # request's match_info.handler returns (so the concerns wrap every request)
    route = next(r for r in gw.app.router.routes() if r.method == "GET")
    assert route.handler is route._handler
    handler_source = await asyncio.to_thread(inspect.getsource, type(route).handler.fget)
    assert "return self._handler" in handler_source
    # and, in use: a live connection is ours, and the request factory saw its start
    reader, writer = await connect(gw)
    await settled(gw, 1)
    assert gw.runner is not None
    assert gw.runner.server is not None
    (protocol,) = gw.runner.server.connections
    assert isinstance(protocol, Connection)
    writer.write(DOMAIN_GET + b"Content-Length: 5\r\n\r\n")
    await asyncio.sleep(0.05)
    assert protocol._reading == "request body"
    writer.write(b"12345")
    assert status_of(await read_reply(reader)) == 200
    await eventually(lambda: protocol._reading is None, "stopped by the end of the body")
    await eventually(lambda: not protocol._handling, "no request in hand after the reply")
    writer.close()
    await settled(gw)
