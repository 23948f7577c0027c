"""OpenTelemetry tracing (docs/TRACING.md): spans, and one trace from publisher to consumer.

The gateways run in this process with ``tracing = true``; their spans go to the
in-memory exporter of :mod:`tests.app.spans`. The webhook receiver is a real HTTP
server on 127.0.0.1 that records the headers it got; the OTLP test runs a real
``main.py serve`` that exports to a real HTTP receiver, which decodes what it got.

Decided behaviour under test:

* Each request is a SERVER span named after its route, child of a valid incoming
  ``traceparent`` (else the root of a new trace), and the request id is its trace id
  unless the request gave a valid ``X-Request-ID``.
* A publish is a PRODUCER span under the request's; each message without a context of
  its own carries the publish span's in its ``traceparent`` header, one with its own
  keeps it. A read is a CONSUMER span linked to the message's context.
* A webhook attempt is a CLIENT span, child of the message's context, and its POST
  carries a ``traceparent`` naming that span: the receiver continues the trace.
* Tracing off: no span is made and messages are not touched.
* With ``otlp_endpoint``, a real gateway process exports its spans over OTLP/HTTP.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from gateway.server.config import ConfigError, load
from tests.app import process
from tests.app.jsonapi import AJ, HJ, body, get, new_pipe
from tests.app.spans import (
    PARENT,
    TRACE,
    TRACEPARENT,
    named,
    parent_id,
    recorded,
    span_id,
    trace_id,
    traceparent_of,
)
from tests.app.test_webhooks import FAST, Receiver, until, until_state, webhook
from tests.conftest import Gateway, MakeGateway

FEED = "/restms/feed/default"
PUBLISH = f"POST {'/restms/feed/{name}'}"


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    yield from recorded()


async def first_message(gw: Gateway, pipe: dict[str, Any]) -> dict[str, Any]:
    """The pipe's first message document (a GET on its first listed message)."""
    status, listed = await get(gw, pipe["uri"])
    assert status == 200, listed
    href = listed["restms"]["pipe"][0]["message"][0]["href"]
    status, message = await get(gw, href)
    assert status == 200, message
    found: dict[str, Any] = message["restms"]["message"][0]
    return found


async def publish(gw: Gateway, *messages: dict[str, Any], **headers: str) -> None:
    data = body(message=list(messages))
    async with gw.http.post(FEED, data=data, headers={**HJ, **headers}) as r:
        assert r.status == 200, await r.text()
        assert r.headers["X-Request-ID"] == TRACE  # the trace's id, from its traceparent


async def test_publish_and_read_follow_the_publishers_trace(
    make_gateway: MakeGateway, spans: InMemorySpanExporter
) -> None:
    gw = await make_gateway(tracing=True)
    pipe = await new_pipe(gw)
    own = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    mine = {"address": pipe["name"], "content": [{"value": "one"}]}
    theirs = {**mine, "header": [{"name": "traceparent", "value": own}]}
    await publish(gw, mine, theirs, traceparent=TRACEPARENT)

    (server,) = named(spans, PUBLISH)
    assert server.kind == SpanKind.SERVER
    assert (trace_id(server), parent_id(server)) == (TRACE, PARENT)
    assert server.attributes is not None
    assert server.attributes["http.response.status_code"] == 200
    (published,) = named(spans, "restms publish")
    assert published.kind == SpanKind.PRODUCER
    assert (trace_id(published), parent_id(published)) == (TRACE, span_id(server))
    assert published.attributes is not None
    assert published.attributes["messaging.batch.message_count"] == 2
    # The second message's own context is linked to, and kept.
    assert [f"{link.context.trace_id:032x}" for link in published.links] == [own[3:35]]

    message = await first_message(gw, pipe)
    assert traceparent_of(message["header"]) == f"00-{TRACE}-{span_id(published)}-01"
    (read,) = [s for s in named(spans, "restms read") if s.links]
    assert read.kind == SpanKind.CONSUMER
    assert [link.context.span_id for link in read.links] == [published.context.span_id]
    status, listed = await get(gw, pipe["uri"])
    second = listed["restms"]["pipe"][0]["message"][1]["href"]
    status, document = await get(gw, second)
    assert status == 200, document
    assert traceparent_of(document["restms"]["message"][0]["header"]) == own


