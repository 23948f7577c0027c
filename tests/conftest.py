"""Shared fixtures: a real gateway on 127.0.0.1 and an HTTP client for it."""

from __future__ import annotations

import dataclasses
import os
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from blockbuster import BlockBuster, blockbuster_ctx

import feeds.redis  # noqa: F401  (imported here, not on a test's event loop: it reads a file)
from feeds.embedded import EmbeddedEngine
from feeds.engine import Engine
from feeds.store import Store
from gateway.server.app import build_app
from gateway.server.config import Config
from gateway.server.connections import GatewayRunner
from gateway.server.keys import SERVICE
from gateway.server.run import make_runner, start_site
from main import open_engine
from tests import nodes

# Gateways the tests start in processes of their own run no Spark worker unless a test
# asks (a JVM each would cost the suite minutes of CPU); in-process ones: make_gateway.
os.environ.setdefault("RESTMS_ANALYTICS_PRELOAD", "0")


@dataclasses.dataclass
class Gateway:
    """A running gateway: its base URL, its engine and a client session bound to it."""

    url: str
    app: web.Application
    http: aiohttp.ClientSession
    runner: GatewayRunner | None = None
    # Several nodes behind a proxy (tests/nodes.py): what stops them, in order.
    closers: list[Callable[[], Awaitable[None]]] = dataclasses.field(default_factory=list)

    async def stop(self) -> None:
        """Shut this gateway down as a clean exit does (its store is committed, closed)."""
        await self.http.close()
        if self.runner is not None:
            runner, self.runner = self.runner, None
            await runner.cleanup()
        closers, self.closers = self.closers, []
        for close in closers:
            await close()

    @property
    def embedded(self) -> EmbeddedEngine:
        """The app's engine service, which the tests know to be the embedded engine."""
        service = self.app[SERVICE]
        assert isinstance(service, EmbeddedEngine)
        return service

    @property
    def engine(self) -> Engine:
        """The embedded engine's live state, for tests that look behind the service."""
        return self.embedded.engine

    @property
    def store(self) -> Store:
        store = self.embedded.store
        assert store is not None, "this gateway keeps nothing (store = memory)"
        return store

    def uri(self, path: str) -> str:
        return self.url + path


MakeGateway = Callable[..., Awaitable[Gateway]]

SHM = "/dev/shm"
SHM_FREE = 2 << 30  # bytes free on it at least (a whole run writes about 100 MB)


def pytest_configure(config: pytest.Config) -> None:
    """Temporary directories (``tmp_path``, so every gateway's data_dir) in memory.

    Starting a gateway creates its SQLite store, a handful of fsyncs: about 50 ms on a
    disk against 3 ms in memory, and the app tests start some two thousand gateways.
    Nothing tested depends on the disk: a crash test kills a process, and what it
    wrote stays in the page cache either way. Where /dev/shm is missing, read-only or
    small (a container's 64 MB), or ``PYTEST_DEBUG_TEMPROOT`` is set, pytest's own
    choice stands.
    """
    if "PYTEST_DEBUG_TEMPROOT" in os.environ or not os.access(SHM, os.W_OK):
        return
    free = os.statvfs(SHM)
    if free.f_bavail * free.f_frsize >= SHM_FREE:
        os.environ["PYTEST_DEBUG_TEMPROOT"] = SHM  # read when the first tmp_path is made


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Keep each module's tests on one worker when the suite runs on several
    (scripts/test, ``--dist loadgroup``): its module-scoped fixtures are made once, as
    in a run on one process. The Spark tests share one group, so one JVM serves them
    all (their session fixture)."""
    for item in items:
        module = item.nodeid.split("::", 1)[0]
        group = "spark" if module.startswith("tests/spark/") else module
        item.add_marker(pytest.mark.xdist_group(group))


async def serve(config: Config) -> tuple[web.Application, GatewayRunner, str]:
    """Build and start a gateway on 127.0.0.1 as production does; its app, runner, URL."""
    app = build_app(config, open_engine(config))
    runner = make_runner(app, config)
    await runner.setup()
    try:
        await start_site(runner, config, "127.0.0.1", 0)
    except BaseException:
        await runner.cleanup()
        raise
    host, port = runner.addresses[0][:2]
    return app, runner, f"{'https' if config.tls_cert else 'http'}://{host}:{port}"


@pytest.fixture
def blockbuster() -> Iterator[BlockBuster]:
    """Fail any test that makes a blocking call on the event loop (STYLE 11)."""
    with blockbuster_ctx() as bb:
        yield bb


@pytest.fixture
def topology(request: pytest.FixtureRequest) -> str:
    """How :func:`make_gateway`'s gateways run: ``one`` gateway on the embedded engine,
    or ``three-nodes`` on the cluster engine behind a round-robin proxy (tests/nodes.py:
    modules marked ``nodes`` run every test both ways)."""
    return str(getattr(request, "param", "one"))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "topology" in metafunc.fixturenames and metafunc.definition.get_closest_marker("nodes"):
        metafunc.parametrize("topology", nodes.TOPOLOGIES, indirect=True)


@pytest.fixture
async def make_gateway(
    tmp_path: Path, blockbuster: BlockBuster, topology: str
) -> AsyncIterator[MakeGateway]:
    """Start real gateways on 127.0.0.1 (random ports) with config overrides.

    Built as production builds them (``gateway.server.run``). With ``tls_cert`` and
    ``tls_key`` overrides the gateway serves HTTPS; ``client_ssl`` is then the context
    its client session verifies the server with. In the ``three-nodes`` topology each
    gateway is three nodes of the cluster engine, reached through a round-robin proxy.
    """
    started: list[Gateway] = []

    async def start(*, client_ssl: ssl.SSLContext | None = None, **overrides: Any) -> Gateway:
        overrides.setdefault("data_dir", str(tmp_path / "var"))
        # A JVM per test gateway would cost minutes of CPU: the Spark tests ask for one.
        overrides.setdefault("analytics_preload", False)
        closers: list[Callable[[], Awaitable[None]]] = []
        if topology == "three-nodes":
            app, url, closers = await nodes.start(serve, Config, overrides)
            runner = None
        else:
            app, runner, url = await serve(Config(port=0, **overrides))
        connector = aiohttp.TCPConnector(ssl=client_ssl) if client_ssl is not None else None
        session = aiohttp.ClientSession(
            base_url=url, timeout=aiohttp.ClientTimeout(total=30), connector=connector
        )
        started.append(Gateway(url=url, app=app, http=session, runner=runner, closers=closers))
        return started[-1]

    yield start
    for gateway in started:
        await gateway.stop()


@pytest.fixture
async def gw(make_gateway: MakeGateway) -> Gateway:
    """A gateway with the default configuration."""
    return await make_gateway()
