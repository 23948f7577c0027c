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
from redis.asyncio import Redis

from feeds.config import EngineConfig
from feeds.redis import RedisEngine, resources, syncing, upkeep
from feeds.redis.catalogue import Cache
from feeds.redis.link import FUNCTIONS
from feeds.service import FeedInfo, Owned, PipeInfo
from restms.errors import NotFound
from restms.specs import EmbeddedContent, MessageSpec
from restms.webhook import WebhookOptions
from tests.cluster_state import master_port, role, whole
from tests.nodes import CLUSTER_URL, DRIVER

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


def _catalogue(cache: Cache) -> tuple[Any, ...]:
    """What a node's cache holds, as every node's should once the news is in."""
    return (
        cache.version,
        {key: set(feed.joins) for key, feed in cache.feeds.items()},
        {key: set(pipe.joins) for key, pipe in cache.pipes.items()},
        set(cache.joins),
        {owner: set(keys) for owner, keys in cache.pipes_of.items()},
    )


async def test_a_node_reads_the_whole_catalogue_a_piece_at_a_time(
    nodes: tuple[RedisEngine, RedisEngine], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node reading the whole catalogue (at its start, or when it fell further behind
    than the log of changes reaches) takes it a piece at a time, the event loop turning
    between the pieces; a join read before its pipe or feed is linked all the same."""
    first, _ = nodes
    monkeypatch.setattr(syncing, "PIECE", 25)
    feeds = [await new_feed(first, f"f{i}", "fanout") for i in range(5)]
    pipes = await asyncio.gather(*(new_pipe(first) for _ in range(150)))
    for i, pipe in enumerate(pipes[:50]):
        await join(first, pipe, feeds[i % 5])
    taken, most, started = 0, 0, False
    apply = Cache.apply

    def counted(cache: Cache, name: str, value: bytes | None) -> None:
        nonlocal taken, most
        taken += 1
        most = max(most, taken)
        apply(cache, name, value)

    async def turns() -> None:  # how many fields were taken between two turns of the loop
        nonlocal taken
        while not started:
            taken = 0
            await asyncio.sleep(0)

    monkeypatch.setattr(Cache, "apply", counted)
    turning = asyncio.create_task(turns())
    late = RedisEngine.open(EngineConfig(), CLUSTER_URL, namespace=first.keys.ns)
    try:
        await late.start()
        started = True
        await turning
        assert len(late.cache.pipes) == 150
        assert len(late.cache.joins) == 200
        assert 0 < most <= 2 * 25  # (HSCAN's COUNT is a hint: a piece may be a little over)
        assert _catalogue(late.cache) == _catalogue(first.cache)
    finally:
        await late.close()


async def test_what_changes_while_a_node_reads_the_catalogue_is_in_its_cache(
    nodes: tuple[RedisEngine, RedisEngine], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The read of the whole catalogue is no snapshot: what another node changes once
    the pieces are read (pipes made and joined, pipes deleted that the read still had)
    is in the cache the node takes, as the news since the version the read began at."""
    first, second = nodes
    monkeypatch.setattr(syncing, "PIECE", 10)
    feed = await new_feed(first, "busy", "fanout")
    old = await asyncio.gather(*(new_pipe(first) for _ in range(30)))
    late = RedisEngine.open(EngineConfig(), CLUSTER_URL, namespace=first.keys.ns)
    read, changed = asyncio.Event(), asyncio.Event()
    sent, asked = late.link.call, 0

    async def held(*command: Any, **options: Any) -> Any:
        nonlocal asked
        if command[1] == "FCALL" and str(command[2]).endswith("cat_since"):
            asked += 1
            if asked == 2:  # the news after the pieces (the first: before the read)
                read.set()
                await asyncio.wait_for(changed.wait(), 30)
        return await sent(*command, **options)

    taken: list[tuple[Any, ...]] = []
    swap = Cache.swap

    def kept(cache: Cache, other: Cache) -> None:
        taken.append(_catalogue(other))
        swap(cache, other)

    monkeypatch.setattr(late.link, "call", held)
    monkeypatch.setattr(Cache, "swap", kept)
    starting = asyncio.create_task(late.start())
    await asyncio.wait_for(read.wait(), 30)
    for pipe in old[:10]:
        made = await new_pipe(second)
        await join(second, made, feed)
        await second.delete_pipe(ME, pipe.key)
    expected = _catalogue(second.cache)
    changed.set()
    try:
        await starting
        assert taken == [expected]
        assert len(late.cache.pipes) == 30
        assert len(late.cache.feeds["busy"].joins) == 10
    finally:
        await late.close()


async def test_a_node_reads_the_catalogue_again_when_more_changed_meanwhile_than_the_log_keeps(
    nodes: tuple[RedisEngine, RedisEngine], monkeypatch: pytest.MonkeyPatch
) -> None:
    """When more changes came during the read than the catalogue's log keeps (about
    10,000), the news since its beginning are no longer there: the node reads it all
    again, and has every change."""
    first, _ = nodes
    late = RedisEngine.open(EngineConfig(), CLUSTER_URL, namespace=first.keys.ns)
    passes, churned = 0, asyncio.Event()
    sent = late.link.batch

    async def held(key: str, commands: list[Any], **options: Any) -> Any:
        nonlocal passes
        if commands[0][0] == "HSCAN" and commands[0][2] == 0:
            passes += 1
            if passes == 1:
                await asyncio.wait_for(churned.wait(), 60)
        return await sent(key, commands, **options)

    monkeypatch.setattr(late.link, "batch", held)
    starting = asyncio.create_task(late.start())
    for _ in range(10_500 // 25):
        await asyncio.gather(*(new_pipe(first) for _ in range(25)))
    churned.set()
    try:
        await starting
        assert passes == 2
        assert len(late.cache.pipes) == 10_500
        assert _catalogue(late.cache) == _catalogue(first.cache)
    finally:
        await late.close()


async def test_a_catalogue_read_whole_keeps_what_the_node_changed_meanwhile(
    nodes: tuple[RedisEngine, RedisEngine], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node that reads the catalogue whole swaps in no cache older than the one in
    use: a pipe it made while the read's news were on their way stays known (it was
    dropped from the node's cache until its next news, and a look-up of the pipe just
    made answered 404)."""
    node, _ = nodes
    await new_feed(node, "t", "topic")
    calls, held, release = 0, asyncio.Event(), asyncio.Event()
    sent = node.link.call

    async def late(key: str, *args: Any, **options: Any) -> Any:
        nonlocal calls
        reply = await sent(key, *args, **options)
        if args[:2] == ("FCALL", FUNCTIONS + "cat_since"):
            calls += 1
            if calls == 1:  # the news after the read, answered: held on their way
                held.set()
                await asyncio.wait_for(release.wait(), 30)
        return reply

    monkeypatch.setattr(node.link, "call", late)
    reading = asyncio.create_task(syncing.reload(node, node.cache.version))
    await asyncio.wait_for(held.wait(), 30)
    pipe = await new_pipe(node)
    release.set()
    await reading
    assert pipe.key in node.cache.pipes
    assert (await node.pipe(ME, pipe.key)).key == pipe.key


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


async def test_a_pipe_two_nodes_drop_at_once_is_dropped_by_one(
    nodes: tuple[RedisEngine, RedisEngine],
) -> None:
    """The look for idle pipes counts a pipe it collected only when its own drop took it
    (two nodes that both found it idle would count it twice)."""
    first, second = nodes
    pipe = await new_pipe(first)
    await second.pipe(ME, pipe.key)  # known to both
    dropped = await asyncio.gather(
        resources.drop_pipe(first, pipe.key), resources.drop_pipe(second, pipe.key)
    )
    assert sorted(dropped) == [False, True]
    for engine in nodes:
        with pytest.raises(NotFound):
            await engine.pipe(ME, pipe.key)


async def test_idle_pipes_are_looked_at_once_a_round_across_nodes_and_collected_once(
    blockbuster: BlockBuster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Q1 on several nodes: the pipes of a bucket are looked at by one node a round, so
    each pipe's last use is read about once a round for the two nodes, not once by
    each, and an idle pipe is collected once; a pipe a cursor holds open on one node is
    not collected by the other."""
    namespace = f"restms-test-{secrets.token_hex(6)}"
    config = EngineConfig(pipe_idle_timeout=2.0)  # a round: every 0.2 s
    made = [
        RedisEngine.open(config, CLUSTER_URL, namespace=namespace, sweep_interval=SWEEP)
        for _ in range(2)
    ]
    looks, rounds = [0, 0], [0, 0]
    for index, engine in enumerate(made):
        batch = engine.link.batch

        async def counted(
            key: str, commands: Any, *, index: int = index, batch: Any = batch, **options: Any
        ) -> Any:
            looks[index] += sum(1 for c in commands if c[0] == "HGET" and c[-1] == "at")
            return await batch(key, commands, **options)

        monkeypatch.setattr(engine.link, "batch", counted)
    collect = upkeep.collect_idle

    async def counted_round(engine: RedisEngine, every: float) -> None:
        rounds[made.index(engine)] += 1
        await collect(engine, every)

    monkeypatch.setattr(upkeep, "collect_idle", counted_round)
    first, second = made
    cursor = None
    try:
        for engine in made:
            await engine.start()
        feed = await new_feed(first, "news", "fanout")
        held = await new_pipe(second)
        await join(second, held, feed)
        await publish(second, feed, msg("1"))
        cursor = second.cursor(ME, held.key)
        assert text(await anext(cursor)) == "1"  # read, and not waiting: as a busy bridge
        idle = await asyncio.gather(*(new_pipe(first) for _ in range(40)))
        looks[:], rounds[:] = [0, 0], [0, 0]
        await asyncio.sleep(1.0)  # about five rounds each, every pipe still in use
        pipes = 41
        assert max(rounds) >= 3
        assert sum(looks) <= 1.5 * max(rounds) * pipes  # each on its own: 2 * rounds * pipes

        async def collected() -> bool:
            return all(p.key not in engine.cache.pipes for p in idle for engine in made)

        await eventually(collected, timeout=15.0)
        await asyncio.sleep(0.5)  # a node that would collect one again has had its round
        assert first.counters.collected + second.counters.collected == 40
        assert (await first.pipe(ME, held.key)).key == held.key
    finally:
        if cursor is not None:
            await cursor.close()
        for engine in made:
            await engine.close()
        await forget_namespace(namespace)


@pytest.mark.alone  # a master of the cluster steps down
async def test_a_failover_during_a_read_of_the_whole_catalogue_has_it_read_again(
    nodes: tuple[RedisEngine, RedisEngine], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An ``HSCAN`` cursor means nothing to another server: when the catalogue's master
    fails over while a node reads the whole catalogue, the node reads it all again from
    the new master, and misses nothing (the cursor carried over would have skipped
    fields)."""
    first, _ = nodes
    monkeypatch.setattr(syncing, "PIECE", 25)
    await asyncio.gather(*(new_pipe(first) for _ in range(150)))
    late = RedisEngine.open(EngineConfig(), CLUSTER_URL, namespace=first.keys.ns)
    pieces, passes = 0, 0
    reading, failed_over = asyncio.Event(), asyncio.Event()
    sent = late.link.batch

    async def held(key: str, commands: list[Any], **options: Any) -> Any:
        nonlocal pieces, passes
        if commands[0][0] == "HSCAN":
            passes += commands[0][2] == 0
            pieces += 1
            if pieces == 2:  # a piece read from the master about to step down
                reading.set()
                await asyncio.wait_for(failed_over.wait(), 30)
        return await sent(key, commands, **options)

    monkeypatch.setattr(late.link, "batch", held)
    starting = asyncio.create_task(late.start())
    try:
        await asyncio.wait_for(reading.wait(), 30)
        master = await master_port(first.keys.cat)
        replica = int((await role(master))[2][0][1])
        async with Redis(host="127.0.0.1", port=replica, driver_info=DRIVER) as instance:
            await instance.execute_command("CLUSTER", "FAILOVER")
        for _ in range(100):  # until the old master knows it too (bounded: 10 s)
            if (await role(master))[0] == b"slave":
                break
            await asyncio.sleep(0.1)
        assert (await role(replica))[0] == b"master"
        failed_over.set()
        await asyncio.wait_for(starting, 30)
        assert _catalogue(late.cache) == _catalogue(first.cache)
        assert passes == 2
    finally:
        failed_over.set()
        await late.close()
        await eventually(whole, timeout=30.0)  # the old master a replica in step again


async def _two_hundred_pipes(engine: RedisEngine) -> list[PipeInfo]:
    """200 pipes, the first three joined to a fanout feed that had two messages."""
    made = list(await asyncio.gather(*(new_pipe(engine) for _ in range(200))))
    feed = await new_feed(engine, None, "fanout")
    for pipe in made[:3]:
        await join(engine, pipe, feed)
    await publish(engine, feed, msg("one"), msg("two"))
    return made


async def test_every_pipe_s_state_is_read_a_bucket_at_a_time(
    nodes: tuple[RedisEngine, RedisEngine], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The admin API's state of every pipe (its list of pipes, and its overview's
    webhook totals) reads a bucket's pipes in one round trip (up to STATES_AT_ONCE
    of them), not four a pipe, and each state is the one a look at that pipe alone
    gives."""
    first, second = nodes
    made = await _two_hundred_pipes(first)
    hook = WebhookOptions(callback="http://127.0.0.1:9/hook", secret="s" * 32)
    hooked = await new_pipe(second, "webhook", webhook=hook)
    calls = 0
    batch, call = first.link.batch, first.link.call

    def looks(command: tuple[Any, ...]) -> bool:  # a range of no message, not a use
        return command[0] == "FCALL" and str(command[1]).endswith("_range") and not command[8]

    async def counted_batch(key: str, commands: list[Any], **options: Any) -> Any:
        nonlocal calls
        calls += any(map(looks, commands))  # (the engine's own rounds go on meanwhile)
        return await batch(key, commands, **options)

    async def counted_call(key: str, *command: Any, **options: Any) -> Any:
        nonlocal calls
        calls += looks(command)
        return await call(key, *command, **options)

    monkeypatch.setattr(first.link, "batch", counted_batch)
    monkeypatch.setattr(first.link, "call", counted_call)
    states = {state.info.key: state for state in await first.pipe_states()}
    assert 0 < calls <= 64  # the buckets (BUCKETS): a pipe at a time, 201 pipes took 402
    monkeypatch.undo()
    assert set(states) == {p.key for p in made} | {hooked.key}
    for pipe in (*made[:4], hooked):
        assert states[pipe.key] == await first.pipe_state(None, pipe.key)
    assert [states[p.key].info.held for p in made[:4]] == [2, 2, 2, 0]
    assert states[made[0].key].bytes == len("one") + len("two")
    assert states[hooked.key].webhook is not None
    assert states[hooked.key].webhook.state == "verifying"
    assert states[made[0].key].webhook is None


async def test_the_census_reads_a_bucket_s_pipes_in_one_round_trip(
    nodes: tuple[RedisEngine, RedisEngine], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The census (the engine's stats: every scrape of /metrics, the admin API) reads
    what each pipe holds a bucket at a time, one round trip for all of its pipes, not
    one a pipe, and counts the same."""
    first, _ = nodes
    await _two_hundred_pipes(first)
    calls = 0
    batch = first.link.batch

    async def counted(key: str, commands: list[Any], **options: Any) -> Any:
        nonlocal calls
        calls += commands[0][0] == "XLEN"  # (the engine's own rounds go on meanwhile)
        return await batch(key, commands, **options)

    monkeypatch.setattr(first.link, "batch", counted)
    census = (await first.stats()).census
    assert calls <= 64  # the buckets (BUCKETS): 200 pipes were 200 round trips
    assert dict(census.pipes) == {"": 200}
    assert census.messages == 6
    assert census.deepest == 2
    assert census.held_bytes == 3 * (len("one") + len("two"))
