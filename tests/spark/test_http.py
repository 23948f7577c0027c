"""Analytics end to end: real traffic through a real gateway on 127.0.0.1, mirrored
into its lake, queried over HTTP (the gateway's Spark worker) and from the command
line. The dashboard's test, in headless Chromium, is tests/browser/test_dashboard.py.

Decided behaviour under test (docs/ANALYTICS.md, "Interfaces"):

* What the test published, fetched and acknowledged is what ``GET /analytics/...``
  counts, exactly; latencies equal the lake's own (read with pyarrow), percentiles by
  nearest rank; every query's JSON equals the same query run in-process.
* No token or a token without the scope: 401 / 403 with a challenge; a narrowed
  ``restms:analytics`` scope is refused; bad parameters and unknown queries are 400
  with a text/plain reason, and never reach the worker.
* A repeated request is answered from the cache (``X-Analytics-Cache: hit`` and the
  counter in ``GET /analytics``).
* A query that outlives ``analytics_timeout`` is 504 with ``Retry-After``.
"""

from __future__ import annotations

import asyncio
import datetime
from typing import Any

import aiohttp
import pyarrow.dataset as ds
import pytest

from gateway.admin.analytics import ANALYTICS
from gateway.admin.mirroring import MIRROR
from gateway.server.keys import CONFIG
from spark_sink import queries, schema
from spark_sink.params import UTC, Params, iso
from tests.app.jsonapi import DOMAIN, get, post, publish
from tests.app.oauth import clients, token
from tests.conftest import MakeGateway
from tests.spark.conftest import WORKER_SETTINGS
from tests.spark.lake import nearest_rank

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]

WAIT = 10.0
SLOW = aiohttp.ClientTimeout(total=180)  # the first query starts the Spark worker
MESSAGES = 5


def size(i: int) -> int:
    """Message i's size as the mirror records it: its address, its message_id property
    (name and value) and its content."""
    return len(f"eu.{i % 2}") + len("message_id") + len(f"m{i}") + 10 + i


async def traffic(gw) -> dict[str, Any]:
    """Five messages into a fanout feed with two pipes; pipe a reads all five and
    acknowledges them, pipe b reads two."""
    status, reply, _ = await post(gw, DOMAIN, feed=[{"name": "orders", "type": "fanout"}])
    assert status in (200, 201), reply
    pipes = []
    for _ in range(2):
        status, reply, location = await post(gw, DOMAIN, pipe=[{}])
        assert status == 201, reply
        status, reply, _ = await post(gw, location, join=[{"feed": gw.uri("/restms/feed/orders")}])
        assert status == 201, reply
        pipes.append(location)
    messages = [
        {"address": f"eu.{i % 2}", "message_id": f"m{i}", "content": [{"value": "x" * (10 + i)}]}
        for i in range(MESSAGES)
    ]
    assert await publish(gw, "/restms/feed/orders", *messages) == [2] * MESSAGES
    read = {}
    for pipe, count in zip(pipes, (MESSAGES, 2), strict=True):
        status, reply = await get(gw, pipe)
        assert status == 200, reply
        hrefs = [m["href"] for m in reply["restms"]["pipe"][0]["message"] if m.get("async") != "1"]
        for href in hrefs[:count]:
            assert (await get(gw, href))[0] == 200
        read[pipe] = hrefs[:count]
    async with gw.http.delete(read[pipes[0]][-1]) as r:
        assert r.status == 200  # acknowledges all five of pipe a
    return {"published": MESSAGES, "delivered": MESSAGES + 2, "acked": MESSAGES}


async def ask(gw, path: str, bearer: str | None, **params: str) -> tuple[int, Any, Any]:
    headers = {"Authorization": f"Bearer {bearer}"} if bearer else {}
    async with gw.http.get(path, params=params, headers=headers, timeout=SLOW) as r:
        body = await (r.json() if r.content_type == "application/json" else r.text())
        return r.status, body, r.headers


