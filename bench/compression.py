"""What gzip-compressed replies and CORS headers cost (docs/BENCHMARKS.md,
"Compression and CORS").

    .venv/bin/python -m bench.compression [--rounds 3] [--duration 4]

One gateway (benchmark 1's settings, and ``cors_origins`` naming one origin), three
cases, each measured both ways in every round, alternating which goes first (ABBA).
The first two with no ``Accept-Encoding``, with ``gzip`` and with ``zstd``:

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
ratios to the first way. Besides, the body of each compressed reply is compressed in
this process by the gateway's packers (gzip at zlib level 1, zstd at level 3) and by
gzip at zlib's default level 6, to give its exact size and the time each takes.
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
from bench.common import JSON, XML, Server, log, median, start, stop_all, xml_messages
from bench.run_all import GATEWAY_ENV
from bench.throughput import run_wrk
from gateway.server import compression
from gateway.server.compression import zstd

BATCH = 100
LISTED = 1000
GZIP = ("Accept-Encoding: gzip",)
ZSTD = ("Accept-Encoding: zstd",)
ORIGIN = "http://app.example:3000"
ORIGINS = {"none": (), "origin": (f"Origin: {ORIGIN}",)}
Ways = dict[str, tuple[str, ...]]  # a way of asking -> the headers sent for it
# url ("" for a publish: a fresh feed each run), body file, type, method, connections, ways
Case = tuple[str, Path, str, str, int, Ways]


async def _fill(base: str) -> tuple[str, bytes, bytes]:
    """A pipe of :data:`LISTED` messages, and the bodies of both replies measured, as
    sent uncompressed: a batched publish's and that pipe's listing."""
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
    await rest.drop_fixture(base, fixture)
    return listed, reply, listing


def _packing(body: bytes) -> dict[str, float]:
    """The compressed size and the time each packer takes on ``body``: the best of 15
    batches of 30, the packers taking turns (other load only adds time)."""
    packers = {
        "gzip1": compression.gzip,  # the gateway's: level 1
        "gzip6": _gzip6,
        "zstd3": compression.zstandard,  # the gateway's: level 3, a context reused
    }
    out: dict[str, float] = {"plain_bytes": len(body)}
    best = dict.fromkeys(packers, float("inf"))
    for _ in range(15):
        for name, pack in packers.items():
            began = time.perf_counter()
            for _ in range(30):
                packed = pack(body)
            best[name] = min(best[name], (time.perf_counter() - began) / 30)
            unpack = zstd.decompress if name.startswith("zstd") else gzip.decompress
            assert unpack(packed) == body
            out[f"{name}_bytes"] = len(packed)
            out[f"{name}_ratio"] = len(packed) / len(body)
    for name, seconds in best.items():
        out[f"{name}_ms"] = seconds * 1000
    return out


def _gzip6(body: bytes) -> bytes:
    packer = zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    return packer.compress(body) + packer.flush()


def _one(
    gateway: Server,
    case: Case,
    duration: float,
    headers: tuple[str, ...],
    serial: int,
) -> dict[str, Any]:
    """One wrk run of ``case``. A publish goes to a fresh fanout feed with one joined
    pipe, deleted afterwards (as benchmark 2's): stored messages never pile up."""
    url, body, kind, method, connections, _ = case
    fixture = None
    if method == "POST":
        fixture = uvloop.run(rest.fanout_fixture(gateway.base, f"c{serial}"))
        url = fixture["feed"]
    try:
        result = run_wrk(
            gateway, url, body, kind, duration, connections, headers=headers, method=method
        )
    finally:
        if fixture is not None and gateway.alive():
            uvloop.run(rest.drop_fixture(gateway.base, fixture))
    result["cpu_ms_per_request"] = 1000 * result["server_cpu_util"] / result["req_per_s"]
    result["bytes_per_reply"] = result["bytes"] / result["requests"]
    return result


def _measure(
    gateway: Server, name: str, case: Case, rounds: int, duration: float, serial: int
) -> dict[str, Any]:
    """Every way of ``case`` in every round, ABBA; medians and ratios to the first way."""
    ways = case[-1]
    sides = list(ways.items())
    samples: dict[str, list[dict[str, Any]]] = {way: [] for way in ways}
    for _, headers in sides:  # warm-up, not recorded
        serial += 1
        _one(gateway, case, 1.0, headers, serial)
    for round_no in range(rounds):
        for side, headers in sides if round_no % 2 == 0 else sides[::-1]:
            serial += 1
            result = _one(gateway, case, duration, headers, serial)
            samples[side].append(result)
            log(
                f"  round {round_no + 1}/{rounds} {name:11s} {side:6s} "
                f"{result['req_per_s']:8.0f} req/s "
                f"{result['cpu_ms_per_request']:.3f} CPU ms/req "
                f"{result['bytes_per_reply']:9.0f} B/reply"
            )
    out: dict[str, Any] = {"samples": samples}
    first = sides[0][0]
    for figure in ("req_per_s", "cpu_ms_per_request", "bytes_per_reply"):
        medians = {w: median([s[figure] for s in samples[w]]) or 0.0 for w in ways}
        ratios = {f"{w}/{first}": m / medians[first] for w, m in medians.items() if w != first}
        out[figure] = {**medians, **ratios}
    return out


def run(rounds: int, duration: float, only: list[str] | None = None) -> dict[str, Any]:
    gateway = start("gateway", {**GATEWAY_ENV, "RESTMS_CORS_ORIGINS": ORIGIN})
    try:
        listed, reply, listing = uvloop.run(_fill(gateway.base))
        out: dict[str, Any] = {
            "batch_reply": {"body": _packing(reply)},
            "listing": {"body": _packing(listing)},
        }
        with tempfile.TemporaryDirectory(prefix="restms-bench-compression-") as tmp:
            files = {}
            for name, content in (
                ("batch", xml_messages(BATCH)),
                ("empty", b""),
                ("single", xml_messages(1)),
            ):
                files[name] = Path(tmp) / name
                files[name].write_bytes(content)
            coded = {"plain": (), "gzip": GZIP, "zstd": ZSTD}
            cases: dict[str, Case] = {
                "batch_reply": ("", files["batch"], XML, "POST", 8, coded),
                "listing": (listed, files["empty"], JSON, "GET", 8, coded),
                "cors": ("", files["single"], XML, "POST", 32, ORIGINS),
            }
            for serial, (name, case) in enumerate(cases.items()):
                if only and name not in only:
                    continue
                measured = _measure(gateway, name, case, rounds, duration, serial * 1000)
                out.setdefault(name, {}).update(measured)
        return out
    finally:
        stop_all()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=4.0, help="seconds per wrk run")
    parser.add_argument("--only", help="comma-separated: batch_reply, listing, cors (all)")
    args = parser.parse_args()
    result = run(args.rounds, args.duration, args.only.split(",") if args.only else None)
    summary = {
        name: {k: v for k, v in figures.items() if k != "samples"}
        for name, figures in result.items()
    }
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
