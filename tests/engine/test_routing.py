"""Routing of every feed type, through the engine service (digest §6.2, F5-F21, P3-P5).

The same rules as tests/app/test_routing_http.py and test_delivery.py assert over HTTP,
here against :class:`feeds.service.EngineService` alone, so every engine is held to them.
"""

from __future__ import annotations

import asyncio

import pytest

from feeds.service import EngineService
from restms.errors import BadRequest, Forbidden, NotFound, ServiceUnavailable
from restms.specs import JoinSpec
from tests.unit.test_routing import F5_TABLE

from .conftest import MakeEngine
from .helpers import ME, join, msg, new_feed, new_pipe, publish, texts


async def test_F15_default_feed_routes_by_pipe_name(engine: EngineService) -> None:
    pipe = await new_pipe(engine)
    default = await engine.feed(ME, "default")
    assert [j.address for j in pipe.joins if j.is_default] == [pipe.key]
    assert await publish(engine, default, msg("hi", pipe.key), msg("no", "nobody")) == [1, 0]
    assert await texts(engine, pipe) == ["hi"]


@pytest.mark.parametrize("kind", ["", "direct"])
async def test_F7_exact_address_match_and_star_is_literal(engine: EngineService, kind: str) -> None:
    feed = await new_feed(engine, "mail", kind)
    bob, star = await new_pipe(engine), await new_pipe(engine)
    await join(engine, bob, feed, "bob")
    await join(engine, star, feed, "*")
    assert await publish(engine, feed, msg("1", "bob"), msg("2", "alice"), msg("3", "*")) == [
        1,
        0,
        1,
    ]
    assert await texts(engine, bob) == ["1"]
    assert await texts(engine, star) == ["3"]


async def test_F21_fanout_delivers_every_message_to_every_join(engine: EngineService) -> None:
    feed = await new_feed(engine, "news", "fanout")
    assert await publish(engine, feed, msg("lost", "x")) == [0]  # F19: no joins, dropped
    pipes = [await new_pipe(engine) for _ in range(3)]
    for index, pipe in enumerate(pipes):
        await join(engine, pipe, feed, f"ignored-{index}")
    assert await publish(engine, feed, msg("a", "x"), msg("b")) == [3, 3]
    for pipe in pipes:
        assert await texts(engine, pipe) == ["a", "b"]


# The table the pure matcher is held to (tests/unit), so both tiers agree.
@pytest.mark.parametrize(("pattern", "address", "expected"), F5_TABLE)
async def test_F5_topic_vectors(
    engine: EngineService, pattern: str, address: str, expected: bool
) -> None:
    feed = await new_feed(engine, "topics", "topic")
    pipe = await new_pipe(engine)
    await join(engine, pipe, feed, pattern)
    assert await publish(engine, feed, msg("m", address)) == [int(expected)]
    assert await texts(engine, pipe) == (["m"] if expected else [])


async def test_parrot_topic_subscribers_in_publish_order(engine: EngineService) -> None:
    """§7.3: three subscribers, five publishes, counts and deliveries as the digest says."""
    news = await new_feed(engine, "news", "topic")
    s1, s2, s3 = [await new_pipe(engine) for _ in range(3)]
    await join(engine, s1, news, "rec.pets.*")
    await join(engine, s2, news, "rec.#")
    await join(engine, s3, news, "rec.cars")
    order = ["rec.pets.dogs", "rec.cars", "rec.pets.cats", "rec.pets", "rec.pets.cats.tabby"]
    counts = await publish(engine, news, *(msg(a, a) for a in order))
    assert counts == [2, 2, 2, 1, 1]
    assert await texts(engine, s1) == ["rec.pets.dogs", "rec.pets.cats"]
    assert await texts(engine, s2) == order
    assert await texts(engine, s3) == ["rec.cars"]


async def test_F6_headers_feed_matches_every_join_header_exactly(engine: EngineService) -> None:
    feed = await new_feed(engine, "by-header", "headers")
    eu, both, every = [await new_pipe(engine) for _ in range(3)]
    await join(engine, eu, feed, "ignored", (("region", "eu"),))
    await join(engine, both, feed, "", (("region", "eu"), ("tier", "gold")))
    await join(engine, every, feed)  # no headers: every message
    messages = [
        msg("eu", headers=(("region", "eu"),)),
        msg("EU", headers=(("region", "EU"),)),  # values compare case-sensitively
        msg("gold", headers=(("tier", "gold"), ("region", "eu"), ("extra", "x"))),
        msg("none"),
    ]
    assert await publish(engine, feed, *messages) == [2, 1, 3, 1]
    assert await texts(engine, eu) == ["eu", "gold"]
    assert await texts(engine, both) == ["gold"]
    assert await texts(engine, every) == ["eu", "EU", "gold", "none"]


