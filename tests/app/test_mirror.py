"""The traffic mirror against a real gateway on 127.0.0.1 (docs/ANALYTICS.md).

Real traffic goes through a real gateway (asynclet GETs, SSE, acknowledgements,
expiry, leases running out, dead letters, a full pipe, a webhook receiver); the
gateway is stopped (which writes what the mirror holds) and the lake is read back with
pyarrow's Hive partitioning.

Decided behaviour under test:

* Each event type is written exactly as often as it happened, with its domain, feed,
  feed type, address, pipe digest, message id, size, principal and outcome; deliver
  and ack events carry the milliseconds since the message arrived.
* No pipe name appears anywhere in the lake (a pipe's name is its capability): pipes
  are named by the digest :func:`feeds.publishing.label` shows, and addresses on the
  default feed (which are pipe names) by the same digest.
* Every file has exactly the documented schema and none is left hidden (``.tmp-``).
* ``GET /admin/mirror`` shows the counters to an admin only; with ``mirror = false``
  nothing is written and the engine has no sink; a full queue drops and counts; an
  unwritable lake is counted and the gateway goes on serving.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pyarrow.parquet as pq

from gateway.admin.mirroring import MIRROR
from gateway.server.keys import CONFIG
from spark_sink.lake import SCHEMA
from tests.app.jsonapi import DOMAIN, HJ, body, get, post, publish
from tests.app.test_webhooks import FAST, Receiver, until, webhook
from tests.conftest import Gateway, MakeGateway

ADMIN = "restms:read restms:publish restms:subscribe restms:admin"
WAIT = 5.0


def digest(name: str) -> str:
    return hashlib.sha256(name.encode()).hexdigest()[:12]


def lake_of(gw: Gateway) -> Path:
    return Path(gw.app[CONFIG].data_dir) / "lake"


def read_lake(lake: Path) -> list[dict[str, Any]]:
    dataset = ds.dataset(lake, format="parquet", partitioning="hive")
    rows: list[dict[str, Any]] = dataset.to_table().to_pylist()
    return rows


def checked_lake(lake: Path) -> list[dict[str, Any]]:
    """The lake's rows, once every file is found complete, partitioned and of the
    documented schema."""
    files = sorted(lake.rglob("*.parquet"))
    assert files
    assert not list(lake.rglob(".tmp-*"))
    for f in files:
        assert pq.read_schema(f).remove_metadata() == SCHEMA
        assert f.parent.name.startswith("hour=")
        assert f.parent.parent.name.startswith("date=")
    return read_lake(lake)


async def feed(gw: Gateway, name: str) -> str:
    status, reply, _ = await post(gw, DOMAIN, feed=[{"name": name, "type": "fanout"}])
    assert status in (200, 201), reply
    return f"/restms/feed/{name}"


async def joined(gw: Gateway, feed_uri: str, **options: str) -> dict[str, Any]:
    status, reply, location = await post(gw, DOMAIN, pipe=[options])
    assert status == 201, reply
    pipe: dict[str, Any] = reply["restms"]["pipe"][0]
    pipe["uri"] = location
    status, reply, _ = await post(gw, location, join=[{"feed": gw.uri(feed_uri)}])
    assert status == 201, reply
    return pipe


def hello(message_id: str, **extra: str) -> dict[str, Any]:
    return {"address": "eu.1", "message_id": message_id, "content": [{"value": "hello"}], **extra}


async def held(gw: Gateway, pipe: dict[str, Any]) -> list[str]:
    status, reply = await get(gw, pipe["uri"])
    assert status == 200, reply
    return [m["href"] for m in reply["restms"]["pipe"][0]["message"] if m.get("async") != "1"]


async def test_traffic_is_mirrored_with_exact_counts_and_fields(
    make_gateway: MakeGateway, tmp_path: Path
) -> None:
    receiver = await Receiver().start()
    try:
        gw = await make_gateway(sweep_interval=0.05, **FAST)
        names = await _traffic(gw, receiver)
        lake = lake_of(gw)
        await gw.stop()  # the mirror writes what it holds
    finally:
        await receiver.stop()
    rows = await asyncio.to_thread(checked_lake, lake)
    counts = Counter((r["event"], r["feed"]) for r in rows)
    assert counts == Counter(
        {
            ("publish", "orders"): 4,
            ("route", "orders"): 6,
            ("deliver", "orders"): 6,
            ("ack", "orders"): 3,
            ("publish", "small"): 2,
            ("route", "small"): 1,
            ("drop", "small"): 1,
            ("publish", "ttl"): 1,
            ("route", "ttl"): 1,
            ("expire", "ttl"): 1,
            ("publish", "work"): 1,
            ("route", "work"): 1,
            ("deliver", "work"): 1,
            ("redeliver", "work"): 1,
            ("dead_letter", "work"): 1,
            ("publish", "default"): 1,
            ("route", "default"): 1,
            ("webhook_attempt", "default"): 1,
            ("deliver", "default"): 1,
            ("ack", "default"): 1,
        }
    )
    # No pipe's name anywhere, in any column.
    for row in rows:
        for value in row.values():
            assert not any(name in str(value) for name in names.values()), row
    orders = [r for r in rows if r["feed"] == "orders"]
    size = (
        sum(map(len, ("eu.1", "message_id", "m1"))) + 5
    )  # its address, its one property, its content
    assert {(r["domain"], r["feed_type"], r["address"], r["size"]) for r in orders} == {
        ("default", "fanout", "eu.1", size)
    }
    published = sorted((r["message_id"], r["outcome"]) for r in orders if r["event"] == "publish")
    assert published == [("m1", "duplicate"), ("m1", "ok"), ("m2", "ok"), ("m3", "ok")]
    assert {r["principal"] for r in orders if r["event"] == "publish"} == {"guest"}
    assert {r["pipe"] for r in orders if r["event"] == "publish"} == {None}
    routed = Counter(r["pipe"] for r in orders if r["event"] == "route")
    assert routed == {digest(names["a"]): 3, digest(names["b"]): 3}
    delivered = [r for r in orders if r["event"] == "deliver"]
    assert Counter(r["pipe"] for r in delivered) == routed
    acks = [r for r in orders if r["event"] == "ack"]
    assert {r["pipe"] for r in acks} == {digest(names["a"])}
    for r in delivered + acks:
        assert r["principal"] == "guest"  # the pipe's owner: its reader
        assert 0 <= r["latency_ms"] < 30_000
    assert min(r["latency_ms"] for r in acks) >= 50  # acknowledged after a pause
    assert all(r["latency_ms"] is None for r in rows if r["event"] in ("publish", "route"))
    (drop,) = [r for r in rows if r["event"] == "drop"]
    assert (drop["outcome"], drop["pipe"]) == ("full", digest(names["c"]))
    (expired,) = [r for r in rows if r["event"] == "expire"]
    assert (expired["outcome"], expired["pipe"]) == ("expired", digest(names["d"]))
    (dead,) = [r for r in rows if r["event"] == "dead_letter"]
    assert (dead["outcome"], dead["message_id"]) == ("max-deliveries", "w1")
    hooked = [r for r in rows if r["feed"] == "default"]
    assert {r["address"] for r in hooked} == {digest(names["w"])}
    assert {r["pipe"] for r in hooked if r["event"] != "publish"} == {digest(names["w"])}
    (attempt,) = [r for r in hooked if r["event"] == "webhook_attempt"]
    assert attempt["outcome"] == "204"
    stamps = [r["ts"].timestamp() for r in rows]
    assert all(abs(ts - time.time()) < 120 for ts in stamps)


async def _traffic(gw: Gateway, receiver: Receiver) -> dict[str, str]:
    """The traffic the first test mirrors; the pipes' names by letter."""
    orders = await feed(gw, "orders")
    a, b = await joined(gw, orders), await joined(gw, orders)
    assert await publish(gw, orders, hello("m1"), hello("m2"), hello("m3")) == [2, 2, 2]
    for href in await held(gw, a):  # three asynclet GETs
        status, _ = await get(gw, href)
        assert status == 200
    await asyncio.sleep(0.06)
    last = (await held(gw, a))[-1]
    async with gw.http.delete(last) as r:
        assert r.status == 200  # acknowledges all three
    async with gw.http.get(b["uri"], headers={"Accept": "text/event-stream"}) as sse:
        seen = 0
        async with asyncio.timeout(WAIT):
            while seen < 3:
                seen += (await sse.content.readline()).startswith(b"event: message")
    status, reply, _ = await post(gw, orders, message=[hello("m1")])
    assert status == 200
    assert reply["restms"]["message"][0]["count"] == "2"  # a duplicate: answered, not routed

    small = await feed(gw, "small")
    c = await joined(gw, small, max_messages="1")
    assert await publish(gw, small, hello("s1"), hello("s2")) == [1, 0]

    ttl = await feed(gw, "ttl")
    d = await joined(gw, ttl)
    assert await publish(gw, ttl, hello("t1", expiration="50")) == [1]
    await asyncio.sleep(0.15)
    assert await held(gw, d) == []  # expired, unread

    work = await feed(gw, "work")
    e = await joined(gw, work, lease="0.1", max_deliveries="1")
    assert await publish(gw, work, hello("w1")) == [1]
    (href,) = await held(gw, e)
    assert (await get(gw, href))[0] == 200
    await until(lambda: gw.engine.counters.dead_lettered == 1, "the lease to run out")

    w = await webhook(gw, receiver.url)
    message = {"address": w["name"], "message_id": "h1", "content": [{"value": "hello"}]}
    async with gw.http.post("/restms/feed/default", data=body(message=[message]), headers=HJ) as r:
        assert r.status == 200
    await until(lambda: gw.engine.counters.acknowledged >= 4, "the webhook delivery")
    return {"a": a["name"], "b": b["name"], "c": c["name"], "d": d["name"], "e": e["name"]} | {
        "w": w["name"]
    }


