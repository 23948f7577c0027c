"""What a reader resuming at a position is told of messages it never acknowledged that
are gone: a pipe's ``acked`` and ``lost`` marks and :meth:`PipeInfo.gap` (the engine
service's "Gaps", docs/EXTENSIONS.md §3), through the engine service alone.

Lost: expired, dropped by overflow, moved to a dead-letter feed, kept in memory only
across a restart. Not lost: acknowledged, or delivered again at a new position.
tests/app/test_gaps.py asserts what SSE, the WebSocket and a GET say of them.
"""

from __future__ import annotations

import asyncio

from feeds.service import EngineService, FeedInfo, Gap, PipeInfo

from .conftest import MakeEngine
from .helpers import ME, eventually, join, msg, new_feed, new_pipe, positions, publish


async def _news(engine: EngineService, **options: object) -> tuple[FeedInfo, PipeInfo]:
    feed = await new_feed(engine, "news", "fanout")
    pipe = await new_pipe(engine, **options)
    await join(engine, pipe, feed)
    return feed, pipe


async def _info(engine: EngineService, pipe: PipeInfo) -> PipeInfo:
    return await engine.pipe(ME, pipe.key)


async def test_a_new_pipe_has_lost_and_acknowledged_nothing(engine: EngineService) -> None:
    feed, pipe = await _news(engine)
    await publish(engine, feed, msg("1"), msg("2"))
    now = await _info(engine, pipe)
    assert (now.acked, now.lost, now.earliest) == (0, 0, 1)
    assert now.gap(1) is None


async def test_overflow_drops_are_a_gap_from_where_the_reader_resumes(
    engine: EngineService,
) -> None:
    feed, pipe = await _news(engine, max_messages=2, overflow="drop-oldest")
    await publish(engine, feed, *(msg(str(n)) for n in range(1, 6)))  # 1 to 3 dropped
    assert await positions(engine, pipe) == [4, 5]
    now = await _info(engine, pipe)
    assert (now.acked, now.lost, now.earliest) == (0, 3, 4)
    assert now.gap(1) == Gap(first=1, last=3, earliest=4)
    assert now.gap(3) == Gap(first=3, last=3, earliest=4)  # it had been sent 1 and 2
    assert now.gap(4) is None  # resuming at the earliest held: nothing lost
    assert now.gap(6) is None


async def test_acknowledged_messages_are_no_gap(engine: EngineService) -> None:
    feed, pipe = await _news(engine, max_messages=3, overflow="drop-oldest")
    await publish(engine, feed, msg("1"), msg("2"), msg("3"))
    assert await engine.ack(ME, pipe.key, 2) == 2
    now = await _info(engine, pipe)
    assert (now.acked, now.lost, now.earliest) == (2, 0, 3)
    assert now.gap(1) is None  # 1 and 2 went, acknowledged: not lost
    await publish(engine, feed, msg("4"), msg("5"), msg("6"), msg("7"))  # 3 and 4 dropped
    now = await _info(engine, pipe)
    assert (now.acked, now.lost) == (2, 4)
    assert now.gap(1) == Gap(first=3, last=4, earliest=5)  # past what was acknowledged
    await engine.ack(ME, pipe.key, 5)  # the reader saw the loss through, and went on
    assert (await _info(engine, pipe)).gap(1) is None


async def test_expired_messages_are_a_gap(engine: EngineService) -> None:
    feed, pipe = await _news(engine)
    await publish(engine, feed, msg("short", expiration=20), msg("long", expiration=60_000))
    await asyncio.sleep(0.1)
    assert await positions(engine, pipe) == [2]  # (a listing drops what expired)
    now = await _info(engine, pipe)
    assert (now.lost, now.earliest) == (1, 2)
    assert now.gap(1) == Gap(first=1, last=1, earliest=2)


