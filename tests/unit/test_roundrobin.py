"""The multi-node tests' round-robin proxy (tests/roundrobin.py) sends each request to
the next node, streams replies as they come, keeps the client's Host and relays
WebSocket frames."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from tests.roundrobin import RoundRobinProxy


async def node(name: str) -> tuple[web.AppRunner, str]:
    async def hello(request: web.Request) -> web.Response:
        body = await request.read()
        return web.Response(text=f"{name} {request.method} {request.host} {body.decode()}")

    async def drip(request: web.Request) -> web.StreamResponse:
        reply = web.StreamResponse()
        await reply.prepare(request)
        await reply.write(b"first\n")
        await asyncio.sleep(3600)  # the client reads the first line long before this
        return reply

    async def echo(request: web.Request) -> web.WebSocketResponse:
        socket = web.WebSocketResponse()
        await socket.prepare(request)
        async for frame in socket:
            await socket.send_str(f"{name}:{frame.data}")
        return socket

    app = web.Application()
    app.router.add_route("*", "/hello", hello)
    app.router.add_get("/drip", drip)
    app.router.add_get("/ws", echo)
    runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=0.1)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    host, port = runner.addresses[0][:2]
    return runner, f"http://{host}:{port}"


@pytest.fixture
async def proxy() -> AsyncIterator[RoundRobinProxy]:
    nodes = [await node(name) for name in ("a", "b", "c")]
    proxy = await RoundRobinProxy([url for _, url in nodes]).start()
    yield proxy
    await proxy.close()
    for runner, _ in nodes:
        await runner.cleanup()


async def test_each_request_goes_to_the_next_node_with_the_clients_host(
    proxy: RoundRobinProxy,
) -> None:
    async with aiohttp.ClientSession() as http:
        answers = []
        for i in range(4):
            async with http.post(proxy.url + "/hello", data=f"body{i}") as r:
                answers.append(await r.text())
    host = proxy.url.removeprefix("http://")
    assert answers == [
        f"a POST {host} body0",
        f"b POST {host} body1",
        f"c POST {host} body2",
        f"a POST {host} body3",
    ]
    assert proxy.sent == [0, 1, 2, 0]


async def test_a_streamed_reply_arrives_before_it_ends(proxy: RoundRobinProxy) -> None:
    async with aiohttp.ClientSession() as http, http.get(proxy.url + "/drip") as r:
        async with asyncio.timeout(5):
            assert await r.content.readline() == b"first\n"


async def test_websocket_frames_are_relayed_both_ways(proxy: RoundRobinProxy) -> None:
    async with aiohttp.ClientSession() as http, http.ws_connect(proxy.url + "/ws") as ws:
        await ws.send_str("ping")
        async with asyncio.timeout(5):
            assert (await ws.receive()).data == "a:ping"
