"""The AMQP 1.0 bridge against the real RabbitMQ on 127.0.0.1:5672 (docs/AMQP.md)."""

from __future__ import annotations

import asyncio
import uuid

import pika
import pytest

from tests.conftest import MakeGateway
from tests.integration.broker import Broker
from tests.integration.gw import (
    AMQP,
    bridge,
    content_bytes,
    gateway,
    headers_of,
    held,
    inbound,
    new_pipe,
    outbound,
    publish,
    take,
    until,
    up,
)

pytestmark = pytest.mark.integration

BINARY = bytes(range(256)) * 4  # 1 KiB, every byte value
FULL = {
    "address": "order.new",
    "message_id": "m-1",
    "correlation_id": "c-1",
    "reply_to": "/queue/replies",
    "delivery_mode": "2",
    "priority": "7",
    "expiration": "60000",
    "timestamp": "1700000000",
    "type": "order",
    "user_id": "guest",
    "app_id": "shop",
    "sender_id": "till-4",
    "header": [{"name": "region", "value": "eu"}, {"name": "amount", "value": "12.50"}],
    "content": [
        {
            "type": "application/octet-stream",
            "encoding": "base64",
            "value": __import__("base64").b64encode(BINARY).decode(),
        }
    ],
}
PROPS = (
    "address",
    "message_id",
    "correlation_id",
    "reply_to",
    "delivery_mode",
    "priority",
    "expiration",
    "timestamp",
    "type",
    "user_id",
    "app_id",
    "sender_id",
)


async def test_round_trip_keeps_every_mapped_property(
    make_gateway: MakeGateway, broker: Broker, queue_name: str
) -> None:
    """HTTP publish -> outbound bridge -> broker queue -> inbound bridge -> HTTP pipe."""
    gw = await gateway(
        make_gateway,
        outbound("out", f"/queue/{queue_name}"),
        inbound("in", f"/queue/{queue_name}"),
    )
    pipe = await new_pipe(gw, "incoming")
    await up(gw, "out", "in")
    text = {"address": "order.text", "message_id": "m-2",
            "content": [{"type": "text/plain; charset=utf-8", "value": "héllo wörld"}]}  # fmt: skip
    empty = {"address": "order.empty", "message_id": "m-3"}
    assert await publish(gw, "orders", FULL, text, empty) == [1, 1, 1]
    got = await take(gw, pipe, 3)
    first = got[0]
    for name in PROPS:
        assert first.get(name) == FULL[name], name
    assert headers_of(first) == {"region": "eu", "amount": "12.50"}
    assert first["content"][0]["type"] == "application/octet-stream"
    assert content_bytes(first) == BINARY
    assert got[1]["address"] == "order.text"
    assert content_bytes(got[1]) == "héllo wörld".encode()
    assert got[1]["content"][0]["type"] == "text/plain; charset=utf-8"
    assert got[2]["address"] == "order.empty"
    assert not got[2].get("content")
    out, inn = bridge(gw, "out").health.counters, bridge(gw, "in").health.counters
    await until(lambda: bridge(gw, "out").backlog() == 0, 10, "the outbound pipe to empty")
    assert (out.sent, out.accepted, out.rejected) == (3, 3, 0)
    assert (inn.received, inn.published, inn.refused) == (3, 3, 0)


async def test_amqp_0_9_1_consumer_reads_what_the_bridge_published(
    make_gateway: MakeGateway, broker: Broker, queue_name: str
) -> None:
    await asyncio.to_thread(broker.declare_queue, queue_name, True, ("amq.topic", "order.#"))
    gw = await gateway(make_gateway, outbound("out", "/exchange/amq.topic/{address}"))
    await up(gw, "out")
    await publish(gw, "orders", FULL, {"address": "other.thing", "message_id": "x"})
    got = await asyncio.to_thread(broker.get, queue_name, 10.0)
    assert got is not None
    method, props, payload = got
    assert method.routing_key == "order.new"  # {address} in the target
    assert payload == BINARY  # one data section: the raw bytes
    assert props.message_id == "m-1"
    assert props.correlation_id == "c-1"
    assert props.content_type == "application/octet-stream"
    assert props.delivery_mode == 2
    assert props.priority == 7
    assert props.expiration == "60000"
    assert props.user_id == "guest"
    assert await asyncio.to_thread(broker.depth, queue_name) == 0  # other.thing not bound