async def test_admin_mirror_shows_counters_to_admins_only(make_gateway: MakeGateway) -> None:
    gw = await make_gateway(guest_scopes=ADMIN)
    orders = await feed(gw, "orders")
    await joined(gw, orders)
    await publish(gw, orders, hello("m1"))
    assert await asyncio.to_thread(gw.app[MIRROR].flush, WAIT)
    async with gw.http.get("/admin/mirror") as r:
        assert r.status == 200
        assert r.headers["Cache-Control"] == "no-store"
        status = await r.json()
    assert status["enabled"] is True
    assert status["emitted"] == 2  # publish and route
    assert status["dropped"] == 0
    assert status["lake"] == str(lake_of(gw))
    plain = await make_gateway()  # the loopback guest: no admin scope
    async with plain.http.get("/admin/mirror") as r:
        assert r.status == 403
        assert r.content_type == "text/plain"
        assert "restms:admin" in await r.text()


async def test_mirror_off_writes_nothing(make_gateway: MakeGateway) -> None:
    gw = await make_gateway(mirror=False, guest_scopes=ADMIN)
    assert gw.engine.mirror is None
    orders = await feed(gw, "orders")
    await joined(gw, orders)
    await publish(gw, orders, hello("m1"))
    async with gw.http.get("/admin/mirror") as r:
        assert (await r.json())["enabled"] is False
    lake = lake_of(gw)
    await gw.stop()
    assert not await asyncio.to_thread(lake.exists)


