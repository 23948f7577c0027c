"""Committing the journal and reading back what waits on disk (docs/DURABILITY.md).

These are the engine's own chores, done for it by :class:`feeds.embedded.EmbeddedEngine`
(and called through the gateway's ``spill`` and ``durability`` modules by the handlers
that have not moved onto the engine service yet).

Commit. The engine appends journal records as it changes; :func:`commit` hands them
to the store and waits for the transaction holding them (503 when it fails), what a
publish held back showing or being withdrawn with it (:mod:`feeds.settling`).
:func:`hand_over` does the same without waiting, for changes nobody waits for, and
:func:`flusher` does it every ``interval`` seconds.

Paging. The engine never blocks: when a pipe holds messages on disk (positions from
``pipe.spill_lo`` on), whoever needs one of them reads the pipe's next page in a worker
thread, after committing the journal so the page is complete, and hands it to
``Engine.page_in``. One read per pipe runs at a time; concurrent readers wait for it.
A rotator or service feed's queue is read back by :class:`QueuePager` when the engine
says it ran empty in memory (``Engine.on_queue_page``).
"""

from __future__ import annotations

import asyncio
import logging

from restms.errors import NotCommitted, ServiceUnavailable

from .engine import Engine
from .model import Feed, Pipe, Slot
from .store import Store, StoreError

log = logging.getLogger(__name__)

PAGE = 512  # messages read back at a time
LOW = PAGE // 4  # a reader of the oldest messages gets the next page below this many
# A feed queue's page is bounded in bytes too (past its first message): its messages
# go to pipes at once, so what a page holds counts against the memory budget until then.
QUEUE_PAGE_BYTES = 4 * 1024 * 1024
RETRY = 1.0  # seconds before a failed read of a feed queue's page is tried again


async def commit(
    engine: Engine, store: Store | None, failed: str = "the change may not survive a restart"
) -> None:
    """Wait until every change the engine made so far is on disk; 503 saying ``failed``
    when the commit fails."""
    if store is None:
        return
    # The journal may be empty while lazy records (positions, webhook delivery state)
    # wait for the flusher: commit_journal hands those over too.
    future = engine.commit_journal(store.submit)
    if future is None:
        return
    try:
        await asyncio.shield(future)  # a caller that goes away does not undo a commit
    except StoreError as exc:
        raise NotCommitted(f"{exc}; {failed}", 5) from exc


def hand_over(engine: Engine, store: Store | None) -> None:
    """Commit the journal without waiting: changes nobody waits for (the store logs
    a failure)."""
    if store is None:
        return
    future = engine.commit_journal(store.submit)
    if future is not None:
        future.add_done_callback(_seen)


def _seen(future: asyncio.Future[None]) -> None:
    if not future.cancelled():
        future.exception()  # retrieved, so asyncio does not report it again


async def flusher(engine: Engine, store: Store, interval: float) -> None:
    """Changes made outside any caller's wait (positions, expiries, queued work handed
    out) reach the disk within ``interval`` seconds."""
    while True:
        await asyncio.sleep(interval)
        hand_over(engine, store)


async def ensure(engine: Engine, store: Store | None, pipe: Pipe, upto: int | None = None) -> None:
    """Read pages back until position ``upto`` is in memory or, without ``upto``,
    until the pipe holds at least ``LOW`` messages in memory (or nothing is on disk)."""
    while pipe.spilled and not pipe.deleted:
        if upto is None and len(pipe.messages) >= LOW:
            return
        if upto is not None and upto < pipe.spill_lo:
            return
        await read_page(engine, store, pipe)


async def ahead(engine: Engine, store: Store | None, pipe: Pipe, after: int) -> None:
    """Read pages back until memory holds a message after position ``after``, or
    nothing waits on disk: readers that leave what they read in the pipe walk on from
    the messages in memory to those on disk."""
    while pipe.spilled and not pipe.deleted:
        if pipe.messages and next(reversed(pipe.messages)) > after:
            return
        await read_page(engine, store, pipe)


async def ack(engine: Engine, store: Store | None, slot: Slot) -> int:
    """D4 across memory and disk: older messages on disk are read back and removed a
    page at a time, so memory never holds more than a page more than the budget."""
    pipe = slot.pipe
    removed = 0
    while pipe.spilled and not pipe.deleted and pipe.spill_lo <= slot.seq:
        await read_page(engine, store, pipe)
        removed += engine.ack(Slot(pipe, min(slot.seq, pipe.spill_lo - 1)))
    return removed + engine.ack(slot)


async def read_page(engine: Engine, store: Store | None, pipe: Pipe) -> None:
    """The pipe's next page from disk into memory (one read per pipe at a time)."""
    if pipe.loading is not None:
        await asyncio.shield(pipe.loading)
        return
    if store is None:  # nothing can be on disk without a store
        return
    loading = asyncio.get_running_loop().create_future()
    pipe.loading = loading
    try:
        await _committed(engine, store)
        low = pipe.spill_lo
        rows = await asyncio.to_thread(store.read_page, pipe.key, low, PAGE)
        engine.page_in(pipe, low, rows)
    except StoreError as exc:
        raise ServiceUnavailable(f"{exc}; retry later", 5) from exc
    finally:
        pipe.loading = None
        loading.set_result(None)


async def _committed(engine: Engine, store: Store) -> None:
    """Every change so far on disk, so a page read next holds every message written
    there: the journal's records, and before them any batch someone else took from the
    journal and is still committing. A batch commits after every batch submitted before
    it, so even an empty one waits."""
    written = engine.commit_journal(store.submit)
    await (written if written is not None else store.submit([]))


class QueuePager:
    """Reads feed queues' pages back when the engine asks (``Engine.on_queue_page``):
    one task per feed at a time, for as long as the feed's queue is empty in memory and
    messages wait on disk."""

    def __init__(self, engine: Engine, store: Store) -> None:
        self._engine = engine
        self._store = store
        self._tasks: dict[Feed, asyncio.Task[None]] = {}

    def want(self, feed: Feed) -> None:
        """The engine's ``on_queue_page``: the feed's next page is wanted."""
        running = self._tasks.get(feed)
        # A task that has ended but whose done callback has not run yet reads no more:
        # a page wanted in that moment needs a task of its own, or nobody reads it.
        if running is not None and not running.done():
            return  # its task reads on while the queue is empty in memory
        task = asyncio.get_running_loop().create_task(self._read(feed), name="queue-pager")
        self._tasks[feed] = task
        task.add_done_callback(lambda done: self._done(feed, done))

    def _done(self, feed: Feed, task: asyncio.Task[None]) -> None:
        if self._tasks.get(feed) is task:
            del self._tasks[feed]
        if not task.cancelled() and task.exception() is not None:
            log.error("reading a feed queue's page back failed", exc_info=task.exception())

    async def stop(self) -> None:
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _read(self, feed: Feed) -> None:
        engine, store = self._engine, self._store
        while feed.qspilled and not feed.queue and not feed.deleted:
            try:
                await _committed(engine, store)
                low = feed.qspill_lo
                rows = await asyncio.to_thread(
                    store.read_queue_page, feed.key, low, PAGE, QUEUE_PAGE_BYTES
                )
            except StoreError as exc:
                log.warning("a feed queue's page could not be read back (%s); retrying", exc)
                await asyncio.sleep(RETRY)
                continue
            engine.queue_page_in(feed, low, rows)
