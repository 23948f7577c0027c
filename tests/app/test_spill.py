"""The memory budget over HTTP: past it, messages wait on disk and come back in order
when readers get there, across a restart too; memory holds about a budget's worth."""

from __future__ import annotations

import asyncio
import sqlite3
from typing import Any

from feeds import paging
from feeds.config import OVERHEAD
from feeds.model import Pipe
from restms.specs import EmbeddedContent, MessageSpec
from tests.app.jsonapi import AJ, DOMAIN, HJ, body, join, new_pipe
from tests.conftest import Gateway, MakeGateway

BODY = "x" * 1000
BUDGET = 200 * (1000 + OVERHEAD)  # about 200 messages in memory


async def publish(gw: Gateway, feed: str, first: int, count: int, persistent: bool) -> None:
    mode = {"delivery_mode": "2"} if persistent else {}
    messages = [
        {"message_id": f"m{n}", **mode, "content": [{"value": BODY}]}
        for n in range(first, first + count)
    ]
    async with gw.http.post(feed, data=body(message=messages), headers=HJ) as r:
        assert r.status == 200, await r.text()


async def listed(gw: Gateway, pipe: dict[str, Any]) -> list[dict[str, str]]:
    async with gw.http.get(pipe["uri"], headers=AJ) as r:
        assert r.status == 200
        doc = await r.json(content_type=None)
    return list(doc["restms"]["pipe"][0].get("message", []))


async def drain(gw: Gateway, pipe: dict[str, Any]) -> list[str]:
    """Read the pipe as a consumer does: list, acknowledge the last listed, repeat."""
    seen: list[str] = []
    for _ in range(1_000):
        held = [m for m in await listed(gw, pipe) if m.get("async") != "1"]
        if not held:
            return seen
        seen.extend(m["message_id"] for m in held)
        async with gw.http.delete(held[-1]["href"]) as r:
            assert r.status == 200
    raise AssertionError("the pipe did not drain")


async def setup(gw: Gateway) -> tuple[str, dict[str, Any]]:
    async with gw.http.post(
        DOMAIN, data=body(feed=[{"name": "big", "type": "fanout"}]), headers=HJ
    ) as r:
        assert r.status == 201
    pipe = await new_pipe(gw)
    await join(gw, pipe, "/restms/feed/big")
    return "/restms/feed/big", pipe


async def test_past_the_budget_messages_wait_on_disk_and_drain_in_order(
    make_gateway: MakeGateway,
) -> None:
    gw = await make_gateway(memory_budget=BUDGET, listing_cap=100)
    feed, pipe = await setup(gw)
    for first in range(0, 1_000, 250):
        await publish(gw, feed, first, 250, persistent=first % 500 == 0)
    engine = gw.engine
    assert engine.counters.spilled >= 750
    assert engine.held <= BUDGET
    first_page = await listed(gw, pipe)
    assert "async" not in first_page[-1]  # capped: no asynclet while messages wait
    async with gw.http.get(pipe["uri"] + ".900", headers=AJ) as r:  # far ahead: read back
        assert r.status == 200
        assert (await r.json(content_type=None))["restms"]["message"][0]["message_id"] == "m899"
    assert await drain(gw, pipe) == [f"m{n}" for n in range(1_000)]
    assert engine.held == 0
    await publish(gw, feed, 1_000, 1, persistent=False)  # memory again, not disk
    assert [m.get("message_id") for m in await listed(gw, pipe)][:1] == ["m1000"]


async def test_a_restart_leaves_a_big_backlog_on_disk_and_drops_stale_volatile_rows(
    make_gateway: MakeGateway,
) -> None:
    gw = await make_gateway(memory_budget=BUDGET)
    feed, pipe = await setup(gw)
    await publish(gw, feed, 0, 300, persistent=True)
    await publish(gw, feed, 300, 300, persistent=False)  # on disk only for room
    await publish(gw, feed, 600, 100, persistent=True)
    await gw.stop()
    again = await make_gateway(memory_budget=BUDGET)
    engine = again.engine
    assert engine.held <= BUDGET + 1000 + OVERHEAD
    path = "/" + pipe["uri"].split("/", 3)[3]
    got = await drain(again, {"uri": path})
    # the persistent ones, in order; non-persistent ones written only for room are gone,
    # except those that were in memory and so lost too: nothing between 300 and 600
    assert got == [f"m{n}" for n in [*range(300), *range(600, 700)]]


async def test_a_page_read_waits_for_a_commit_another_task_has_under_way(
    make_gateway: MakeGateway,
) -> None:
    """The journal may have been taken by someone else (the background flusher, a feed
    queue's page reader) and its commit not be done yet: a page read must not look at
    the disk before it is, or it finds the pipe's newest messages missing."""
    # the flusher never runs here, so the journal is still there for the commit below
    gw = await make_gateway(memory_budget=BUDGET, journal_interval=3600)
    _, pipe = await setup(gw)
    engine, store = gw.engine, gw.store
    held = engine.resolve(pipe["name"])
    assert isinstance(held, Pipe)
    specs = [
        MessageSpec(props=(("message_id", f"m{n}"),), contents=(EmbeddedContent(value=BODY),))
        for n in range(300)
    ]
    engine.publish(engine.public_feeds["big"], specs)
    assert held.spilled > 50
    # Another connection holds the write lock, so the commit below waits for it.
    blocker = await asyncio.to_thread(
        sqlite3.connect, store.path, isolation_level=None, check_same_thread=False
    )
    await asyncio.to_thread(blocker.execute, "BEGIN IMMEDIATE")
    # Someone else's commit of the publish, not awaited; then a read of the first page
    # on disk.
    under_way = engine.commit_journal(store.submit)
    assert under_way is not None
    reading = asyncio.create_task(paging.ensure(engine, store, held, held.spill_lo))
    await asyncio.sleep(0.3)
    await asyncio.to_thread(blocker.execute, "ROLLBACK")
    await asyncio.to_thread(blocker.close)
    await reading
    await under_way
    assert await drain(gw, pipe) == [f"m{n}" for n in range(300)]