async def test_a_dead_lettered_message_is_a_gap_and_a_redelivered_one_is_not(
    engine: EngineService,
) -> None:
    feed, pipe = await _news(engine, lease=0.1, max_deliveries=2)
    await publish(engine, feed, msg("job"))
    assert await engine.read(ME, pipe.key, 1, lease=True) is not None
    again = await engine.read(ME, pipe.key, 2, wait=5.0, lease=True)  # its lease ran out
    assert again is not None
    now = await _info(engine, pipe)
    assert now.lost == 0  # it moved to position 2: not lost
    assert now.gap(1) is None

    async def dead_lettered() -> bool:  # after its second lease
        return (await _info(engine, pipe)).held == 0

    await eventually(dead_lettered)
    now = await _info(engine, pipe)
    assert (now.lost, now.earliest) == (2, 3)
    assert now.gap(1) == Gap(first=1, last=2, earliest=3)


async def test_dead_letter_by_a_reader_is_a_gap_in_the_middle(engine: EngineService) -> None:
    feed, pipe = await _news(engine)
    await publish(engine, feed, msg("1"), msg("bad"), msg("3"))
    await engine.dead_letter(ME, pipe.key, 2, "rejected")
    now = await _info(engine, pipe)
    assert (now.lost, now.earliest) == (2, 1)
    # 1 and 3 are still sent: only position 2 of 1 to 2 is missing
    assert now.gap(1) == Gap(first=1, last=2, earliest=1)
    assert now.gap(3) is None


async def test_a_cursor_acknowledging_moves_the_mark(engine: EngineService) -> None:
    feed, pipe = await _news(engine)
    await publish(engine, feed, msg("1"), msg("2"), msg("3"))
    cursor = engine.cursor(ME, pipe.key)
    try:
        assert len(await cursor.take(10)) == 3
        await cursor.ack(2)
    finally:
        await cursor.close()
    assert (await _info(engine, pipe)).acked == 2
    assert await engine.purge(None, pipe.key) == 1
    assert (await _info(engine, pipe)).acked == 3


async def test_the_marks_survive_a_restart_and_memory_only_messages_are_lost(
    restart: MakeEngine,
) -> None:
    engine = await restart()
    feed, pipe = await _news(engine, max_messages=4, overflow="drop-oldest")
    await publish(engine, feed, *(msg(str(n), persistent=True) for n in range(1, 6)))
    await engine.ack(ME, pipe.key, 3)  # dropped 1 (lost), then acknowledged to 3
    await publish(engine, feed, msg("6"), msg("7", persistent=True))  # 6 in memory only
    before = await _info(engine, pipe)
    assert (before.acked, before.lost) == (3, 1)
    assert before.gap(1) is None  # every loss is older than what was acknowledged

    engine = await restart()
    held = await positions(engine, pipe)
    after = await _info(engine, pipe)
    assert after.acked == 3
    if held == [4, 5, 7]:  # 6 went with the restart: lost
        assert after.lost == 6
        assert after.gap(5) == Gap(first=5, last=6, earliest=4)
    else:  # an engine that keeps every message across a restart lost nothing
        assert (held, after.lost, after.gap(5)) == ([4, 5, 6, 7], 1, None)
    assert after.gap(7) is None  # a reader that had been sent 6 lost nothing


async def test_a_restart_loses_nothing_of_a_durable_pipe(restart: MakeEngine) -> None:
    engine = await restart()
    feed, pipe = await _news(engine, durable=True)
    await publish(engine, feed, msg("1"), msg("2"))
    engine = await restart()
    after = await _info(engine, pipe)
    assert (after.acked, after.lost, after.earliest) == (0, 0, 1)
    assert after.gap(1) is None


async def test_memory_only_messages_past_the_memory_budget_are_lost_in_a_restart(
    restart: MakeEngine,
) -> None:
    engine = await restart(memory_budget=8_000)  # a few messages in memory, then disk
    feed, pipe = await _news(engine)
    await publish(engine, feed, *(msg(f"m{n}", persistent=n < 40) for n in range(1, 41)))
    assert (await engine.stats()).census.on_disk > 0

    engine = await restart(memory_budget=8_000)
    held = await positions(engine, pipe)
    after = await _info(engine, pipe)
    if held == list(range(1, 40)):  # m40, kept for one run only, went with it
        assert (after.lost, after.gap(2)) == (40, Gap(first=2, last=40, earliest=1))
    else:  # an engine that keeps every message across a restart lost nothing
        assert (held, after.lost) == (list(range(1, 41)), 0)
