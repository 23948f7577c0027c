"""The engines the conformance suite runs against: its one seam.

Every test in this folder speaks to an engine through :mod:`feeds.service` alone. Only
the fixtures below know which engine that is; another engine joins the suite by adding
its name to ``ENGINES`` (and to ``DURABLE`` when it keeps messages across a restart)
and a branch to :func:`_open`.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import pytest
from blockbuster import BlockBuster

from feeds.config import EngineConfig
from feeds.embedded import EmbeddedEngine
from feeds.redis import RedisEngine
from feeds.redis.link import DRIVER
from feeds.service import EngineService
from tests.app.test_readyz import Lock
from tests.nodes import CLUSTER_URL, PORTS
from tests.nodes import forget as forget_namespace

ENGINES = ("embedded-memory", "embedded-sqlite", "redis")
# Engines whose persistent messages survive a restart. The Redis engine keeps every
# message (AOF) across an engine's restart: it is a gateway node going, not the store.
DURABLE = ("embedded-sqlite", "redis")
# What the Redis engine does not do yet: these tests (by name, without the engine
# parameter) run on the embedded engines only. Each line says what is missing.
REDIS_LACKS = frozenset(
    {
        # Paging to disk past a memory budget: the cluster holds every message (its
        # memory is the budget), so nothing is "on disk" in the engine's sense.
        "test_a_purge_takes_what_is_on_disk_and_is_kept",
        "test_messages_past_the_memory_budget_are_read_back_in_order",
        "test_memory_only_messages_past_the_memory_budget_are_lost_in_a_restart",
    }
)
# Leases run out and the journal is flushed within these many seconds, so tests that
# wait for either stay short.
SWEEP = 0.02
FLUSH = 0.01
# Seconds the embedded engine's commits wait for the store's write lock while another
# connection holds it (refuse_commits), before they fail: a commit refused that way
# fails as one refused after the default 5 s does, in a fraction of the time.
BUSY = 0.25

MakeEngine = Callable[..., Awaitable[EngineService]]


def _open(kind: str, data: Path, config: dict[str, Any]) -> EngineService:
    """``data``: the embedded engine's directory; its name, the Redis engine's namespace."""
    engine_config = EngineConfig(**config)
    if kind == "redis":
        return RedisEngine.open(
            engine_config, CLUSTER_URL, namespace=_namespace(data), sweep_interval=SWEEP
        )
    if kind == "embedded-memory":
        return EmbeddedEngine.open(engine_config, sweep_interval=SWEEP, journal_interval=FLUSH)
    if kind == "embedded-sqlite":
        return EmbeddedEngine.open(
            engine_config, data, busy_timeout=BUSY, sweep_interval=SWEEP, journal_interval=FLUSH
        )
    raise ValueError(f"no engine named {kind!r}")


def _namespace(data: Path) -> str:
    """A test's own key namespace on the shared cluster (one per data directory)."""
    made = _NAMESPACES.get(data)
    if made is None:
        made = _NAMESPACES[data] = f"restms-test-{secrets.token_hex(6)}"
    return made


_NAMESPACES: dict[Path, str] = {}


async def _forget(data: Path) -> None:
    namespace = _NAMESPACES.pop(data, None)
    if namespace is not None:
        await forget_namespace(namespace)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrise by engine: every engine, but the Redis engine only where it does
    what the test asks (REDIS_LACKS)."""
    name = metafunc.definition.originalname
    for fixture, kinds in (("make_engine", ENGINES), ("restart", DURABLE)):
        if fixture in metafunc.fixturenames:
            chosen = [k for k in kinds if k != "redis" or name not in REDIS_LACKS]
            metafunc.parametrize(fixture, chosen, indirect=True)


@pytest.fixture
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
    for index in range(len(started)):
        await _forget(tmp_path / f"engine-{index}")


@pytest.fixture
async def engine(make_engine: MakeEngine) -> EngineService:
    return await make_engine()


def keeps_every_message(service: EngineService) -> bool:
    """Whether the engine keeps non-persistent messages across its restart too: the
    Redis engine's restart is a gateway node going, while the cluster keeps every
    message it took."""
    return isinstance(service, RedisEngine)


def refuse_commits(service: EngineService) -> AbstractAsyncContextManager[object]:
    """While inside, the engine's commits fail for real (they do not fake a failure).

    For the embedded engine: another connection holds the store's write lock, as
    another process could, so a transaction gives up after the store's busy timeout
    (``BUSY``). For the Redis engine: every master demands two replicas before it
    takes a write (``min-replicas-to-write``), and each has one, so writes fail with
    NOREPLICAS.
    """
    if isinstance(service, RedisEngine):
        return _no_replicas()
    assert isinstance(service, EmbeddedEngine)
    assert service.store is not None
    return Lock(service.store.path)


@contextlib.asynccontextmanager
async def _no_replicas() -> AsyncIterator[None]:
    from redis.asyncio import Redis

    masters = []
    for port in PORTS:
        client = Redis(host="127.0.0.1", port=port, driver_info=DRIVER)
        role = await client.execute_command("ROLE")
        if role[0] == b"master":
            masters.append(client)
        else:
            await client.aclose()
    try:
        for client in masters:
            await client.config_set("min-replicas-to-write", 2)
        yield
    finally:
        for client in masters:
            await client.config_set("min-replicas-to-write", 0)
            await client.aclose()


async def _crash(service: EngineService) -> None:
    """Stop as a killed process would: whatever the engine did not commit is lost.

    For the embedded engine: its background tasks (the journal flusher) stop at once,
    and the journal it still holds is never handed to the store, whose writer only
    finishes the transactions already handed to it, as SQLite would have them once
    their commit returned.
    """
    if isinstance(service, RedisEngine):  # its tasks stop; it says goodbye to nobody
        await service.crash()
        return
    assert isinstance(service, EmbeddedEngine)
    for task in service._tasks:
        task.cancel()
    service.engine.shutdown()
    if service.store is not None:
        await asyncio.to_thread(service.store.close)


@pytest.fixture
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
    await _forget(tmp_path / "engine")
