"""The store's test transaction behind :meth:`EmbeddedEngine.readiness`.

An empty transaction writes no page: it shows the writer thread is there and that a
commit goes through within the time given. Concurrent asks share the one under way. A
store whose last transaction failed is probed too: the probe committing is what
clears the failure (a gateway taken out of traffic would otherwise never commit again
to show it has recovered).
"""

from __future__ import annotations

import asyncio
import contextlib

from ..store import Store, StoreError


class Probe:
    """The test transaction in progress, shared by whoever asks meanwhile."""

    __slots__ = ("_running",)

    def __init__(self) -> None:
        self._running: asyncio.Task[str] | None = None

    async def store(self, store: Store, timeout: float) -> str:
        """ "" when the store commits within ``timeout`` seconds, else why not."""
        if not store.running:
            return "store: not open"
        if self._running is None or self._running.done():
            self._running = asyncio.create_task(_commit(store, timeout), name="readiness-probe")
        return await asyncio.shield(self._running)

    async def stop(self) -> None:
        running = self._running
        if running is not None and not running.done():
            running.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await running


async def _commit(store: Store, timeout: float) -> str:
    future = store.submit([])
    try:
        async with asyncio.timeout(timeout):
            await asyncio.shield(future)
    except TimeoutError:
        future.add_done_callback(_seen)  # it may still fail: retrieve that, quietly
        failed = f" (the last transaction failed: {store.failing})" if store.failing else ""
        return f"store: no commit within {timeout:g} s{failed}"
    except StoreError as exc:
        return f"store: {exc}"
    return ""


def _seen(future: asyncio.Future[None]) -> None:
    if not future.cancelled():
        future.exception()
