"""Rotator and service feeds' queues past the memory budget, with a real store: queued
messages wait on disk as a pipe's do (not refused), come back a page at a time when
the queue runs empty in memory, in order and exactly once, across a restart too.

The engine reads pages in a worker thread (feeds/paging.py); here the test does what
it does, by hand: the engine asks through ``on_queue_page``, the test reads the page.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from feeds import EngineConfig
from feeds.config import OVERHEAD
from feeds.engine import Engine
from feeds.model import Feed, Pipe, Slot
from feeds.paging import PAGE, QueuePager
from feeds.store import Store
from restms.errors import ServiceUnavailable
from restms.specs import EmbeddedContent, FeedSpec, JoinSpec, MessageSpec, PipeSpec

BODY = "x" * 1000
SIZE = len(BODY)  # a message's size: no address, properties count only when set
BUDGET = 20 * (SIZE + 20 + OVERHEAD)  # about 20 messages in memory


def msg(mid: str, *, persistent: bool = True) -> MessageSpec:
    props = [("message_id", mid)]
    if persistent:
        props.insert(0, ("delivery_mode", "2"))
    return MessageSpec(props=tuple(props), contents=(EmbeddedContent(value=BODY),))


class Gateway:
    """An engine and its store, and what the gateway's page readers do for it."""

    def __init__(self, engine: Engine, store: Store) -> None:
        self.engine, self.store = engine, store
        self.wanted: list[Feed] = []  # feeds whose queue asked for a page
        engine.on_queue_page = self.wanted.append

    @classmethod
    async def open(cls, path: Path, **config: int) -> Gateway:
        store = Store(path)
        snapshot = await asyncio.to_thread(store.load, BUDGET, OVERHEAD)
        gateway = cls(Engine(EngineConfig(memory_budget=BUDGET, **config)), store)
        gateway.engine.restore(snapshot)  # (which may ask for pages already)
        store.start(asyncio.get_running_loop())
        return gateway

    async def commit(self) -> None:
        """Every change so far committed, as the gateway hands the journal over (what a
        publish held back until its commit shows once it committed)."""
        written = self.engine.commit_journal(self.store.submit)
        await (written if written is not None else self.store.submit([]))
        await asyncio.sleep(0)  # what the commit settled shows on the loop's next turn

    async def close(self) -> None:
        await self.commit()
        await asyncio.to_thread(self.store.close)

    async def queue_pages(self) -> int:
        """Read back the pages asked for (feeds.paging.QueuePager); how many reads."""
        reads = 0
        while self.wanted:
            feed = self.wanted.pop(0)
            while feed.qspilled and not feed.queue and not feed.deleted:
                await self.commit()
                low = feed.qspill_lo
                rows = await asyncio.to_thread(
                    self.store.read_queue_page, feed.key, low, 512, 16 * SIZE
                )
                self.engine.queue_page_in(feed, low, rows)
                reads += 1
        return reads

    async def pipe_page(self, pipe: Pipe) -> None:
        """Read back the pipe's next page (feeds.paging.read_page)."""
        await self.commit()
        low = pipe.spill_lo
        rows = await asyncio.to_thread(self.store.read_page, pipe.key, low, 512)
        self.engine.page_in(pipe, low, rows)

    async def consume(self, pipe: Pipe) -> list[str]:
        """Read the pipe as a worker does, acknowledging each message, until nothing is
        left for it in memory or on disk, in the pipe or in the feed's queue."""
        seen: list[str] = []
        for _ in range(10_000):
            if pipe.messages:
                seq, message = next(iter(pipe.messages.items()))
                seen.append(message.spec.prop("message_id") or "")
                self.engine.ack(Slot(pipe, seq))
            elif pipe.spilled:
                await self.pipe_page(pipe)
            elif self.wanted:
                await self.queue_pages()
            else:
                return seen
        raise AssertionError("the pipe did not drain")


def rotator(engine: Engine, name: str = "work") -> Feed:
    feed, _ = engine.create_feed(engine.domain("default"), FeedSpec(name=name, type="rotator"), "")
    return feed