async def test_inbound_takes_what_an_amqp_0_9_1_client_published(
    make_gateway: MakeGateway, broker: Broker, queue_name: str
) -> None:
    await asyncio.to_thread(broker.declare_queue, queue_name)
    gw = await gateway(make_gateway, inbound("in", f"/queue/{queue_name}"))
    pipe = await new_pipe(gw, "incoming")
    props = pika.BasicProperties(
        message_id="p-1",
        correlation_id="pc-9",
        reply_to="answers",
        content_type="application/x-thing",
        delivery_mode=2,
        priority=3,
        expiration="5000",
    )
    await asyncio.to_thread(broker.publish, "", queue_name, BINARY, props)
    [message] = await take(gw, pipe, 1)
    assert message["message_id"] == "p-1"
    assert message["correlation_id"] == "pc-9"
    assert message["reply_to"] == "/queue/answers"  # RabbitMQ's 1.0 form of a queue name
    assert message["delivery_mode"] == "2"
    assert message["priority"] == "3"
    assert message["expiration"] == "5000"
    assert message["address"] == queue_name  # subject = the 0-9-1 routing key
    assert message["content"][0]["type"] == "application/x-thing"
    assert content_bytes(message) == BINARY


@pytest.mark.alone  # the broker stops
async def test_broker_outage_loses_nothing_and_duplicates_nothing(
    make_gateway: MakeGateway, broker: Broker, queue_name: str
) -> None:
    """stop_app in the middle of a stream: every acknowledged publish arrives once
    (redeliveries are absorbed by the feed's message_id window)."""
    gw = await gateway(
        make_gateway,
        outbound("out", f"/queue/{queue_name}", window=32),
        inbound("in", f"/queue/{queue_name}", window=32),
    )
    pipe = await new_pipe(gw, "incoming")
    await up(gw, "out", "in")
    sent: list[str] = []

    async def burst(n: int) -> None:
        first = len(sent)
        batch = [{"address": "o.x", "message_id": f"id-{first + i}",
                  "content": [{"value": f"payload {first + i}"}]} for i in range(n)]  # fmt: skip
        await publish(gw, "orders", *batch)
        sent.extend(m["message_id"] for m in batch)

    for _ in range(5):
        await burst(40)
    await asyncio.to_thread(broker.stop_app)
    for _ in range(5):  # accepted by the gateway while the broker is away
        await burst(40)
    await until(lambda: bridge(gw, "out").health.state.name != "up", 20, "out to notice")
    assert bridge(gw, "out").backlog() > 0  # waiting in the bridge's pipe
    await asyncio.to_thread(broker.start_app)
    for _ in range(5):
        await burst(40)
    got = await take(gw, pipe, len(sent), timeout=90)
    ids = [m["message_id"] for m in got]
    assert sorted(ids) == sorted(sent)  # nothing lost, nothing twice
    await asyncio.sleep(1.0)
    assert await held(gw, pipe) == []  # and nothing more arrives later
    await until(lambda: bridge(gw, "out").backlog() == 0, 30, "the outbound pipe to empty")
    assert bridge(gw, "out").health.counters.disconnects >= 1
    assert bridge(gw, "in").health.counters.connects >= 2


