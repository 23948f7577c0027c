"""A publish that waits for its commit is held back from readers until then, and
withdrawn when the commit fails (feeds.settling).

The store is a stand-in whose transactions the test ends by hand, with success or
with the store's own error: what the engine does is what is tested, not SQLite (the
app test in tests/app/test_commit_failure.py fails real commits).
"""

from __future__ import annotations

import asyncio
from typing import Any

from feeds.config import OVERHEAD
from feeds.engine import Engine
from feeds.model import Feed, Pipe, Slot
from feeds.store import Op, Snapshot, StoreError
from restms.specs import Duplicate, EmbeddedContent, JoinSpec, LinkedContent, MessageSpec, PipeSpec

from .test_guarantees import engine, join, new_feed, new_pipe


class Transactions:
    """What the engine hands over, each batch's future resolved by the test."""

    def __init__(self) -> None:
        self.batches: list[tuple[list[Op], asyncio.Future[None]]] = []

    def submit(self, ops: list[Op]) -> asyncio.Future[None]:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.batches.append((ops, future))
        return future

    async def end(self, ok: bool) -> None:
        """End every batch handed over so far, in one transaction (group commit)."""
        for _, future in self.batches:
            if not future.done():
                if ok:
                    future.set_result(None)
                else:
                    future.set_exception(StoreError("could not commit: database or disk is full"))
        for _ in range(2):  # the futures' callbacks run, then what they left to do
            await asyncio.sleep(0)


def durable(**config: Any) -> Engine:
    e = engine(**config)
    e.restore(Snapshot())  # a journal from here on, as with a store
    return e


def message(mid: str, body: str, persistent: bool = True) -> MessageSpec:
    props = [("message_id", mid)] if mid else []
    if persistent:
        props.append(("delivery_mode", "2"))
    return MessageSpec(props=tuple(props), contents=(EmbeddedContent(value=body),))


def bodies(e: Engine, pipe: Pipe) -> list[str]:
    listed, _ = e.listing(pipe)
    return [m.spec.contents[0].value for m in listed]  # type: ignore[union-attr]


def fanout(e: Engine, pipes: int = 1) -> tuple[Feed, list[Pipe]]:
    feed = new_feed(e, "f")
    made = [new_pipe(e) for _ in range(pipes)]
    for pipe in made:
        join(e, pipe, feed)
    return feed, made


async def test_a_persistent_publish_shows_nothing_until_its_commit() -> None:
    e, store = durable(), Transactions()
    feed, (pipe,) = fanout(e)
    reader = asyncio.create_task(e.wait_message(Slot(pipe, 1), 10))
    await asyncio.sleep(0)
    e.publish(feed, [message("a", "one")])
    assert e.commit_journal(store.submit) is not None
    await asyncio.sleep(0.01)
    assert not reader.done()
    assert e.listing(pipe) == ([], 1)  # the asynclet is still position 1
    assert e.message(Slot(pipe, 1)) is None
    assert list(e.stream(pipe, 0)) == []
    assert e.ack(Slot(pipe, 1)) == 0  # a guessed position is not acknowledged either
    await store.end(ok=True)
    got = await asyncio.wait_for(reader, 5)
    assert got is not None
    assert (got.seq, got.spec.prop("message_id")) == (1, "a")
    assert bodies(e, pipe) == ["one"]


async def test_a_failed_commit_withdraws_every_copy_and_a_retry_is_routed_again() -> None:
    e, store = durable(), Transactions()
    feed, (one, two) = fanout(e, 2)
    reader = asyncio.create_task(e.wait_message(Slot(one, 1), 10))
    await asyncio.sleep(0)
    mirrored: list[tuple[Any, ...]] = []
    e.mirror = lambda item, rows=1: mirrored.append(item)
    assert e.publish(feed, [message("a", "refused")]) == [2]
    e.commit_journal(store.submit)
    await store.end(ok=False)
    drops = [(item[1], item[7], item[10]) for item in mirrored if item[1] == "drop"]
    assert drops == [("drop", "a", "uncommitted")] * 2  # the failure, one a copy
    assert not [item for item in mirrored if item[1] == "deliver"]
    e.mirror = None
    await asyncio.sleep(0.01)
    assert not reader.done()  # never handed the refused message
    for pipe in (one, two):
        assert (pipe.messages, pipe.next_seq, pipe.hidden) == ({}, 1, 0)
    assert e.counters.withdrawn == 2
    counts = e.publish(feed, [message("a", "accepted")])
    assert counts == [2]
    assert not isinstance(counts[0], Duplicate)  # its message_id was forgotten
    e.commit_journal(store.submit)
    await store.end(ok=True)
    got = await asyncio.wait_for(reader, 5)
    assert got is not None
    assert got.seq == 1  # never shown, so its position is taken again
    assert got.spec.contents[0].value == "accepted"  # type: ignore[union-attr]


async def test_what_comes_behind_a_held_back_message_waits_and_outlives_its_failure() -> None:
    e, store = durable(), Transactions()
    feed, (pipe,) = fanout(e)
    e.publish(feed, [message("", "persistent")])
    e.commit_journal(store.submit)
    e.publish(feed, [message("", "plain", persistent=False)])  # nothing to commit
    assert not e.unsettled
    assert e.listing(pipe) == ([], 1)  # behind the held-back one: not shown yet
    await store.end(ok=False)
    assert bodies(e, pipe) == ["plain"]
    assert e.listing(pipe)[1] == 3  # position 1 is a gap: a message was placed after it
    assert e.message(Slot(pipe, 2)) is not None