def worker(engine: Engine, feed: Feed, kind: str = "") -> Pipe:
    pipe = engine.create_pipe(engine.domain("default"), PipeSpec(type=kind), "")
    engine.create_join(pipe, JoinSpec(feed_path=f"/restms/feed/{feed.key}"))
    return pipe


async def test_past_the_budget_a_queue_waits_on_disk_and_is_handed_out_in_order(
    tmp_path: Path,
) -> None:
    gw = await Gateway.open(tmp_path)
    engine = gw.engine
    feed = rotator(engine)
    names = [f"m{n}" for n in range(200)]
    specs = [msg(name, persistent=n % 2 == 0) for n, name in enumerate(names)]
    for spec in specs:  # none refused: past the budget, they go to disk
        assert engine.publish(feed, [spec]) == [0]
        assert engine.held <= BUDGET
    on_disk = feed.qspilled
    assert on_disk >= 170
    assert len(feed.queue) + on_disk == 200
    assert engine.counters.spilled == on_disk
    assert feed.queue_bytes + feed.qspilled_bytes == sum(s.head_size + SIZE for s in specs)
    assert engine.census().queued_on_disk == on_disk
    await gw.commit()
    pipe = worker(engine, feed)  # takes what is in memory, then asks for a page
    assert gw.wanted == [feed]
    assert engine.publish(feed, [msg("late")]) == [0]  # queued behind those on disk
    assert await gw.consume(pipe) == [*names, "late"]  # every one, once, in order
    assert (len(feed.queue), feed.qspilled, feed.qspilled_bytes, engine.held) == (0, 0, 0, 0)
    assert engine.counters.paged_in >= on_disk
    assert engine.publish(feed, [msg("after")]) == [1]  # memory again, not disk
    await gw.close()
    rows = sqlite_rows(tmp_path, "SELECT count(*) FROM queued")
    assert rows == [(0,)]  # every queued row, persistent or not, left the disk


def sqlite_rows(path: Path, sql: str) -> list[tuple[object, ...]]:
    db = sqlite3.connect(path / "gateway.sqlite3")
    try:
        return db.execute(sql).fetchall()
    finally:
        db.close()


async def test_a_restart_restores_persistent_queued_messages_from_memory_and_disk_in_order(
    tmp_path: Path,
) -> None:
    gw = await Gateway.open(tmp_path)
    engine = gw.engine
    feed = rotator(engine)
    for n in range(60):
        engine.publish(feed, [msg(f"p{n}")])
    for n in range(40):  # on disk only for room: a restart drops them
        engine.publish(feed, [msg(f"v{n}", persistent=False)])
    for n in range(60, 90):
        engine.publish(feed, [msg(f"p{n}")])
    assert len(feed.queue) < 25
    assert feed.qspilled > 100
    await gw.close()

    again = await Gateway.open(tmp_path)
    restored = again.engine.public_feed("work")
    assert again.engine.held <= BUDGET + SIZE + 100 + OVERHEAD
    assert restored.qspilled > 0  # what did not fit the budget stayed on disk
    pipe = worker(again.engine, restored)
    assert await again.consume(pipe) == [f"p{n}" for n in range(90)]
    await again.close()

    third = await Gateway.open(tmp_path)  # handed out means gone from the queue
    left = third.engine.public_feed("work")
    assert (len(left.queue), left.qspilled) == (0, 0)
    await third.close()


async def test_requeued_work_goes_before_what_waits_on_disk(tmp_path: Path) -> None:
    """A queue is FIFO across memory and disk; work a deleted pipe gives back goes to
    the front, in memory, and an ondemand worker's asking reads the disk's pages back."""
    gw = await Gateway.open(tmp_path)
    engine = gw.engine
    feed = rotator(engine)
    first = worker(engine, feed)
    engine.publish(feed, [msg("r1"), msg("r2", persistent=False)])  # the worker takes them
    assert [m.spec.prop("message_id") for m in first.messages.values()] == ["r1", "r2"]
    names = [f"q{n}" for n in range(100)]
    first.max_messages = 2  # full: what follows queues, mostly on disk
    for name in names:
        engine.publish(feed, [msg(name)])
    assert feed.qspilled > 70
    await gw.commit()  # (until then the publishes are held back from every reader)
    engine.delete_pipe(first)  # r1 and r2 go back to the front
    assert [s.prop("message_id") for s, *_ in list(feed.queue)[:2]] == ["r1", "r2"]
    pipe = worker(engine, feed, "ondemand")  # takes one message per waiting GET
    seen: list[str] = []
    for _ in range(1_000):
        if not engine.reading.pull(pipe):
            if not gw.wanted:
                break
            await gw.queue_pages()
            continue
        seq, message = next(iter(pipe.messages.items()))
        seen.append(message.spec.prop("message_id") or "")
        engine.ack(Slot(pipe, seq))
    assert seen == ["r1", "r2", *names]
    await gw.close()