async def test_a_full_queue_drops_and_counts(make_gateway: MakeGateway) -> None:
    """A publish's events are queued or dropped together: one message (a publish and a
    route event) fits in a queue of five events, a hundred (200 events) never do."""
    gw = await make_gateway(mirror_queue=5, guest_scopes=ADMIN)
    orders = await feed(gw, "orders")
    await joined(gw, orders)
    assert await publish(gw, orders, hello("first")) == [1]
    assert await publish(gw, orders, *(hello(f"m{n}") for n in range(100))) == [1] * 100
    async with gw.http.get("/admin/mirror") as r:
        status = await r.json()
    assert (status["emitted"], status["dropped"]) == (202, 200)
    lake = lake_of(gw)
    mirror = gw.app[MIRROR]
    await gw.stop()
    counters = mirror.counters
    rows = await asyncio.to_thread(checked_lake, lake)
    # Written: the first publish's two rows, and the row that says 200 were dropped.
    assert counters.written == mirror.emitted - counters.dropped + 1 == len(rows) == 3
    assert [r["message_id"] for r in rows if r["event"] != "mirror_lost"] == ["first", "first"]
    assert [r["size"] for r in rows if r["event"] == "mirror_lost"] == [200]


async def test_an_unwritable_lake_is_counted_and_the_gateway_serves_on(
    make_gateway: MakeGateway, tmp_path: Path
) -> None:
    blocked = tmp_path / "not-a-directory"
    await asyncio.to_thread(blocked.write_text, "a file where the lake should be")
    gw = await make_gateway(mirror_lake=str(blocked), guest_scopes=ADMIN)
    orders = await feed(gw, "orders")
    await joined(gw, orders)
    mirror = gw.app[MIRROR]
    for n in range(3):
        await publish(gw, orders, hello(f"m{n}"))
        assert await asyncio.to_thread(mirror.flush, WAIT)
    async with gw.http.get("/admin/mirror") as r:
        status = await r.json()
    assert status["errors"] >= 1
    assert (status["written"], status["files"], status["lost"]) == (0, 0, 6)
    assert "not-a-directory" in status["last_error"]
    async with gw.http.get("/healthz") as r:
        assert r.status == 200
