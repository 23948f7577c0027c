"""Reading back messages that wait on disk past the memory budget (docs/DURABILITY.md).

The engine never blocks: when a pipe holds messages on disk (positions from
``pipe.spill_lo`` on), a request that needs one of them first reads the pipe's next
page in a worker thread, after committing the journal so the page is complete, and
hands it to :meth:`feeds.engine.Engine.page_in`. One read per pipe runs at a time;
concurrent requests wait for it.
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from feeds.model import Pipe, Slot
from feeds.store import StoreError
from restms.errors import ServiceUnavailable

from .keys import ENGINE, STORE

PAGE = 512  # messages read back at a time
LOW = PAGE // 4  # a reader of the oldest messages gets the next page below this many


async def ensure(app: web.Application, pipe: Pipe, upto: int | None = None) -> None:
    """Read pages back until position ``upto`` is in memory or, without ``upto``,
    until the pipe holds at least ``LOW`` messages in memory (or nothing is on disk)."""
    while pipe.spilled and not pipe.deleted:
        if upto is None and len(pipe.messages) >= LOW:
            return
        if upto is not None and upto < pipe.spill_lo:
            return
        await _read_page(app, pipe)


async def ahead(app: web.Application, pipe: Pipe, after: int) -> None:
    """Read pages back until memory holds a message after position ``after``, or
    nothing waits on disk: readers that leave what they read in the pipe (SSE,
    WebSocket) walk on from the messages in memory to those on disk."""
    while pipe.spilled and not pipe.deleted:
        if pipe.messages and next(reversed(pipe.messages)) > after:
            return
        await _read_page(app, pipe)


async def ack(app: web.Application, slot: Slot) -> int:
    """D4 across memory and disk: older messages on disk are read back and removed a
    page at a time, so memory never holds more than a page more than the budget."""
    engine, pipe = app[ENGINE], slot.pipe
    removed = 0
    while pipe.spilled and not pipe.deleted and pipe.spill_lo <= slot.seq:
        await _read_page(app, pipe)
        removed += engine.ack(Slot(pipe, min(slot.seq, pipe.spill_lo - 1)))
    return removed + engine.ack(slot)


async def _read_page(app: web.Application, pipe: Pipe) -> None:
    if pipe.loading is not None:
        await asyncio.shield(pipe.loading)
        return
    engine, store = app[ENGINE], app.get(STORE)
    if store is None:  # nothing can be on disk without a store
        return
    loading = asyncio.get_running_loop().create_future()
    pipe.loading = loading
    try:
        ops = engine.take_journal()
        if ops:
            await store.submit(ops)  # the page must hold what was written to disk so far
        low = pipe.spill_lo
        rows = await asyncio.to_thread(store.read_page, pipe.key, low, PAGE)
        engine.page_in(pipe, low, rows)
    except StoreError as exc:
        raise ServiceUnavailable(f"{exc}; retry later", 5) from exc
    finally:
        pipe.loading = None
        loading.set_result(None)