async def test_F12_regexp_feed_full_matches_the_address(engine: EngineService) -> None:
    feed = await new_feed(engine, "re", "regexp")
    pipe = await new_pipe(engine)
    await join(engine, pipe, feed, "order-[0-9]+")
    assert await publish(engine, feed, msg("a", "order-12"), msg("b", "xorder-12")) == [1, 0]
    assert await texts(engine, pipe) == ["a"]


@pytest.mark.parametrize("kind", ["rotator", "service"])
async def test_F8_round_robin_gives_each_message_to_one_join(
    engine: EngineService, kind: str
) -> None:
    feed = await new_feed(engine, f"rr-{kind}", kind)
    workers = [await new_pipe(engine) for _ in range(3)]
    for worker in workers:
        await join(engine, worker, feed, "ignored")
    assert await publish(engine, feed, *(msg(f"J{i}") for i in range(7))) == [1] * 7
    assert [await texts(engine, w) for w in workers] == [
        ["J0", "J3", "J6"],
        ["J1", "J4"],
        ["J2", "J5"],
    ]


@pytest.mark.parametrize("kind", ["rotator", "service"])
async def test_F8_messages_queue_without_joins_and_drain_on_join(
    engine: EngineService, kind: str
) -> None:
    feed = await new_feed(engine, f"q-{kind}", kind)
    result = await engine.publish(ME, feed.key, [msg("J1"), msg("J2")])
    assert (result.counts, result.queued, result.placed) == ((0, 0), 2, ())
    assert (await engine.feed(ME, feed.key)).queued == 2
    worker = await new_pipe(engine)
    await join(engine, worker, feed)
    assert await texts(engine, worker) == ["J1", "J2"]
    assert (await engine.feed(ME, feed.key)).queued == 0
    assert await publish(engine, feed, msg("J3")) == [1]
    assert await texts(engine, worker) == ["J1", "J2", "J3"]


async def test_F8_Q22_publish_to_a_full_queue_is_refused_whole(make_engine: MakeEngine) -> None:
    engine = await make_engine(max_feed_queue=2)
    feed = await new_feed(engine, "bounded", "rotator")
    assert await publish(engine, feed, msg("J1")) == [0]
    with pytest.raises(ServiceUnavailable) as refused:
        await publish(engine, feed, msg("J2"), msg("J3"))
    assert refused.value.retry_after >= 0
    assert await publish(engine, feed, msg("J2")) == [0]
    worker = await new_pipe(engine)
    await join(engine, worker, feed)
    assert await texts(engine, worker) == ["J1", "J2"]


async def test_F8_service_feed_deletes_itself_after_its_last_join(engine: EngineService) -> None:
    feed = await new_feed(engine, "jobs", "service")
    w1, w2 = await new_pipe(engine), await new_pipe(engine)
    j1, j2 = await join(engine, w1, feed), await join(engine, w2, feed)
    await engine.delete_join(ME, j1.key)
    assert (await engine.feed(ME, "jobs")).joins == 1
    await engine.delete_pipe(ME, w2.key)  # its join goes with it: the last one
    with pytest.raises(NotFound):
        await engine.feed(ME, "jobs")
    with pytest.raises(NotFound):
        await publish(engine, feed, msg("late"))
    with pytest.raises(NotFound):
        await engine.join(ME, j2.key)  # R6


async def test_F8_rotator_feed_survives_its_last_join(engine: EngineService) -> None:
    feed = await new_feed(engine, "work", "rotator")
    worker = await new_pipe(engine)
    made = await join(engine, worker, feed)
    await engine.delete_join(ME, made.key)
    assert (await engine.feed(ME, "work")).joins == 0


async def test_F5_F18_pipe_matched_by_two_joins_gets_one_copy_counted_twice(
    engine: EngineService,
) -> None:
    feed = await new_feed(engine, "t", "topic")
    pipe = await new_pipe(engine)
    await join(engine, pipe, feed, "a.*")
    await join(engine, pipe, feed, "#")
    result = await engine.publish(ME, feed.key, [msg("x", "a.b")])
    assert result.counts == (2,)
    assert [(p.pipe, p.first, p.last) for p in result.placed] == [(pipe.key, 1, 1)]
    assert await texts(engine, pipe) == ["x"]


