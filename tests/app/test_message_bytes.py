"""Every byte of a message is counted: its address, properties and headers weigh with its
contents in a pipe's ``max_bytes``, the memory budget and the byte metrics; one header
is bounded; rotator and service feeds' queues are bounded in bytes and, past the
memory budget, wait on disk (docs/DURABILITY.md, "What a message weighs")."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from feeds.config import OVERHEAD
from tests.app.jsonapi import DOMAIN, HJ, JSON, body, join, new_pipe, post
from tests.app.test_metrics import scrape, value
from tests.app.test_patterns import recv
from tests.app.test_spill import drain
from tests.app.xmlapi import call, doc
from tests.conftest import Gateway, MakeGateway

KIB = 1024


async def new_feed(gw: Gateway, name: str, kind: str) -> str:
    status, reply, _ = await post(gw, DOMAIN, feed=[{"name": name, "type": kind}])
    assert status == 201, reply
    return f"/restms/feed/{name}"


async def publish(gw: Gateway, feed: str, *messages: dict[str, Any]) -> tuple[int, str, Any]:
    """(status, Content-Type, parsed reply or its text)."""
    async with gw.http.post(feed, data=body(message=list(messages)), headers=HJ) as r:
        text = await r.text()
        parsed = json.loads(text) if r.content_type == JSON else text
        return r.status, r.headers.get("Content-Type", ""), (parsed, r.headers)


def headed(size: int, name: str = "x-big") -> dict[str, Any]:
    """A message with no content and one header of ``size`` characters in all."""
    return {"header": [{"name": name, "value": "h" * (size - len(name))}]}


async def test_a_header_alone_passes_a_pipes_max_bytes(make_gateway: MakeGateway) -> None:
    """The issue's pipe of max_bytes 1000 took 300 messages of 1 MiB headers: a message
    whose header is larger than that is now skipped, or refused by a "reject" pipe."""
    gw = await make_gateway()
    feed = await new_feed(gw, "news", "fanout")
    small = await new_pipe(gw, max_bytes="1000")
    await join(gw, small, feed)
    status, _, (reply, _) = await publish(gw, feed, *[headed(2000) for _ in range(5)])
    assert status == 200, reply
    assert [m["count"] for m in reply["restms"]["message"]] == ["0"] * 5
    pipe = gw.engine._private[small["name"]]
    assert (len(pipe.messages), pipe.bytes) == (0, 0)
    assert gw.engine.counters.skipped_full == 5
    status, _, (reply, _) = await publish(gw, feed, headed(600))  # fits: counted, held
    assert [m["count"] for m in reply["restms"]["message"]] == ["1"]
    assert pipe.bytes == 600
    strict = await new_pipe(gw, max_bytes="1000", overflow="reject")
    await join(gw, strict, await new_feed(gw, "strict", "fanout"))
    status, kind, (text, _) = await publish(gw, "/restms/feed/strict", headed(2000))
    assert (status, kind.split(";")[0]) == (413, "text/plain")
    assert "2000 bytes" in text


async def test_the_memory_budget_pages_out_messages_large_by_their_headers(
    make_gateway: MakeGateway,
) -> None:
    budget = 20 * (4000 + OVERHEAD)  # twenty such messages in memory, the rest on disk
    gw = await make_gateway(memory_budget=budget, metrics_access="loopback")
    feed = await new_feed(gw, "news", "fanout")
    await join(gw, await new_pipe(gw), feed)
    for _ in range(4):
        status, _, (reply, _) = await publish(gw, feed, *[headed(4000) for _ in range(25)])
        assert status == 200, reply
    engine = gw.engine
    assert engine.counters.spilled >= 80
    assert engine.held <= budget
    samples, _ = await scrape(gw)
    assert value(samples, "restms_messages_spilled_total") >= 80
    assert value(samples, "restms_pipe_bytes") <= budget


@pytest.mark.parametrize(
    ("fmt", "wrap"),
    [
        # the scanner's plain shape, the generic XML path (a namespaced attribute), JSON
        ("xml", '<message address="a"><header name="{name}" value="{value}"/></message>'),
        (
            "xml",
            '<message xmlns:x="urn:x" x:address="a">'
            '<header name="{name}" value="{value}"/></message>',
        ),
        ("json", ""),
    ],
)
async def test_one_headers_name_and_value_are_bounded(gw: Gateway, fmt: str, wrap: str) -> None:
    """413, text/plain, naming the header, past max_header_bytes (8 KiB); at it, 200."""
    for size, expected in ((8192, 200), (8193, 413)):
        name = "x-long"
        value = "v" * (size - len(name))
        if fmt == "xml":
            reply = await call(
                gw, "POST", "/restms/feed/default", doc(wrap.format(name=name, value=value))
            )
            status, kind, text = reply.status, reply.headers["Content-Type"], reply.body.decode()
        else:
            message = {"address": "a", "header": [{"name": name, "value": value}]}
            status, kind, (text, _) = await publish(gw, "/restms/feed/default", message)
        assert status == expected, text
        if expected == 413:
            assert kind.startswith("text/plain")
            assert "'x-long'" in str(text)
            assert "8192" in str(text)


async def test_a_rotator_queue_is_bounded_in_bytes(make_gateway: MakeGateway) -> None:
    """The issue's rotator with no pipe took 300 messages of 1 MiB (only counted): its
    queue now holds at most max_feed_queue_bytes, refusing more with 503, Retry-After."""
    bound = 1024 * KIB
    gw = await make_gateway(max_feed_queue_bytes=bound, metrics_access="loopback")
    feed = await new_feed(gw, "work", "rotator")
    queue = gw.engine.public_feeds["work"]
    message = {"content": [{"value": "x" * (64 * KIB)}]}
    statuses = []
    for _ in range(300):
        status, kind, (reply, headers) = await publish(gw, feed, message)
        statuses.append(status)
        assert queue.queue_bytes <= bound
        if status == 503:
            assert kind.startswith("text/plain")
            assert headers["Retry-After"] == "1"
            assert f"of {bound} bytes queued" in reply
    assert statuses == [200] * 16 + [503] * 284  # 16 x 64 KiB: the bound exactly
    samples, _ = await scrape(gw)
    assert value(samples, "restms_feed_queued_bytes") == bound
    pipe = await new_pipe(gw)
    await join(gw, pipe, feed)  # the queue drains into the pipe: room again
    assert (queue.queue_bytes, len(queue.queue)) == (0, 0)
    status, _, _ = await publish(gw, feed, message)
    assert status == 200


async def test_past_the_memory_budget_a_rotator_queue_waits_on_disk(
    make_gateway: MakeGateway,
) -> None:
    """The issue's rotator with no pipe, under a small memory budget: its queue is paged
    to disk as a pipe is, so every publish under max_feed_queue_bytes is taken while
    memory holds about the budget; a pipe that joins later gets every message in order."""
    budget = 1024 * KIB
    gw = await make_gateway(memory_budget=budget, metrics_access="loopback", listing_cap=50)
    feed = await new_feed(gw, "work", "rotator")
    engine = gw.engine
    queue = engine.public_feeds["work"]
    names = [f"m{n}" for n in range(300)]
    for name in names:
        message = {"message_id": name, "content": [{"value": "x" * (64 * KIB)}]}
        status, _, (reply, _) = await publish(gw, feed, message)
        assert status == 200, reply
        assert engine.held <= budget
    assert len(queue.queue) <= budget // (64 * KIB)
    samples, _ = await scrape(gw)
    assert value(samples, "restms_feed_queued_messages") == 300
    assert value(samples, "restms_feed_queued_on_disk") == queue.qspilled >= 280
    pipe = await new_pipe(gw)
    await join(gw, pipe, feed)  # what is in memory at once, then page after page
    for _ in range(600):
        if not (queue.queue or queue.qspilled):
            break
        await asyncio.sleep(0.05)
    assert (len(queue.queue), queue.qspilled) == (0, 0)
    assert await drain(gw, pipe) == names  # every one, once, in order
    assert engine.held == 0


async def test_a_restart_brings_back_a_rotator_queue_from_memory_and_disk(
    make_gateway: MakeGateway,
) -> None:
    """Persistent queued messages come back in order after a restart, those that waited
    on disk too; non-persistent ones written only for room are dropped."""
    budget = 256 * KIB
    gw = await make_gateway(memory_budget=budget)
    feed = await new_feed(gw, "work", "rotator")

    def message(name: str, persistent: bool) -> dict[str, Any]:
        mode = {"delivery_mode": "2"} if persistent else {}
        return {"message_id": name, **mode, "content": [{"value": "x" * (16 * KIB)}]}

    kept = [f"p{n}" for n in range(60)]
    for name in kept[:40]:
        assert (await publish(gw, feed, message(name, True)))[0] == 200
    for n in range(30):  # on disk only for room
        assert (await publish(gw, feed, message(f"v{n}", False)))[0] == 200
    for name in kept[40:]:
        assert (await publish(gw, feed, message(name, True)))[0] == 200
    assert gw.engine.public_feeds["work"].qspilled > 60
    await gw.stop()
    again = await make_gateway(memory_budget=budget)
    queue = again.engine.public_feeds["work"]
    assert queue.qspilled > 0
    assert again.engine.held <= budget + 16 * KIB + 100 + OVERHEAD
    pipe = await new_pipe(again)
    await join(again, pipe, feed)
    for _ in range(600):
        if not (queue.queue or queue.qspilled):
            break
        await asyncio.sleep(0.05)
    assert await drain(again, pipe) == kept


async def test_an_ondemand_worker_gets_queued_messages_back_from_disk(
    make_gateway: MakeGateway,
) -> None:
    """An ondemand pipe's GET that finds the queue empty in memory waits while the
    queue's next page is read back, then gets the oldest message: one at a time, in order."""
    gw = await make_gateway(memory_budget=256 * KIB)
    feed = await new_feed(gw, "work", "rotator")
    names = [f"m{n}" for n in range(40)]
    for name in names:
        message = {"message_id": name, "content": [{"value": "x" * (16 * KIB)}]}
        assert (await publish(gw, feed, message))[0] == 200
    queue = gw.engine.public_feeds["work"]
    assert queue.qspilled > 20
    worker = await new_pipe(gw, "ondemand")
    await join(gw, worker, feed)
    assert [(await recv(gw, worker))["message_id"] for _ in names] == names
    assert (len(queue.queue), queue.qspilled) == (0, 0)


