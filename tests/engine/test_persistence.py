"""What an engine keeps across a restart, and messages past its memory budget: run
against the engines that keep messages (``DURABLE`` in conftest).

The same rules as tests/app/test_crash.py, test_spill.py and test_commit_failure.py
assert through a whole gateway.
"""

from __future__ import annotations

import asyncio

import pytest

from restms.errors import NotCommitted

from .conftest import MakeEngine, keeps_every_message, refuse_commits
from .helpers import ME, join, msg, new_feed, new_pipe, positions, publish, text, texts


async def test_resources_and_persistent_messages_survive_a_restart(restart: MakeEngine) -> None:
    engine = await restart()
    feed = await new_feed(engine, "orders", "fanout")
    private = await new_feed(engine)
    pipe = await new_pipe(engine, title="worker")
    made = await join(engine, pipe, feed, "eu")
    result = await engine.publish(
        ME,
        feed.key,
        [msg("acked", persistent=True), msg("kept", persistent=True), msg("transient")],
    )
    assert result.committed  # answered once on disk
    assert await engine.ack(ME, pipe.key, 1) == 1

    engine = await restart()
    again = await engine.pipe(ME, pipe.key)
    assert (again.title, again.owner) == ("worker", ME)
    assert made.key in {j.key for j in again.joins}
    assert (await engine.feed(ME, private.key)).owner == ME
    if keeps_every_message(engine):  # a restart is a node going: the store keeps all
        assert await texts(engine, pipe) == ["kept", "transient"]
        assert await positions(engine, pipe) == [2, 3]
        assert await publish(engine, feed, msg("after")) == [1]
        assert await positions(engine, pipe) == [2, 3, 4]
        return
    assert await texts(engine, pipe) == ["kept"]  # a non-persistent message is not kept
    assert await positions(engine, pipe) == [2]
    assert await publish(engine, feed, msg("after")) == [1]
    assert await positions(engine, pipe) == [2, 4]  # 3 was issued before: never again


async def test_a_persistent_publish_is_on_disk_when_it_returns(restart: MakeEngine) -> None:
    engine = await restart()
    feed = await new_feed(engine, "orders", "fanout")
    pipe = await new_pipe(engine)
    await join(engine, pipe, feed)
    await publish(engine, feed, msg("durable", persistent=True))
    engine = await restart(crash=True)  # at once: no flush, no clean close
    assert await texts(engine, pipe) == ["durable"]


@pytest.mark.alone  # the cluster's masters refuse every write meanwhile
async def test_a_publish_whose_commit_fails_leaves_nothing_behind(restart: MakeEngine) -> None:
    """Answered 503; no reader saw it, its position is given back, its message_id is
    free for the retry (tests/app/test_commit_failure.py, through the service)."""
    engine = await restart()
    feed = await new_feed(engine, "orders", "fanout")
    pipe = await new_pipe(engine)
    await join(engine, pipe, feed)
    reader = asyncio.create_task(engine.read(ME, pipe.key, 1, wait=30.0))
    async with refuse_commits(engine):
        with pytest.raises(NotCommitted) as refused:  # told apart from a full gateway
            await engine.publish(ME, feed.key, [msg("lost", mid="m1", persistent=True)])
        assert refused.value.retry_after > 0
    assert not reader.done()
    listing = await engine.listing(ME, pipe.key)
    assert (listing.messages, listing.asynclet) == ((), 1)
    retried = await engine.publish(ME, feed.key, [msg("kept", mid="m1", persistent=True)])
    assert (retried.counts, retried.duplicates) == ((1,), (False,))
    got = await asyncio.wait_for(reader, 5.0)
    assert got is not None
    assert (got.position, text(got)) == (1, "kept")


async def test_a_message_id_is_still_a_duplicate_after_a_restart(restart: MakeEngine) -> None:
    engine = await restart()
    feed = await new_feed(engine, "orders", "fanout")
    pipe = await new_pipe(engine)
    await join(engine, pipe, feed)
    await engine.publish(ME, feed.key, [msg("once", mid="m1", persistent=True)])
    engine = await restart()
    retried = await engine.publish(ME, feed.key, [msg("once", mid="m1", persistent=True)])
    assert (retried.counts, retried.duplicates) == ((1,), (True,))
    assert await texts(engine, pipe) == ["once"]


async def test_a_rotator_queue_survives_a_restart(restart: MakeEngine) -> None:
    engine = await restart()
    feed = await new_feed(engine, "jobs", "rotator")
    await publish(engine, feed, msg("J1", persistent=True), msg("J2", persistent=True))
    engine = await restart()
    worker = await new_pipe(engine)
    await join(engine, worker, feed)
    assert await texts(engine, worker) == ["J1", "J2"]


async def test_messages_past_the_memory_budget_are_read_back_in_order(
    restart: MakeEngine,
) -> None:
    engine = await restart(memory_budget=8_000)  # a few messages in memory, then disk
    feed = await new_feed(engine, "bulk", "fanout")
    pipe = await new_pipe(engine)
    await join(engine, pipe, feed)
    await publish(engine, feed, *(msg(f"m{i}", persistent=i % 2 == 0) for i in range(1, 41)))
    assert (await engine.stats()).census.on_disk > 0
    got = await engine.read(ME, pipe.key, 37)  # far past memory: paged in by the engine
    assert got is not None
    assert text(got) == "m37"
    cursor = engine.cursor(ME, pipe.key, after=30)
    assert [text(await anext(cursor)) for _ in range(10)] == [f"m{i}" for i in range(31, 41)]
    await cursor.close()
    assert await engine.ack(ME, pipe.key, 35) == 35
    assert await texts(engine, pipe) == [f"m{i}" for i in range(36, 41)]

    engine = await restart(memory_budget=8_000)  # what was on disk and not acked is kept
    assert await texts(engine, pipe) == ["m36", "m38", "m40"]


async def test_a_cursors_ack_survives_a_crash_or_with_wait_false_a_clean_close(
    restart: MakeEngine,
) -> None:
    """A waiting ack is committed when it returns; one that does not wait (a bridge's)
    is committed by the time the engine closes."""
    engine = await restart()
    feed = await new_feed(engine, "orders", "fanout")
    pipe = await new_pipe(engine, durable=True)
    await join(engine, pipe, feed)
    await publish(engine, feed, *(msg(str(n), persistent=True) for n in range(1, 5)))
    cursor = engine.cursor(ME, pipe.key)
    assert len(await cursor.take(4)) == 4
    assert await cursor.ack(2) == 2
    engine = await restart(crash=True)
    assert await positions(engine, pipe) == [3, 4]
    cursor = engine.cursor(ME, pipe.key, after=2)
    assert len(await cursor.take(4)) == 2
    assert await cursor.ack(3, wait=False) == 1
    assert await positions(engine, pipe) == [4]  # gone at once for readers
    engine = await restart()
    assert await positions(engine, pipe) == [4]
