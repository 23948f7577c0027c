"""Benchmarks 1 and 2: publish throughput with wrk, gateway versus the bare aiohttp server.

1. single: one ``<message>`` (1 KiB embedded plain content) per POST, req/s.
2. batch: 100 such messages per POST, msg/s, for an XML and a JSON body.
5. the single and XML batch cases again with ``delivery_mode="2"`` (persistent: each
   reply waits for its SQLite commit), on the gateway only: their baseline is the
   non-persistent case of the same round.

Each gateway run publishes to a fresh fanout feed with one joined pipe, which is
deleted afterwards so that stored messages never carry over between runs (the
gateway is started with a large ``max_pipe_messages`` so the pipe never overflows
during a run). The bare server gets the very same body files and wrk settings.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import uvloop

from bench import rest
from bench.common import (
    BENCH,
    JSON,
    XML,
    Server,
    cpu_seconds,
    ensure_tool,
    json_messages,
    log,
    machine_busy,
    system_ticks,
    xml_messages,
)

LUA = BENCH / "post.lua"
BATCH = 100

# name -> (body, content type, messages per request, wrk connections)
CASES: dict[str, tuple[bytes, str, int, int]] = {}


def cases() -> dict[str, tuple[bytes, str, int, int]]:
    if not CASES:
        CASES["single"] = (xml_messages(1), XML, 1, 32)
        CASES["batch_xml"] = (xml_messages(BATCH), XML, BATCH, 8)
        CASES["batch_json"] = (json_messages(BATCH), JSON, BATCH, 8)
        CASES["single_durable"] = (xml_messages(1, persistent=True), XML, 1, 32)
        CASES["batch_durable"] = (xml_messages(BATCH, persistent=True), XML, BATCH, 8)
    return CASES


# Cases measured on the gateway only (the bare server does not store anything).
GATEWAY_ONLY = frozenset({"single_durable", "batch_durable"})


def ensure_wrk() -> str:
    """wrk from PATH, installing the Debian package if it is missing."""
    return ensure_tool("wrk", "wrk")


def run_wrk(
    server: Server,
    url: str,
    body: Path,
    content_type: str,
    duration: float,
    connections: int,
    *,
    headers: tuple[str, ...] = (),
    method: str = "POST",
) -> dict[str, Any]:
    """One wrk run (1 thread) with the server's and wrk's CPU use over the run;
    ``headers`` ("Name: value") are sent on every request besides the script's."""
    argv = [
        ensure_wrk(),
        "-t1",
        f"-c{connections}",
        f"-d{duration:g}s",
        "--timeout",
        "10s",
        "-s",
        str(LUA),
        *(arg for header in headers for arg in ("-H", header)),
        url,
        "--",
        str(body),
        content_type,
        method,
    ]
    sys0 = system_ticks()
    before_children = resource.getrusage(resource.RUSAGE_CHILDREN)
    server_cpu0 = cpu_seconds(server.pid)
    t0 = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=duration + 60, check=False)
    wall = time.monotonic() - t0
    server_cpu = cpu_seconds(server.pid) - server_cpu0
    after_children = resource.getrusage(resource.RUSAGE_CHILDREN)
    sys1 = system_ticks()
    wrk_cpu = (after_children.ru_utime + after_children.ru_stime) - (
        before_children.ru_utime + before_children.ru_stime
    )
    line = next((x for x in done.stdout.splitlines() if x.startswith("WRKJSON ")), None)
    if done.returncode != 0 or line is None:
        raise RuntimeError(f"wrk failed ({done.returncode}): {done.stdout}\n{done.stderr}")
    stats = json.loads(line[len("WRKJSON ") :])
    seconds = stats["duration_us"] / 1e6
    errors = sum(stats[k] for k in ("connect", "read", "write", "status", "timeout"))
    if stats["status"]:  # refusals (a 429, say) are fast: counting them flatters the rate
        raise RuntimeError(
            f"{stats['status']} of {stats['requests']} requests were answered with a status "
            "other than 2xx: the run measures refusals, not publishing"
        )
    return {
        "requests": stats["requests"],
        "bytes": stats["bytes"],  # read from the server, headers included
        "seconds": seconds,
        "req_per_s": stats["requests"] / seconds,
        "errors": errors,
        "non_2xx": stats["status"],
        "latency_p50_ms": stats["lat_p50_us"] / 1000,
        "latency_p99_ms": stats["lat_p99_us"] / 1000,
        "server_cpu_util": server_cpu / wall,
        "wrk_cpu_util": wrk_cpu / wall,
        "machine_busy": machine_busy(sys0, sys1),
        "alive_after": server.alive(),
    }