async def test_each_publish_of_a_failed_group_commit_is_withdrawn() -> None:
    e, store = durable(), Transactions()
    feed, (pipe,) = fanout(e)
    e.publish(feed, [message("a", "first")])
    e.commit_journal(store.submit)
    e.publish(feed, [message("b", "second"), message("c", "third")])
    e.commit_journal(store.submit)
    assert len(store.batches) == 2
    await store.end(ok=False)  # one transaction held both batches
    assert (pipe.messages, pipe.next_seq, pipe.hidden) == ({}, 1, 0)
    assert e.publish(feed, [message(i, i) for i in "abc"]) == [1, 1, 1]  # no duplicate


async def test_a_batch_is_withdrawn_whole_and_only_its_own_ids_are_forgotten() -> None:
    e, store = durable(), Transactions()
    feed, (pipe,) = fanout(e)
    e.publish(feed, [message("kept", "kept")])
    e.commit_journal(store.submit)
    await store.end(ok=True)
    batch = [
        message("plain", "plain", persistent=False),  # before the persistent one
        message("kept", "again"),  # a duplicate: not routed
        message("new", "new"),
    ]
    counts = e.publish(feed, batch)
    assert isinstance(counts[1], Duplicate)
    assert bodies(e, pipe) == ["kept"]  # the whole batch is held back
    e.commit_journal(store.submit)
    await store.end(ok=False)
    assert bodies(e, pipe) == ["kept"]
    assert pipe.next_seq == 2
    again = e.publish(feed, batch)
    assert not isinstance(again[0], Duplicate)
    assert isinstance(again[1], Duplicate)  # the first publish's id stays remembered
    assert not isinstance(again[2], Duplicate)


async def test_queued_work_of_a_refused_publish_is_never_handed_out() -> None:
    e, store = durable(), Transactions()
    feed = new_feed(e, "work", "rotator")
    held_before = e.held
    e.publish(feed, [message("", "refused")])  # no pipe yet: queued
    e.commit_journal(store.submit)
    worker = e.create_pipe(e.domain("default"), PipeSpec(), "guest")
    e.create_join(worker, JoinSpec(feed_path="/restms/feed/work"))
    assert len(feed.queue) == 1
    assert feed.queue_bytes > 0
    assert not worker.messages  # held back in the queue until committed
    await store.end(ok=False)
    assert not feed.queue
    assert not worker.messages
    # Its bytes left the queue's bound and the memory budget with it.
    assert feed.queue_bytes == 0
    assert e.held == held_before
    e.publish(feed, [message("", "accepted")])
    e.commit_journal(store.submit)
    await store.end(ok=True)
    assert bodies(e, worker) == ["accepted"]
    assert worker.next_seq == 2


async def test_queued_work_a_refused_publish_put_on_disk_is_no_longer_counted() -> None:
    # A budget of about two messages: the rest of the queue waits on disk.
    e, store = durable(memory_budget=2 * (OVERHEAD + 100), max_feed_queue=10), Transactions()
    feed = new_feed(e, "work", "rotator")
    e.publish(feed, [message("", "kept")])
    e.commit_journal(store.submit)
    await store.end(ok=True)
    e.publish(feed, [message(f"m{n}", f"refused {n}") for n in range(6)])
    assert feed.qspilled > 0
    on_disk = feed.qspilled
    e.commit_journal(store.submit)
    await store.end(ok=False)
    # Its rows were never written: the queue's bounds and gauges count nothing of it.
    assert feed.qspilled == 0
    assert feed.qspilled_bytes == 0
    assert e.counters.withdrawn == 6  # on disk and in memory
    assert e.census().queued == 1  # only "kept" is left
    assert on_disk < 6
    # So the queue's message bound still has room for nine more.
    assert e.publish(feed, [message(f"n{n}", "again") for n in range(9)]) == [0] * 9


async def test_queued_work_is_handed_out_once_committed() -> None:
    e, store = durable(), Transactions()
    feed = new_feed(e, "work", "rotator")
    e.publish(feed, [message("", "one")])
    e.commit_journal(store.submit)
    worker = e.create_pipe(e.domain("default"), PipeSpec(), "guest")
    e.create_join(worker, JoinSpec(feed_path="/restms/feed/work"))
    await store.end(ok=True)
    assert bodies(e, worker) == ["one"]
    assert feed.hidden is None


async def test_the_staged_contents_of_a_refused_publish_can_be_used_by_its_retry() -> None:
    e, store = durable(), Transactions()
    feed, (pipe,) = fanout(e)
    staged = e.stage(feed, b"attachment", "application/octet-stream", "guest")
    linked = MessageSpec(
        props=(("delivery_mode", "2"),),
        contents=(LinkedContent(path=f"/restms/resource/{staged.key}"),),
    )
    e.publish(feed, [linked], "guest")
    assert e.peek(staged.key) is None  # used up
    assert e.census().staged_bytes == 0
    e.commit_journal(store.submit)
    await store.end(ok=False)
    assert e.peek(staged.key) is staged  # there again for the retry
    # ... and counted again, in all and in its owner's share.
    assert e.census().staged_bytes == len(b"attachment")
    assert e._staged_of["guest"] == len(b"attachment")
    assert e.publish(feed, [linked], "guest") == [1]
    e.commit_journal(store.submit)
    await store.end(ok=True)
    assert e.peek(staged.key) is None
    (held,) = e.listing(pipe)[0]
    assert held.parts == (staged.blob,)
