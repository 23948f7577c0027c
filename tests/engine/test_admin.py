"""What the gateway's administrators see and do (docs/ADMIN.md): every pipe whoever owns
it, a pipe's figures, a purge, and how many resources of each kind there are. Looking
or purging is not use: an idle pipe stays idle (Q1)."""

from __future__ import annotations

import asyncio

import pytest

from feeds.service import EngineService, WebhookState
from restms.errors import NotFound
from restms.webhook import WebhookOptions

from .conftest import MakeEngine
from .helpers import ME, OTHER, eventually, join, msg, new_feed, new_pipe, publish, texts

NEVER = "x" * 22  # a key never issued


async def test_every_pipe_of_every_owner_with_its_figures(engine: EngineService) -> None:
    feed = await new_feed(engine, "news", "fanout")
    mine, theirs = await new_pipe(engine, title="mine"), await new_pipe(engine, owner=OTHER)
    await join(engine, mine, feed)
    await publish(engine, feed, msg("one"), msg("two"))
    states = {state.info.key: state for state in await engine.pipe_states()}
    assert set(states) == {mine.key, theirs.key}
    state = states[mine.key]
    assert (state.info.owner, state.info.title, state.info.held) == (ME, "mine", 2)
    assert (state.info.oldest, state.info.asynclet, len(state.info.joins)) == (1, 3, 2)
    listed = (await engine.listing(ME, mine.key)).messages
    assert state.bytes == sum(m.size for m in listed) > 0
    assert (state.on_disk, state.waiting, state.pinned, state.webhook) == (0, 0, False, None)
    assert states[theirs.key].info.owner == OTHER
    assert states[theirs.key].info.held == 0
    assert await engine.pipe_state(None, mine.key) == state  # the gateway sees any pipe
    assert await engine.pipe_state(ME, mine.key) == state
    for principal, key in ((OTHER, mine.key), (None, NEVER)):
        with pytest.raises(NotFound) as hidden:
            await engine.pipe_state(principal, key)
        assert hidden.value.reason == "no such resource"


async def test_a_pipe_state_counts_waiting_requests_and_a_reading_cursor(
    engine: EngineService,
) -> None:
    feed = await new_feed(engine, "news", "fanout")
    pipe = await new_pipe(engine)
    await join(engine, pipe, feed)
    reader = asyncio.create_task(engine.read(ME, pipe.key, 1, wait=30.0))

    async def waiting(count: int) -> bool:
        return (await engine.pipe_state(None, pipe.key)).waiting == count

    await eventually(lambda: waiting(1))
    await publish(engine, feed, msg("one"))
    assert (await asyncio.wait_for(reader, 5.0)) is not None
    await eventually(lambda: waiting(0))
    cursor = engine.cursor(ME, pipe.key)
    await anext(cursor)
    assert (await engine.pipe_state(None, pipe.key)).pinned
    await cursor.close()
    assert not (await engine.pipe_state(None, pipe.key)).pinned


async def test_a_purge_acknowledges_everything_and_positions_go_on(
    engine: EngineService,
) -> None:
    feed = await new_feed(engine, "news", "fanout")
    pipe, other = await new_pipe(engine), await new_pipe(engine)
    await join(engine, pipe, feed)
    await join(engine, other, feed)
    await publish(engine, feed, msg("1"), msg("2"), msg("3", persistent=True))
    assert await engine.purge(None, pipe.key) == 3
    assert await engine.purge(None, pipe.key) == 0
    state = await engine.pipe_state(None, pipe.key)
    assert (state.info.held, state.info.oldest, state.info.asynclet) == (0, None, 4)
    assert await texts(engine, other) == ["1", "2", "3"]  # only the purged pipe
    await publish(engine, feed, msg("4"))
    listed = (await engine.listing(ME, pipe.key)).messages
    assert [m.position for m in listed] == [4]
    with pytest.raises(NotFound):
        await engine.purge(OTHER, pipe.key)
    assert await engine.purge(ME, pipe.key) == 1  # its owner may purge it too


async def test_a_purge_takes_what_is_on_disk_and_is_kept(restart: MakeEngine) -> None:
    engine = await restart(memory_budget=8_000)  # a few messages in memory, then disk
    feed = await new_feed(engine, "bulk", "fanout")
    pipe = await new_pipe(engine)
    await join(engine, pipe, feed)
    await publish(engine, feed, *(msg(f"m{i}", persistent=True) for i in range(1, 41)))
    before = await engine.pipe_state(None, pipe.key)
    assert before.on_disk > 0
    assert before.info.held == 40
    assert await engine.purge(None, pipe.key) == 40
    after = await engine.pipe_state(None, pipe.key)
    assert (after.info.held, after.on_disk, after.bytes) == (0, 0, 0)
    engine = await restart(crash=True, memory_budget=8_000)  # committed when it returned
    assert await texts(engine, pipe) == []
    assert (await engine.pipe_state(None, pipe.key)).info.asynclet == 41


async def test_looking_and_purging_do_not_keep_an_idle_pipe(make_engine: MakeEngine) -> None:
    engine = await make_engine(pipe_idle_timeout=0.2)
    pipe = await new_pipe(engine)

    async def collected() -> bool:
        try:
            await engine.pipe_state(None, pipe.key)
            await engine.purge(None, pipe.key)
        except NotFound:
            return True
        return False

    await eventually(collected)
    assert await engine.pipe_states() == ()


async def test_the_inventory_counts_each_kind(engine: EngineService) -> None:
    empty = await engine.inventory()
    assert (empty.domains, empty.pipes, empty.joins, empty.private_feeds, empty.staged) == (
        1,
        0,
        0,
        0,
        0,
    )
    public = await new_feed(engine, "news", "fanout")
    private = await new_feed(engine)
    pipe = await new_pipe(engine)
    await join(engine, pipe, public)
    await join(engine, pipe, private)
    await engine.stage(ME, public.key, b"blob", "text/plain")
    counted = await engine.inventory()
    assert counted.public_feeds == empty.public_feeds + 1
    assert (counted.private_feeds, counted.pipes, counted.joins, counted.staged) == (1, 1, 3, 1)
    await engine.delete_pipe(ME, pipe.key)
    assert (await engine.inventory()).joins == 0


async def test_a_webhook_pipes_state_and_totals(engine: EngineService) -> None:
    hook = WebhookOptions(callback="http://127.0.0.1:9/hook", secret="s" * 32)
    webhook, plain = await new_pipe(engine, "webhook", webhook=hook), await new_pipe(engine)
    states = {state.info.key: state.webhook for state in await engine.pipe_states()}
    assert states[plain.key] is None
    assert states[webhook.key] == WebhookState(
        state="verifying", delivered=0, failures=0, dead_lettered=0
    )