async def test_a_queue_paged_while_a_worker_reads_keeps_every_message_in_order(
    make_gateway: MakeGateway,
) -> None:
    """Publishing and reading at once: a worker's small pipe fills, the queue passes the
    memory budget and pages, and the worker still gets each message once, in order."""
    gw = await make_gateway(memory_budget=128 * KIB)
    feed = await new_feed(gw, "work", "rotator")
    pipe = await new_pipe(gw, max_messages="5")
    await join(gw, pipe, feed)
    names = [f"m{n}" for n in range(300)]
    queue = gw.engine.public_feeds["work"]
    deepest = 0

    async def publisher() -> None:
        nonlocal deepest
        for name in names:
            message = {"message_id": name, "content": [{"value": "x" * (8 * KIB)}]}
            assert (await publish(gw, feed, message))[0] == 200
            deepest = max(deepest, queue.qspilled)

    async def reader() -> list[str]:
        for _ in range(2_000):  # first let the queue pass the budget
            if queue.qspilled:
                break
            await asyncio.sleep(0.005)
        seen: list[str] = []
        for _ in range(20_000):
            if len(seen) == len(names):
                break
            seen.extend(await drain(gw, pipe))
            await asyncio.sleep(0.005)
        return seen

    async with asyncio.timeout(120):
        _, seen = await asyncio.gather(publisher(), reader())
    assert deepest > 0  # some of the queue waited on disk
    assert seen == names
