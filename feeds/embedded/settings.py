"""The embedded engine's settings (:meth:`feeds.service.EngineService.setting`): a dict
in memory, read back from the store's ``settings`` table at start, each change
committed in a transaction of its own before it is answered.

One change of a name is under way at a time: a second waits for the first's commit,
so ``only_new`` answers only a value that was kept, and a failed commit puts back
what the name held before (nobody was told of the value that failed). Dropping a
name (``only``: while it holds that value) is a change like the others.
"""

from __future__ import annotations

import asyncio
import functools

from restms.errors import NotCommitted, ServiceUnavailable

from ..service import check_prefix, check_setting
from ..store import Store, StoreError


class Settings:
    """Names and values, kept in ``store`` (None: in memory only, for this run)."""

    def __init__(self, store: Store | None) -> None:
        self._store = store
        self._held: dict[str, str] = {}
        self._pending: dict[str, asyncio.Future[None]] = {}  # a name's commit under way

    def restore(self, rows: list[tuple[str, str]]) -> None:
        self._held = dict(rows)

    async def setting(self, name: str) -> str | None:
        check_setting(name)
        await self._settled(name)
        return self._held.get(name)

    async def listed(self, prefix: str) -> tuple[tuple[str, str], ...]:
        check_prefix(prefix)
        while self._pending:  # only what was kept (a change under way: once settled)
            await asyncio.wait(list(self._pending.values()))
        return tuple(sorted(item for item in self._held.items() if item[0].startswith(prefix)))

    async def keep(self, name: str, value: str, only_new: bool) -> str:
        check_setting(name, value)
        await self._settled(name)
        held = self._held.get(name)
        if only_new and held is not None:
            return held
        self._held[name] = value
        await self._commit(name, value, held, ("setting", name, value))
        return value

    async def drop(self, name: str, only: str | None) -> bool:
        check_setting(name, only)
        await self._settled(name)
        held = self._held.get(name)
        if held is None or (only is not None and held != only):
            return False
        del self._held[name]
        await self._commit(name, None, held, ("setting-", name))
        return True

    async def _commit(
        self, name: str, value: str | None, before: str | None, op: tuple[str, ...]
    ) -> None:
        """Commit the change of ``name`` to ``value`` (None: dropped) already made in
        memory; when it fails, ``before`` is put back and the caller gets 503."""
        if self._store is None:
            return
        if not self._store.running:  # closed: nothing would ever commit it
            self._put_back(name, value, before)
            raise ServiceUnavailable("the gateway is shutting down", 1)
        future = self._store.submit([op])
        self._pending[name] = future
        future.add_done_callback(functools.partial(self._done, name, value, before))
        try:
            await asyncio.shield(future)  # a caller that goes away does not undo a commit
        except StoreError as exc:
            raise NotCommitted(f"{exc}; the setting {name!r} was not changed", 5) from exc

    async def _settled(self, name: str) -> None:
        """Wait until no change of ``name`` is under way (committed or put back)."""
        while (pending := self._pending.get(name)) is not None:
            await asyncio.wait([pending])

    def _done(
        self, name: str, value: str | None, before: str | None, future: asyncio.Future[None]
    ) -> None:
        if self._pending.get(name) is future:
            del self._pending[name]
        if future.cancelled() or future.exception() is not None:
            self._put_back(name, value, before)

    def _put_back(self, name: str, value: str | None, before: str | None) -> None:
        if self._held.get(name) != value:  # (not what the failed change put there)
            return
        if before is None:
            del self._held[name]
        else:
            self._held[name] = before
