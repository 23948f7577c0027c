"""The real RabbitMQ the integration tests use: the fixtures, and what its AMQP 1.0
plugin (RabbitMQ 3.10) does that the bridges must live with.

Blocking clients run off the event loop: pika through ``asyncio.to_thread``, proton's
event-driven ``Container`` in a worker thread (``asyncio.to_thread(container.run)``).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pika
import pika.exceptions
import pytest
from blockbuster import BlockBuster
from proton import Message
from proton.handlers import MessagingHandler
from proton.reactor import Container

from tests.integration.broker import (
    AMQP1_URL,
    PASSWORD,
    USER,
    Broker,
    BrokerUnavailable,
    DurableTerminus,
    amqp1_handshake,
)

pytestmark = pytest.mark.integration


class RoundTrip(MessagingHandler):
    """On one AMQP 1.0 connection, send ``send`` to ``address`` and receive ``receive``
    messages from it (``len(send)`` by default); done when all are settled.

    Records the errors the peer reports instead of raising inside the reactor (an
    exception there escapes ``Container.run`` and leaves its sockets open).
    """

    def __init__(
        self,
        address: str,
        send: list[Any],
        *,
        durable: bool,
        receive: int | None = None,
        timeout: float = 20.0,
    ) -> None:
        super().__init__(auto_accept=False)
        self.address = address
        self.send = send
        self.receive = len(send) if receive is None else receive
        self.durable = durable
        self.timeout = timeout
        self.sent = 0
        self.accepted = 0
        self.received: list[Any] = []
        self.errors: list[str] = []

    def on_start(self, event: Any) -> None:
        self.timer = event.container.schedule(self.timeout, self)
        conn = event.container.connect(
            AMQP1_URL, user=USER, password=PASSWORD, allowed_mechs="PLAIN", reconnect=False
        )
        options = [DurableTerminus()] if self.durable else None
        if self.receive:
            event.container.create_receiver(conn, self.address, options=options)
        if self.send:
            event.container.create_sender(conn, self.address, options=options)

    def on_sendable(self, event: Any) -> None:
        while event.sender.credit and self.sent < len(self.send):
            body = self.send[self.sent]
            # bytes go as a data section (inferred), anything else as an amqp-value
            message = Message(body=body, inferred=isinstance(body, bytes), durable=self.durable)
            event.sender.send(message)
            self.sent += 1

    def on_accepted(self, event: Any) -> None:
        self.accepted += 1
        self._done_yet(event)

    def on_message(self, event: Any) -> None:
        body = event.message.body
        # proton 0.40 gives a data section as a memoryview of a buffer it reuses
        # after this callback: copy it now.
        self.received.append(bytes(body) if isinstance(body, memoryview) else body)
        self.accept(event.delivery)
        self._done_yet(event)

    def _done_yet(self, event: Any) -> None:
        if self.accepted == len(self.send) and len(self.received) == self.receive:
            event.connection.close()

    def on_connection_closed(self, event: Any) -> None:
        self._stop(event)

    def on_link_error(self, event: Any) -> None:
        self._fail(event, "link", event.link.remote_condition)

    def on_session_error(self, event: Any) -> None:
        self._fail(event, "session", event.session.remote_condition)

    def on_connection_error(self, event: Any) -> None:
        self._fail(event, "connection", event.connection.remote_condition)

    def on_transport_error(self, event: Any) -> None:
        self._fail(event, "transport", event.transport.condition)

    def on_timer_task(self, event: Any) -> None:
        self.errors.append(f"timed out after {self.timeout} s")
        event.container.stop()

    def _fail(self, event: Any, where: str, condition: Any) -> None:
        self.errors.append(f"{where}: {condition.name if condition else '?'}: {condition}")
        self._stop(event)

    def _stop(self, event: Any) -> None:
        self.timer.cancel()
        event.container.stop()  # else the reactor idles on until its next 3 s tick


async def round_trip(
    address: str, send: list[Any], *, durable: bool, receive: int | None = None
) -> RoundTrip:
    handler = RoundTrip(address, send, durable=durable, receive=receive)
    await asyncio.to_thread(Container(handler).run)
    return handler


def test_declare_publish_get_depth_purge(broker: Broker, queue_name: str) -> None:
    broker.declare_queue(queue_name, bind=("amq.topic", "restms.test.#"))
    assert broker.depth(queue_name) == 0

    props = pika.BasicProperties(content_type="text/plain", headers={"n": 1}, delivery_mode=2)
    broker.publish("amq.topic", "restms.test.a", b"first", props)
    broker.publish("", queue_name, b"second")  # the default exchange, by queue name
    broker.publish("amq.topic", "elsewhere", b"unrouted")  # confirmed, and dropped
    assert broker.depth(queue_name) == 2

    got = broker.get(queue_name)
    assert got is not None
    method, properties, body = got
    assert (method.routing_key, body) == ("restms.test.a", b"first")
    assert (properties.content_type, properties.headers) == ("text/plain", {"n": 1})
    assert broker.depth(queue_name) == 1

    broker.purge(queue_name)
    assert broker.depth(queue_name) == 0
    assert broker.get(queue_name, timeout=0.2) is None

    for i in range(5):
        broker.publish("", queue_name, b"%d" % i)
    assert [body for _, _, body in broker.get_all(queue_name, 5, timeout=5)] == [
        b"0",
        b"1",
        b"2",
        b"3",
        b"4",
    ]


def test_channel_error_leaves_broker_usable(broker: Broker, queue_name: str) -> None:
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        broker.depth(queue_name)  # never declared
    assert info.value.reply_code == 404
    broker.track(other := queue_name + "-other")
    broker.declare_queue(other, durable=False)
    assert broker.depth(other) == 0


async def test_amqp1_round_trip(broker: Broker, queue_name: str, blockbuster: BlockBuster) -> None:
    await asyncio.to_thread(broker.declare_queue, queue_name, durable=True)
    bodies = [f"message {i}" for i in range(10)]

    done = await round_trip(f"/queue/{queue_name}", bodies, durable=True)

    assert done.errors == []
    assert (done.sent, done.accepted) == (10, 10)
    assert done.received == bodies
    assert await asyncio.to_thread(broker.depth, queue_name) == 0


async def test_amqp1_terminus_durability_must_match_queue(
    broker: Broker, queue_name: str, blockbuster: BlockBuster
) -> None:
    # RabbitMQ 3.10 declares the queue behind /queue/<name> with the terminus'
    # durability; a non-durable terminus on a durable queue ends the session.
    await asyncio.to_thread(broker.declare_queue, queue_name, durable=True)

    done = await round_trip(f"/queue/{queue_name}", ["lost"], durable=False)

    assert done.received == []
    assert any("amqp:precondition-failed" in error for error in done.errors), done.errors


async def test_amqp1_data_section_is_the_091_body(
    broker: Broker, queue_name: str, blockbuster: BlockBuster
) -> None:
    # A 1.0 data section reaches 0-9-1 consumers as the plain body (an amqp-value
    # section would arrive still encoded); a 0-9-1 body reaches 1.0 as a data section.
    await asyncio.to_thread(broker.declare_queue, queue_name, durable=False)
    sent = await round_trip(f"/queue/{queue_name}", [b"\x00raw\xff"], durable=False, receive=0)
    assert sent.errors == []

    got = await asyncio.to_thread(broker.get, queue_name)
    assert got is not None
    assert got[2] == b"\x00raw\xff"

    await asyncio.to_thread(broker.publish, "", queue_name, b"from 0-9-1")
    received = await round_trip(f"/queue/{queue_name}", [], durable=False, receive=1)
    assert received.errors == []
    assert received.received == [b"from 0-9-1"]


@pytest.mark.alone  # the broker stops
async def test_stop_app_start_app_leaves_broker_usable(
    broker: Broker, queue_name: str, blockbuster: BlockBuster
) -> None:
    await asyncio.to_thread(broker.declare_queue, queue_name, durable=True)
    persistent = pika.BasicProperties(delivery_mode=2)
    await asyncio.to_thread(broker.publish, "", queue_name, b"kept", persistent)

    await asyncio.to_thread(broker.stop_app)
    with pytest.raises(BrokerUnavailable):
        await asyncio.to_thread(amqp1_handshake, timeout=5)
    with pytest.raises(BrokerUnavailable):
        await asyncio.to_thread(broker.wait_ready, 1.0)

    await asyncio.to_thread(broker.start_app)
    assert not broker.app_stopped
    # The old connection died with the app: the next call reconnects on its own.
    got = await asyncio.to_thread(broker.get, queue_name)
    assert got is not None
    assert got[2] == b"kept"  # durable queue, persistent message
    await asyncio.to_thread(amqp1_handshake)

    # Left stopped, as by a test that failed half-way: the teardown path restarts it.
    await asyncio.to_thread(broker.stop_app)
    await asyncio.to_thread(broker.cleanup)  # also deleted queue_name: track it again
    assert not broker.app_stopped
    broker.track(queue_name)
    done = await round_trip(f"/queue/{queue_name}", ["after"], durable=True)
    assert done.errors == []
    assert done.received == ["after"]
