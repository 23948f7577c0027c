"""The engine and its SQLite store without HTTP: what a restart brings back, and what not."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from feeds import EngineConfig
from feeds.engine import Engine
from feeds.model import Blob, Feed, PartRef, Pipe, Slot
from feeds.store import Store, StoreError
from restms.specs import (
    Duplicate,
    EmbeddedContent,
    FeedSpec,
    JoinSpec,
    LinkedContent,
    MessageSpec,
    PipeOptions,
    PipeSpec,
)


def msg(mid: str, *, persistent: bool = True, ttl: str | None = None, **kw: object) -> MessageSpec:
    props = [("message_id", mid)]
    if persistent:
        props.insert(0, ("delivery_mode", "2"))
    if ttl is not None:
        props.insert(1, ("expiration", ttl))
    return MessageSpec(props=tuple(props), contents=(EmbeddedContent(value=f"body {mid}"),), **kw)


async def opened(path: Path, config: EngineConfig | None = None) -> tuple[Engine, Store]:
    store = Store(path)
    snapshot = await asyncio.to_thread(store.load)
    engine = Engine(config)
    engine.restore(snapshot)
    store.start(asyncio.get_running_loop())
    return engine, store


async def settle(engine: Engine, store: Store) -> None:
    """Commit what a publish did, as the gateway does before its reply: until then
    readers see none of it (feeds.settling)."""
    future = engine.commit_journal(store.submit)
    assert future is not None
    await future
    await asyncio.sleep(0)  # what it held back shows


async def commit_and_close(engine: Engine, store: Store) -> None:
    await store.submit(engine.take_journal())
    await asyncio.to_thread(store.close)


def ids(pipe: Pipe) -> list[tuple[int, str | None]]:
    return [(seq, m.spec.prop("message_id")) for seq, m in pipe.messages.items()]


def pipe_of(engine: Engine, key: str) -> Pipe:
    found = engine.resolve(key)
    assert isinstance(found, Pipe)
    return found


async def test_resources_and_persistent_messages_come_back_under_the_same_keys(
    tmp_path: Path,
) -> None:
    engine, store = await opened(tmp_path)
    domain = engine.domain("default")
    news, _ = engine.create_feed(domain, FeedSpec(name="news", type="topic", title="T"), "ann")
    private, _ = engine.create_feed(domain, FeedSpec(name=None, type="fanout"), "bob")
    pipe = engine.create_pipe(domain, PipeSpec(title="mine"), "ann")
    join = engine.create_join(pipe, JoinSpec(feed_path="/restms/feed/news", address="a.*"))[0]
    headers_join = engine.create_join(
        pipe,
        JoinSpec(feed_path=f"/restms/resource/{private.key}", type="", headers=(("k", "v"),)),
    )[0]
    engine.publish(news, [msg("p1", address="a.b"), msg("n1", persistent=False, address="a.b")])
    engine.publish(news, [msg("p2", address="a.c"), msg("p3", address="a.d")])
    next_seq = pipe.next_seq
    await commit_and_close(engine, store)

    again, store2 = await opened(tmp_path)
    restored = pipe_of(again, pipe.key)
    assert restored.title == "mine"
    assert restored.owner == "ann"
    assert ids(restored) == [(1, "p1"), (3, "p2"), (4, "p3")]  # the non-persistent one is gone
    assert restored.next_seq == next_seq  # positions never repeat
    assert again.public_feed("news").title == "T"
    assert isinstance(again.resolve(private.key), Feed)
    assert {j.key for j in restored.joins.values()} == {
        join.key,
        headers_join.key,
        *(j.key for j in pipe.joins.values() if j.is_default),
    }
    assert again.resolve(headers_join.key).spec.headers == (("k", "v"),)  # type: ignore[union-attr]
    message = restored.messages[3]
    assert message.parts == (EmbeddedContent(value="body p2"),)
    assert message.feed_name == "news"
    # and routing works on what came back
    assert again.publish(again.public_feed("news"), [msg("p4", address="a.z")]) == [1]
    await commit_and_close(again, store2)


async def test_acknowledged_expired_and_deleted_state_stays_gone(tmp_path: Path) -> None:
    engine, store = await opened(tmp_path)
    domain = engine.domain("default")
    feed, _ = engine.create_feed(domain, FeedSpec(name="f", type="fanout"), "")
    gone_feed, _ = engine.create_feed(domain, FeedSpec(name="gone", type="fanout"), "")
    pipe = engine.create_pipe(domain, PipeSpec(), "")
    doomed = engine.create_pipe(domain, PipeSpec(), "")
    engine.create_join(pipe, JoinSpec(feed_path="/restms/feed/f"))
    engine.create_join(doomed, JoinSpec(feed_path="/restms/feed/f"))
    engine.publish(feed, [msg("m1"), msg("m2"), msg("m3"), msg("short", ttl="0")])
    await settle(engine, store)
    engine.ack(Slot(pipe, 2))  # m1 and m2
    engine.delete_pipe(doomed)
    engine.delete_feed(gone_feed)
    engine.message(Slot(pipe, 4))  # the expired one is found expired and dropped
    await commit_and_close(engine, store)

    again, store2 = await opened(tmp_path)
    assert ids(pipe_of(again, pipe.key)) == [(3, "m3")]
    with pytest.raises(Exception, match="no such resource"):
        again.resolve(doomed.key)
    assert "gone" not in again.public_feeds
    await commit_and_close(again, store2)


async def test_deleted_contents_stay_deleted(tmp_path: Path) -> None:
    engine, store = await opened(tmp_path)
    domain = engine.domain("default")
    feed, _ = engine.create_feed(domain, FeedSpec(name="f", type="fanout"), "")
    pipe = engine.create_pipe(domain, PipeSpec(), "")
    engine.create_join(pipe, JoinSpec(feed_path="/restms/feed/f"))
    staged = engine.stage(feed, b"\x00\x01binary", "application/octet-stream", "")
    linked = MessageSpec(
        props=(("delivery_mode", "2"),),
        contents=(
            EmbeddedContent(value="keep"),
            LinkedContent(path=f"/restms/resource/{staged.key}"),
        ),
    )
    engine.publish(feed, [linked, linked.__class__(props=linked.props)])
    await settle(engine, store)
    engine.delete_part(PartRef(pipe, 1, 0))
    await commit_and_close(engine, store)

    again, store2 = await opened(tmp_path)
    parts = pipe_of(again, pipe.key).messages[1].parts
    assert parts == (None, Blob(b"\x00\x01binary", "application/octet-stream"))
    await commit_and_close(again, store2)


@pytest.mark.parametrize("kind", ["rotator", "service"])
async def test_queued_work_survives_in_order_and_requeued_work_goes_first(
    tmp_path: Path, kind: str
) -> None:
    engine, store = await opened(tmp_path)
    domain = engine.domain("default")
    feed, _ = engine.create_feed(domain, FeedSpec(name="work", type=kind), "")
    worker = engine.create_pipe(domain, PipeSpec(), "")
    engine.create_join(worker, JoinSpec(feed_path="/restms/feed/work"))
    engine.publish(feed, [msg("w1")])  # goes to the worker
    keeper = engine.create_pipe(domain, PipeSpec(type="ondemand"), "")
    engine.create_join(keeper, JoinSpec(feed_path="/restms/feed/work"))  # service: stays alive
    engine.publish(feed, [msg("w2", persistent=False)])  # worker has room: it takes it
    engine.delete_pipe(worker)  # w1 (persistent) and w2 go back to the front of the queue
    engine.publish(feed, [msg("w3"), msg("w4")])
    assert [s.prop("message_id") for s, *_ in feed.queue] == ["w1", "w2", "w3", "w4"]
    await commit_and_close(engine, store)

    again, store2 = await opened(tmp_path)
    queue = again.public_feed("work").queue
    assert [s.prop("message_id") for s, *_ in queue] == ["w1", "w3", "w4"]
    # a new worker takes them in that order
    fresh = again.create_pipe(again.domain("default"), PipeSpec(), "")
    again.create_join(fresh, JoinSpec(feed_path="/restms/feed/work"))
    assert [m for _, m in ids(fresh)] == ["w1", "w3", "w4"]
    await commit_and_close(again, store2)

    third, store3 = await opened(tmp_path)  # taken from the queue means gone from it
    assert not third.public_feed("work").queue
    assert [m for _, m in ids(pipe_of(third, fresh.key))] == ["w1", "w3", "w4"]
    await commit_and_close(third, store3)


async def test_concurrent_batches_share_commits(tmp_path: Path) -> None:
    engine, store = await opened(tmp_path)
    feed, _ = engine.create_feed(engine.domain("default"), FeedSpec(name="f", type="fanout"), "")
    pipe = engine.create_pipe(engine.domain("default"), PipeSpec(), "")
    engine.create_join(pipe, JoinSpec(feed_path="/restms/feed/f"))
    futures = []
    for i in range(300):
        engine.publish(feed, [msg(f"m{i}")])
        futures.append(store.submit(engine.take_journal()))
    await asyncio.gather(*futures)
    assert store.batches >= 300
    assert store.commits < store.batches  # group commit: fewer transactions than batches
    await asyncio.to_thread(store.close)
    with sqlite3.connect(tmp_path / "gateway.sqlite3") as db:
        assert db.execute("SELECT count(*) FROM messages").fetchone() == (300,)


async def test_a_store_from_another_schema_is_refused(tmp_path: Path) -> None:
    with sqlite3.connect(tmp_path / "gateway.sqlite3") as db:
        db.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        db.execute("INSERT INTO meta VALUES ('schema', '99')")
    with pytest.raises(StoreError, match="schema 99"):
        await asyncio.to_thread(Store(tmp_path).load)


async def test_rows_that_no_longer_fit_the_configuration_are_skipped(tmp_path: Path) -> None:
    config = EngineConfig(domains=(("default", "D"), ("extra", "E")))
    engine, store = await opened(tmp_path, config)
    engine.create_feed(engine.domain("extra"), FeedSpec(name="elsewhere"), "")
    await commit_and_close(engine, store)
    again, store2 = await opened(tmp_path)  # "extra" is no longer configured
    assert "elsewhere" not in again.public_feeds
    await commit_and_close(again, store2)


async def test_pipe_options_and_redelivery_counts_survive_a_restart(tmp_path: Path) -> None:
    clock = [1_000.0]
    config = EngineConfig(lease=5)
    engine = Engine(config, wall=lambda: clock[0], mono=lambda: clock[0])
    store = Store(tmp_path)
    engine.restore(await asyncio.to_thread(store.load))
    store.start(asyncio.get_running_loop())
    domain = engine.domain("default")
    options = PipeOptions(max_messages=7, overflow="drop-oldest", lease=5, durable=True)
    pipe = engine.create_pipe(domain, PipeSpec(options=options), "ann")
    news, _ = engine.create_feed(domain, FeedSpec(name="news", type="fanout"), "ann")
    engine.create_join(pipe, JoinSpec(feed_path="/restms/feed/news"))
    engine.publish(news, [msg("a", persistent=False)])  # durable pipe: stored anyway
    message = next(iter(pipe.messages.values()))
    engine.lease(pipe, message)
    clock[0] += 5
    assert engine.sweep_leases() == 1
    await commit_and_close(engine, store)

    again, store2 = await opened(tmp_path)
    restored = pipe_of(again, pipe.key)
    assert (restored.max_messages, restored.overflow, restored.durable) == (7, "drop-oldest", True)
    assert restored.max_bytes == again.config.max_pipe_bytes  # not asked for: the default
    [back] = restored.messages.values()
    assert back.spec.prop("message_id") == "a"
    assert back.redeliveries == 1
    assert back.seq == 2
    assert restored.bytes == sum(
        map(len, ("message_id", "a", "body a"))
    )  # its properties and content
    await commit_and_close(again, store2)


async def test_a_publish_retried_after_a_restart_is_still_a_duplicate(tmp_path: Path) -> None:
    engine, store = await opened(tmp_path)
    domain = engine.domain("default")
    news, _ = engine.create_feed(domain, FeedSpec(name="news", type="fanout"), "ann")
    for _ in range(2):
        pipe = engine.create_pipe(domain, PipeSpec(), "ann")
        engine.create_join(pipe, JoinSpec(feed_path="/restms/feed/news"))
    assert engine.publish(news, [msg("once")]) == [2]
    await commit_and_close(engine, store)

    again, store2 = await opened(tmp_path)
    counts = again.publish(again.public_feed("news"), [msg("once"), msg("new")])
    assert counts == [2, 2]
    assert isinstance(counts[0], Duplicate)
    assert not isinstance(counts[1], Duplicate)
    await commit_and_close(again, store2)


async def test_a_schema_1_store_is_migrated_and_keeps_its_pipes(tmp_path: Path) -> None:
    with sqlite3.connect(tmp_path / "gateway.sqlite3") as db:
        db.executescript(
            "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);"
            "INSERT INTO meta VALUES ('schema', '1');"
            "CREATE TABLE pipes (key TEXT PRIMARY KEY, type TEXT NOT NULL, title TEXT,"
            " domain TEXT NOT NULL, owner TEXT NOT NULL, next_seq INTEGER NOT NULL DEFAULT 1);"
            "INSERT INTO pipes VALUES ('oldpipe', '', 'old', 'default', 'ann', 4);"
        )
    engine, store = await opened(tmp_path)
    pipe = pipe_of(engine, "oldpipe")
    assert (pipe.title, pipe.next_seq, pipe.overflow) == ("old", 4, "skip")
    await commit_and_close(engine, store)
    with sqlite3.connect(tmp_path / "gateway.sqlite3") as db:
        assert db.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone() == ("5",)
        assert db.execute("SELECT count(*) FROM webhooks").fetchone() == (0,)  # schema 3
        assert db.execute("SELECT acked, lost FROM pipes").fetchone() == (0, 0)  # schema 4
