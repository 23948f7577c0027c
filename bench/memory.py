"""Benchmark 16: memory that comes back after pipes are deleted.

On one freshly started gateway (embedded engine, its own temporary data directory):

1. read VmRSS once start-up has settled: the idle figure;
2. ``cycles`` times: create ``pipes`` default-type pipes, join each to one direct feed
   (the join's address is the pipe's name), publish ``messages`` messages to each
   pipe through that feed (batches of 1,000 messages a request, each addressed to one
   pipe, each with its own ``message_id``), read each pipe's first message (a GET
   that leases it, left unacknowledged), then delete every pipe (its joins and
   messages go with it);
3. after each cycle, read VmRSS twice: once it stops moving (``settled``), and again
   ``free_s`` seconds later (``freed``: the gateway's periodic work has run).

Each cycle's ``freed`` RSS is compared with the first cycle's; the target is that no
cycle ends more than 10 % above the first (nothing kept per deleted pipe).
Requests run ``concurrency`` at a time over keep-alive connections.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aiohttp
import uvloop

from bench.common import JSON, BenchError, json_reply, log, median, rss_mb, start

# One principal (the loopback guest) makes all the pipes and joins: the abuse limits
# a real deployment keeps (docs/AUTH.md) are lifted for it, as in benchmark 4.
LIMITS = {
    "RESTMS_RATE_LIMIT": "0",
    "RESTMS_MAX_PIPES_PER_PRINCIPAL": "20000",
    "RESTMS_MAX_JOINS_PER_PRINCIPAL": "40000",
    "RESTMS_METRICS_ACCESS": "loopback",
}
HEADERS = {"Content-Type": JSON, "Accept": JSON}
BATCH = 1_000  # messages per publish request
TARGET = 1.10  # each cycle's RSS over the first cycle's, at most


def _quiet_rss(pid: int, limit: float = 10.0) -> float:
    """VmRSS once three readings 0.5 s apart agree within 0.5 MB (or at ``limit``)."""
    samples: list[float] = []
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        samples.append(rss_mb(pid))
        if len(samples) >= 3 and max(samples[-3:]) - min(samples[-3:]) < 0.5:
            break
        time.sleep(0.5)
    return median(samples[-3:]) or samples[-1]


async def _cycle(
    http: aiohttp.ClientSession, feed: str, cycle: int, pipes: int, messages: int, width: int
) -> dict[str, float]:
    gate = asyncio.Semaphore(width)

    async def make() -> tuple[str, str, str]:
        async with gate:
            async with http.post(
                "/restms/domain/default", data=b'{"restms":{"pipe":[{}]}}', headers=HEADERS
            ) as r:
                listing = await json_reply(r, (201,))
                uri = r.headers["Location"]
            name = uri.rsplit("/", 1)[1]
            doc = {"restms": {"join": [{"feed": feed, "address": name}]}}
            async with http.post(uri, data=json.dumps(doc), headers=HEADERS) as r:
                await json_reply(r, (201,))
            return uri, name, listing["restms"]["pipe"][0]["message"][-1]["href"]

    t0 = time.monotonic()
    made = await asyncio.gather(*(make() for _ in range(pipes)))
    t1 = time.monotonic()
    names = [name for _, name, _ in made for _ in range(messages)]

    async def publish(first: int) -> None:
        doc = {
            "restms": {
                "message": [
                    {
                        "address": name,
                        "message_id": f"m{cycle}-{first + n}",
                        "content": [{"value": f"cycle {cycle} message {first + n}"}],
                    }
                    for n, name in enumerate(names[first : first + BATCH])
                ]
            }
        }
        async with gate, http.post(feed, data=json.dumps(doc), headers=HEADERS) as r:
            await json_reply(r, (200,))

    await asyncio.gather(*(publish(first) for first in range(0, len(names), BATCH)))

    async def read(asynclet: str) -> None:
        async with gate, http.get(asynclet, headers=HEADERS) as r:
            await json_reply(r, (200,))

    await asyncio.gather(*(read(asynclet) for _, _, asynclet in made))
    t2 = time.monotonic()

    async def remove(uri: str) -> None:
        async with gate, http.delete(uri) as r:
            await json_reply(r, (200,))

    await asyncio.gather(*(remove(uri) for uri, _, _ in made))
    t3 = time.monotonic()
    return {"create_s": t1 - t0, "publish_s": t2 - t1, "delete_s": t3 - t2}


async def _setup(base: str) -> str:
    async with aiohttp.ClientSession(base_url=base) as http:
        doc = {"restms": {"feed": [{"name": "memory", "type": "direct"}]}}
        async with http.post("/restms/domain/default", data=json.dumps(doc), headers=HEADERS) as r:
            await json_reply(r, (201,))
            return r.headers["Location"]


async def _run_cycle(
    base: str, feed: str, cycle: int, pipes: int, messages: int, width: int
) -> dict[str, float]:
    connector = aiohttp.TCPConnector(limit=width)
    async with aiohttp.ClientSession(base_url=base, connector=connector) as http:
        return await _cycle(http, feed, cycle, pipes, messages, width)


async def _pipes_left(base: str) -> int:
    """Pipes the gateway still reports (the ``restms_pipes`` gauges on /metrics, summed
    over pipe types)."""
    async with aiohttp.ClientSession() as http, http.get(f"{base}/metrics") as r:
        text = await r.text()
    return sum(
        int(float(line.rsplit(" ", 1)[1]))
        for line in text.splitlines()
        if line.startswith("restms_pipes{")
    )


def run(
    cycles: int = 5,
    pipes: int = 10_000,
    messages: int = 3,
    width: int = 32,
    free_s: float = 5.0,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    gateway = start("gateway", {**LIMITS, **(env or {})})
    try:
        time.sleep(2.0)
        idle = _quiet_rss(gateway.pid)
        log(f"  idle RSS {idle:.1f} MB")
        feed = uvloop.run(_setup(gateway.base))
        rows: list[dict[str, Any]] = []
        for n in range(cycles):
            timing = uvloop.run(_run_cycle(gateway.base, feed, n, pipes, messages, width))
            settled = _quiet_rss(gateway.pid)
            time.sleep(free_s)
            freed = _quiet_rss(gateway.pid)
            left = uvloop.run(_pipes_left(gateway.base))
            row = {"cycle": n + 1, "settled_mb": settled, "freed_mb": freed, "pipes_left": left}
            row.update(timing)
            row["ratio"] = freed / rows[0]["freed_mb"] if rows else 1.0
            rows.append(row)
            log(
                f"  cycle {n + 1}: {pipes} pipes made+joined in {timing['create_s']:.1f} s, "
                f"{pipes * messages} messages published and {pipes} read in "
                f"{timing['publish_s']:.1f} s, deleted in {timing['delete_s']:.1f} s; "
                f"RSS {settled:.1f} MB settled, {freed:.1f} MB "
                f"{free_s:g} s later ({row['ratio']:.3f} of cycle 1); pipes left {left}"
            )
        if not gateway.alive():
            raise BenchError("the gateway exited during the run")
        ratios = [row["ratio"] for row in rows]
        return {
            "pipes": pipes,
            "messages": messages,
            "cycles": rows,
            "idle_mb": idle,
            "max_ratio": max(ratios),
            "pass": max(ratios) <= TARGET and all(row["pipes_left"] == 0 for row in rows),
        }
    finally:
        gateway.stop()


def describe(data: dict[str, Any]) -> list[str]:
    """The table this benchmark prints: idle RSS, then one line per cycle."""
    lines = [
        f"{data['pipes']:,} pipes x {data['messages']} messages a cycle; idle RSS "
        f"{data['idle_mb']:.1f} MB",
        "cycle | RSS settled MB | RSS freed MB | / cycle 1 | pipes left",
    ]
    for row in data["cycles"]:
        lines.append(
            f"{row['cycle']:5d} | {row['settled_mb']:14.1f} | {row['freed_mb']:12.1f} | "
            f"{row['ratio']:9.3f} | {row['pipes_left']}"
        )
    verdict = "PASS" if data["pass"] else "FAIL"
    lines.append(f"{verdict}: every cycle within 10 % of the first (max {data['max_ratio']:.3f})")
    return lines


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cycles", type=int, default=5)
    parser.add_argument("--pipes", type=int, default=10_000)
    parser.add_argument("--messages", type=int, default=3)
    parser.add_argument("--mirror", choices=("on", "off"), default="on")
    args = parser.parse_args()
    result = run(
        args.cycles,
        args.pipes,
        args.messages,
        env={} if args.mirror == "on" else {"RESTMS_MIRROR": "0"},
    )
    for line in describe(result):
        print(line)
