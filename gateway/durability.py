"""Commit the engine's journal to the store: before replies, and in the background.

Every request that changed something durable waits, before its reply goes out, for
the transaction holding its changes (:func:`committed`). Between a handler's engine
call and that wait there is no ``await``, so the journal it hands over holds its own
changes (and perhaps older ones, which only commit sooner). Changes made outside a
request (queued work handed to an ondemand GET, expiries, each pipe's next position)
are committed by :func:`_flusher` within ``journal_interval`` seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path

from aiohttp import web

from feeds.config import OVERHEAD
from feeds.store import Store, StoreError
from restms.errors import ServiceUnavailable

from .keys import CONFIG, ENGINE, STORE

log = logging.getLogger(__name__)


async def committed(request: web.Request) -> None:
    """Wait until what this request changed is on disk (nothing to wait for: at once)."""
    await commit(request.app)


async def commit(app: web.Application) -> None:
    """Wait until every change the engine made so far is on disk (bridges use this too)."""
    store = app.get(STORE)
    engine = app[ENGINE]
    if store is None or not engine.journal:
        return
    future = store.submit(engine.take_journal())
    try:
        await asyncio.shield(future)  # a client that goes away does not undo a commit
    except StoreError as exc:
        raise ServiceUnavailable(f"{exc}; the change may not survive a restart", 5) from exc


async def store_context(app: web.Application) -> AsyncIterator[None]:
    """Open the store, restore the engine from it, commit in the background, close."""
    config = app[CONFIG]
    await asyncio.to_thread(Path(config.data_dir).mkdir, parents=True, exist_ok=True)
    store = app.get(STORE)
    if store is None:  # store = "memory"
        yield
        return
    engine = app[ENGINE]
    budget = engine.config.memory_budget
    snapshot = await asyncio.to_thread(store.load, budget, OVERHEAD)
    engine.restore(snapshot)
    log.info(
        "store %s: %d feeds, %d pipes, %d messages restored",
        store.path,
        len(snapshot.feeds),
        len(snapshot.pipes),
        len(snapshot.messages) + len(snapshot.queued) + sum(s[3] for s in snapshot.spills),
    )
    store.start(asyncio.get_running_loop())
    task = asyncio.create_task(_flusher(app, store), name="journal-flusher")
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    ops = engine.take_journal()
    if ops:
        with contextlib.suppress(StoreError):
            await store.submit(ops)
    await asyncio.to_thread(store.close)


async def _flusher(app: web.Application, store: Store) -> None:
    engine, interval = app[ENGINE], app[CONFIG].journal_interval
    while True:
        await asyncio.sleep(interval)
        ops = engine.take_journal()
        if ops:  # nobody waits for these; the store logs a failure
            store.submit(ops).add_done_callback(_seen)


def _seen(future: asyncio.Future[None]) -> None:
    if not future.cancelled():
        future.exception()  # retrieved, so asyncio does not report it again