async def test_a_full_pipe_throttles_the_inbound_link(
    make_gateway: MakeGateway, broker: Broker, queue_name: str
) -> None:
    """Credit follows what the gateway absorbs: the broker queue grows, not the gateway."""
    total, room, window = 600, 50, 20
    await asyncio.to_thread(broker.declare_queue, queue_name)
    gw = await gateway(make_gateway, inbound("in", f"/queue/{queue_name}", window=window))
    pipe = await new_pipe(gw, "incoming", max_messages=str(room))
    the = bridge(gw, "in")
    await up(gw, "in")

    def fill() -> None:
        for i in range(total):
            props = pika.BasicProperties(message_id=f"b-{i}")
            broker.publish("", queue_name, b"x" * 1024, props)

    await asyncio.to_thread(fill)
    await until(lambda: the.health.counters.throttled > 0, 20, "the bridge to hold back")
    await asyncio.sleep(0.5)
    assert len(await held(gw, pipe)) == room  # full, and nothing skipped it
    counters = the.health.counters
    assert (counters.published, counters.unroutable) == (room, 0)
    # held unsettled, waiting for room: the credit, and the few RabbitMQ 3.10 may
    # deliver past it; the rest waits at the broker
    assert the.backlog() <= 2 * window
    depth = await asyncio.to_thread(broker.depth, queue_name)
    assert depth >= total - room - 2 * window, counters
    got = await take(gw, pipe, total, timeout=90)  # reading makes room: all flow, in order
    assert [m["message_id"] for m in got] == [f"b-{i}" for i in range(total)]
    assert await asyncio.to_thread(broker.depth, queue_name) == 0


async def test_a_message_the_broker_refuses_goes_to_the_dead_letter_feed(
    make_gateway: MakeGateway, broker: Broker, queue_name: str
) -> None:
    """RabbitMQ ends the session over a user-id that is not the connection's user; after
    a few tries alone the message is dead-lettered with the broker's reason."""
    await asyncio.to_thread(broker.declare_queue, queue_name, True, ("amq.topic", "t.#"))
    gw = await gateway(
        make_gateway, outbound("out", "/exchange/amq.topic/{address}", reconnect_min=0.1)
    )
    dead = await new_pipe(gw, "dead-letter")
    await up(gw, "out")
    before = {"address": "t.a", "message_id": "ok-1"}
    bad = {"address": "t.b", "message_id": "bad", "user_id": "mallory"}
    after = {"address": "t.c", "message_id": "ok-2"}
    await publish(gw, "orders", before, bad, after)
    [letter] = await take(gw, dead, 1, timeout=60)
    assert letter["message_id"] == "bad"
    reasons = headers_of(letter)
    assert reasons["x-death-reason"] == "rejected"
    assert reasons["x-bridge"] == "out"
    assert "precondition-failed" in reasons["x-bridge-error"]
    got = await asyncio.to_thread(broker.get_all, queue_name, 2, 20.0)
    assert sorted(p.message_id for _, p, _ in got) == ["ok-1", "ok-2"]
    await until(lambda: bridge(gw, "out").backlog() == 0, 20, "the outbound pipe to empty")
    counters = bridge(gw, "out").health.counters
    assert (counters.rejected, counters.dead_lettered) == (1, 1)


async def test_a_refused_target_keeps_messages_until_it_exists(
    make_gateway: MakeGateway, broker: Broker, queue_name: str
) -> None:
    exchange = f"restms-test-x-{uuid.uuid4().hex[:8]}"
    gw = await gateway(
        make_gateway, outbound("out", f"/exchange/{exchange}/{{address}}", retry_max=0.5)
    )
    await up(gw, "out")
    await publish(gw, "orders", {"address": "k", "message_id": "late"})
    the = bridge(gw, "out")
    await until(lambda: "not-found" in the.health.last_error, 20, "the link to be refused")
    assert the.backlog() == 1
    await asyncio.to_thread(broker.declare_exchange, exchange, "direct")
    await asyncio.to_thread(broker.declare_queue, queue_name, True, (exchange, "k"))
    got = await asyncio.to_thread(broker.get, queue_name, 20.0)
    assert got is not None
    assert got[1].message_id == "late"
    await until(lambda: the.backlog() == 0, 10, "the pipe to empty")
    assert the.health.counters.disconnects >= 1  # RabbitMQ ends the session, not the link
    await asyncio.to_thread(broker.delete_exchange, exchange)


