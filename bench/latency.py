"""Benchmark 3: publish -> asynclet delivery latency, and the bare server's round trip.

Gateway: one keep-alive connection holds a GET on the pipe's asynclet; a second
keep-alive connection publishes one message (1 KiB embedded plain content) to the
fanout feed the pipe is joined to. Latency runs from just before the publish request
is written to the moment the asynclet GET's response has been read in full. Each
message is then acknowledged (DELETE on its URI) and the next asynclet is read from
the pipe listing; neither is timed.

Baseline: the round trip of the same 1-message POST to the bare aiohttp server, on a
keep-alive connection, with the same raw client.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import uvloop

from bench import rest
from bench.common import JSON, XML, Server, log, percentile, xml_messages

PARK = 0.002  # seconds between writing the asynclet GET and publishing, so the GET waits


async def _gateway(
    base: str, count: int, feed_name: str, publish_base: str | None = None
) -> dict[str, Any]:
    fixture = await rest.fanout_fixture(base, feed_name)
    waiter = await rest.Conn.open(base)
    publisher = await rest.Conn.open(publish_base or base)
    control = await rest.Conn.open(base)
    feed_path = rest.path_of(fixture["feed"])
    asynclet = rest.path_of(fixture["asynclet"])
    samples: list[float] = []
    try:
        for i in range(count):
            tag = f"lat-{i:06d}"
            body = xml_messages(1, tag=tag)
            waiter.send("GET", asynclet, headers={"Accept": XML})
            await asyncio.sleep(PARK)
            t0 = time.perf_counter()
            publisher.send("POST", feed_path, body, {"Content-Type": XML})
            status, got = await waiter.recv()
            t1 = time.perf_counter()
            pub_status, pub_body = await publisher.recv()
            if pub_status != 200 or b'count="1"' not in pub_body:
                raise RuntimeError(f"publish {i}: {pub_status} {pub_body[:200]!r}")
            if status != 200 or tag.encode() not in got:
                raise RuntimeError(f"asynclet {i}: {status} {got[:200]!r}")
            samples.append((t1 - t0) * 1000)
            status, _ = await control.request("DELETE", asynclet)
            if status != 200:
                raise RuntimeError(f"ack {i}: {status}")
            status, listing = await control.request(
                "GET", rest.path_of(fixture["pipe"]), headers={"Accept": JSON}
            )
            if status != 200:
                raise RuntimeError(f"pipe listing {i}: {status}")
            asynclet = _asynclet(listing)
    finally:
        for conn in (waiter, publisher, control):
            await conn.close()
    await rest.drop_fixture(base, fixture)
    return _summary(samples)


def _asynclet(listing: bytes) -> str:
    last = json.loads(listing)["restms"]["pipe"][0]["message"][-1]
    if last.get("async") != "1":
        raise RuntimeError("pipe listing has no asynclet")
    return rest.path_of(last["href"])


async def _bare(base: str, count: int) -> dict[str, Any]:
    conn = await rest.Conn.open(base)
    samples: list[float] = []
    try:
        for i in range(count):
            body = xml_messages(1, tag=f"lat-{i:06d}")
            await asyncio.sleep(PARK)
            t0 = time.perf_counter()
            status, _ = await conn.request(
                "POST", "/restms/feed/bench", body, {"Content-Type": XML}
            )
            t1 = time.perf_counter()
            if status != 200:
                raise RuntimeError(f"bare POST {i}: {status}")
            samples.append((t1 - t0) * 1000)
    finally:
        await conn.close()
    return _summary(samples)


def _summary(samples: list[float]) -> dict[str, Any]:
    return {
        "count": len(samples),
        "p50_ms": percentile(samples, 50),
        "p90_ms": percentile(samples, 90),
        "p99_ms": percentile(samples, 99),
        "max_ms": max(samples) if samples else None,
    }


def gateway_run(
    gateway: Server, count: int, feed_name: str, publisher: Server | None = None
) -> dict[str, Any]:
    """``count`` timed publish -> asynclet deliveries through a fresh fanout feed
    ``feed_name`` (and its pipe, dropped after), with their percentiles. The asynclet
    waits on ``gateway``; the messages are published to ``publisher`` (another node of
    the same cluster engine) when given, else to ``gateway``."""
    return uvloop.run(
        _gateway(gateway.base, count, feed_name, publisher.base if publisher else None)
    )


def run(gateway: Server, bare: Server, rounds: int, count: int) -> dict[str, Any]:
    out: dict[str, Any] = {"gateway": [], "bare": [], "count_per_round": count}
    uvloop.run(_bare(bare.base, 50))  # warm-up
    gateway_run(gateway, 50, "latwarm")
    for round_no in range(rounds):
        order = ["bare", "gateway"] if round_no % 2 == 0 else ["gateway", "bare"]
        for kind in order:
            if kind == "bare":
                result = uvloop.run(_bare(bare.base, count))
            else:
                result = gateway_run(gateway, count, f"lat{round_no}")
            result["round"] = round_no
            out[kind].append(result)
            log(
                f"  round {round_no + 1}/{rounds} latency {kind:7s} "
                f"p50={result['p50_ms']:.3f} ms p99={result['p99_ms']:.3f} ms"
            )
    return out