async def test_F18_a_batch_counts_each_message_s_copies_when_a_pipe_fills_midway(
    engine: EngineService,
) -> None:
    # Messages of one address share their route; the count of each must still be its
    # own once a pipe of that route is full (the third "a" finds the small pipe full).
    feed = await new_feed(engine, "mixed", "topic")
    small, large = await new_pipe(engine, max_messages=2), await new_pipe(engine)
    await join(engine, small, feed, "a")
    await join(engine, large, feed, "a")
    await join(engine, large, feed, "#")
    batch = [msg("a1", "a"), msg("b1", "b"), msg("a2", "a"), msg("a3", "a"), msg("b2", "b")]
    result = await engine.publish(ME, feed.key, batch)
    assert result.counts == (3, 1, 3, 2, 1)
    assert {(p.pipe, p.first, p.last) for p in result.placed} == {
        (small.key, 1, 2),
        (large.key, 1, 5),
    }
    assert await texts(engine, small) == ["a1", "a2"]
    assert await texts(engine, large) == ["a1", "b1", "a2", "a3", "b2"]


async def test_F11_message_published_before_the_join_is_not_delivered(
    engine: EngineService,
) -> None:
    feed = await new_feed(engine, "late", "fanout")
    pipe = await new_pipe(engine)
    await publish(engine, feed, msg("before"))
    await join(engine, pipe, feed)
    await publish(engine, feed, msg("after"))
    assert await texts(engine, pipe) == ["after"]


async def test_F10_identical_join_is_the_existing_one(engine: EngineService) -> None:
    feed = await new_feed(engine, "h", "headers")
    pipe = await new_pipe(engine)
    first = await join(engine, pipe, feed, "", (("a", "1"), ("b", "2")))
    spec = JoinSpec(feed_path="/restms/feed/h", headers=(("b", "2"), ("a", "1")))
    again, created = await engine.create_join(ME, pipe.key, spec)
    assert (again.key, created) == (first.key, False)


async def test_F16_the_default_feed_takes_no_other_join(engine: EngineService) -> None:
    pipe = await new_pipe(engine)
    default_join = next(j for j in pipe.joins if j.is_default)
    with pytest.raises(Forbidden):
        await engine.create_join(ME, pipe.key, JoinSpec(feed_path="/restms/feed/default"))
    with pytest.raises(Forbidden):
        await engine.delete_join(ME, default_join.key)
    copy = JoinSpec(feed_path="/restms/feed/default", address=pipe.key)
    same, created = await engine.create_join(ME, pipe.key, copy)
    assert (same.key, created) == (default_join.key, False)


async def test_G14_a_join_naming_no_feed_is_400(engine: EngineService) -> None:
    pipe = await new_pipe(engine)
    with pytest.raises(BadRequest):
        await engine.create_join(ME, pipe.key, JoinSpec(feed_path="/restms/feed/nowhere"))


@pytest.mark.parametrize("kind", ["", "fanout", "direct", "topic", "headers"])
async def test_P4_ondemand_join_to_a_non_queueing_feed_is_403(
    engine: EngineService, kind: str
) -> None:
    feed = await new_feed(engine, f"f-{kind or 'default-type'}", kind)
    pipe = await new_pipe(engine, "ondemand")
    assert pipe.joins == ()  # P5: no default join
    with pytest.raises(Forbidden):
        await join(engine, pipe, feed)


async def test_P3_ondemand_takes_a_message_only_when_read(engine: EngineService) -> None:
    feed = await new_feed(engine, "od", "service")
    lazy, eager = await new_pipe(engine, "ondemand"), await new_pipe(engine, "ondemand")
    await join(engine, lazy, feed)
    await join(engine, eager, feed)
    assert await publish(engine, feed, msg("J1"), msg("J2")) == [0, 0]  # nobody asked
    assert await texts(engine, lazy) == []
    got = await engine.read(ME, eager.key, 1, wait=1.0)
    assert got is not None
    assert got.position == 1
    assert await texts(engine, eager) == ["J1"]  # one at a time
    assert await texts(engine, lazy) == []
    waiting = asyncio.create_task(engine.read(ME, lazy.key, 1, wait=5.0))
    got = await waiting
    assert got is not None
    assert await texts(engine, lazy) == ["J2"]


# (P2's "fifo" alias is the codec's: restms.specs turns it into "" before an engine sees it)
@pytest.mark.parametrize("kind", ["", "stream"])
async def test_P1_P6_pipe_types_with_a_default_join(engine: EngineService, kind: str) -> None:
    pipe = await new_pipe(engine, kind)
    assert pipe.type == kind
    assert [(j.feed, j.address, j.is_default) for j in pipe.joins] == [("default", pipe.key, True)]
