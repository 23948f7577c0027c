"""A federation link made at run time through /admin/bridges, watched as operators
watch it: its status (no secrets), the system feed's events, the backlog and lag
metrics while its remote is away, and the traffic mirror (docs/FEDERATION.md)."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from bridges.config import parse
from feeds.config import FeedConfig
from gateway.admin.bridging import BRIDGES
from gateway.server.keys import SERVICE
from tests.app.oauth import clients
from tests.app.test_events import Watcher
from tests.app.test_mirror import checked_lake, lake_of
from tests.conftest import Gateway, MakeGateway
from tests.integration.gw import new_pipe, publish, take, until

pytestmark = pytest.mark.timeout(60)

FEEDS = (FeedConfig(name="news", type="topic"),)
# The remotes here are gateways on loopback, which a link made at run time may reach
# only when federation_allow says so (docs/FEDERATION.md, "Security").
LOOPBACK = "127.0.0.0/8"


def definition(remote: Gateway, **more: Any) -> dict[str, Any]:
    return {
        "kind": "federation",
        "name": "to-b",
        "direction": "out",
        "feed": "news",
        "address": "#",
        "remote": remote.uri("/restms/feed/news"),
        "retry_min": 0.1,
        "retry_max": 0.5,
        **more,
    }


async def metric(gw: Gateway, name: str) -> float:
    async with gw.http.get("/metrics") as r:
        assert r.status == 200, await r.text()
        text = await r.text()
    line = next(x for x in text.splitlines() if x.startswith(f'{name}{{bridge="to-b"}}'))
    return float(line.rpartition(" ")[2])


async def test_a_link_made_at_run_time_runs_reports_and_is_deleted(
    make_gateway: MakeGateway, tmp_path: Path
) -> None:
    peers, secrets = await clients(peer="restms:publish")
    b = await make_gateway(
        feeds=FEEDS, data_dir=str(tmp_path / "b"), gateway_id="site-b", clients=peers
    )
    a = await make_gateway(
        feeds=FEEDS,
        data_dir=str(tmp_path / "a"),
        guest_scopes="restms:admin",
        metrics_access="loopback",
        federation_allow=LOOPBACK,
    )
    watcher = await Watcher.start(a, "bridge.federation.*")
    credentials = {
        "token_url": b.uri("/oauth/token"),
        "client_id": "peer",
        "client_secret": secrets["peer"],
    }
    async with a.http.post("/admin/bridges", json=definition(b, **credentials)) as r:
        assert r.status == 201, await r.text()
        assert r.headers["Location"].endswith("/admin/bridges/to-b")
    up = await watcher.event("bridge.federation.up")
    assert up.headers["object"] == "to-b"
    async with a.http.get("/admin/bridges/to-b") as r:
        status = await r.json()
        text = await r.text()
    assert (status["kind"], status["state"], status["remote_id"]) == ("federation", "up", "site-b")
    assert status["definition"]["client_secret"] == "***"
    assert secrets["peer"] not in text
    on_b = await new_pipe(b, "news", "#")
    await publish(a, "news", {"address": "n.1", "content": [{"value": "one"}]})
    assert len(await take(b, on_b, 1)) == 1
    assert await metric(a, "restms_bridge_sent_total") == 1
    # the remote goes away: the link says so, and what is published waits, counted
    await b.stop()
    await publish(a, "news", *({"address": f"n.{i}", "content": [{"value": "w"}]}
                               for i in range(3)))  # fmt: skip
    down = await watcher.event("bridge.federation.down")
    assert down.details["state"] == "retrying"
    assert down.details["error"]
    await asyncio.sleep(0.3)
    assert await metric(a, "restms_bridge_backlog") == 3
    assert await metric(a, "restms_bridge_lag_seconds") > 0
    assert await metric(a, "restms_bridge_retried_total") >= 1
    async with a.http.delete("/admin/bridges/to-b") as r:
        assert r.status == 409, await r.text()  # messages wait
    async with a.http.delete("/admin/bridges/to-b?discard=true") as r:
        assert r.status == 200, await r.text()
        assert (await r.json())["discarded"] == 3
    async with a.http.get("/admin/bridges/to-b") as r:
        assert r.status == 404


async def test_deleting_a_pull_link_deletes_its_pipe_on_the_remote(
    make_gateway: MakeGateway, tmp_path: Path
) -> None:
    b = await make_gateway(feeds=FEEDS, data_dir=str(tmp_path / "b"))
    a = await make_gateway(
        feeds=FEEDS,
        data_dir=str(tmp_path / "a"),
        guest_scopes="restms:admin",
        federation_allow=LOOPBACK,
    )
    pull = {**definition(b), "name": "from-b", "direction": "in"}
    async with a.http.post("/admin/bridges", json=pull) as r:
        assert r.status == 201, await r.text()
    await until(lambda: a.app[BRIDGES].get("from-b").health.state.name == "up", 20, "up")
    remote_pipe = await a.app[SERVICE].setting("federation/from-b/pipe")
    assert remote_pipe is not None
    assert remote_pipe.startswith(b.url)
    async with b.http.get(remote_pipe) as r:
        assert r.status == 200  # the link's pipe, made on B (the loopback guest's)
    async with a.http.delete("/admin/bridges/from-b") as r:
        assert r.status == 200, await r.text()
    async with b.http.get(remote_pipe) as r:
        assert r.status == 404
    assert not await a.app[SERVICE].setting("federation/from-b/pipe")


async def test_bad_link_definitions_are_refused_with_the_reason(
    make_gateway: MakeGateway, tmp_path: Path
) -> None:
    a = await make_gateway(
        feeds=FEEDS,
        data_dir=str(tmp_path / "a"),
        guest_scopes="restms:admin",
        federation_allow=LOOPBACK,
    )
    bad = {**definition(a), "remote": "http://127.0.0.1:9/restms/pipe/x"}
    async with a.http.post("/admin/bridges", json=bad) as r:
        assert r.status == 400
        assert r.content_type == "text/plain"
        assert "must be a feed's URL" in await r.text()
    missing = {**definition(a), "feed": "nowhere"}
    async with a.http.post("/admin/bridges", json=missing) as r:
        assert r.status == 400
        assert "no feed named 'nowhere'" in await r.text()


async def test_federation_traffic_is_mirrored(make_gateway: MakeGateway, tmp_path: Path) -> None:
    """A push link's deliveries are ``bridge_out`` events, a pull link's publishes
    ``bridge_in`` ones; A's own messages, read back by its pull link from B, end there
    (their trail names A) and are not mirrored as coming in."""
    b = await make_gateway(feeds=FEEDS, data_dir=str(tmp_path / "b"))
    pull = {**definition(b), "name": "from-b", "direction": "in", "feed": "local"}
    a = await make_gateway(
        feeds=(*FEEDS, FeedConfig(name="local", type="topic")),
        data_dir=str(tmp_path / "a"),
        bridges=(parse(definition(b)), parse(pull)),
    )
    links = a.app[BRIDGES]
    await until(lambda: all(x.health.state.name == "up" for x in links), 20, "up")
    await publish(a, "news", *({"address": "n", "message_id": f"p{i}"} for i in range(2)))
    await until(lambda: links.get("to-b").backlog() == 0, 20, "pushed")
    await publish(b, "news", {"address": "w", "message_id": "from-b"})
    await until(lambda: links.get("from-b").counters.published == 1, 20, "pulled")
    await until(lambda: links.get("from-b").counters.looped == 2, 20, "A's own ended")
    lake = lake_of(a)
    await a.stop()
    rows = await asyncio.to_thread(checked_lake, lake)
    bridged = Counter(
        (r["event"], r["bridge"], r["message_id"]) for r in rows if r["bridge"] is not None
    )
    assert bridged == {
        ("bridge_out", "to-b", "p0"): 1,
        ("bridge_out", "to-b", "p1"): 1,
        ("bridge_in", "from-b", "from-b"): 1,
    }