async def test_the_queue_bounds_still_refuse_counting_what_waits_on_disk(tmp_path: Path) -> None:
    gw = await Gateway.open(tmp_path, max_feed_queue=50)
    engine = gw.engine
    feed = rotator(engine)
    for n in range(50):
        engine.publish(feed, [msg(f"m{n}")])
    assert feed.qspilled > 25
    with pytest.raises(ServiceUnavailable) as caught:
        engine.publish(feed, [msg("one-more")])
    assert "has 50 of 50 messages queued" in caught.value.reason
    await gw.close()


async def test_a_dead_letter_counts_what_its_feed_queue_holds_on_disk(tmp_path: Path) -> None:
    """Behind messages on disk a dead letter queues too, pipe or no pipe: so the queue's
    bound decides, as it does for a publish."""
    gw = await Gateway.open(tmp_path, max_feed_queue=12)
    engine = gw.engine
    news, _ = engine.create_feed(engine.domain("default"), FeedSpec(name="news"), "")
    reader = worker(engine, news)
    engine.publish(news, [msg(f"n{n}") for n in range(25)])  # the budget, filled by a pipe
    dead = engine.public_feed("dead-letter")
    engine.publish(dead, [msg(f"d{n}") for n in range(12)])  # so these wait on disk
    assert (len(dead.queue), dead.qspilled) == (0, 12)
    worker(engine, dead)  # a pipe that could take one, while the page is being read
    letter = next(iter(reader.messages.values()))
    assert not engine.dead_letter(reader, letter, "rejected")  # the queue is full
    assert engine.counters.dead_discarded == 1
    await gw.close()


class Interleaved(Engine):
    """An engine after whose every page read back a reader acts at once: its callback
    is the next thing the loop runs, before the page reader's own task is wound up."""

    def __init__(self, config: EngineConfig, reader: Callable[[], None]) -> None:
        super().__init__(config)
        self.reader = reader

    def queue_page_in(self, feed: Feed, low: int, rows: list[tuple[int, bytes]]) -> int:
        taken = super().queue_page_in(feed, low, rows)
        asyncio.get_running_loop().call_soon(self.reader)
        return taken


async def test_a_page_wanted_as_the_last_read_ends_is_still_read(tmp_path: Path) -> None:
    """The queue ran empty in memory in the moment the page reader's task ended: that
    want started no read and the worker waited forever (a test of the gateway hung)."""
    budget = (PAGE + 100) * (SIZE + 20 + OVERHEAD)  # a page read back fits in memory
    store = Store(tmp_path)
    snapshot = await asyncio.to_thread(store.load, budget, OVERHEAD)
    seen: list[str] = []

    def take_all() -> None:
        while pipe.messages:
            seq, message = next(iter(pipe.messages.items()))
            seen.append(message.spec.prop("message_id") or "")
            engine.ack(Slot(pipe, seq))

    engine = Interleaved(EngineConfig(memory_budget=budget), take_all)
    engine.restore(snapshot)
    store.start(asyncio.get_running_loop())
    pager = QueuePager(engine, store)
    engine.on_queue_page = pager.want
    feed = rotator(engine)
    pipe = worker(engine, feed)
    pipe.max_messages = 2  # full at once: the rest queues, more than a page on disk
    names = [f"m{n}" for n in range(3 * PAGE + 100)]
    for name in names:
        engine.publish(feed, [msg(name, persistent=False)])
    assert feed.qspilled > PAGE
    for _ in range(500):
        take_all()
        if len(seen) == len(names):
            break
        await asyncio.sleep(0.01)
    await pager.stop()
    await asyncio.to_thread(store.close)
    assert seen == names