async def test_a_new_trace_names_the_request(
    make_gateway: MakeGateway, spans: InMemorySpanExporter
) -> None:
    """No traceparent, no X-Request-ID: the request's span starts a trace, whose id is
    the request id; a path no route serves is a span too, named ``unrouted``."""
    gw = await make_gateway(tracing=True)
    async with gw.http.get("/healthz") as r:
        assert r.status == 200
        shown = r.headers["X-Request-ID"]
    (server,) = named(spans, "GET /healthz")
    assert server.parent is None
    assert trace_id(server) == shown
    async with gw.http.get("/nowhere", headers={"X-Request-ID": "mine"}) as r:
        assert r.status == 404
        assert r.headers["X-Request-ID"] == "mine"  # a given id still wins
    (unrouted,) = named(spans, "GET unrouted")
    assert unrouted.attributes is not None
    assert unrouted.attributes["http.response.status_code"] == 404


async def test_a_webhook_delivery_continues_the_trace(
    make_gateway: MakeGateway, spans: InMemorySpanExporter
) -> None:
    receiver = await Receiver().start()
    try:
        gw = await make_gateway(tracing=True, **FAST)
        pipe = await webhook(gw, receiver.url)
        await until_state(gw, pipe, state="active")
        message = {"address": pipe["name"], "content": [{"value": "hooked"}]}
        await publish(gw, message, traceparent=TRACEPARENT)
        await until(lambda: receiver.deliveries, "the delivery")
        await until(lambda: named(spans, "webhook POST"), "the attempt's span")
    finally:
        await receiver.stop()
    (delivery,) = receiver.deliveries
    (published,) = named(spans, "restms publish")
    (attempt,) = named(spans, "webhook POST")
    assert attempt.kind == SpanKind.CLIENT
    assert (trace_id(attempt), parent_id(attempt)) == (TRACE, span_id(published))
    assert attempt.attributes is not None
    assert attempt.attributes["restms.webhook.outcome"] == "204"
    # The receiver sees the trace: in the POST's header (the attempt) and in the
    # message's own headers (its publish).
    assert delivery.headers["traceparent"] == f"00-{TRACE}-{span_id(attempt)}-01"
    carried = traceparent_of(delivery.message["header"])
    assert carried == f"00-{TRACE}-{span_id(published)}-01"


async def test_tracing_off_makes_no_span_and_leaves_messages_alone(
    make_gateway: MakeGateway, spans: InMemorySpanExporter
) -> None:
    gw = await make_gateway()  # tracing = false, the default
    pipe = await new_pipe(gw)
    await publish(gw, {"address": pipe["name"]}, traceparent=TRACEPARENT)
    message = await first_message(gw, pipe)
    assert "header" not in message
    assert spans.get_finished_spans() == ()


async def test_sampled_out_traces_stay_out(
    make_gateway: MakeGateway, spans: InMemorySpanExporter
) -> None:
    """A caller that did not sample its trace (flags 00): nothing is recorded, and the
    message carries the trace on, not sampled, so its consumers record nothing either."""
    gw = await make_gateway(tracing=True)
    pipe = await new_pipe(gw)
    unsampled = f"00-{TRACE}-{PARENT}-00"
    await publish(gw, {"address": pipe["name"]}, traceparent=unsampled)
    message = await first_message(gw, pipe)
    carried = traceparent_of(message["header"])
    assert carried.startswith(f"00-{TRACE}-")
    assert carried.endswith("-00")
    assert spans.get_finished_spans()  # the other requests' (new traces, sampled)
    assert [s for s in spans.get_finished_spans() if trace_id(s) == TRACE] == []


