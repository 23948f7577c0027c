"""What gzip-compressed replies and CORS headers cost (docs/BENCHMARKS.md,
"Compression and CORS").

    .venv/bin/python -m bench.compression [--rounds 3] [--duration 4]

One gateway (benchmark 1's settings, and ``cors_origins`` naming one origin), three
cases, each measured both ways in every round, alternating which goes first (ABBA).
The first two with and without ``Accept-Encoding: gzip`` on every request:

* ``batch_reply``: benchmark 2's batched publish (100 messages of 1 KiB in one XML
  POST, ``wrk -t1 -c8``) to a fanout feed with one joined pipe: its reply lists the
  100 counts.
* ``listing``: ``GET`` of a pipe holding 1,000 messages (``listing_cap``), as RestMS
  JSON (``wrk -t1 -c8``): the listing names each message.

The third with and without ``Origin`` (an allowed one):

* ``cors``: benchmark 1's single publish (``wrk -t1 -c32``); with the header every reply
  gets ``Access-Control-Allow-Origin`` and ``Access-Control-Expose-Headers``.

For each: requests a second, the gateway's CPU time per request, and the bytes a reply
takes on the wire (wrk's count, headers included); the medians of the rounds and the
ratio of the second way to the first. Besides, the body of each compressed reply is
compressed in this process at zlib level 1 (the gateway's) and 6 (zlib's default) to
give its exact size and the time each takes.
"""

from __future__ import annotations

import argparse
import gzip
import json
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

import aiohttp
import uvloop

from bench import rest
from bench.common import JSON, XML, log, median, start, stop_all, xml_messages
from bench.run_all import GATEWAY_ENV
from bench.throughput import run_wrk

BATCH = 100
LISTED = 1000
GZIP = ("Accept-Encoding: gzip",)
ORIGIN = "http://app.example:3000"


async def _fill(base: str) -> tuple[dict[str, str], str, bytes, bytes]:
    """The publish fixture, a pipe of :data:`LISTED` messages, and the bodies of both
    replies as sent uncompressed."""
    fixture = await rest.fanout_fixture(base, "compression")
    async with aiohttp.ClientSession() as http:
        listed, _ = await rest.create_pipe(http, base)
        name = listed.rsplit("/", 1)[1]
        messages = xml_messages(LISTED, address=name)
        await rest.publish(http, f"{base}/restms/feed/default", messages)
        async with http.get(listed, headers={"Accept": JSON, "Accept-Encoding": "identity"}) as r:
            listing = await r.read()
        async with http.post(
            fixture["feed"],
            data=xml_messages(BATCH),
            headers={"Content-Type": XML, "Accept-Encoding": "identity"},
        ) as r:
            reply = await r.read()
    return fixture, listed, reply, listing


def _gzip_cost(body: bytes) -> dict[str, float]:
    """The compressed size and the time zlib takes on ``body`` at levels 1 and 6: the
    best of 15 batches of 30, the levels taking turns (other load only adds time)."""
    out: dict[str, float] = {"plain_bytes": len(body)}
    best = {1: float("inf"), 6: float("inf")}
    for _ in range(15):
        for level in (1, 6):
            began = time.perf_counter()
            for _ in range(30):
                packer = zlib.compressobj(level, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
                packed = packer.compress(body) + packer.flush()
            best[level] = min(best[level], (time.perf_counter() - began) / 30)
            assert gzip.decompress(packed) == body
            out[f"level{level}_bytes"] = len(packed)
            out[f"level{level}_ratio"] = len(packed) / len(body)
    for level, seconds in best.items():
        out[f"level{level}_ms"] = seconds * 1000
    return out


def run(rounds: int, duration: float) -> dict[str, Any]:
    gateway = start("gateway", {**GATEWAY_ENV, "RESTMS_CORS_ORIGINS": ORIGIN})
    try:
        fixture, listed, reply, listing = uvloop.run(_fill(gateway.base))
        out: dict[str, Any] = {
            "batch_reply": {"body": _gzip_cost(reply)},
            "listing": {"body": _gzip_cost(listing)},
        }
        with tempfile.TemporaryDirectory(prefix="restms-bench-compression-") as tmp:
            batch = Path(tmp) / "batch.xml"
            batch.write_bytes(xml_messages(BATCH))
            empty = Path(tmp) / "empty"
            empty.write_bytes(b"")
            single = Path(tmp) / "single.xml"
            single.write_bytes(xml_messages(1))
            origin = (f"Origin: {ORIGIN}",)
            cases = {
                "batch_reply": (fixture["feed"], batch, XML, "POST", 8, ("plain", "gzip"), GZIP),
                "listing": (listed, empty, JSON, "GET", 8, ("plain", "gzip"), GZIP),
                "cors": (fixture["feed"], single, XML, "POST", 32, ("none", "origin"), origin),
            }
            for name, (url, body, kind, method, connections, ways, header) in cases.items():
                samples: dict[str, list[dict[str, Any]]] = {way: [] for way in ways}
                sides = [(ways[0], ()), (ways[1], header)]
                warm = (url, body, kind, 1.0, connections)
                run_wrk(gateway, *warm, headers=header, method=method)  # not recorded
                for round_no in range(rounds):
                    for side, headers in sides if round_no % 2 == 0 else sides[::-1]:
                        result = run_wrk(
                            gateway,
                            url,
                            body,
                            kind,
                            duration,
                            connections,
                            headers=headers,
                            method=method,
                        )
                        result["cpu_ms_per_request"] = (
                            1000 * result["server_cpu_util"] / result["req_per_s"]
                        )
                        result["bytes_per_reply"] = result["bytes"] / result["requests"]
                        samples[side].append(result)
                        log(
                            f"  round {round_no + 1}/{rounds} {name:11s} {side:6s} "
                            f"{result['req_per_s']:8.0f} req/s "
                            f"{result['cpu_ms_per_request']:.3f} CPU ms/req "
                            f"{result['bytes_per_reply']:9.0f} B/reply"
                        )
                out.setdefault(name, {})["samples"] = samples
                for figure in ("req_per_s", "cpu_ms_per_request", "bytes_per_reply"):
                    first, second = (median([s[figure] for s in samples[w]]) or 0.0 for w in ways)
                    out[name][figure] = {ways[0]: first, ways[1]: second, "ratio": second / first}
        return out
    finally:
        stop_all()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=4.0, help="seconds per wrk run")
    args = parser.parse_args()
    result = run(args.rounds, args.duration)
    summary = {
        name: {k: v for k, v in figures.items() if k != "samples"}
        for name, figures in result.items()
    }
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