async def test_http_queries(make_gateway: MakeGateway, spark) -> None:
    configured, secrets = await clients(
        analyst="restms:analytics", narrow="restms:analytics:domain/default", reader="restms:read"
    )
    gw = await make_gateway(clients=configured, **WORKER_SETTINGS)
    analyst = await token(gw, "analyst", secrets["analyst"])
    narrow = await token(gw, "narrow", secrets["narrow"])
    reader = await token(gw, "reader", secrets["reader"])
    started = datetime.datetime.now(UTC).replace(microsecond=0)
    sent = await traffic(gw)
    assert await asyncio.to_thread(gw.app[MIRROR].flush, WAIT)
    lake = gw.app[CONFIG].lake
    since = iso(started - datetime.timedelta(minutes=1))
    until = iso(started + datetime.timedelta(minutes=10))
    window = {"since": since, "until": until}

    # Refusals first: none of them starts the worker.
    status, text, headers = await ask(gw, "/analytics/throughput", "not-a-token")
    assert status == 401
    assert "invalid_token" in headers["WWW-Authenticate"]
    for bearer in (reader, narrow, None):  # None: the loopback guest
        status, text, headers = await ask(gw, "/analytics/throughput", bearer)
        assert status == 403, text
        assert 'scope="restms:analytics"' in headers["WWW-Authenticate"]
    for query, params, reason in (
        ("throughput", {"since": "tomorrow"}, "since must be an ISO 8601 time"),
        ("throughput", {"bucket": "5y"}, "bucket must be a span"),
        ("throughput", {"color": "red"}, "unknown parameter 'color'"),
        ("latencies", {}, "no query 'latencies'"),
    ):
        status, text, headers = await ask(gw, f"/analytics/{query}", analyst, **params)
        assert status == 400
        assert headers["Content-Type"].startswith("text/plain")
        assert reason in text
    async with gw.http.get(
        "/analytics/latency?feed=a&feed=b", headers={"Authorization": f"Bearer {analyst}"}
    ) as r:
        assert r.status == 400
        assert "given twice" in await r.text()
    assert gw.app[ANALYTICS].worker.starts == 0

    # Exact counts from Spark, as sent.
    status, answer, headers = await ask(gw, "/analytics/throughput", analyst, bucket="1h", **window)
    assert status == 200, answer
    assert headers["X-Analytics-Cache"] == "miss"
    (row,) = answer["rows"]
    assert row[1:4] == ["orders", sent["published"], sent["delivered"]]
    assert row[4] == sum(map(size, range(MESSAGES)))
    status, again, headers = await ask(gw, "/analytics/throughput", analyst, bucket="1h", **window)
    assert (status, headers["X-Analytics-Cache"], again) == (200, "hit", answer)
    status, listing, _ = await ask(gw, "/analytics", analyst)
    assert listing["cache"]["hits"] == 1
    assert listing["cache"]["worker_starts"] == 1

    # Latency fields agree with the lake's own rows, read with pyarrow.
    table = await asyncio.to_thread(
        lambda: ds.dataset(lake, format="parquet", partitioning="hive").to_table()
    )
    picked = table.select(["event", "feed", "latency_ms"]).to_pylist()
    rows = [r for r in picked if r["feed"] == "orders"]
    delivers = [r["latency_ms"] for r in rows if r["event"] == schema.DELIVER]
    acks = [r["latency_ms"] for r in rows if r["event"] == schema.ACK]
    assert (len(delivers), len(acks)) == (sent["delivered"], sent["acked"])
    status, latency, _ = await ask(gw, "/analytics/latency", analyst, **window)
    assert status == 200, latency
    got = dict(zip(latency["columns"], latency["rows"][0], strict=True))
    assert got["delivered"] == sent["delivered"]
    assert got["acked"] == sent["acked"]
    assert got["deliver_max_ms"] == max(delivers)
    assert got["deliver_mean_ms"] == pytest.approx(sum(delivers) / len(delivers))
    for share, column in ((0.5, "p50"), (0.9, "p90"), (0.99, "p99")):
        assert got[f"deliver_{column}_ms"] == nearest_rank(delivers, share)
        assert got[f"ack_{column}_ms"] == nearest_rank(acks, share)

    # Every query's answer over HTTP is the in-process answer.
    p = Params.from_wire(latency)
    for name in sorted(queries.BATCH):
        status, answer, _ = await ask(gw, f"/analytics/{name}", analyst, **window)
        assert status == 200, answer
        local = await asyncio.to_thread(queries.run, spark, lake, name, p)
        assert answer["rows"] == [list(r) for r in local.rows], name
    status, principals, _ = await ask(gw, "/analytics/principals", analyst, **window)
    assert principals["rows"] == [["guest", MESSAGES, sum(map(size, range(MESSAGES)))]]

    # A query that outlives analytics_timeout: 504 with the reason; its worker is stopped.
    gw.app[ANALYTICS].timeout = 0.001
    status, text, headers = await ask(gw, "/analytics/bridges", analyst, since="2h")
    assert status == 504
    assert "took longer than 0.001 s" in text
    assert headers["Retry-After"] == "5"
    assert gw.app[ANALYTICS].worker.running is False


async def test_analytics_off_is_503_and_starts_no_worker(make_gateway: MakeGateway) -> None:
    """With ``analytics = false`` a checked query is 503 (Retry-After, text/plain), a bad
    one still 400, the index still answers, and no Spark worker is ever started."""
    configured, secrets = await clients(analyst="restms:analytics")
    gw = await make_gateway(clients=configured, analytics=False, mirror=False)
    analyst = await token(gw, "analyst", secrets["analyst"])
    status, text, headers = await ask(gw, "/analytics/throughput", analyst, since="1h")
    assert status == 503
    assert "analytics are off" in text
    assert headers["Content-Type"].startswith("text/plain")
    assert headers["Retry-After"] == "5"
    status, text, _ = await ask(gw, "/analytics/throughput", analyst, since="yesterday")
    assert status == 400
    status, index, _ = await ask(gw, "/analytics", analyst)
    assert status == 200
    assert index["cache"]["worker_starts"] == 0
    assert gw.app[ANALYTICS].worker.starts == 0