async def test_spans_are_exported_over_otlp(tmp_path: Path) -> None:
    """A real gateway process with ``otlp_endpoint`` set posts its spans, in OTLP's
    protobuf encoding, to a real receiver; they are there by the time it has stopped."""
    got: list[ExportTraceServiceRequest] = []

    async def collect(request: web.Request) -> web.Response:
        decoded = ExportTraceServiceRequest()
        decoded.ParseFromString(await request.read())
        got.append(decoded)
        return web.Response(status=200)

    app = web.Application()
    app.router.add_post("/v1/traces", collect)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    port = runner.addresses[0][1]
    env = {
        "RESTMS_TRACING": "true",
        "RESTMS_OTLP_ENDPOINT": f"http://127.0.0.1:{port}/v1/traces",
        "RESTMS_TRACING_SERVICE": "gateway-under-test",
        "RESTMS_DATA_DIR": str(tmp_path / "var"),
    }
    proc = await process.start("--port", "0", env=env)
    try:
        gateway = await process.listening_port(proc)
        async with aiohttp.ClientSession() as http:
            url = f"http://127.0.0.1:{gateway}/restms/domain/default"
            async with http.get(url, headers={**AJ, "traceparent": TRACEPARENT}) as r:
                assert r.status == 200
        proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(30):
            await proc.communicate()
        assert proc.returncode == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await runner.cleanup()
    exported = [
        (resource, span)
        for request in got
        for resource in request.resource_spans
        for scope in resource.scope_spans
        for span in scope.spans
    ]
    found = [(r, s) for r, s in exported if s.name == "GET /restms/domain/{name}"]
    assert len(found) == 1, [s.name for _, s in exported]
    resource, span = found[0]
    assert span.trace_id.hex() == TRACE
    assert span.parent_span_id.hex() == PARENT
    names = {a.key: a.value.string_value for a in resource.resource.attributes}
    assert names["service.name"] == "gateway-under-test"


async def test_config_refuses_an_endpoint_without_tracing(tmp_path: Path) -> None:
    code, _, err = await process.main_py(
        "serve",
        "--port",
        "0",
        env={"RESTMS_OTLP_ENDPOINT": "http://127.0.0.1:4318/v1/traces"},
    )
    assert code == 2
    assert "otlp_endpoint needs tracing = true" in err


@pytest.mark.parametrize(
    "endpoint",
    [
        "http://[::1/v1/traces",  # before: a ValueError traceback at start-up
        "http://127.0.0.1:99999/v1/traces",  # before: taken, every export failing
        "http://127.0.0.1:abc/v1/traces",
        "http://collector host/v1/traces",
        "collector:4318/v1/traces",
    ],
)
def test_a_bad_otlp_endpoint_is_a_clear_configuration_error(endpoint: str) -> None:
    with pytest.raises(ConfigError, match="otlp_endpoint must be an http"):
        load(env={"RESTMS_TRACING": "true", "RESTMS_OTLP_ENDPOINT": endpoint})


async def test_a_clients_bad_trace_context_is_ignored_without_logging_it(
    make_gateway: MakeGateway, spans: InMemorySpanExporter, caplog: pytest.LogCaptureFixture
) -> None:
    """A malformed ``tracestate`` or an overlong ``traceparent`` (HTTP headers, or a
    message's own headers) is ignored as any bad correlation header: the request
    succeeds and the gateway logs nothing of it. The OpenTelemetry SDK warns with the
    whole value, so any client could have written kilobytes to the log per request."""
    gw = await make_gateway(tracing=True)
    junk = "junk" * 1000
    headers = {"traceparent": TRACEPARENT, "tracestate": f"a=b,{junk}"}
    with caplog.at_level("DEBUG"):
        async with gw.http.get("/healthz", headers=headers) as r:
            assert r.status == 200
        async with gw.http.get("/healthz", headers={"traceparent": "00-" + junk}) as r:
            assert r.status == 200
        bad = [
            {"name": "traceparent", "value": TRACEPARENT},
            {"name": "tracestate", "value": junk},
        ]
        await publish(gw, {"address": "a", "header": bad}, traceparent=TRACEPARENT)
    warned = [r.name for r in caplog.records if r.name.startswith("opentelemetry")]
    assert warned == []
    assert not [r for r in caplog.records if "junk" in r.getMessage()]
    (server,) = [s for s in named(spans, "GET /healthz") if s.parent is not None]
    assert trace_id(server) == TRACE  # the valid traceparent still counts
