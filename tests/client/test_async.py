"""The asyncio client against a real gateway process: the same operations as the
synchronous one, ``async for`` over every transport, a restart under a consumer and a
publisher at once; under blockbuster, so no call of the library blocks the loop."""

from __future__ import annotations

import asyncio
import logging

import pytest
from blockbuster import BlockBuster

from restms_client import AsyncClient, Message, Retry
from tests.client.conftest import MakeProcess, unique
from tests.client.gateway import GatewayProcess

PATIENT = Retry(attempts=300, backoff=0.05, max_backoff=0.5)


async def test_async_round_trip(gateway: GatewayProcess, blockbuster: BlockBuster) -> None:
    async with AsyncClient(gateway.url) as client:
        feed = await client.create_feed(unique("news"), "topic")
        pipe = await client.create_pipe(title="reader")
        join = await client.join(pipe, feed, "weather.#")
        assert join.feed == feed.href
        published = await client.publish(
            feed,
            [Message.of("rain", address="weather.eu"), Message.of("goal", address="sport")],
        )
        assert published.counts == (1, 0)
        async for message in client.messages(pipe):
            assert (message.text, message.address, message.position) == ("rain", "weather.eu", 1)
            await message.ack()
            break
        assert (await client.pipe(pipe)).messages == ()


@pytest.mark.parametrize("transport", ["poll", "sse", "websocket"])
async def test_every_transport_reads_in_order_and_auto_acks(
    gateway: GatewayProcess, blockbuster: BlockBuster, transport: str
) -> None:
    async with AsyncClient(gateway.url) as client:
        pipe = await client.create_pipe()
        default = (await client.domain()).feed("default")
        await client.publish(default, [Message.of(str(i), address=pipe.name) for i in range(3)])
        got = []
        async with client.messages(pipe, transport=transport, auto_ack=True) as messages:
            async for message in messages:
                got.append((message.position, message.text))
                if len(got) == 3:
                    break
                if len(got) == 1:  # and one that arrives while the reader waits
                    await client.publish(default, Message.of("3", address=pipe.name))
        assert got == [(1, "0"), (2, "1"), (3, "2")]
        # the first two were acknowledged when the loop asked for the next one
        assert [m.position for m in (await client.pipe(pipe)).messages] == [3, 4]


@pytest.mark.timeout(300)
async def test_a_consumer_and_a_publisher_through_a_restart(
    make_process: MakeProcess, caplog: pytest.LogCaptureFixture
) -> None:
    gateway = make_process()
    caplog.set_level(logging.INFO, logger="restms_client")
    ids = [f"m-{i}" for i in range(40)]
    async with AsyncClient(gateway.url, retry=PATIENT) as client:
        feed = await client.create_feed(unique("orders"), "fanout")
        pipe = await client.create_pipe(title="orders")
        await client.join(pipe, feed)
        halfway = asyncio.Event()

        async def publish() -> None:
            async with AsyncClient(gateway.url, retry=PATIENT) as publisher:
                for n, i in enumerate(ids):
                    await publisher.publish(feed, Message.of(i, message_id=i), persistent=True)
                    if n == 10:
                        halfway.set()

        async def consume() -> list[str]:
            processed: list[str] = []
            async for message in client.messages(pipe):
                processed.append(message.text)
                await message.ack()
                if len(processed) == len(ids):
                    return processed
            raise AssertionError("the reader ended")

        publisher = asyncio.create_task(publish())
        consumer = asyncio.create_task(consume())
        await asyncio.wait_for(halfway.wait(), 30)
        await asyncio.to_thread(gateway.stop)
        await asyncio.to_thread(gateway.start)
        await asyncio.wait_for(publisher, 120)
        processed = await asyncio.wait_for(consumer, 120)

        assert processed == ids  # in order, each once: nothing lost, nothing repeated
        assert (await client.pipe(pipe)).messages == ()
        assert any("retry" in r.getMessage() for r in caplog.records)


async def test_a_bound_pipe_on_the_asyncio_client(
    gateway: GatewayProcess, blockbuster: BlockBuster
) -> None:
    async with AsyncClient(gateway.url) as client:
        feed = await client.create_feed(unique("bound"), "fanout")
        pipe = client.bind(await client.create_pipe(title="bound"))
        await pipe.join(feed)
        await client.publish(feed, Message.of("a"))
        async with pipe.messages() as messages:
            async for message in messages:
                assert message.text == "a"
                await message.ack()
                break
        await pipe.delete()
