"""Analytics that keep up, through a real gateway on 127.0.0.1 with its defaults: the
worker starts with the gateway, new traffic shows in the answers within ten seconds,
and an idle worker is stopped.

Decided behaviour under test (docs/ANALYTICS.md, "How the gateway runs Spark",
"Freshness"):

* With ``analytics_preload`` the worker is ``starting`` before any query, then
  ``ready``; ``GET /admin/analytics`` and ``/readyz`` say so, with since when.
* Messages published are counted by ``throughput`` and by the streaming job's
  ``rolling`` within ten seconds (files rotate every 3 s, the job runs every 2 s, an
  answer reaching the present is cached 2 s at most); the answers say nothing was lost.
* A worker that answered nothing for ``analytics_idle_seconds`` is ``idle-released``:
  its process is gone.
"""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any

import aiohttp
import pytest

from tests.app.jsonapi import DOMAIN, post, publish
from tests.app.oauth import clients, token
from tests.conftest import Gateway, MakeGateway
from tests.spark.conftest import PARTITIONS
from tests.spark.processes import gone

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]

FRESH = 10.0  # seconds new traffic may take to show, by default
IDLE = 8.0  # seconds an idle worker lives here
MESSAGES = 7
SLOW = aiohttp.ClientTimeout(total=180)


async def status(gw: Gateway, bearer: str) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {bearer}"}
    async with gw.http.get("/admin/analytics", headers=headers) as r:
        assert r.status == 200
        assert r.headers["Cache-Control"] == "no-store"
        found: dict[str, Any] = await r.json()
        return found


async def readyz_line(gw: Gateway) -> str:
    async with gw.http.get("/readyz") as r:
        assert r.status == 200  # the worker's state is information only, by default
        (line,) = [s for s in (await r.text()).splitlines() if s.startswith("analytics")]
        return line


async def wait_state(gw: Gateway, bearer: str, state: str, within: float) -> dict[str, Any]:
    deadline = time.monotonic() + within
    while True:
        worker = (await status(gw, bearer))["worker"]
        if worker["state"] == state or time.monotonic() > deadline:
            assert worker["state"] == state, worker
            return worker
        await asyncio.sleep(0.2)


async def counted(gw: Gateway, bearer: str, query: str) -> tuple[int, int]:
    """(published, lost) in the last ten minutes, as the query answers now."""
    headers = {"Authorization": f"Bearer {bearer}"}
    params = {"since": "10m"} | ({"bucket": "1h"} if query == "throughput" else {})
    async with gw.http.get(
        f"/analytics/{query}", params=params, headers=headers, timeout=SLOW
    ) as r:
        assert r.status == 200, await r.text()
        answer = await r.json()
    column = answer["columns"].index("published")
    return sum(row[column] for row in answer["rows"]), answer["lost"]


async def shows_within(gw: Gateway, bearer: str, query: str, since: float) -> float:
    """Seconds from ``since`` to the start of the first ``query`` that counts every
    message: FRESH at most. (How long a query then runs is its own time, not the age of
    what it reads.)"""
    while True:
        started = time.monotonic() - since
        published, lost = await counted(gw, bearer, query)
        assert lost == 0
        if published == MESSAGES:
            return started
        assert started <= FRESH, f"{query}: {published} of {MESSAGES} after {started:.1f} s"
        await asyncio.sleep(0.25)


async def test_traffic_shows_within_ten_seconds_and_an_idle_worker_goes(
    make_gateway: MakeGateway, spark
) -> None:
    configured, secrets = await clients(analyst="restms:analytics")
    gw = await make_gateway(
        clients=configured,
        analytics_preload=True,
        analytics_master="local[2]",
        analytics_partitions=PARTITIONS,
        analytics_idle_seconds=IDLE,
    )
    analyst = await token(gw, "analyst", secrets["analyst"])
    first = (await status(gw, analyst))["worker"]
    assert first["state"] in ("starting", "ready")  # before any query
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", first["since"])
    assert re.fullmatch(r"analytics worker: (starting|ready) since \S+Z", await readyz_line(gw))
    ready = await wait_state(gw, analyst, "ready", 180)
    assert ready["starts"] == 1
    assert await readyz_line(gw) == f"analytics worker: ready since {ready['since']}"

    status_, reply, _ = await post(gw, DOMAIN, feed=[{"name": "fresh", "type": "fanout"}])
    assert status_ in (200, 201), reply
    messages = [{"address": f"a.{i}", "content": [{"value": "x"}]} for i in range(MESSAGES)]
    assert await publish(gw, "/restms/feed/fresh", *messages) == [0] * MESSAGES
    published_at = time.monotonic()
    batch = await shows_within(gw, analyst, "throughput", published_at)
    rolling = await shows_within(gw, analyst, "rolling", published_at)
    print(f"fresh: throughput after {batch:.1f} s, rolling after {rolling:.1f} s")

    released = await wait_state(gw, analyst, "idle-released", IDLE + 30)
    assert released["pid"] is None
    assert ready["pid"] is not None
    assert gone(ready["pid"])  # its memory is released: the process has ended (reaped)
