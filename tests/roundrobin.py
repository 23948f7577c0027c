"""A round-robin HTTP proxy on 127.0.0.1 for the multi-node tests: each request goes
to the next node in turn, as a plain load balancer with no sticky sessions sends it.

Responses are streamed back as they come (SSE, multipart streams and long polls pass
through unbuffered), WebSocket upgrades are relayed frame by frame, and the client's
``Host`` is kept so the URIs a node writes into its documents point at the proxy,
not at the node.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import aiohttp
from aiohttp import web

# Headers that belong to one connection, not to the request (RFC 9110 §7.6.1).
HOP_BY_HOP = frozenset(
    h.lower()
    for h in (
        "Connection",
        "Keep-Alive",
        "Proxy-Authenticate",
        "Proxy-Authorization",
        "TE",
        "Trailer",
        "Transfer-Encoding",
        "Upgrade",
    )
)


class RoundRobinProxy:
    """Forward each request to the next of ``nodes`` (base URLs) in turn."""

    def __init__(self, nodes: Sequence[str]) -> None:
        self.nodes = list(nodes)
        self._turn = 0
        self.sent: list[int] = []  # the node each request went to, in order
        self._session: aiohttp.ClientSession | None = None
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> RoundRobinProxy:
        self._session = aiohttp.ClientSession(
            auto_decompress=False, timeout=aiohttp.ClientTimeout(total=None)
        )
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._forward)
        # A stream passing through (an SSE stream a federation link reads) ends with the
        # proxy: aiohttp's default would wait 60 s for its handler at every close.
        self._runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        self.url = f"http://{host}:{port}"
        return self

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    @property
    def host(self) -> str:
        """``host:port`` of the proxy, as clients send it in ``Host``."""
        return self.url.removeprefix("http://")

    def add(self, node: str) -> None:
        """One more node (base URL), after those there: it takes its turn from now on."""
        self.nodes.append(node)

    def _pick(self) -> str:
        index = self._turn % len(self.nodes)
        self._turn += 1
        self.sent.append(index)
        return self.nodes[index]

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        assert self._session is not None
        node = self._pick()
        target = node + request.rel_url.raw_path_qs
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        if request.headers.get("Upgrade", "").lower() == "websocket":
            return await self._relay_websocket(request, target)
        body = await request.read()
        async with self._session.request(
            request.method, target, headers=headers, data=body, allow_redirects=False
        ) as upstream:
            reply = web.StreamResponse(status=upstream.status, reason=upstream.reason)
            for name, value in upstream.headers.items():
                if name.lower() not in HOP_BY_HOP and name.lower() != "content-length":
                    reply.headers.add(name, value)
            if upstream.content_length is not None:
                reply.content_length = upstream.content_length
            await reply.prepare(request)
            async for chunk in upstream.content.iter_any():
                await reply.write(chunk)
            await reply.write_eof()
            return reply

    async def _relay_websocket(self, request: web.Request, target: str) -> web.StreamResponse:
        assert self._session is not None
        headers = {
            k: v
            for k, v in request.headers.items()
            if k.lower() not in HOP_BY_HOP and not k.lower().startswith("sec-websocket")
        }
        protocols = [
            p.strip() for p in request.headers.get("Sec-WebSocket-Protocol", "").split(",") if p
        ]
        try:
            upstream = await self._session.ws_connect(
                target.replace("http", "ws", 1), headers=headers, protocols=protocols
            )
        except aiohttp.WSServerHandshakeError as refused:
            return web.Response(status=refused.status, text=refused.message)
        client = web.WebSocketResponse(protocols=[upstream.protocol] if upstream.protocol else ())
        await client.prepare(request)

        async def pump(
            source: aiohttp.ClientWebSocketResponse | web.WebSocketResponse,
            sink: aiohttp.ClientWebSocketResponse | web.WebSocketResponse,
        ) -> None:
            async for frame in source:
                if frame.type == aiohttp.WSMsgType.TEXT:
                    await sink.send_str(frame.data)
                elif frame.type == aiohttp.WSMsgType.BINARY:
                    await sink.send_bytes(frame.data)
            await sink.close(code=source.close_code or 1000)

        await asyncio.gather(pump(upstream, client), pump(client, upstream))
        return client
