"""Positions, acknowledgement, waiting, leases, deduplication, overflow, expiry, cursors
and contents, through the engine service (digest §4, §5, Q2, Q6, Q30).

The same rules as tests/app/test_delivery.py and test_guarantees.py assert over HTTP.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from feeds.service import Blob, ContentRef, Cursor, EngineService, FeedInfo, PipeInfo
from restms.errors import Forbidden, NotFound, PayloadTooLarge, ServiceUnavailable
from restms.specs import LinkedContent, MessageSpec

from .conftest import MakeEngine
from .helpers import ME, eventually, join, msg, new_feed, new_pipe, positions, publish, text, texts


async def _news(
    engine: EngineService, kind: str = "fanout", **options: object
) -> tuple[FeedInfo, PipeInfo]:
    feed = await new_feed(engine, "news", kind)
    pipe = await new_pipe(engine, **options)
    await join(engine, pipe, feed)
    return feed, pipe


# ---------------------------------------------------------------- positions (A3, Q6)
async def test_A3_positions_are_contiguous_and_never_reused(engine: EngineService) -> None:
    feed, pipe = await _news(engine)
    assert (await engine.pipe(ME, pipe.key)).asynclet == 1
    await publish(engine, feed, msg("1"), msg("2"), msg("3"))
    assert await positions(engine, pipe) == [1, 2, 3]
    assert await engine.ack(ME, pipe.key, 3) == 3
    await publish(engine, feed, msg("4"))
    assert await positions(engine, pipe) == [4]  # 1-3 are gone, never handed out again
    listing = await engine.listing(ME, pipe.key)
    assert listing.asynclet == 5
    info = await engine.pipe(ME, pipe.key)
    assert (info.held, info.oldest, info.asynclet) == (1, 4, 5)


async def test_A5_reads_beyond_the_asynclet_or_before_the_first_are_404(
    engine: EngineService,
) -> None:
    feed, pipe = await _news(engine)
    await publish(engine, feed, msg("1"))
    for position in (0, 3, 100):
        with pytest.raises(NotFound):
            await engine.read(ME, pipe.key, position, wait=5.0)  # at once, never waits
    await engine.ack(ME, pipe.key, 1)
    with pytest.raises(NotFound):
        await engine.read(ME, pipe.key, 1)  # acknowledged: gone


async def test_A5_positions_never_issued_are_404_not_a_failure(engine: EngineService) -> None:
    _, pipe = await _news(engine)
    for position in (0, 2**64 + 1, 10**20):  # 0 of an empty pipe; past any counter
        with pytest.raises(NotFound):
            await engine.read(ME, pipe.key, position, lease=True)
        assert await engine.look(ME, pipe.key, position) is None


# ---------------------------------------------------------------- acknowledgement (D4, A7)
async def test_D4_ack_removes_the_message_and_every_older_one(engine: EngineService) -> None:
    feed, pipe = await _news(engine)
    await publish(engine, feed, *(msg(str(i)) for i in range(1, 5)))
    assert await engine.ack(ME, pipe.key, 2) == 2
    assert await texts(engine, pipe) == ["3", "4"]
    assert await engine.ack(ME, pipe.key, 2) == 0  # D5: again, nothing more
    assert await engine.ack(ME, pipe.key, 5) == 0  # A7: the asynclet: a no-op
    assert await texts(engine, pipe) == ["3", "4"]
    assert await engine.ack(ME, pipe.key, 4) == 2
    assert await texts(engine, pipe) == []


# ---------------------------------------------------------------- waiting (A2, A6, A9)
async def test_A2_a_read_at_the_asynclet_waits_and_is_woken_by_a_publish(
    engine: EngineService,
) -> None:
    feed, pipe = await _news(engine)
    reader = asyncio.create_task(engine.read(ME, pipe.key, 1, wait=5.0))
    await asyncio.sleep(0.05)
    assert not reader.done()
    started = time.monotonic()
    await publish(engine, feed, msg("woken"))
    got = await asyncio.wait_for(reader, 1.0)
    assert time.monotonic() - started < 1.0
    assert got is not None
    assert (got.position, text(got)) == (1, "woken")


async def test_A5_every_waiter_at_the_asynclet_gets_the_message(engine: EngineService) -> None:
    feed, pipe = await _news(engine)
    readers = [asyncio.create_task(engine.read(ME, pipe.key, 1, wait=5.0)) for _ in range(3)]
    await asyncio.sleep(0.02)
    await publish(engine, feed, msg("all"))
    got = await asyncio.wait_for(asyncio.gather(*readers), 1.0)
    assert [m and text(m) for m in got] == ["all"] * 3


async def test_A9_a_read_that_waits_in_vain_returns_none_at_its_deadline(
    engine: EngineService,
) -> None:
    _feed, pipe = await _news(engine)
    started = time.monotonic()
    assert await engine.read(ME, pipe.key, 1, wait=0.1) is None
    assert 0.09 <= time.monotonic() - started < 1.0
    assert await engine.read(ME, pipe.key, 1) is None  # wait 0: U11's HEAD, never blocks


async def test_A6_deleting_the_pipe_ends_a_waiting_read_with_404(engine: EngineService) -> None:
    _feed, pipe = await _news(engine)
    reader = asyncio.create_task(engine.read(ME, pipe.key, 1, wait=5.0))
    await asyncio.sleep(0.02)
    await engine.delete_pipe(ME, pipe.key)
    with pytest.raises(NotFound):
        await asyncio.wait_for(reader, 1.0)


async def test_D9_one_writer_100_messages_arrive_in_order(engine: EngineService) -> None:
    feed, pipe = await _news(engine)
    for i in range(100):
        await publish(engine, feed, msg(str(i)))
    assert await texts(engine, pipe) == [str(i) for i in range(100)]


# ---------------------------------------------------------------- deduplication
async def test_a_repeated_message_id_is_a_duplicate_and_not_routed_again(
    engine: EngineService,
) -> None:
    feed, pipe = await _news(engine)
    first = await engine.publish(ME, feed.key, [msg("a", mid="a")])
    assert (first.counts, first.duplicates) == ((1,), (False,))
    again = await engine.publish(ME, feed.key, [msg("a again", mid="a"), msg("b", mid="b")])
    assert (again.counts, again.duplicates) == ((1, 1), (True, False))
    inside = await engine.publish(ME, feed.key, [msg("c", mid="c"), msg("c2", mid="c")])
    assert inside.duplicates == (False, True)  # repeated within one request too
    assert await texts(engine, pipe) == ["a", "b", "c"]
    assert (await engine.stats()).counter("duplicates") == 2


# ---------------------------------------------------------------- overflow (Q2)
async def test_Q2_a_full_pipe_is_skipped_and_not_counted(engine: EngineService) -> None:
    feed = await new_feed(engine, "news", "fanout")
    small, big = await new_pipe(engine, max_messages=1), await new_pipe(engine)
    await join(engine, small, feed)
    await join(engine, big, feed)
    assert await publish(engine, feed, msg("1"), msg("2")) == [2, 1]
    assert await texts(engine, small) == ["1"]
    assert await texts(engine, big) == ["1", "2"]


async def test_Q2_a_full_reject_pipe_refuses_the_whole_publish(engine: EngineService) -> None:
    feed = await new_feed(engine, "news", "fanout")
    strict = await new_pipe(engine, max_messages=2, overflow="reject")
    other = await new_pipe(engine)
    await join(engine, strict, feed)
    await join(engine, other, feed)
    assert await publish(engine, feed, msg("1"), msg("2")) == [2, 2]
    with pytest.raises(ServiceUnavailable) as refused:
        await publish(engine, feed, msg("3"))
    assert refused.value.retry_after > 0
    assert strict.key not in refused.value.reason  # the name is the pipe's capability
    assert await texts(engine, other) == ["1", "2"]  # nothing routed anywhere
    await engine.ack(ME, strict.key, 1)
    assert await publish(engine, feed, msg("3")) == [2]


async def test_Q2_a_message_larger_than_a_reject_pipe_takes_is_413(
    engine: EngineService,
) -> None:
    feed, _pipe = await _news(engine, max_bytes=100, overflow="reject")
    with pytest.raises(PayloadTooLarge):
        await publish(engine, feed, msg("x" * 200))


async def test_Q2_drop_oldest_keeps_the_newest(engine: EngineService) -> None:
    feed, pipe = await _news(engine, max_messages=2, overflow="drop-oldest")
    assert await publish(engine, feed, msg("1"), msg("2"), msg("3")) == [1, 1, 1]
    assert await texts(engine, pipe) == ["2", "3"]
    assert await positions(engine, pipe) == [2, 3]


# ---------------------------------------------------------------- expiry (Q30)
async def test_Q30_an_expired_message_is_dropped_unread(engine: EngineService) -> None:
    feed, pipe = await _news(engine)
    await publish(engine, feed, msg("short", expiration=50), msg("long", expiration=60_000))
    await asyncio.sleep(0.1)
    assert await texts(engine, pipe) == ["long"]
    with pytest.raises(NotFound):
        await engine.read(ME, pipe.key, 1)
    assert (await engine.stats()).counter("expired") == 1


# ---------------------------------------------------------------- leases and dead letters
async def test_an_unacknowledged_message_comes_back_then_goes_to_the_dead_letter_feed(
    engine: EngineService,
) -> None:
    feed, pipe = await _news(engine, lease=0.1, max_deliveries=2)
    dead = await new_pipe(engine)
    await join(engine, dead, await engine.feed(ME, "dead-letter"))
    await publish(engine, feed, msg("job", mid="job"))
    first = await engine.read(ME, pipe.key, 1, lease=True)
    assert first is not None
    assert first.redeliveries == 0
    again = await engine.read(ME, pipe.key, 2, wait=5.0, lease=True)  # after the lease
    assert again is not None
    assert (text(again), again.redeliveries) == ("job", 1)
    with pytest.raises(NotFound):
        await engine.read(ME, pipe.key, 1)  # it left its old position
    letter = await engine.read(ME, dead.key, 1, wait=5.0)  # after the second lease
    assert letter is not None
    headers = dict(letter.spec.headers)
    assert headers["x-death-reason"] == "max-deliveries"
    assert headers["x-delivery-count"] == "2"
    assert await texts(engine, pipe) == []
    stats = await engine.stats()
    assert (stats.counter("redelivered"), stats.counter("dead_lettered")) == (2, 1)


async def test_an_acknowledged_or_unleased_message_is_not_redelivered(
    engine: EngineService,
) -> None:
    feed, pipe = await _news(engine, lease=0.05)
    await publish(engine, feed, msg("acked"), msg("peeked"))
    assert await engine.read(ME, pipe.key, 1, lease=True) is not None
    assert await engine.read(ME, pipe.key, 2) is not None  # no lease: a look
    await engine.ack(ME, pipe.key, 1)
    assert await engine.read(ME, pipe.key, 3, wait=0.3) is None  # five leases: nothing back
    assert await positions(engine, pipe) == [2]


async def test_a_leased_rotator_message_goes_to_another_worker(engine: EngineService) -> None:
    feed = await new_feed(engine, "jobs", "rotator")
    slow = await new_pipe(engine, lease=0.05)
    fast = await new_pipe(engine)
    await join(engine, slow, feed)
    await join(engine, fast, feed)
    await publish(engine, feed, msg("J1"))
    assert await engine.read(ME, slow.key, 1, lease=True) is not None
    got = await engine.read(ME, fast.key, 1, wait=5.0)
    assert got is not None
    assert (text(got), got.redeliveries) == ("J1", 1)


async def test_dead_letter_moves_one_message_now(engine: EngineService) -> None:
    feed, pipe = await _news(engine)
    dead = await new_pipe(engine)
    await join(engine, dead, await engine.feed(ME, "dead-letter"))
    await publish(engine, feed, msg("1"), msg("bad"), msg("3"))
    assert await engine.dead_letter(ME, pipe.key, 2, "rejected")
    assert await texts(engine, pipe) == ["1", "3"]
    letter = await engine.read(ME, dead.key, 1)
    assert letter is not None
    assert (text(letter), dict(letter.spec.headers)["x-death-reason"]) == ("bad", "rejected")


async def test_dead_letter_to_a_named_feed_with_headers_saying_why(engine: EngineService) -> None:
    """A bridge names its own dead-letter feed and says which bridge refused what."""
    feed, pipe = await _news(engine)
    graveyard = await new_feed(engine, "graveyard", "fanout")
    dead, default = await new_pipe(engine), await new_pipe(engine)
    await join(engine, dead, graveyard)
    await join(engine, default, await engine.feed(ME, "dead-letter"))
    await publish(engine, feed, msg("1"), msg("bad"))
    why = (("x-bridge", "out"), ("x-bridge-error", "refused by the far side"))
    assert await engine.dead_letter(ME, pipe.key, 2, "rejected", feed="graveyard", headers=why)
    assert await texts(engine, pipe) == ["1"]
    assert await texts(engine, default) == []
    letter = await engine.read(ME, dead.key, 1)
    assert letter is not None
    assert text(letter) == "bad"
    assert letter.spec.headers == (
        ("x-death-reason", "rejected"),
        *why,
        ("x-original-feed", "news"),
    )
    assert not await engine.dead_letter(ME, pipe.key, 1, "rejected", feed="no-such-feed")
    assert await texts(engine, pipe) == []  # dropped all the same


# ---------------------------------------------------------------- room (Q2, bridges)
async def test_room_is_what_every_full_skipping_pipe_can_still_hold(
    engine: EngineService,
) -> None:
    feed = await new_feed(engine, "news", "topic")
    small = await new_pipe(engine, max_messages=2)
    big = await new_pipe(engine)
    refusing = await new_pipe(engine, max_messages=1, overflow="reject")
    await join(engine, small, feed, "eu.*")
    await join(engine, big, feed, "*")
    batch = [msg("1", "eu.a"), msg("2", "us.b"), msg("3", "eu.c"), msg("4", "eu.d")]
    assert await engine.room(ME, feed.key, batch) == 3  # "us.b" does not reach ``small``
    await publish(engine, feed, msg("0", "eu.z"))
    assert await engine.room(ME, feed.key, batch) == 2
    await publish(engine, feed, msg("0", "eu.z"))
    assert await engine.room(ME, feed.key, batch) == 0
    assert await engine.room(ME, feed.key, batch[1:2]) == 1
    other = await new_feed(engine, "other", "fanout")
    await join(engine, refusing, other)
    await publish(engine, other, msg("full"))
    assert await engine.room(ME, other.key, batch) == 4  # a "reject" pipe refuses itself
    queue = await new_feed(engine, "jobs", "rotator")
    assert await engine.room(ME, queue.key, batch) == 4


async def test_room_waits_for_a_full_pipe_to_make_room(engine: EngineService) -> None:
    feed, pipe = await _news(engine, max_messages=1)
    await publish(engine, feed, msg("1"))
    started = time.monotonic()
    assert await engine.room(ME, feed.key, [msg("2")], wait=0.05) == 0
    assert time.monotonic() - started >= 0.04  # it waited, in vain
    waiting = asyncio.create_task(engine.room(ME, feed.key, [msg("2")], wait=30.0))
    await asyncio.sleep(0.02)
    assert not waiting.done()
    await engine.ack(ME, pipe.key, 1)
    assert await asyncio.wait_for(waiting, 5.0) == 1


# ---------------------------------------------------------------- cursors
async def test_a_cursor_reads_on_from_a_position_and_waits_for_more(
    engine: EngineService,
) -> None:
    feed, pipe = await _news(engine)
    await publish(engine, feed, msg("1"), msg("2"), msg("3"))
    cursor = engine.cursor(ME, pipe.key, after=1)
    seen = [await anext(cursor), await anext(cursor)]
    assert [(m.position, text(m)) for m in seen] == [(2, "2"), (3, "3")]
    assert cursor.position == 3
    pending = asyncio.create_task(anext(cursor))
    await asyncio.sleep(0.02)
    assert not pending.done()
    await publish(engine, feed, msg("4"))
    fourth = await asyncio.wait_for(pending, 1.0)
    assert (fourth.position, text(fourth)) == (4, "4")
    assert await cursor.ack(3) == 3
    assert await texts(engine, pipe) == ["4"]
    resumed = engine.cursor(ME, pipe.key, after=cursor.position - 1)  # as a Last-Event-ID
    assert (await anext(resumed)).position == 4
    await cursor.close()
    await resumed.close()
    with pytest.raises(StopAsyncIteration):
        await anext(cursor)


async def test_a_cursor_takes_what_is_there_up_to_a_limit_and_waits_for_the_first(
    engine: EngineService,
) -> None:
    feed, pipe = await _news(engine)
    await publish(engine, feed, *(msg(str(n)) for n in range(1, 6)))
    cursor = engine.cursor(ME, pipe.key)
    assert [m.position for m in await cursor.take(3)] == [1, 2, 3]
    assert (cursor.position, cursor.held) == (3, 5)  # taken is not acknowledged
    assert [text(m) for m in await cursor.take(10)] == ["4", "5"]
    started = time.monotonic()
    assert await cursor.take(10, wait=0.05) == ()
    assert time.monotonic() - started >= 0.04
    waiting = asyncio.create_task(cursor.take(10, wait=30.0))
    await asyncio.sleep(0.02)
    assert not waiting.done()
    await publish(engine, feed, msg("6"))
    assert [m.position for m in await asyncio.wait_for(waiting, 5.0)] == [6]
    cancelled = asyncio.create_task(cursor.take(10, wait=30.0))
    await asyncio.sleep(0.02)
    cancelled.cancel()
    await asyncio.gather(cancelled, return_exceptions=True)
    await publish(engine, feed, msg("7"))
    assert [m.position for m in await cursor.take(10, wait=5.0)] == [7]  # nothing lost
    assert await cursor.ack(6) == 6
    assert cursor.held == 1
    closed = asyncio.create_task(cursor.take(10, wait=30.0))
    await asyncio.sleep(0.02)
    await cursor.close()
    assert await asyncio.wait_for(closed, 1.0) == ()


async def test_closing_a_cursor_ends_its_wait(engine: EngineService) -> None:
    _feed, pipe = await _news(engine)
    cursor = engine.cursor(ME, pipe.key)
    collected = asyncio.create_task(_collect(cursor))
    await asyncio.sleep(0.02)
    await cursor.close()
    assert await asyncio.wait_for(collected, 1.0) == []


async def test_a_cursor_ends_when_its_pipe_is_deleted(engine: EngineService) -> None:
    feed, pipe = await _news(engine)
    await publish(engine, feed, msg("1"))
    cursor = engine.cursor(ME, pipe.key)
    collected = asyncio.create_task(_collect(cursor))
    await eventually(lambda: _listed_once(collected))
    await engine.delete_pipe(ME, pipe.key)
    assert await asyncio.wait_for(collected, 1.0) == ["1"]
    with pytest.raises(StopAsyncIteration):
        await anext(cursor)  # ended: it stays ended


async def test_a_leasing_cursor_sees_an_unacknowledged_message_again(
    engine: EngineService,
) -> None:
    feed, pipe = await _news(engine, lease=0.05)
    await publish(engine, feed, msg("job"))
    cursor = engine.cursor(ME, pipe.key, lease=True)
    first = await anext(cursor)
    again = await asyncio.wait_for(anext(cursor), 5.0)
    assert (first.position, again.position, again.redeliveries) == (1, 2, 1)
    await cursor.close()


async def _collect(cursor: Cursor) -> list[str]:
    return [text(m) async for m in cursor]


async def _listed_once(task: asyncio.Task[list[str]]) -> bool:
    await asyncio.sleep(0.02)  # the cursor had its turn; it waits for news now
    return not task.done()


# ---------------------------------------------------------------- staged and delivered contents
async def test_M1_M7_a_staged_content_is_delivered_with_its_exact_bytes(
    engine: EngineService,
) -> None:
    feed, pipe = await _news(engine)
    staged = await engine.stage(ME, feed.key, b"\x00\xffbinary", "application/x-thing")
    info, blob = await engine.staged(ME, staged.key)
    assert (info.size, blob) == (
        8,
        Blob(data=b"\x00\xffbinary", content_type="application/x-thing"),
    )
    linked = MessageSpec(contents=(LinkedContent(path=f"/restms/resource/{staged.key}"),))
    assert await publish(engine, feed, linked) == [1]
    got = await engine.read(ME, pipe.key, 1)
    assert got is not None
    assert got.parts == (Blob(data=b"\x00\xffbinary", content_type="application/x-thing"),)
    ref = ContentRef(pipe=pipe.key, position=1, index=0)
    assert (await engine.content(ME, ref)).data == b"\x00\xffbinary"
    with pytest.raises(NotFound):
        await publish(engine, feed, linked)  # M8: used up
    with pytest.raises(NotFound):
        await engine.staged(ME, staged.key)
    await engine.delete_content(ME, ref)  # D6
    with pytest.raises(NotFound):
        await engine.content(ME, ref)
    after = await engine.read(ME, pipe.key, 1)
    assert after is not None
    assert (after.parts, after.version) == ((None,), 2)


async def test_M9_M10_a_foreign_reference_refuses_the_request_and_keeps_the_good_one(
    engine: EngineService,
) -> None:
    feed, pipe = await _news(engine)
    other = await new_feed(engine, "other", "fanout")
    good = await engine.stage(ME, feed.key, b"good", "text/plain")
    foreign = await engine.stage(ME, other.key, b"foreign", "text/plain")
    batch = [
        MessageSpec(contents=(LinkedContent(path=f"/restms/resource/{good.key}"),)),
        MessageSpec(contents=(LinkedContent(path=f"/restms/resource/{foreign.key}"),)),
    ]
    with pytest.raises(Forbidden):
        await engine.publish(ME, feed.key, batch)
    assert await texts(engine, pipe) == []
    assert (await engine.staged(ME, good.key))[1].data == b"good"


async def test_stats_count_what_happened(engine: EngineService) -> None:
    feed, pipe = await _news(engine)
    before = await engine.stats()
    await publish(engine, feed, msg("1"), msg("2"))
    await engine.ack(ME, pipe.key, 1)
    after = await engine.stats()
    assert after.counter("published") - before.counter("published") == 2
    assert after.counter("acknowledged") - before.counter("acknowledged") == 1
    assert after.census.messages == 1
    assert dict(after.census.pipes)[""] == 1


async def test_Q1_an_open_cursor_keeps_its_pipe_from_being_collected_as_idle(
    make_engine: MakeEngine,
) -> None:
    engine = await make_engine(pipe_idle_timeout=0.1)
    feed = await new_feed(engine, "news", "fanout")
    read, idle = await new_pipe(engine), await new_pipe(engine)
    await join(engine, read, feed)
    await join(engine, idle, feed)
    await publish(engine, feed, msg("1"))
    cursor = engine.cursor(ME, read.key)
    assert text(await anext(cursor)) == "1"  # read, and not waiting: as a busy bridge

    async def pipes_left(count: int) -> bool:
        return sum(dict((await engine.stats()).census.pipes).values()) == count

    await eventually(lambda: pipes_left(1))  # the idle one went
    assert (await engine.pipe(ME, read.key)).key == read.key
    await cursor.close()
    await eventually(lambda: pipes_left(0))  # idle from its close on


async def test_closing_the_engine_ends_waiting_reads_with_a_retriable_503(
    make_engine: MakeEngine,
) -> None:
    engine = await make_engine()
    _feed, pipe = await _news(engine)
    reader = asyncio.create_task(engine.read(ME, pipe.key, 1, wait=30.0))
    await asyncio.sleep(0.02)
    await engine.close()
    with pytest.raises(ServiceUnavailable) as ended:
        await asyncio.wait_for(reader, 1.0)
    assert ended.value.retry_after > 0


# ---------------------------------------------------------------- continuous readers
async def test_a_cursor_says_why_it_ended(make_engine: MakeEngine) -> None:
    engine = await make_engine()
    feed, pipe = await _news(engine)
    await publish(engine, feed, msg("1"))
    reading = engine.cursor(ME, pipe.key)
    closed = engine.cursor(ME, pipe.key)
    assert [m.position for m in await reading.take(10)] == [1]
    await closed.take(10)
    assert (reading.ended, closed.ended) == (None, None)
    await closed.close()
    assert closed.ended == "closed"
    waiting = asyncio.create_task(reading.take(10, wait=30.0))
    await asyncio.sleep(0.02)
    await engine.delete_pipe(ME, pipe.key)
    assert await asyncio.wait_for(waiting, 1.0) == ()
    assert reading.ended == "deleted"
    other = await new_pipe(engine)
    shut = engine.cursor(ME, other.key)
    waiting = asyncio.create_task(shut.take(10, wait=30.0))
    await asyncio.sleep(0.02)
    await engine.close()
    assert await asyncio.wait_for(waiting, 1.0) == ()
    assert shut.ended == "closing"


async def test_a_windowed_cursor_holds_no_more_than_its_window_unacknowledged(
    engine: EngineService,
) -> None:
    feed, pipe = await _news(engine)
    await publish(engine, feed, *(msg(str(n)) for n in range(1, 7)))
    cursor = engine.cursor(ME, pipe.key)
    cursor.window(3)
    assert [m.position for m in await cursor.take(10)] == [1, 2, 3]
    assert await cursor.take(10, wait=0.05) == ()  # full: it waits for acknowledgements
    waiting = asyncio.create_task(cursor.take(10, wait=30.0))
    await asyncio.sleep(0.02)
    assert not waiting.done()
    assert await engine.ack(ME, pipe.key, 1) == 1  # by anyone: room for one more
    assert [m.position for m in await asyncio.wait_for(waiting, 5.0)] == [4]
    assert await cursor.ack(4) == 3
    assert [m.position for m in await cursor.take(10)] == [5, 6]
    await cursor.close()


async def test_a_cursor_leases_what_its_reader_sent_and_only_that(
    make_engine: MakeEngine,
) -> None:
    engine = await make_engine()
    feed, pipe = await _news(engine, lease=0.05)
    await publish(engine, feed, msg("sent"), msg("kept"))
    before = (await engine.stats()).counter("delivered")
    cursor = engine.cursor(ME, pipe.key)
    first, _unsent = await cursor.take(10)
    await cursor.sent(first.position)  # the second could not be sent: not leased
    assert (await engine.stats()).counter("delivered") - before == 1

    async def moved() -> bool:
        return await positions(engine, pipe) == [2, 3]

    await eventually(moved)  # the lease ran out: delivered again at a new position
    again = await engine.read(ME, pipe.key, 3)
    assert again is not None
    assert (text(again), again.redeliveries) == ("sent", 1)
    assert await positions(engine, pipe) == [2, 3]  # the unsent one stayed where it was
    await cursor.close()


async def test_stats_hold_the_delivery_latency_and_the_depths(engine: EngineService) -> None:
    feed, pipe = await _news(engine)
    before = await engine.stats()
    await publish(engine, feed, msg("1"), msg("22"))
    cursor = engine.cursor(ME, pipe.key)
    for message in await cursor.take(10):
        await cursor.sent(message.position)
    await cursor.close()
    after = await engine.stats()
    latency = after.latency
    assert len(latency.counts) == len(latency.bounds) + 1  # the last: above every bound
    assert list(latency.bounds) == sorted(latency.bounds)
    delivered = after.counter("delivered") - before.counter("delivered")
    assert delivered == 2
    assert sum(latency.counts) - sum(before.latency.counts) == delivered
    assert latency.total >= before.latency.total
    assert after.census.deepest == 2
    assert not after.closing


async def test_stats_count_the_bytes_waiting_in_feed_queues(engine: EngineService) -> None:
    feed = await new_feed(engine, "queue", "service")
    await publish(engine, feed, msg("four"), msg("five5"))
    census = (await engine.stats()).census
    assert census.queued == 2
    assert census.queued_bytes >= len(b"four") + len(b"five5")
    assert census.queued_on_disk == 0


async def test_stats_tell_when_the_engine_is_closing(make_engine: MakeEngine) -> None:
    engine = await make_engine()
    assert not (await engine.stats()).closing
    await engine.close()
    assert (await engine.stats()).closing


# ---------------------------------------------------------------- the traffic mirror
async def test_a_mirror_sink_is_offered_what_is_done_until_taken_away(
    engine: EngineService,
) -> None:
    feed, pipe = await _news(engine)
    offered: list[int] = []  # the rows each offer stands for

    def sink(item: tuple[object, ...], rows: int = 1, /) -> None:
        assert isinstance(item, tuple)
        offered.append(rows)

    engine.mirror_to(sink)
    await publish(engine, feed, msg("1"))
    assert sum(offered) == 2  # the publish and its route to the one pipe
    await engine.ack(ME, pipe.key, 1)
    assert sum(offered) == 3  # and the acknowledgement
    engine.mirror_to(None)
    await publish(engine, feed, msg("2"))
    await engine.ack(ME, pipe.key, 2)
    assert sum(offered) == 3
