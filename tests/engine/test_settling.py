"""Redis engine only: a publish that failed after it may have placed copies is settled
(feeds/redis/settling.py): what it placed is taken back once a replica can confirm it,
and its message ids stay claimed until then, so a repeat neither places the message
beside a copy still to be taken back nor is told it was kept when it was not.

The failure is real: the engine asks for two replicas' confirmation (``WAIT 2``) where
each master has one, so the master places the copies and the confirmation never comes;
asking for one again stands for the replica coming back.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator

import pytest
from blockbuster import BlockBuster

from feeds.config import EngineConfig
from feeds.redis import RedisEngine
from feeds.redis.link import FUNCTIONS
from restms.errors import NotCommitted, ServiceUnavailable
from tests.nodes import CLUSTER_URL

from .conftest import SWEEP, forget_namespace
from .helpers import ME, eventually, msg, new_pipe, positions, texts
from .test_cluster import joined_pipe


@pytest.fixture
async def engine(blockbuster: BlockBuster) -> AsyncIterator[RedisEngine]:
    namespace = f"restms-test-{secrets.token_hex(6)}"
    made = RedisEngine.open(EngineConfig(), CLUSTER_URL, namespace=namespace, sweep_interval=SWEEP)
    await made.start()
    yield made
    await made.close()
    await forget_namespace(namespace)


def unconfirmable(engine: RedisEngine) -> None:
    engine.link.replicas = 2  # each master has one: WAIT 2 answers 1
    engine.link.wait_ms = 100  # (the confirmation that never comes: not a second's wait)


def confirmable(engine: RedisEngine) -> None:
    engine.link.replicas, engine.link.wait_ms = 1, 1000


async def test_an_unconfirmed_publish_is_taken_back_and_its_id_held_until_then(
    engine: RedisEngine,
) -> None:
    feed, pipe = await joined_pipe(engine, "orders")
    unconfirmable(engine)
    with pytest.raises(NotCommitted):
        await engine.publish(ME, feed.key, [msg("one", mid="m1", persistent=True)])
    # Not settled while no replica can confirm: a repeat waits for the outcome, then is
    # refused (the copy is still there, to be taken back).
    with pytest.raises(ServiceUnavailable):
        await engine.publish(ME, feed.key, [msg("one", mid="m1", persistent=True)])
    confirmable(engine)

    async def confirmed() -> bool:
        return engine.counters.withdrawn == 1

    await eventually(confirmed)
    assert await texts(engine, pipe) == []
    result = await engine.publish(ME, feed.key, [msg("one", mid="m1", persistent=True)])
    # placed, not a duplicate: the first was taken back
    assert (result.counts, result.duplicates) == ((1,), (False,))
    assert await texts(engine, pipe) == ["one"]
    assert await positions(engine, pipe) == [2]  # the first copy's position stays a gap


async def test_settling_takes_back_what_is_there_and_answers_the_same_when_asked_again(
    engine: RedisEngine,
) -> None:
    """The settle function: of a publish's copies in two pipes of one bucket, the one a
    reader acknowledged meanwhile is told gone (its message counts as kept), the other
    taken back; asked again, the same answer."""
    first, second = await new_pipe(engine), await new_pipe(engine)
    while engine.keys.pipe(second.key)[2] != engine.keys.pipe(first.key)[2]:
        second = await new_pipe(engine)  # (one bucket in 64)
    (s1, h1, tag), (s2, h2, _tag) = engine.keys.pipe(first.key), engine.keys.pipe(second.key)
    mark = f"{tag}:u:test"
    per_pipe = (100, 10_000, "reject", 0, 1, 3, 0, b"abc")
    place = ("FCALL", FUNCTIONS + "place", 5, s1, h1, s2, h2, mark, tag, 0, "test")
    placed = await engine.link.call(tag, *place, *per_pipe, *per_pipe, write=True, durable=True)
    assert placed == [0, 1, 0, 1]
    assert await engine.ack(ME, first.key, 1) == 1
    for _ in range(2):
        settled = await engine.link.call(
            tag, "FCALL", FUNCTIONS + "settle", 5, mark, s1, h1, s2, h2, tag,
            write=True, durable=True,
        )  # fmt: skip
        assert settled == b"g,t"
    assert await texts(engine, second) == []


async def test_a_place_that_reaches_the_master_after_its_settling_places_nothing(
    engine: RedisEngine,
) -> None:
    """As a place queued in a stopped master's socket would, run when it resumes."""
    feed, pipe = await joined_pipe(engine, "late")
    stream, state, tag = engine.keys.pipe(pipe.key)
    mark = f"{tag}:u:test"
    settled = await engine.link.call(
        tag, "FCALL", FUNCTIONS + "settle", 3, mark, stream, state, tag, write=True, durable=True
    )
    assert settled == b""  # nothing was placed there
    place = ("FCALL", FUNCTIONS + "place", 3, stream, state, mark, tag, 0, "test")
    with pytest.raises(NotCommitted):
        await engine.link.call(tag, *place, 10, 1000, "reject", 0, 1, 3, 0, b"abc", write=True)
    assert await texts(engine, pipe) == []
    await engine.publish(ME, feed.key, [msg("next")])  # the next publish's position: 1
    assert await positions(engine, pipe) == [1]
