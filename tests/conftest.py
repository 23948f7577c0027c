"""Shared fixtures: a real gateway on 127.0.0.1 and an HTTP client for it."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from blockbuster import BlockBuster, blockbuster_ctx

from feeds.engine import Engine
from gateway.app import build_app
from gateway.config import Config
from gateway.keys import ENGINE


@dataclasses.dataclass
class Gateway:
    """A running gateway: its base URL, its engine and a client session bound to it."""

    url: str
    app: web.Application
    http: aiohttp.ClientSession
    runner: web.AppRunner | None = None

    async def stop(self) -> None:
        """Shut this gateway down as a clean exit does (its store is committed, closed)."""
        await self.http.close()
        if self.runner is not None:
            runner, self.runner = self.runner, None
            await runner.cleanup()

    @property
    def engine(self) -> Engine:
        return self.app[ENGINE]

    def uri(self, path: str) -> str:
        return self.url + path


MakeGateway = Callable[..., Awaitable[Gateway]]


@pytest.fixture
def blockbuster() -> Iterator[BlockBuster]:
    """Fail any test that makes a blocking call on the event loop (STYLE 11)."""
    with blockbuster_ctx() as bb:
        yield bb


@pytest.fixture
async def make_gateway(tmp_path: Path, blockbuster: BlockBuster) -> AsyncIterator[MakeGateway]:
    """Start real gateways on 127.0.0.1 (random ports) with config overrides."""
    started: list[Gateway] = []

    async def start(**overrides: Any) -> Gateway:
        overrides.setdefault("data_dir", str(tmp_path / "var"))
        config = Config(port=0, **overrides)
        app = build_app(config)
        runner = web.AppRunner(
            app, handler_cancellation=True, access_log=None, shutdown_timeout=1.0
        )
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        host, port = runner.addresses[0][:2]
        url = f"http://{host}:{port}"
        session = aiohttp.ClientSession(base_url=url, timeout=aiohttp.ClientTimeout(total=30))
        started.append(Gateway(url=url, app=app, http=session, runner=runner))
        return started[-1]

    yield start
    for gateway in started:
        await gateway.stop()


@pytest.fixture
async def gw(make_gateway: MakeGateway) -> Gateway:
    """A gateway with the default configuration."""
    return await make_gateway()
