"""Benchmark 6: a backlog of persistent messages far past the memory budget.

One round:

1. Start the gateway (default settings: 96 MiB memory budget) on a fresh data
   directory, make ``pipes`` pipes and publish ``count`` persistent 1 KiB messages to
   them through the default feed (batches of 1,000, each message addressed to one
   pipe). Measure the gateway's RSS once the backlog is in (target: under 300 MB),
   against its RSS just after start-up (the baseline, same run).
2. Stop it with SIGTERM and start it again on the same data directory: the recovery
   time is from process start to listening, against a gateway started on an empty
   data directory in the same round (the baseline). RSS after recovery.
3. Drain every pipe as a consumer does (list, acknowledge the last listed, repeat)
   and check every message comes back once, in order. Drain time, final RSS.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
import time
from typing import Any

import aiohttp

from .common import JSON, log, payload, rss_mb, start

BATCH = 1_000
HEADERS = {"Content-Type": JSON, "Accept": JSON}


def _messages(first: int, count: int, pipes: list[str]) -> bytes:
    body = payload()
    return json.dumps(
        {
            "restms": {
                "message": [
                    {
                        "address": pipes[n % len(pipes)],
                        "message_id": f"b{n}",
                        "delivery_mode": "2",
                        "content": [{"value": body}],
                    }
                    for n in range(first, first + count)
                ]
            }
        },
        separators=(",", ":"),
    ).encode()


async def _fill(base: str, count: int, pipes: int) -> tuple[list[str], float]:
    async with aiohttp.ClientSession(base_url=base) as http:
        names = []
        for _ in range(pipes):
            async with http.post(
                "/restms/domain/default", data=b'{"restms":{"pipe":[{}]}}', headers=HEADERS
            ) as r:
                assert r.status == 201, await r.text()
                names.append(r.headers["Location"].rsplit("/", 1)[1])
        t0 = time.monotonic()
        sem = asyncio.Semaphore(4)

        async def batch(first: int) -> None:
            async with sem:
                data = _messages(first, min(BATCH, count - first), names)
                async with http.post("/restms/feed/default", data=data, headers=HEADERS) as r:
                    assert r.status == 200, await r.text()

        await asyncio.gather(*(batch(first) for first in range(0, count, BATCH)))
        return names, time.monotonic() - t0


async def _drain(base: str, names: list[str], count: int) -> tuple[int, bool, float]:
    """Drain every pipe; (messages seen, each once and in publish order, seconds).

    Batches are published concurrently, so a pipe's messages from different batches
    may interleave; within one batch (one request) they must keep their order.
    """
    t0 = time.monotonic()
    seen: set[int] = set()
    ordered = True
    async with aiohttp.ClientSession(base_url=base) as http:

        async def one(name: str) -> None:
            nonlocal ordered
            last: dict[int, int] = {}  # batch -> the last number seen from it
            while True:
                async with http.get(f"/restms/resource/{name}", headers=HEADERS) as r:
                    doc = await r.json(content_type=None)
                held = [m for m in doc["restms"]["pipe"][0].get("message", []) if "async" not in m]
                if not held:
                    return
                for m in held:
                    n = int(m["message_id"][1:])
                    ordered &= n not in seen and n > last.get(n // BATCH, -1)
                    last[n // BATCH] = n
                    seen.add(n)
                async with http.delete(held[-1]["href"]) as r:
                    assert r.status == 200

        await asyncio.gather(*(one(name) for name in names))
    return len(seen), ordered and len(seen) == count, time.monotonic() - t0


def _settled_rss(pid: int, wait: float = 3.0) -> float:
    time.sleep(wait)
    return rss_mb(pid)


def _startup(data_dir: str | None) -> tuple[Any, float]:
    t0 = time.monotonic()
    server = start("gateway", None, data_dir)
    return server, time.monotonic() - t0


def one_round(count: int, pipes: int, round_no: int) -> dict[str, Any]:
    data_dir = tempfile.mkdtemp(prefix="restms-bench-backlog-")
    try:
        gateway, _ = _startup(data_dir)
        idle_mb = _settled_rss(gateway.pid, 1.0)
        names, fill_s = asyncio.run(_fill(gateway.base, count, pipes))
        full_mb = _settled_rss(gateway.pid)
        gateway.stop()
        empty, empty_start_s = _startup(None)  # the baseline: the same start, no data
        empty.stop()
        gateway, recovery_s = _startup(data_dir)
        recovered_mb = _settled_rss(gateway.pid)
        seen, ok, drain_s = asyncio.run(_drain(gateway.base, names, count))
        drained_mb = _settled_rss(gateway.pid, 1.0)
        gateway.stop()
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
    result = {
        "round": round_no,
        "count": count,
        "pipes": pipes,
        "idle_rss_mb": idle_mb,
        "backlog_rss_mb": full_mb,
        "fill_s": fill_s,
        "fill_msg_per_s": count / fill_s,
        "recovery_s": recovery_s,
        "empty_start_s": empty_start_s,
        "recovered_rss_mb": recovered_mb,
        "drained": seen,
        "drained_in_order": ok,
        "drain_s": drain_s,
        "drain_msg_per_s": seen / drain_s if drain_s else None,
        "drained_rss_mb": drained_mb,
    }
    log(f"  backlog round {round_no}: {result}")
    return result


def run(rounds: int, count: int, pipes: int) -> dict[str, Any]:
    log(f"== backlog: {count:,} persistent 1 KiB messages in {pipes} pipes, {rounds} round(s)")
    return {"rounds": [one_round(count, pipes, n) for n in range(1, rounds + 1)]}
