"""GET /readyz and who may GET /metrics, against a real gateway on 127.0.0.1."""

from __future__ import annotations

import asyncio
import re
import sqlite3
import threading
import time
from pathlib import Path

import pytest

import bridges.config
from feeds.store import FILE_NAME
from tests.app.oauth import clients, token
from tests.conftest import Gateway, MakeGateway

pytestmark = pytest.mark.app

NOWHERE = "amqp://127.0.0.1:1"  # refuses connections: the bridge never gets "up"


SINCE = re.compile(r" since \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")
WORKER = "analytics worker: stopped"  # no query yet, and the tests' gateways preload none


async def ready(gw: Gateway, **headers: str) -> tuple[int, list[str]]:
    """The status and the lines, the analytics worker's without its time."""
    async with gw.http.get("/readyz", headers=headers) as r:
        assert r.content_type == "text/plain"
        return r.status, [SINCE.sub("", line) for line in (await r.text()).splitlines()]


async def test_a_running_gateway_is_ready_and_says_why(make_gateway: MakeGateway) -> None:
    gw = await make_gateway()
    status, lines = await ready(gw)
    assert status == 200
    assert lines == ["ready", "store: committing", WORKER]


async def test_readyz_is_public_even_when_anonymous_requests_are_not(
    make_gateway: MakeGateway,
) -> None:
    gw = await make_gateway(anonymous=False, guest_user=False)
    async with gw.http.get("/restms/domain/default") as r:
        assert r.status == 401
    status, lines = await ready(gw)
    assert (status, lines[0]) == (200, "ready")


async def test_not_ready_once_shutdown_has_begun(make_gateway: MakeGateway) -> None:
    gw = await make_gateway()
    await gw.app.shutdown()  # what the server's signal handler starts with
    status, lines = await ready(gw)
    assert status == 503
    assert "shutting down" in " ".join(lines)


class Lock:
    """Another connection holding the store's write lock, as another process could."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._taken = threading.Event()
        self._release = threading.Event()
        self._thread = threading.Thread(target=self._hold, daemon=True)

    def _hold(self) -> None:
        db = sqlite3.connect(self._path, isolation_level=None)
        db.execute("BEGIN IMMEDIATE")
        self._taken.set()
        self._release.wait(30)
        db.execute("ROLLBACK")
        db.close()

    async def __aenter__(self) -> Lock:
        self._thread.start()
        assert await asyncio.to_thread(self._taken.wait, 10)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._release.set()
        await asyncio.to_thread(self._thread.join, 10)


async def test_not_ready_while_the_store_cannot_commit(
    make_gateway: MakeGateway, tmp_path: Path
) -> None:
    gw = await make_gateway(ready_commit_timeout=0.3)
    async with Lock(tmp_path / "var" / FILE_NAME):
        status, lines = await ready(gw)
        assert status == 503
        assert lines == ["not ready", "store: no commit within 0.3 s", WORKER]
    # The writer gets the lock once it is released (within the store's busy timeout).
    status, lines = await ready(gw)
    assert (status, lines) == (200, ["ready", "store: committing", WORKER])


async def test_a_failed_commit_is_counted_and_the_probe_shows_recovery(
    make_gateway: MakeGateway, tmp_path: Path
) -> None:
    # The store's transactions outlast the probe's 0.3 s, so the probe says it saw no
    # commit (and why the last one failed) rather than the failure itself.
    gw = await make_gateway(ready_commit_timeout=0.3, store_busy_timeout=1.5, metrics_access="open")
    store = gw.store
    async with Lock(tmp_path / "var" / FILE_NAME):
        status, lines = await ready(gw)  # its test transaction waits for the lock ...
        assert status == 503
        deadline = time.monotonic() + 10  # ... until the store's busy timeout ends it
        while not store.failing:
            assert time.monotonic() < deadline, "the store's transaction never failed"
            await asyncio.sleep(0.05)
        assert store.failures == 1
        async with gw.http.get("/metrics") as r:
            text = await r.text()
        assert "restms_store_failing 1.0" in text.splitlines()
        assert "restms_store_commit_failures_total 1.0" in text.splitlines()
        status, lines = await ready(gw)
        assert status == 503
        assert lines[1] == "store: no commit within 0.3 s (the last transaction failed: " + (
            "database is locked)"
        )
    status, lines = await ready(gw)  # the probe commits, which clears the failure
    assert (status, lines) == (200, ["ready", "store: committing", WORKER])
    assert not store.failing


async def test_bridges_are_listed_and_decide_only_when_configured_to(
    make_gateway: MakeGateway,
) -> None:
    bridge = bridges.config.parse(
        {
            "name": "up-north",
            "direction": "out",
            "urls": [NOWHERE],
            "feed": "default",
            "target": "/queue/x",
        }
    )
    relaxed = await make_gateway(bridges=(bridge,), store="memory")
    status, lines = await ready(relaxed)
    assert status == 200
    assert lines[0] == "ready"
    assert any(line.startswith("bridge up-north: ") for line in lines)
    strict = await make_gateway(bridges=(bridge,), store="memory", ready_needs_bridges=True)
    status, lines = await ready(strict)
    assert status == 503
    assert lines[0] == "not ready"
    assert lines[1].startswith("bridge up-north: ")
    assert not lines[1].endswith(": up")


async def test_the_analytics_worker_is_listed_and_decides_only_when_configured_to(
    make_gateway: MakeGateway,
) -> None:
    off = await make_gateway(analytics=False, mirror=False)
    assert await ready(off) == (200, ["ready", "store: committing", "analytics: off"])
    strict = await make_gateway(ready_needs_analytics=True, mirror=False)
    assert await ready(strict) == (503, ["not ready", WORKER, "store: committing"])


async def test_metrics_need_the_scope_unless_opened(make_gateway: MakeGateway) -> None:
    configured, secrets = await clients(
        scraper="restms:metrics", narrow="restms:metrics:domain/default", reader="restms:read"
    )
    gw = await make_gateway(clients=configured, oauth_issuer="http://gw.test")

    async def scrape(**headers: str) -> int:
        async with gw.http.get("/metrics", headers=headers) as r:
            await r.read()
            return r.status

    bearer = {n: f"Bearer {await token(gw, n, s)}" for n, s in secrets.items()}
    assert await scrape() == 403  # the loopback guest has no restms:metrics
    assert await scrape(Authorization=bearer["scraper"]) == 200
    assert await scrape(Authorization=bearer["narrow"]) == 403  # honoured only unqualified
    assert await scrape(Authorization=bearer["reader"]) == 403
    assert await scrape(Authorization="Bearer nonsense") == 401

    loopback = await make_gateway(metrics_access="loopback", anonymous=False)
    async with loopback.http.get("/metrics") as r:
        assert r.status == 200  # from this host, without credentials
    async with loopback.http.get("/metrics", headers={"X-Forwarded-For": "192.0.2.7"}) as r:
        assert r.status == 401  # relayed by a proxy: not trusted as loopback
    opened = await make_gateway(metrics_access="open", anonymous=False)
    async with opened.http.get("/metrics", headers={"X-Forwarded-For": "192.0.2.7"}) as r:
        assert r.status == 200