def measure(
    kind: str,
    server: Server,
    case: str,
    body_file: Path,
    duration: float,
    feed_name: str,
) -> dict[str, Any]:
    _, content_type, per_request, connections = cases()[case]
    fixture = None
    skipped = 0
    if kind == "gateway":
        fixture = uvloop.run(rest.fanout_fixture(server.base, feed_name))
        url = fixture["feed"]
        skipped = uvloop.run(rest.skipped_full(server.base))
    else:
        url = f"{server.base}/restms/feed/{feed_name}"
    try:
        result = run_wrk(server, url, body_file, content_type, duration, connections)
        if fixture is not None:
            skipped = uvloop.run(rest.skipped_full(server.base)) - skipped
            if skipped:
                raise RuntimeError(
                    f"{skipped} copies were skipped because the pipe was full: the run "
                    "measured skipping, not placing messages (raise RESTMS_MAX_PIPE_*)"
                )
    finally:
        if fixture is not None and server.alive():
            uvloop.run(rest.drop_fixture(server.base, fixture))
    result["msg_per_s"] = result["req_per_s"] * per_request
    # what one fully available core would do: less sensitive to other load on the machine
    cpu = result["server_cpu_util"]
    result["msg_per_server_cpu_s"] = result["msg_per_s"] / cpu if cpu else None
    result["server"] = kind
    result["case"] = case
    return result


def run(
    gateway: Server, bare: Server, rounds: int, duration: float, only: list[str] | None = None
) -> dict[str, Any]:
    """Interleave bare and gateway runs (alternating which goes first) for every case."""
    names = [c for c in cases() if only is None or c in only]
    out: dict[str, Any] = {name: {"gateway": [], "bare": []} for name in names}
    with tempfile.TemporaryDirectory(prefix="restms-bench-bodies-") as tmp:
        files = {}
        for name in names:
            files[name] = Path(tmp) / f"{name}.body"
            files[name].write_bytes(cases()[name][0])
        for name in names:  # warm-up: short runs, not recorded
            for kind, server in (("bare", bare), ("gateway", gateway)):
                if kind == "bare" and name in GATEWAY_ONLY:
                    continue
                measure(kind, server, name, files[name], 1.0, f"warm{os.getpid()}{name}")
        serial = 0
        for round_no in range(rounds):
            for name in names:
                order = [("bare", bare), ("gateway", gateway)]
                if round_no % 2:
                    order.reverse()
                for kind, server in order:
                    if kind == "bare" and name in GATEWAY_ONLY:
                        continue
                    serial += 1
                    result = measure(kind, server, name, files[name], duration, f"b{serial}")
                    result["round"] = round_no
                    out[name][kind].append(result)
                    log(
                        f"  round {round_no + 1}/{rounds} {name:10s} {kind:7s} "
                        f"{result['req_per_s']:9.0f} req/s {result['msg_per_s']:10.0f} msg/s "
                        f"errors={result['errors']} server_cpu={result['server_cpu_util']:.2f} "
                        f"wrk_cpu={result['wrk_cpu_util']:.2f}"
                    )
    for name in names:
        out[name]["body_bytes"] = len(cases()[name][0])
        out[name]["messages_per_request"] = cases()[name][2]
        out[name]["connections"] = cases()[name][3]
    return out
