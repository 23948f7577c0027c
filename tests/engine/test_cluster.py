"""Two Redis engines on one namespace, as two gateway nodes on one cluster (issue 24):
what one does, the other sees, with no stickiness. Redis-only: the embedded engine is
one process per data directory by design."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator
from typing import Any

import pytest
from blockbuster import BlockBuster

from feeds.config import EngineConfig
from feeds.redis import RedisEngine
from feeds.service import FeedInfo, Owned, PipeInfo
from restms.errors import NotFound
from restms.specs import EmbeddedContent, MessageSpec
from restms.webhook import WebhookOptions
from tests.nodes import CLUSTER_URL

from .conftest import SWEEP, forget_namespace
from .helpers import ME, eventually, join, msg, new_feed, new_pipe, publish, text, texts

HOOK = WebhookOptions(callback="http://127.0.0.1:9/hook", secret="s" * 32)


@pytest.fixture
async def nodes(blockbuster: BlockBuster) -> AsyncIterator[tuple[RedisEngine, RedisEngine]]:
    namespace = f"restms-test-{secrets.token_hex(6)}"
    config = EngineConfig(lease=0.1)
    made = [
        RedisEngine.open(config, CLUSTER_URL, namespace=namespace, sweep_interval=SWEEP)
        for _ in range(2)
    ]
    for engine in made:
        await engine.start()
    yield made[0], made[1]
    for engine in made:
        await engine.close()
    await forget_namespace(namespace)


async def joined_pipe(engine: RedisEngine, name: str) -> tuple[FeedInfo, PipeInfo]:
    """A fanout feed and a pipe joined to it, made on ``engine``."""
    feed = await new_feed(engine, name, "fanout")
    pipe = await new_pipe(engine)
    await join(engine, pipe, feed)
    return feed, pipe


async def test_a_read_waiting_on_one_node_wakes_for_a_publish_on_the_other(
    nodes: tuple[RedisEngine, RedisEngine],
) -> None:
    first, second = nodes
    _feed, pipe = await joined_pipe(first, "news")
    reader = asyncio.create_task(first.read(ME, pipe.key, 1, wait=5.0))
    await asyncio.sleep(0.05)
    assert not reader.done()
    # the second node never saw these resources: it routes with what the first made
    assert await publish(second, await second.feed(ME, "news"), msg("across")) == [1]
    got = await asyncio.wait_for(reader, 2.0)
    assert got is not None
    assert (got.position, text(got)) == (1, "across")
    assert await second.ack(ME, pipe.key, 1) == 1
    assert await texts(first, pipe) == []


@pytest.mark.parametrize(
    ("batch", "carried"),
    [
        ((msg("one", "a.b", headers=(("h", "v"),), mid="m1"),), True),
        ((msg("first"), msg("second"), msg("third")), True),  # the first is carried
        ((msg("expires", expiration=60_000),), False),  # a reader must check its expiry
        ((msg("x" * 9000),), False),  # larger than a wake-up carries
    ],
)
async def test_a_read_woken_across_nodes_is_answered_as_the_stream_holds_it(
    nodes: tuple[RedisEngine, RedisEngine], batch: tuple[MessageSpec, ...], carried: bool
) -> None:
    """The wake-up of a place carries its first message (library.lua, place): the
    reader waiting for it on another node is answered from it, and what it gets is
    what reading the stream gives."""
    first, second = nodes
    _feed, pipe = await joined_pipe(first, "carried")
    reads = 0
    ranged = first._range

    async def counted(*args: Any, **kwargs: Any) -> list[Any]:
        nonlocal reads
        reads += 1
        return await ranged(*args, **kwargs)

    first._range = counted  # type: ignore[method-assign]
    reader = asyncio.create_task(first.read(ME, pipe.key, 1, wait=5.0))
    await asyncio.sleep(0.05)
    assert not reader.done()
    assert reads == 1
    assert await publish(second, await second.feed(ME, "carried"), *batch) == [1] * len(batch)
    got = await asyncio.wait_for(reader, 2.0)
    assert reads == (1 if carried else 2)
    assert got == await second.look(ME, pipe.key, 1)
    assert got is not None
    sent = batch[0]
    assert (got.spec.address, got.spec.props, got.spec.headers) == (
        sent.address,
        sent.props,
        sent.headers,
    )
    assert [text(got)] == [c.value for c in sent.contents if isinstance(c, EmbeddedContent)]


async def test_a_change_on_one_node_reaches_the_others_cache(
    nodes: tuple[RedisEngine, RedisEngine],
) -> None:
    first, second = nodes
    seen = await second.feed(ME, "default")
    await new_feed(first, "sport")

    async def announced() -> bool:  # the news comes by pub/sub, a moment later
        return "sport" in (await second.domain("default")).feeds

    await eventually(announced)
    domain = await second.domain("default")
    waiter = asyncio.create_task(second.changed(None, domain, 5.0))
    await asyncio.sleep(0.05)
    await new_feed(first, "weather")
    changed = await asyncio.wait_for(waiter, 2.0)
    assert changed is not None
    assert "weather" in changed.feeds
    assert seen.key == "default"
    pipe = await new_pipe(second)
    reading = asyncio.create_task(first.read(ME, pipe.key, 1, wait=5.0))
    await asyncio.sleep(0.05)
    await second.delete_pipe(ME, pipe.key)
    with pytest.raises(NotFound):  # the waiting read on the other node ends (A6)
        await asyncio.wait_for(reading, 2.0)


async def test_pipes_made_at_once_on_two_nodes_do_not_turn_each_other_away(
    nodes: tuple[RedisEngine, RedisEngine], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pipe is a record under a new random key: its making depends on nothing else the
    catalogue holds, so pipes made at once are each one catalogue write, none sent again
    because another made the catalogue move first; both nodes then know them all."""
    writes: list[str] = []
    for engine in nodes:
        sent = engine.link.call

        async def counted(*command: Any, sent: Any = sent, **options: Any) -> Any:
            if command[1] == "FCALL" and str(command[2]).endswith("cat_change"):
                writes.append(command[2])
            return await sent(*command, **options)

        monkeypatch.setattr(engine.link, "call", counted)
    made = await asyncio.gather(*(new_pipe(engine) for engine in nodes for _ in range(16)))
    keys = {pipe.key for pipe in made}
    assert len(keys) == 32
    assert len(writes) == 32

    async def known() -> bool:  # the other node's news come by pub/sub, a moment later
        return all(keys <= set(engine.cache.pipes) for engine in nodes)

    await eventually(known)
    for engine in nodes:
        assert {(await engine.pipe(ME, key)).key for key in keys} == keys


