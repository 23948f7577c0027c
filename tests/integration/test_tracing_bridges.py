"""Tracing across the bridges (docs/TRACING.md): the trace a message carries goes out and
comes in through ZeroMQ sockets and a real RabbitMQ, as the message's ``traceparent``.

The gateway runs in this process with ``tracing = true``; its spans go to the in-memory
exporter of :mod:`tests.app.spans`. The far sides are real: zmq sockets connected to the
bridge's, and a RabbitMQ queue (``scripts/services``) one bridge sends to and another
reads.

Decided behaviour under test:

* A message sent out is a PRODUCER span ``send <bridge>``, child of the context the
  message carries (here, the publish span under the publisher's request), and the far
  side gets the message with a ``traceparent`` naming that span: same trace.
* A message that comes in with a ``traceparent`` is a CONSUMER span ``receive
  <bridge>``, its child; the publish into the feed links to it, and the message a
  reader gets carries the receive span's context: the sender's trace goes on. Through
  RabbitMQ, out by one bridge and in by another, it is one trace end to end.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import orjson
import pytest
import zmq
import zmq.asyncio
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from tests.app.jsonapi import HJ, body
from tests.app.spans import (
    TRACE,
    TRACEPARENT,
    named,
    parent_id,
    recorded,
    span_id,
    trace_id,
)
from tests.conftest import Gateway, MakeGateway
from tests.integration import gw as amqp_gw
from tests.integration.broker import Broker
from tests.integration.gw import headers_of, new_pipe, take
from tests.integration.test_zmq_bridge import endpoint, gateway, zmq_bridge

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

# The trace of a sender on the far side, coming in.
THEIR_TRACE = "0af7651916cd43dd8448eb211c80319c"
THEIR_PARENT = "b7ad6b7169203331"
THEIRS = f"00-{THEIR_TRACE}-{THEIR_PARENT}-01"


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    yield from recorded()


@pytest.fixture
async def far_side() -> AsyncIterator[Callable[[int, str], zmq.asyncio.Socket]]:
    """Makes the far side's sockets, each connected to an endpoint; closes them after."""
    context = zmq.asyncio.Context()
    made: list[zmq.asyncio.Socket] = []

    def connected(kind: int, where: str) -> zmq.asyncio.Socket:
        sock = context.socket(kind)
        made.append(sock)
        sock.connect(where)
        return sock

    yield connected
    for sock in made:
        sock.close(linger=0)
    context.term()


async def publish_traced(gw: Gateway, feed: str, *messages: dict[str, Any]) -> None:
    """Publish as a client in the trace TRACE (its span PARENT) does."""
    headers = {**HJ, "traceparent": TRACEPARENT}
    async with gw.http.post(
        f"/restms/feed/{feed}", data=body(message=list(messages)), headers=headers
    ) as r:
        assert r.status == 200, await r.text()


def sent_under_publish(spans: InMemorySpanExporter, bridge: str) -> str:
    """The ``send`` span of ``bridge``, checked to be the publish span's child in the
    publisher's trace; the traceparent the far side must have got."""
    (published,) = [s for s in named(spans, "restms publish") if trace_id(s) == TRACE]
    (sent,) = named(spans, f"send {bridge}")
    assert sent.kind == SpanKind.PRODUCER
    assert (trace_id(sent), parent_id(sent)) == (TRACE, span_id(published))
    return f"00-{TRACE}-{span_id(sent)}-01"


def received_under(spans: InMemorySpanExporter, bridge: str, trace: str, parent: str | None) -> str:
    """The ``receive`` span of ``bridge``, checked to be the child of the sender's span
    (``parent`` in ``trace``) and linked from the publish into the feed; the
    traceparent a reader must get."""
    (received,) = named(spans, f"receive {bridge}")
    assert received.kind == SpanKind.CONSUMER
    assert (trace_id(received), parent_id(received)) == (trace, parent)
    linked = [s for s in named(spans, "restms publish") if s.links]
    assert [link.context.span_id for s in linked for link in s.links] == [received.context.span_id]
    return f"00-{trace}-{span_id(received)}-01"


async def test_zeromq_bridges_carry_the_trace(
    make_gateway: MakeGateway,
    spans: InMemorySpanExporter,
    far_side: Callable[[int, str], zmq.asyncio.Socket],
) -> None:
    gw = await gateway(
        make_gateway,
        zmq_bridge("out", "push", "orders", address="#"),
        zmq_bridge("in", "pull", "incoming"),
        tracing=True,
    )
    reader = await new_pipe(gw, "incoming")
    far_in = far_side(zmq.PULL, endpoint(gw, "out"))
    far_out = far_side(zmq.PUSH, endpoint(gw, "in"))

    await publish_traced(gw, "orders", {"address": "eu.order", "content": [{"value": "out"}]})
    async with asyncio.timeout(20):
        frames = await far_in.recv_multipart()
    envelope = orjson.loads(frames[1])
    assert dict(envelope["h"])["traceparent"] == sent_under_publish(spans, "out")

    header = orjson.dumps({"v": 1, "h": [["traceparent", THEIRS]]})
    await far_out.send_multipart([b"eu.in", header, b"in"])
    (message,) = await take(gw, reader, 1)
    carried = received_under(spans, "in", THEIR_TRACE, THEIR_PARENT)
    assert headers_of(message)["traceparent"] == carried


async def test_amqp_bridges_carry_the_trace_through_the_broker(
    make_gateway: MakeGateway, spans: InMemorySpanExporter, broker: Broker, queue_name: str
) -> None:
    """Out to a queue and back in from it: the message's trace is one, from the
    publisher's request to the reader, with the broker between the send and receive."""
    await asyncio.to_thread(broker.declare_queue, queue_name)
    gw = await amqp_gw.gateway(
        make_gateway,
        amqp_gw.outbound("out", f"/queue/{queue_name}"),
        amqp_gw.inbound("in", f"/queue/{queue_name}"),
        tracing=True,
    )
    await amqp_gw.up(gw, "out", "in")
    reader = await new_pipe(gw, "incoming")
    await publish_traced(gw, "orders", {"address": "eu.order", "content": [{"value": "out"}]})
    (message,) = await take(gw, reader, 1)
    sent = sent_under_publish(spans, "out")
    carried = received_under(spans, "in", TRACE, sent.split("-")[2])
    assert headers_of(message)["traceparent"] == carried
