"""Tracing across a federation hop (docs/TRACING.md): two gateways, each a process of its
own (tests/sites.py), site A pushing its ``news`` feed to site B's, both with tracing on
and exporting over OTLP/HTTP to one real receiver in the test.

Decided behaviour under test: a message published at A by a client in trace T reaches
B's reader carrying T; on the way, A's push link made a ``federation send`` span, child
of A's publish span, whose context the message carried to B, and B's publish links to it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from tests.app.spans import TRACE, TRACEPARENT
from tests.sites import FEED, Client, Link, sites

JSON = {"Content-Type": "application/restms+json", "Accept": "application/restms+json"}


class Collector:
    """An OTLP/HTTP receiver on 127.0.0.1: the spans posted to it, decoded."""

    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.came = asyncio.Event()  # set when spans come
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/traces", self._collect)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}/v1/traces"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _collect(self, request: web.Request) -> web.Response:
        decoded = ExportTraceServiceRequest()
        decoded.ParseFromString(await request.read())
        for resource in decoded.resource_spans:
            for scope in resource.scope_spans:
                self.spans.extend(scope.spans)
        self.came.set()
        return web.Response(status=200)

    def named(self, name: str) -> list[Span]:
        return [span for span in self.spans if span.name == name]

    async def until(self, name: str, count: int, within: float = 20.0) -> None:
        """Wait (bounded) until ``count`` spans called ``name`` came."""
        async with asyncio.timeout(within):
            while len(self.named(name)) < count:
                self.came.clear()
                await self.came.wait()


def traceparent(message: dict[str, Any]) -> str:
    (found,) = [h["value"] for h in message["header"] if h["name"] == "traceparent"]
    return str(found)


async def test_a_push_link_carries_the_trace_to_the_remote(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    collector = Collector()
    await collector.start()
    monkeypatch.setenv("RESTMS_TRACING", "true")  # the sites' processes inherit these
    monkeypatch.setenv("RESTMS_OTLP_ENDPOINT", collector.url)
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")  # export within 0.1 s
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http,
            sites(tmp_path, "AB", [Link("A", "B")]) as running,
        ):
            client = Client(http)
            there = await client.reader(running["B"])
            message = {"address": "news.traced", "content": [{"value": "hop"}]}
            body = orjson.dumps({"restms": {"message": [message]}})
            url = f"{running['A'].url}/restms/feed/{FEED}"
            async with http.post(url, data=body, headers={**JSON, "traceparent": TRACEPARENT}) as r:
                assert r.status == 200, await r.text()
            (arrived,) = await client.wait_for(there, 1, 20.0)
            await collector.until("federation send", 1)
            await collector.until("restms publish", 2)  # A's and B's
    finally:
        await collector.stop()
    (sent,) = collector.named("federation send")
    published = {span.span_id: span for span in collector.named("restms publish")}
    at_a = published[sent.parent_span_id]  # the send is the child of A's publish
    assert at_a.trace_id.hex() == sent.trace_id.hex() == TRACE
    assert traceparent(arrived) == f"00-{TRACE}-{sent.span_id.hex()}-01"
    at_b = [span for span in published.values() if span.links]
    assert [link.span_id for span in at_b for link in span.links] == [sent.span_id]