async def test_a_node_started_later_counts_each_principals_resources_as_the_others(
    nodes: tuple[RedisEngine, RedisEngine],
) -> None:
    """A node that reads the whole catalogue at its start indexes each principal's pipes
    and feeds, and the webhook pipes, as the nodes that saw them made one by one (quotas,
    listings, the webhook pipes the nodes share out)."""
    first, second = nodes
    mine = [await new_pipe(first) for _ in range(3)]
    await new_pipe(second, owner="someone-else")
    await new_pipe(second, "webhook", owner="someone-else", webhook=HOOK)
    await new_feed(second)
    await second.delete_pipe(ME, mine[1].key)
    late = RedisEngine.open(EngineConfig(), CLUSTER_URL, namespace=first.keys.ns)
    await late.start()
    try:
        for engine in (first, second, late):
            await eventually(lambda engine=engine: _settled(engine))
            assert await engine.owned(ME) == Owned(feeds=1, pipes=2, joins=2)
            assert await engine.owned("someone-else") == Owned(feeds=0, pipes=2, joins=2)
            assert (await engine.stats()).census.webhook_pipes == 1
            assert {p.key for p in await engine.pipes(ME)} == {mine[0].key, mine[2].key}
    finally:
        await late.close()


async def _settled(engine: RedisEngine) -> bool:
    return len(engine.cache.pipes) == 4


async def test_a_lease_taken_on_one_node_runs_out_on_the_other(
    nodes: tuple[RedisEngine, RedisEngine],
) -> None:
    first, second = nodes
    feed, pipe = await joined_pipe(first, "jobs")
    await publish(first, feed, msg("job"))
    assert await first.read(ME, pipe.key, 1, lease=True) is not None
    await first.close()  # the node that leased it is gone: another sweeps its bucket
    again = await second.read(ME, pipe.key, 2, wait=5.0)
    assert again is not None
    assert (text(again), again.redeliveries) == ("job", 1)


async def test_one_message_id_published_on_two_nodes_at_once_is_routed_once(
    nodes: tuple[RedisEngine, RedisEngine],
) -> None:
    first, second = nodes
    feed, pipe = await joined_pipe(first, "orders")
    for round_ in range(20):
        mid = f"m{round_}"
        both = await asyncio.gather(
            first.publish(ME, feed.key, [msg(mid, mid=mid)]),
            second.publish(ME, feed.key, [msg(mid, mid=mid)]),
        )
        assert sorted(result.duplicates for result in both) == [(False,), (True,)]
    assert await texts(first, pipe) == [f"m{n}" for n in range(20)]


async def test_a_resource_deleted_on_one_node_is_gone_on_the_other_at_once(
    nodes: tuple[RedisEngine, RedisEngine],
) -> None:
    first, second = nodes
    feed, pipe = await joined_pipe(first, "matrix")
    (made,) = [j for j in (await first.pipe(ME, pipe.key)).joins if not j.is_default]
    assert (await second.join(ME, made.key)).key == made.key  # the other node knows it
    assert (await second.feed(ME, feed.key)).key == feed.key
    await first.delete_pipe(ME, pipe.key)
    await first.delete_feed(ME, feed.key)
    # asked at once, before the news of the change could reach the other node
    with pytest.raises(NotFound):
        await second.join(ME, made.key)
    with pytest.raises(NotFound):
        await second.feed(ME, feed.key)
    for key in (pipe.key, made.key):
        with pytest.raises(NotFound):
            await second.resolve(ME, key)
    with pytest.raises(NotFound):
        await second.pipe(ME, pipe.key)
    with pytest.raises(NotFound):
        await second.listing(ME, pipe.key)


async def test_a_withdrawal_takes_back_only_the_record_it_placed(
    nodes: tuple[RedisEngine, RedisEngine],
) -> None:
    from feeds.redis.placing import withdraw

    first, _second = nodes
    feed, pipe = await joined_pipe(first, "withdrawn")
    await publish(first, feed, msg("kept"))
    stream, _state, tag = first.keys.pipe(pipe.key)
    ((_id, fields),) = await first.link.call(tag, "XRANGE", stream, "0-1", "0-1")
    placed = fields[b"m"]
    # Position 1 holds another message than the one the failed publish placed there (a
    # master that failed over issued it again): it stays.
    await withdraw(first, {pipe.key: [1]}, {pipe.key: [placed + b" (another)"]})
    assert await texts(first, pipe) == ["kept"]
    await withdraw(first, {pipe.key: [1]}, {pipe.key: [placed]})
    assert await texts(first, pipe) == []
