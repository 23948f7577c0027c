"""The engines the conformance suite runs against: its one seam.

Every test in this folder speaks to an engine through :mod:`feeds.service` alone. Only
the fixtures below know which engine that is; another engine joins the suite by adding
its name to ``ENGINES`` (and to ``DURABLE`` when it keeps messages across a restart)
and a branch to :func:`_open`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import pytest
from blockbuster import BlockBuster

from feeds.config import EngineConfig
from feeds.embedded import EmbeddedEngine
from feeds.service import EngineService
from tests.app.test_readyz import Lock

ENGINES = ("embedded-memory", "embedded-sqlite")
DURABLE = ("embedded-sqlite",)  # engines whose persistent messages survive a restart
# Leases run out and the journal is flushed within these many seconds, so tests that
# wait for either stay short.
SWEEP = 0.02
FLUSH = 0.01

MakeEngine = Callable[..., Awaitable[EngineService]]


def _open(kind: str, data: Path, config: dict[str, Any]) -> EngineService:
    engine_config = EngineConfig(**config)
    if kind == "embedded-memory":
        return EmbeddedEngine.open(engine_config, sweep_interval=SWEEP, journal_interval=FLUSH)
    if kind == "embedded-sqlite":
        return EmbeddedEngine.open(
            engine_config, data, sweep_interval=SWEEP, journal_interval=FLUSH
        )
    raise ValueError(f"no engine named {kind!r}")


@pytest.fixture(params=ENGINES)
async def make_engine(
    request: pytest.FixtureRequest, tmp_path: Path, blockbuster: BlockBuster
) -> AsyncIterator[MakeEngine]:
    """Start engines of one kind with configuration overrides; each has its own data."""
    started: list[EngineService] = []

    async def make(**config: Any) -> EngineService:
        service = _open(request.param, tmp_path / f"engine-{len(started)}", config)
        await service.start()
        started.append(service)
        return service

    yield make
    for service in reversed(started):
        await service.close()


@pytest.fixture
async def engine(make_engine: MakeEngine) -> EngineService:
    return await make_engine()


def refuse_commits(service: EngineService) -> AbstractAsyncContextManager[object]:
    """While inside, the engine's commits fail for real (they do not fake a failure).

    For the embedded engine: another connection holds the store's write lock, as
    another process could, so a transaction gives up after SQLite's busy timeout.
    """
    assert isinstance(service, EmbeddedEngine)
    assert service.store is not None
    return Lock(service.store.path)


async def _crash(service: EngineService) -> None:
    """Stop as a killed process would: whatever the engine did not commit is lost.

    For the embedded engine: its background tasks (the journal flusher) stop at once,
    and the journal it still holds is never handed to the store, whose writer only
    finishes the transactions already handed to it, as SQLite would have them once
    their commit returned.
    """
    assert isinstance(service, EmbeddedEngine)
    for task in service._tasks:
        task.cancel()
    service.engine.shutdown()
    if service.store is not None:
        await asyncio.to_thread(service.store.close)


@pytest.fixture(params=DURABLE)
async def restart(
    request: pytest.FixtureRequest, tmp_path: Path, blockbuster: BlockBuster
) -> AsyncIterator[MakeEngine]:
    """Start an engine on the same data each call, stopping the one before as a clean
    exit does, or as a crash does with ``crash=True``."""
    running: list[EngineService] = []

    async def again(*, crash: bool = False, **config: Any) -> EngineService:
        if running:
            before = running.pop()
            await (_crash(before) if crash else before.close())
        service = _open(request.param, tmp_path / "engine", config)
        await service.start()
        running.append(service)
        return service

    yield again
    for service in running:
        await service.close()
