"""The engine on its own (no HTTP): positions, acknowledgement, routing into pipes, queueing
feeds, ondemand pulls, requeue, service self-delete, staged contents and their expiry.

Engine methods are synchronous except :meth:`Engine.wait_message`, which the async
tests drive directly. IDs are the digest's (§4, §5, §6, §9).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from feeds import EngineConfig
from feeds.engine import Engine
from feeds.model import Blob, Feed, Join, PartRef, Pipe, Slot, StagedContent
from restms.errors import BadRequest, Forbidden, NotFound, ServiceUnavailable
from restms.specs import EmbeddedContent, FeedSpec, JoinSpec, LinkedContent, MessageSpec, PipeSpec

OWNER = "guest"


# ---------------------------------------------------------------- helpers
def engine(**config: Any) -> Engine:
    return Engine(EngineConfig(**config))


def new_feed(e: Engine, name: str | None, kind: str = "") -> Feed:
    feed, created = e.create_feed(e.domain("default"), FeedSpec(name=name, type=kind), OWNER)
    assert created
    return feed


def feed_path(feed: Feed) -> str:
    return f"/restms/feed/{feed.key}" if feed.public else f"/restms/resource/{feed.key}"


def new_pipe(e: Engine, kind: str = "") -> Pipe:
    return e.create_pipe(e.domain("default"), PipeSpec(type=kind), OWNER)


def join(
    e: Engine, pipe: Pipe, feed: Feed, address: str = "", headers: tuple[tuple[str, str], ...] = ()
) -> Join:
    joined, created = e.create_join(
        pipe, JoinSpec(feed_path=feed_path(feed), address=address, headers=headers)
    )
    assert created
    return joined


def msg(mid: str = "", address: str = "", **kw: Any) -> MessageSpec:
    props = (("message_id", mid),) if mid else ()
    return MessageSpec(address=address, props=props, **kw)


def ids(pipe: Pipe) -> list[str | None]:
    return [m.spec.prop("message_id") for m in pipe.messages.values()]


def jobs(*numbers: int) -> list[MessageSpec]:
    return [msg(f"J{n}") for n in numbers]


def part(e: Engine, key: str) -> PartRef:
    """The delivered content ``/restms/resource/{key}`` names."""
    found = e.resolve(key)
    assert isinstance(found, PartRef)
    return found


def staged_ref(staged: StagedContent) -> LinkedContent:
    return LinkedContent(path=f"/restms/resource/{staged.key}")


# ---------------------------------------------------------------- positions, listing, ack
def test_A3_positions_only_grow_and_the_asynclet_is_next() -> None:
    e = engine()
    pipe = new_pipe(e)
    default = e.default_feed
    assert e.listing(pipe) == ([], 1)
    assert e.publish(default, [msg("a", pipe.key), msg("b", pipe.key)]) == [1, 1]
    listed, asynclet = e.listing(pipe)
    assert [m.seq for m in listed] == [1, 2]
    assert asynclet == 3
    assert e.ack(Slot(pipe, 2)) == 2
    e.publish(default, [msg("c", pipe.key)])
    listed, asynclet = e.listing(pipe)
    assert [m.seq for m in listed] == [3]  # positions are never reused
    assert asynclet == 4


def test_A8_listing_cap_leaves_the_asynclet_out() -> None:
    e = engine(listing_cap=2)
    pipe = new_pipe(e)
    e.publish(e.default_feed, [msg(str(i), pipe.key) for i in range(2)])
    assert e.listing(pipe)[1] == 3
    e.publish(e.default_feed, [msg("2", pipe.key)])
    listed, asynclet = e.listing(pipe)
    assert [m.seq for m in listed] == [1, 2]
    assert asynclet is None


def test_D4_ack_removes_the_message_and_all_older() -> None:
    e = engine()
    pipe = new_pipe(e)
    e.publish(e.default_feed, [msg(str(i), pipe.key) for i in range(4)])
    assert e.ack(Slot(pipe, 3)) == 3
    assert ids(pipe) == ["3"]
    assert e.ack(Slot(pipe, 3)) == 0  # D5: again is harmless
    assert e.ack(Slot(pipe, 1)) == 0
    assert ids(pipe) == ["3"]


def test_A7_ack_on_pending_or_later_positions_is_a_no_op() -> None:
    e = engine()
    pipe = new_pipe(e)
    e.publish(e.default_feed, [msg("a", pipe.key), msg("b", pipe.key)])
    assert e.ack(Slot(pipe, 3)) == 0
    assert e.ack(Slot(pipe, 99)) == 0
    assert ids(pipe) == ["a", "b"]
    assert e.pending(Slot(pipe, 3))
    assert not e.pending(Slot(pipe, 2))
    assert not e.pending(Slot(pipe, 4))


def test_U2_A3_message_positions_resolve_to_slots() -> None:
    e = engine()
    pipe = new_pipe(e)
    assert e.resolve(f"{pipe.key}.7") == Slot(pipe, 7)
    with pytest.raises(NotFound):
        e.resolve(f"{pipe.key}.x")
    with pytest.raises(NotFound):
        e.resolve("nosuchpipe.1")


# ---------------------------------------------------------------- waiting (A2, A5, A6, A9)
async def test_A2_wait_returns_a_filled_slot_at_once() -> None:
    e = engine()
    pipe = new_pipe(e)
    e.publish(e.default_feed, [msg("x", pipe.key)])
    async with asyncio.timeout(0.5):
        found = await e.wait_message(Slot(pipe, 1), 10)
    assert found is not None
    assert found.spec.prop("message_id") == "x"


async def test_A2_A5_every_waiter_wakes_on_publish() -> None:
    e = engine()
    pipe = new_pipe(e)
    waiters = [asyncio.create_task(e.wait_message(Slot(pipe, 1), 5)) for _ in range(3)]
    await asyncio.sleep(0.02)
    assert not any(w.done() for w in waiters)
    e.publish(e.default_feed, [msg("x", pipe.key)])
    async with asyncio.timeout(0.5):
        found = await asyncio.gather(*waiters)
    assert all(m is not None and m.seq == 1 for m in found)


async def test_A9_wait_returns_none_when_the_time_runs_out() -> None:
    e = engine()
    pipe = new_pipe(e)
    async with asyncio.timeout(1):
        assert await e.wait_message(Slot(pipe, 1), 0.05) is None


@pytest.mark.parametrize("kind", ["", "ondemand"])
async def test_A6_a_wait_given_up_or_timed_out_leaves_nothing_behind(kind: str) -> None:
    e = engine()
    pipe = new_pipe(e, kind)
    waiter = asyncio.create_task(e.wait_message(Slot(pipe, 1), 5))
    await asyncio.sleep(0.02)
    assert pipe.waiting == 1
    assert pipe.demand == (1 if kind else 0)
    waiter.cancel()  # the client went away
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert (pipe.waiting, pipe.demand, e.deadlines._dead) == (0, 0, 1)
    async with asyncio.timeout(1):
        assert await e.wait_message(Slot(pipe, 1), 0.02) is None
    assert (pipe.waiting, pipe.demand, e.deadlines._dead) == (0, 0, 1)


@pytest.mark.parametrize("seq", [0, 2, 50])
async def test_A5_wait_beyond_the_asynclet_is_404_at_once(seq: int) -> None:
    e = engine()
    pipe = new_pipe(e)
    async with asyncio.timeout(0.5):
        with pytest.raises(NotFound):
            await e.wait_message(Slot(pipe, seq), 10)


async def test_D5_wait_on_an_acknowledged_position_is_404() -> None:
    e = engine()
    pipe = new_pipe(e)
    e.publish(e.default_feed, [msg("x", pipe.key)])
    e.ack(Slot(pipe, 1))
    with pytest.raises(NotFound):
        await e.wait_message(Slot(pipe, 1), 10)


async def test_A6_deleting_the_pipe_ends_waits_with_404() -> None:
    e = engine()
    pipe = new_pipe(e)
    waiter = asyncio.create_task(e.wait_message(Slot(pipe, 1), 5))
    await asyncio.sleep(0.02)
    e.delete_pipe(pipe)
    async with asyncio.timeout(0.5):
        with pytest.raises(NotFound):
            await waiter


async def test_shutdown_ends_waits_with_a_retriable_503() -> None:
    e = engine()
    pipe = new_pipe(e)
    waiter = asyncio.create_task(e.wait_message(Slot(pipe, 1), 5))
    await asyncio.sleep(0.02)
    e.shutdown()
    async with asyncio.timeout(0.5):
        with pytest.raises(ServiceUnavailable) as caught:
            await waiter
    assert caught.value.retry_after >= 1
    with pytest.raises(ServiceUnavailable):  # a new wait is refused at once
        await e.wait_message(Slot(pipe, 1), 5)
    e.publish(
        e.default_feed, [msg("late", address=pipe.key)]
    )  # a message already there is still served
    assert (await e.wait_message(Slot(pipe, 1), 5)) is not None


# ---------------------------------------------------------------- fanout-style routing
def test_F15_F16_default_join_and_default_feed_rules() -> None:
    e = engine()
    pipe = new_pipe(e)
    (default,) = pipe.joins.values()
    assert default.is_default
    assert default.feed is e.default_feed
    assert default.spec.address == pipe.key
    same, created = e.create_join(
        pipe, JoinSpec(feed_path="/restms/feed/default", address=pipe.key)
    )
    assert (same, created) == (default, False)
    with pytest.raises(Forbidden):
        e.create_join(pipe, JoinSpec(feed_path="/restms/feed/default", address="other"))
    with pytest.raises(Forbidden):
        e.delete_join(default)


def test_F10_identical_join_is_the_same_join() -> None:
    e = engine()
    feed = new_feed(e, "h", "headers")
    pipe = new_pipe(e)
    first = join(e, pipe, feed, "a", (("x", "1"), ("y", "2")))
    again, created = e.create_join(
        pipe, JoinSpec(feed_path="/restms/feed/h", address="a", headers=(("y", "2"), ("x", "1")))
    )
    assert (again, created) == (first, False)
    other, created = e.create_join(pipe, JoinSpec(feed_path="/restms/feed/h", address="b"))
    assert created
    assert other is not first


def test_G14_join_to_a_missing_feed_is_400() -> None:
    e = engine()
    pipe = new_pipe(e)
    with pytest.raises(BadRequest):
        e.create_join(pipe, JoinSpec(feed_path="/restms/feed/nope"))
    with pytest.raises(BadRequest):
        e.create_join(pipe, JoinSpec(feed_path="/elsewhere"))


def test_F12_bad_regexp_join_is_400_and_not_linked() -> None:
    e = engine()
    feed = new_feed(e, "rx", "regexp")
    pipe = new_pipe(e)
    with pytest.raises(BadRequest):
        e.create_join(pipe, JoinSpec(feed_path="/restms/feed/rx", address="("))
    assert feed.joins == {}
    assert len(pipe.joins) == 1


def test_F18_one_copy_per_pipe_and_count_per_matching_join() -> None:
    e = engine()
    feed = new_feed(e, "t", "topic")
    a, b = new_pipe(e), new_pipe(e)
    join(e, a, feed, "rec.*")
    join(e, a, feed, "#")
    join(e, b, feed, "rec.cars")
    assert e.publish(feed, [msg("1", "rec.cars"), msg("2", "misc"), msg("3", "x.y")]) == [3, 1, 1]
    assert ids(a) == ["1", "2", "3"]
    assert ids(b) == ["1"]


def test_F5_topic_routing_follows_join_changes() -> None:
    e = engine()
    feed = new_feed(e, "t", "topic")
    pipe = new_pipe(e)
    assert e.publish(feed, [msg("", "a.b")]) == [0]
    joined = join(e, pipe, feed, "a.*")
    assert e.publish(feed, [msg("", "a.b")]) == [1]
    e.delete_join(joined)
    assert e.publish(feed, [msg("", "a.b")]) == [0]


@pytest.mark.parametrize("kind", ["", "direct"])
def test_F7_exact_routing_star_is_literal(kind: str) -> None:
    e = engine()
    feed = new_feed(e, "d", kind)
    star, bob = new_pipe(e), new_pipe(e)
    join(e, star, feed, "*")
    join(e, bob, feed, "bob")
    assert e.publish(feed, [msg("1", "bob"), msg("2", "x"), msg("3", "*")]) == [1, 0, 1]
    assert ids(star) == ["3"]
    assert ids(bob) == ["1"]


def test_F6_headers_routing() -> None:
    e = engine()
    feed = new_feed(e, "h", "headers")
    eu, anyone = new_pipe(e), new_pipe(e)
    join(e, eu, feed, "", (("region", "eu"),))
    join(e, anyone, feed)
    counts = e.publish(
        feed,
        [
            msg("1", headers=(("region", "eu"),)),
            msg("2", headers=(("region", "us"),)),
            msg("3"),
        ],
    )
    assert counts == [2, 1, 1]
    assert ids(eu) == ["1"]


def test_F21_fanout_routing() -> None:
    e = engine()
    feed = new_feed(e, "f", "fanout")
    pipes = [new_pipe(e) for _ in range(3)]
    for pipe in pipes:
        join(e, pipe, feed, "ignored")
    assert e.publish(feed, [msg("1", "a"), msg("2", "")]) == [3, 3]
    assert all(ids(p) == ["1", "2"] for p in pipes)


def test_Q2_full_pipe_is_skipped_and_not_counted() -> None:
    e = engine(max_pipe_messages=1)
    feed = new_feed(e, "f", "fanout")
    full, free = new_pipe(e), new_pipe(e)
    join(e, full, feed)
    join(e, free, feed)
    e.publish(e.default_feed, [msg("pre", full.key)])
    assert e.publish(feed, [msg("1")]) == [1]
    assert ids(full) == ["pre"]
    assert ids(free) == ["1"]
    assert e.counters.skipped_full == 1


def test_Q2_F18_pipe_taking_its_last_slot_counts_every_matching_join() -> None:
    """Decided: count = joins matched whose pipe took the message."""
    e = engine(max_pipe_messages=1)
    feed = new_feed(e, "t", "topic")
    pipe = new_pipe(e)
    join(e, pipe, feed, "a.*")
    join(e, pipe, feed, "#")
    assert e.publish(feed, [msg("1", "a.b")]) == [2]
    assert ids(pipe) == ["1"]


# ---------------------------------------------------------------- rotator and service (F8)
@pytest.mark.parametrize("kind", ["rotator", "service"])
def test_F8_round_robin(kind: str) -> None:
    e = engine()
    feed = new_feed(e, "w", kind)
    workers = [new_pipe(e) for _ in range(3)]
    for worker in workers:
        join(e, worker, feed)
    assert e.publish(feed, jobs(*range(7))) == [1] * 7
    assert [ids(w) for w in workers] == [["J0", "J3", "J6"], ["J1", "J4"], ["J2", "J5"]]


def test_F8_round_robin_skips_full_pipes() -> None:
    e = engine(max_pipe_messages=1)
    feed = new_feed(e, "w", "rotator")
    a, b = new_pipe(e), new_pipe(e)
    join(e, a, feed)
    join(e, b, feed)
    assert e.publish(feed, jobs(1, 2, 3)) == [1, 1, 0]
    assert (ids(a), ids(b)) == (["J1"], ["J2"])
    assert [s.prop("message_id") for s, *_ in feed.queue] == ["J3"]
    e.ack(Slot(b, 1))  # room in b: the queue drains there
    assert ids(b) == ["J3"]
    assert not feed.queue


@pytest.mark.parametrize("kind", ["rotator", "service"])
def test_F8_queue_without_joins_then_drain_on_join_in_order(kind: str) -> None:
    e = engine()
    feed = new_feed(e, "w", kind)
    assert e.publish(feed, jobs(1, 2, 3)) == [0, 0, 0]
    assert e.counters.queued == 3
    worker = new_pipe(e)
    join(e, worker, feed)
    assert ids(worker) == ["J1", "J2", "J3"]
    assert not feed.queue


def test_F8_Q22_full_queue_rejects_the_whole_request() -> None:
    e = engine(max_feed_queue=2)
    feed = new_feed(e, "w", "rotator")
    e.publish(feed, jobs(1))
    with pytest.raises(ServiceUnavailable):
        e.publish(feed, jobs(2, 3))
    assert [s.prop("message_id") for s, *_ in feed.queue] == ["J1"]
    e.publish(feed, jobs(2))
    with pytest.raises(ServiceUnavailable):
        e.publish(feed, jobs(3))


def test_F8_Q22_queue_never_grows_past_its_bound() -> None:
    """With an eligible pipe that fills up mid-request, the rest may not overflow the queue."""
    e = engine(max_feed_queue=1, max_pipe_messages=1)
    feed = new_feed(e, "w", "rotator")
    worker = new_pipe(e)
    join(e, worker, feed)
    try:
        e.publish(feed, jobs(1, 2, 3))
    except ServiceUnavailable:
        assert not worker.messages  # refused as a whole
    assert len(feed.queue) <= 1


def test_F8_round_robin_order_is_kept_when_the_queue_is_nearly_full() -> None:
    e = engine(max_feed_queue=1)
    feed = new_feed(e, "w", "rotator")
    workers = [new_pipe(e) for _ in range(3)]
    for worker in workers:
        join(e, worker, feed)
    assert e.publish(feed, jobs(0, 1)) == [1, 1]
    assert [ids(w) for w in workers] == [["J0"], ["J1"], []]


def test_F8_service_deletes_itself_after_its_last_join() -> None:
    e = engine()
    feed = new_feed(e, "svc", "service")
    assert e.publish(feed, jobs(0)) == [0]  # no join yet: it stays and queues
    assert e.public_feed("svc") is feed
    a, b = new_pipe(e), new_pipe(e)
    ja = join(e, a, feed)
    join(e, b, feed)
    assert ids(a) == ["J0"]
    e.delete_join(ja)
    assert e.public_feed("svc") is feed
    e.delete_pipe(b)  # its join goes with it: the last one
    assert feed.deleted
    with pytest.raises(NotFound):
        e.public_feed("svc")
    with pytest.raises(NotFound):
        e.publish(feed, jobs(1))
    assert "svc" not in e.domain("default").feeds
    assert ids(a) == ["J0"]  # R5: delivered messages stay


def test_F8_service_discards_waiting_messages_when_it_goes() -> None:
    e = engine(max_pipe_messages=1)
    feed = new_feed(e, "svc", "service")
    worker = new_pipe(e)
    joined = join(e, worker, feed)
    e.publish(feed, jobs(1, 2, 3))
    assert len(feed.queue) == 2
    e.delete_join(joined)
    assert feed.deleted
    assert not feed.queue
    assert e.counters.discarded == 2


def test_F8_rotator_survives_its_last_join() -> None:
    e = engine()
    feed = new_feed(e, "rot", "rotator")
    worker = new_pipe(e)
    e.delete_join(join(e, worker, feed))
    assert not feed.deleted
    assert e.publish(feed, jobs(1)) == [0]


# ---------------------------------------------------------------- ondemand (P3-P5)
def test_P4_P5_ondemand_joins_only_queueing_feeds_and_has_no_default_join() -> None:
    e = engine()
    pipe = new_pipe(e, "ondemand")
    assert pipe.joins == {}
    for kind in ("", "fanout", "direct", "topic", "headers", "regexp"):
        feed = new_feed(e, f"f-{kind or 'plain'}", kind)
        with pytest.raises(Forbidden):
            e.create_join(pipe, JoinSpec(feed_path=feed_path(feed), address="a"))
    with pytest.raises(Forbidden):
        e.create_join(pipe, JoinSpec(feed_path="/restms/feed/default", address=pipe.key))
    join(e, pipe, new_feed(e, "r", "rotator"))
    join(e, pipe, new_feed(e, "s", "service"))


async def test_P3_ondemand_pulls_only_when_asked() -> None:
    e = engine()
    feed = new_feed(e, "w", "rotator")
    pipe = new_pipe(e, "ondemand")
    join(e, pipe, feed)
    assert e.publish(feed, jobs(1, 2)) == [0, 0]
    assert not pipe.messages
    got = await e.wait_message(Slot(pipe, 1), 1)
    assert got is not None
    assert got.spec.prop("message_id") == "J1"
    assert ids(pipe) == ["J1"]
    assert len(feed.queue) == 1
    # Asking for the next position while J1 is held pulls nothing.
    waiter = asyncio.create_task(e.wait_message(Slot(pipe, 2), 1))
    await asyncio.sleep(0.02)
    assert not waiter.done()
    assert ids(pipe) == ["J1"]
    e.ack(Slot(pipe, 1))  # room again, and a GET waits: J2 goes to it
    async with asyncio.timeout(0.5):
        got = await waiter
    assert got is not None
    assert got.spec.prop("message_id") == "J2"


async def test_P3_ondemand_waiter_is_eligible_for_the_next_publish() -> None:
    e = engine()
    feed = new_feed(e, "w", "rotator")
    idle, busy = new_pipe(e, "ondemand"), new_pipe(e, "ondemand")
    join(e, idle, feed)
    join(e, busy, feed)
    waiter = asyncio.create_task(e.wait_message(Slot(busy, 1), 1))
    await asyncio.sleep(0.02)
    assert e.publish(feed, jobs(1)) == [1]
    async with asyncio.timeout(0.5):
        got = await waiter
    assert got is not None
    assert not idle.messages
    assert busy.demand == 0


# ---------------------------------------------------------------- requeue (Q1)
def test_Q1_deleted_pipe_gives_unacknowledged_work_back_in_order() -> None:
    e = engine(max_pipe_messages=2)
    feed = new_feed(e, "w", "rotator")
    a, b = new_pipe(e), new_pipe(e)
    join(e, a, feed)
    join(e, b, feed)
    e.publish(feed, jobs(1, 2, 3, 4))
    assert (ids(a), ids(b)) == (["J1", "J3"], ["J2", "J4"])
    e.delete_pipe(a)
    assert e.counters.requeued == 2
    assert [s.prop("message_id") for s, *_ in feed.queue] == ["J1", "J3"]  # b is full
    e.ack(Slot(b, 1))
    assert ids(b) == ["J4", "J1"]
    e.ack(Slot(b, 3))
    assert ids(b) == ["J3"]
    assert not feed.queue


def test_Q1_acknowledged_and_fanout_messages_are_not_requeued() -> None:
    e = engine()
    rot = new_feed(e, "w", "rotator")
    fan = new_feed(e, "f", "fanout")
    a, b = new_pipe(e), new_pipe(e)
    join(e, a, rot)
    join(e, a, fan)
    join(e, b, rot)
    e.publish(rot, jobs(1))  # to a
    e.ack(Slot(a, 1))
    e.publish(fan, jobs(2))  # to a
    e.publish(rot, jobs(3))  # to b
    e.publish(rot, jobs(4))  # to a
    e.delete_pipe(a)
    assert ids(b) == ["J3", "J4"]
    assert e.counters.requeued == 1


async def test_Q1_ondemand_pipe_deleted_with_a_held_job_gives_it_back() -> None:
    e = engine()
    feed = new_feed(e, "w", "service")
    dying, other = new_pipe(e, "ondemand"), new_pipe(e, "ondemand")
    join(e, dying, feed)
    join(e, other, feed)
    e.publish(feed, jobs(1, 2))
    got = await e.wait_message(Slot(dying, 1), 1)
    assert got is not None
    assert got.spec.prop("message_id") == "J1"
    e.delete_pipe(dying)
    assert not feed.deleted
    assert [s.prop("message_id") for s, *_ in feed.queue] == ["J1", "J2"]
    got = await e.wait_message(Slot(other, 1), 1)
    assert got is not None
    assert got.spec.prop("message_id") == "J1"


def test_Q1_requeue_onto_a_service_that_goes_with_the_pipe_discards() -> None:
    e = engine()
    feed = new_feed(e, "svc", "service")
    only = new_pipe(e)
    join(e, only, feed)
    e.publish(feed, jobs(1))
    e.delete_pipe(only)
    assert feed.deleted
    assert not feed.queue


def test_R5_Q29_deleting_a_feed_keeps_delivered_messages_and_drops_staged() -> None:
    e = engine()
    feed = new_feed(e, "f", "fanout")
    pipe = new_pipe(e)
    joined = join(e, pipe, feed)
    staged = e.stage(feed, b"x", "text/plain", OWNER)
    e.publish(feed, jobs(1))
    e.delete_feed(feed)
    assert ids(pipe) == ["J1"]
    assert joined.deleted
    assert staged.deleted
    with pytest.raises(NotFound):
        e.resolve(staged.key)
    with pytest.raises(NotFound):
        e.resolve(joined.key)


def test_F17_configured_feeds_cannot_be_deleted() -> None:
    e = engine()
    with pytest.raises(Forbidden):
        e.delete_feed(e.default_feed)


# ---------------------------------------------------------------- staged contents (M7-M10)
def test_M7_publish_uses_the_staged_content_up_and_delivers_its_bytes() -> None:
    e = engine()
    feed = new_feed(e, "f", "fanout")
    a, b = new_pipe(e), new_pipe(e)
    join(e, a, feed)
    join(e, b, feed)
    staged = e.stage(feed, b"\x00bytes", "application/x-y", OWNER)
    assert e.publish(feed, [msg("1", contents=(staged_ref(staged),))]) == [2]
    assert staged.deleted
    with pytest.raises(NotFound):
        e.resolve(staged.key)
    for pipe in (a, b):
        (part,) = pipe.messages[1].parts
        assert part == Blob(b"\x00bytes", "application/x-y")


def test_M8_reusing_a_published_staged_content_is_404() -> None:
    e = engine()
    feed = new_feed(e, "f", "fanout")
    pipe = new_pipe(e)
    join(e, pipe, feed)
    staged = e.stage(feed, b"once", "text/plain", OWNER)
    e.publish(feed, [msg("1", contents=(staged_ref(staged),))])
    with pytest.raises(NotFound):
        e.publish(feed, [msg("2", contents=(staged_ref(staged),))])
    assert ids(pipe) == ["1"]


def test_M8_M10_same_staged_content_twice_in_one_request_is_404_and_not_used() -> None:
    e = engine()
    feed = new_feed(e, "f", "fanout")
    pipe = new_pipe(e)
    join(e, pipe, feed)
    staged = e.stage(feed, b"dup", "text/plain", OWNER)
    ref = staged_ref(staged)
    with pytest.raises(NotFound):
        e.publish(feed, [msg("1", contents=(ref,)), msg("2", contents=(ref,))])
    assert not staged.deleted
    assert e.resolve(staged.key) is staged
    assert not pipe.messages


def test_M9_M10_foreign_staged_content_is_403_and_nothing_is_used() -> None:
    e = engine()
    feed, other = new_feed(e, "f", "fanout"), new_feed(e, "g", "fanout")
    pipe = new_pipe(e)
    join(e, pipe, feed)
    good = e.stage(feed, b"good", "text/plain", OWNER)
    foreign = e.stage(other, b"foreign", "text/plain", OWNER)
    with pytest.raises(Forbidden):
        e.publish(
            feed,
            [msg("1", contents=(staged_ref(good),)), msg("2", contents=(staged_ref(foreign),))],
        )
    assert not good.deleted
    assert not foreign.deleted
    assert not pipe.messages
    assert e.publish(feed, [msg("3", contents=(staged_ref(good),))]) == [1]


@pytest.mark.parametrize(
    ("order", "error"), [(("foreign", "missing"), Forbidden), (("missing", "foreign"), NotFound)]
)
def test_M10_first_failing_message_decides_the_status(
    order: tuple[str, str], error: type[Exception]
) -> None:
    e = engine()
    feed, other = new_feed(e, "f", "fanout"), new_feed(e, "g", "fanout")
    refs = {
        "foreign": staged_ref(e.stage(other, b"x", "text/plain", OWNER)),
        "missing": LinkedContent(path="/restms/resource/never-staged"),
    }
    with pytest.raises(error):
        e.publish(feed, [msg(str(i), contents=(refs[name],)) for i, name in enumerate(order)])


def test_M10_F8_publish_refused_by_a_full_queue_keeps_its_staged_content() -> None:
    e = engine(max_feed_queue=1)
    feed = new_feed(e, "w", "rotator")
    e.publish(feed, jobs(1))
    staged = e.stage(feed, b"work", "text/plain", OWNER)
    with pytest.raises(ServiceUnavailable):
        e.publish(feed, [msg("2", contents=(staged_ref(staged),))])
    assert not staged.deleted
    assert e.resolve(staged.key) is staged


def test_D6_deleting_one_delivered_content_leaves_other_copies() -> None:
    e = engine()
    feed = new_feed(e, "f", "fanout")
    a, b = new_pipe(e), new_pipe(e)
    join(e, a, feed)
    join(e, b, feed)
    staged = e.stage(feed, b"shared", "text/plain", OWNER)
    embedded = EmbeddedContent(value="inline")
    e.publish(feed, [msg("1", contents=(staged_ref(staged), embedded))])
    ref_a = part(e, f"{a.key}.1.0")
    e.delete_part(ref_a)
    with pytest.raises(NotFound):
        e.part(ref_a)
    assert e.part(part(e, f"{b.key}.1.0")).data == b"shared"
    assert a.messages[1].parts == (None, embedded)
    with pytest.raises(NotFound):
        e.part(part(e, f"{a.key}.1.1"))  # an embedded content has no bytes to serve


# ---------------------------------------------------------------- expiry (M4)
class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_M4_sweep_drops_staged_contents_past_their_ttl() -> None:
    clock = Clock()
    e = Engine(EngineConfig(staged_ttl=10), mono=clock)
    feed = new_feed(e, "f", "fanout")
    old = e.stage(feed, b"old", "text/plain", OWNER)
    clock.now += 5
    young = e.stage(feed, b"young", "text/plain", OWNER)
    clock.now += 4.999
    assert e.sweep() == 0
    clock.now += 0.001
    assert e.sweep() == 1
    assert old.deleted
    assert not young.deleted
    with pytest.raises(NotFound):
        e.resolve(old.key)
    assert e.resolve(young.key) is young
    clock.now += 5
    assert e.sweep() == 1
    assert e.sweep() == 0
    assert e.counters.staged_expired == 2


def test_M4_sweep_leaves_used_contents_and_delivered_messages_alone() -> None:
    clock = Clock()
    e = Engine(EngineConfig(staged_ttl=1), mono=clock)
    feed = new_feed(e, "f", "fanout")
    pipe = new_pipe(e)
    join(e, pipe, feed)
    staged = e.stage(feed, b"kept", "text/plain", OWNER)
    e.publish(feed, [msg("1", contents=(staged_ref(staged),))])
    clock.now += 100
    assert e.sweep() == 0
    assert e.part(part(e, f"{pipe.key}.1.0")).data == b"kept"


def test_M4_expired_bytes_free_the_staging_budget() -> None:
    clock = Clock()
    e = Engine(EngineConfig(staged_ttl=1, max_staged_bytes=10), mono=clock)
    feed = new_feed(e, "f", "fanout")
    e.stage(feed, b"12345678", "text/plain", OWNER)
    with pytest.raises(ServiceUnavailable):
        e.stage(feed, b"123", "text/plain", OWNER)
    clock.now += 1
    assert e.sweep() == 1
    e.stage(feed, b"123", "text/plain", OWNER)
