"""amqps://: the bridge talks TLS (verifying the broker's certificate and name) to a
TLS front on 127.0.0.1 that forwards to the local RabbitMQ."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trustme

from tests.conftest import MakeGateway
from tests.integration.broker import Broker
from tests.integration.gw import bridge, content_bytes, gateway, inbound, new_pipe, take, until

pytestmark = pytest.mark.integration


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError, ssl.SSLError):
            await writer.wait_closed()


@contextlib.asynccontextmanager
async def tls_front(context: ssl.SSLContext) -> AsyncIterator[int]:
    """A TLS listener on 127.0.0.1 whose connections are forwarded to RabbitMQ."""

    open_writers: set[asyncio.StreamWriter] = set()
    forwarding: set[asyncio.Task[object]] = set()

    async def forward(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            forwarding.add(task)
        open_writers.add(writer)
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", 5672)
            open_writers.add(up_writer)
        except OSError:
            writer.close()
            await writer.wait_closed()
            return
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    server = await asyncio.start_server(forward, "127.0.0.1", 0, ssl=context)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        for writer in open_writers:
            writer.transport.abort()
        for task in forwarding:
            task.cancel()
        async with asyncio.timeout(10):
            await asyncio.gather(*forwarding, return_exceptions=True)
            await server.wait_closed()
        await asyncio.sleep(0.05)  # let the aborted transports finish closing


@pytest.fixture
def certificates(tmp_path: Path) -> tuple[ssl.SSLContext, str]:
    authority = trustme.CA()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    authority.issue_cert("localhost").configure_cert(context)
    ca = tmp_path / "ca.pem"
    authority.cert_pem.write_to_path(str(ca))
    return context, str(ca)


async def test_amqps_with_a_verified_certificate(
    make_gateway: MakeGateway,
    broker: Broker,
    queue_name: str,
    certificates: tuple[ssl.SSLContext, str],
) -> None:
    context, ca = certificates
    await asyncio.to_thread(broker.declare_queue, queue_name)
    async with tls_front(context) as port:
        definition = inbound("in", f"/queue/{queue_name}", tls_ca=ca)
        definition["urls"] = [f"amqps://guest:guest@localhost:{port}"]
        gw = await gateway(make_gateway, definition)
        pipe = await new_pipe(gw, "incoming")
        await until(lambda: bridge(gw, "in").health.state.name == "up", 20, "amqps up")
        assert bridge(gw, "in").status()["url"] == f"amqps://guest:***@localhost:{port}"
        await asyncio.to_thread(broker.publish, "", queue_name, b"over tls", None)
        [message] = await take(gw, pipe, 1)
        assert content_bytes(message) == b"over tls"
        await gw.stop()


async def test_amqps_refuses_a_certificate_it_cannot_verify(
    make_gateway: MakeGateway,
    broker: Broker,
    queue_name: str,
    certificates: tuple[ssl.SSLContext, str],
) -> None:
    context, _ = certificates
    async with tls_front(context) as port:
        definition = inbound("in", f"/queue/{queue_name}")  # no tls_ca: system CAs only
        definition["urls"] = [f"amqps://guest:guest@localhost:{port}"]
        gw = await gateway(make_gateway, definition)
        the = bridge(gw, "in")
        await until(lambda: the.health.last_error != "", 20, "the TLS failure")
        assert the.health.state.name != "up"
        assert the.health.counters.connects == 0
        await gw.stop()