async def test_failover_to_the_next_url(
    make_gateway: MakeGateway, broker: Broker, queue_name: str
) -> None:
    definition = inbound("in", f"/queue/{queue_name}", reconnect_min=0.1)
    definition["urls"] = ["amqp://guest:guest@127.0.0.1:1", AMQP]
    await asyncio.to_thread(broker.declare_queue, queue_name)
    gw = await gateway(make_gateway, definition)
    pipe = await new_pipe(gw, "incoming")
    await up(gw, "in")
    status = bridge(gw, "in").status()
    assert status["url"] == "amqp://guest:***@127.0.0.1:5672"
    assert status["last_error"]  # the first URL failed, and says so
    await asyncio.to_thread(broker.publish, "", queue_name, b"hi", None)
    [message] = await take(gw, pipe, 1)
    assert content_bytes(message) == b"hi"


async def test_sasl_anonymous_and_address_from_a_header(
    make_gateway: MakeGateway, broker: Broker, queue_name: str
) -> None:
    """No user: SASL ANONYMOUS (RabbitMQ maps it to its default user); the inbound
    address taken from an application property instead of the subject."""
    receive = inbound("in", f"/queue/{queue_name}", address_from="header:region")
    receive["urls"] = ["amqp://127.0.0.1:5672"]
    receive["feed"] = "routed"  # a direct feed: the address decides
    gw = await gateway(make_gateway, outbound("out", f"/queue/{queue_name}"), receive)
    pipe = await new_pipe(gw, "routed", address="eu")
    await up(gw, "out", "in")
    await publish(gw, "orders", {**FULL, "user_id": ""}, {"address": "a.b", "message_id": "m-9"})
    [message] = await take(gw, pipe, 1)
    assert message["address"] == "eu"
    assert headers_of(message)["amqp.subject"] == "order.new"  # the subject is kept
    assert content_bytes(message) == BINARY
    await until(lambda: bridge(gw, "in").health.counters.published == 2, 10, "both published")
    assert await held(gw, pipe) == []  # the one without a region had address ""
    status = bridge(gw, "in").status()
    assert status["url"] == "amqp://127.0.0.1:5672"
    assert status["definition"]["sasl"] == ""


async def test_a_stopped_bridge_leaves_the_broker_nothing_held(
    make_gateway: MakeGateway, broker: Broker, queue_name: str
) -> None:
    """Stopping closes the AMQP connection: the broker takes the receiver's credit back,
    so what reaches the queue afterwards stays there for the next consumer."""
    await asyncio.to_thread(broker.declare_queue, queue_name)
    gw = await gateway(make_gateway, inbound("in", f"/queue/{queue_name}"))
    await up(gw, "in")
    await bridge(gw, "in").stop()
    for _ in range(10):
        await asyncio.to_thread(broker.publish, "", queue_name, b"later", None)
    await asyncio.sleep(0.5)
    assert await asyncio.to_thread(broker.depth, queue_name) == 10


async def test_a_broker_message_the_gateway_cannot_take_is_refused_not_lost_silently(
    make_gateway: MakeGateway, broker: Broker, queue_name: str
) -> None:
    """Bad input from the broker side: an address XML cannot carry and an oversized
    body are rejected at the broker (counted, with the reason); the stream goes on."""
    await asyncio.to_thread(broker.declare_queue, queue_name, True, ("amq.fanout", ""))
    gw = await gateway(make_gateway, inbound("in", f"/queue/{queue_name}", max_message_size=4096))
    pipe = await new_pipe(gw, "incoming")
    await up(gw, "in")
    for key, payload, ident in (
        ("bad\x01key", b"x", "control"),
        ("big", b"y" * 5000, "too-big"),
        ("fine", b"ok", "good"),
    ):
        props = pika.BasicProperties(message_id=ident)
        await asyncio.to_thread(broker.publish, "amq.fanout", key, payload, props)
    [message] = await take(gw, pipe, 1)
    assert message["message_id"] == "good"
    the = bridge(gw, "in")
    await until(lambda: the.health.counters.refused == 2, 10, "two refusals")
    assert the.health.last_error == (
        "refused a broker message: a body of 5000 bytes is over the limit of 4096 bytes"
    )
    assert the.health.counters.published == 1
    assert await asyncio.to_thread(broker.depth, queue_name) == 0  # settled, not stuck
