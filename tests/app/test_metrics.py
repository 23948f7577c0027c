"""GET /metrics against a real gateway: counters move by exactly what the traffic did.

Each test scrapes, makes traffic (publishes, deliveries, acknowledgements, errors),
scrapes again and compares samples parsed with ``prometheus_client.parser``.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.app.gauges import Samples, scrape, until_waiting, value, waiting
from tests.app.jsonapi import AJ, DOMAIN, HJ, JSON, body, get, new_pipe, publish
from tests.app.oauth import clients, token
from tests.conftest import MakeGateway

pytestmark = pytest.mark.app

FEED = "/restms/feed/default"  # routes on the address: a pipe's name
RESOURCE = "/restms/resource/{name}"


def delta(before: Samples, after: Samples, name: str, **labels: str) -> float:
    return value(after, name, **labels) - value(before, name, **labels)


def message(address: str, text: str) -> dict[str, Any]:
    return {"address": address, "content": [{"type": "text/plain", "value": text}]}


async def test_counters_move_by_exactly_the_traffic(make_gateway: MakeGateway) -> None:
    gw = await make_gateway(metrics_access="loopback")
    pipe = await new_pipe(gw)
    name = pipe["name"]
    before, _ = await scrape(gw)

    # One publish request of three messages into the pipe (three copies routed).
    assert await publish(gw, FEED, *(message(name, t) for t in ("a", "b", "c"))) == [1, 1, 1]
    # One that fails: not a document (400 on the same route).
    async with gw.http.post(FEED, data=b"{not json", headers=HJ) as r:
        assert r.status == 400
    # Read the first two messages (two deliveries), acknowledge up to the second.
    status, reply = await get(gw, pipe["uri"])
    hrefs = [m["href"] for m in reply["restms"]["pipe"][0]["message"] if m.get("async") != "1"]
    assert len(hrefs) == 3
    for href in hrefs[:2]:
        status, _ = await get(gw, href)
        assert status == 200
    async with gw.http.delete(hrefs[1]) as r:
        assert r.status == 200
    # A path no route serves.
    async with gw.http.get("/no/such/thing") as r:
        assert r.status == 404

    after, text = await scrape(gw)
    assert delta(before, after, "restms_messages_published_total") == 3
    assert delta(before, after, "restms_messages_routed_total") == 3
    assert delta(before, after, "restms_messages_delivered_total") == 2
    assert delta(before, after, "restms_messages_acknowledged_total") == 2
    latency = "restms_delivery_latency_seconds"
    assert delta(before, after, latency + "_count") == 2
    assert delta(before, after, latency + "_bucket", le="+Inf") == 2
    assert delta(before, after, latency + "_bucket", le="3600.0") == 2  # not an hour old
    assert 0 <= delta(before, after, latency + "_sum") < 60
    assert value(after, "restms_pipe_messages") == 1  # the third, still held
    assert value(after, "restms_pipe_depth_max") == 1
    assert value(after, "restms_pipes", type="default") == 1
    requests = "restms_http_requests_total"
    assert delta(before, after, requests, route=FEED_ROUTE, method="POST", status="200") == 1
    assert delta(before, after, requests, route=FEED_ROUTE, method="POST", status="400") == 1
    # The pipe listing and two messages: three GETs on the one resource route.
    assert delta(before, after, requests, route=RESOURCE, method="GET", status="200") == 3
    assert delta(before, after, requests, route=RESOURCE, method="DELETE", status="200") == 1
    assert delta(before, after, requests, route="(unmatched)", method="GET", status="404") == 1
    assert delta(before, after, requests, route="/metrics", method="GET", status="200") == 1
    duration = "restms_http_request_duration_seconds_count"
    assert delta(before, after, duration, route=FEED_ROUTE, method="POST") == 2
    inf = "restms_http_request_duration_seconds_bucket"
    assert delta(before, after, inf, route=FEED_ROUTE, method="POST", le="+Inf") == 2
    assert value(after, "restms_http_requests_in_flight") == 1  # the scrape itself
    assert value(after, "restms_store_up") == 1
    assert delta(before, after, "restms_store_commits_total") >= 1
    # Capabilities never appear: the private pipe's name is in no label.
    assert name not in text
    assert value(after, "process_cpu_seconds_total") > 0  # the process collectors run


FEED_ROUTE = "/restms/feed/{name}"


async def test_requests_no_route_serves_are_one_route(make_gateway: MakeGateway) -> None:
    """However many paths nothing serves, they count under one label set (and one entry)."""
    gw = await make_gateway(metrics_access="loopback")
    before, _ = await scrape(gw)
    for path in ("/no/such/thing", "/nor/this", "/nor/that"):
        async with gw.http.get(path) as r:
            assert r.status == 404
    async with gw.http.delete("/healthz") as r:
        assert r.status == 405
    after, text = await scrape(gw)
    requests = "restms_http_requests_total"
    assert delta(before, after, requests, route="(unmatched)", method="GET", status="404") == 3
    assert delta(before, after, requests, route="(unmatched)", method="DELETE", status="405") == 1
    labels = ('route="(unmatched)"', 'method="GET"', 'status="404"')
    lines = [x for x in text.splitlines() if x.startswith(requests + "{")]
    assert len([x for x in lines if all(label in x for label in labels)]) == 1


async def test_waiting_requests_are_counted_by_kind(make_gateway: MakeGateway) -> None:
    gw = await make_gateway(metrics_access="loopback", max_wait=30.0)
    pipe = await new_pipe(gw)
    status, reply = await get(gw, pipe["uri"])
    (asynclet,) = [m["href"] for m in reply["restms"]["pipe"][0]["message"]]

    assert await waiting(gw, "asynclet", 0)
    read = asyncio.create_task(get(gw, asynclet))
    await until_waiting(gw, "asynclet", 1)
    assert await publish(gw, FEED, message(pipe["name"], "x")) == [1]
    status, _ = await read
    assert status == 200
    await until_waiting(gw, "asynclet", 0)

    async with gw.http.get(pipe["uri"], headers={"Accept": "text/event-stream"}) as sse:
        assert sse.status == 200
        await until_waiting(gw, "sse", 1)
        async with gw.http.ws_connect(pipe["uri"]) as socket:
            await until_waiting(gw, "websocket", 1)
            await socket.close()
        await until_waiting(gw, "websocket", 0)
    await until_waiting(gw, "sse", 0)


async def test_a_refusal_is_counted_as_an_auth_failure(make_gateway: MakeGateway) -> None:
    configured, secrets = await clients(reader="restms:read")
    gw = await make_gateway(
        clients=configured, oauth_issuer="http://gw.test", metrics_access="open"
    )
    reader = {"Authorization": f"Bearer {await token(gw, 'reader', secrets['reader'])}"}
    before, _ = await scrape(gw)
    async with gw.http.get(DOMAIN, headers={"Authorization": "Bearer nonsense", **AJ}) as r:
        assert r.status == 401
    async with gw.http.post(DOMAIN, data=body(pipe=[{}]), headers={**HJ, **reader}) as r:
        assert r.status == 403
        assert r.content_type != JSON
    after, _ = await scrape(gw)
    failures = "restms_auth_failures_total"
    assert delta(before, after, failures, reason="unauthorized") == 1
    assert delta(before, after, failures, reason="insufficient_scope") == 1
