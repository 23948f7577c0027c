"""Run every benchmark, print a summary table and write the raw results as JSON.

    bench/run                  # everything, default rounds (= .venv/bin/python -m bench.run_all)
    bench/run --quick          # a short smoke run of everything
    bench/run --only auth      # one section (here benchmark 8)
    bench/run --only amqp      # benchmark 9: the AMQP 1.0 bridge (needs RabbitMQ)
    bench/run --only zeromq    # benchmark 10: the ZeroMQ bridge
    bench/run --only webhooks  # benchmark 11: webhook pipe delivery
    bench/run --only websocket # benchmark 12: WebSocket fan-out to 1,000 sockets
    bench/run --only mirror    # benchmark 13: publish with the traffic mirror on vs off
    bench/run --only analytics # benchmark 14: Spark queries over 10 million events
    bench/run --only cost      # benchmark 15: Python steps and CPU instructions a publish takes
    bench/run --only memory    # benchmark 16: RSS after cycles of 10,000 pipes made and deleted

Each figure is the median over several rounds, and every round also measures the
baseline (bench/bare_server.py: a bare aiohttp + uvloop app) with the same load
generator on the same machine; benchmark 8's baseline is the same gateway answering
guest requests, benchmark 9's a raw asynchronous proton client on the same broker,
benchmark 10's raw pyzmq PUSH -> PULL between two processes, benchmark 11's a plain
aiohttp client POSTing the same documents to the same receiver, benchmark 12's a bare
aiohttp WebSocket server broadcasting to the same clients.
Raw per-round results go to bench/results/results-<time>.json (and latest.json). All
servers and clients are started here on 127.0.0.1 and stopped on every exit path.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
import traceback
from datetime import UTC, datetime
from typing import Any

from bench import (
    amqp_bridge,
    analytics,
    asynclets,
    auth_cost,
    backlog,
    cost,
    latency,
    memory,
    mirror,
    throughput,
    webhooks,
    websocket_fanout,
    zeromq_bridge,
)
from bench.common import RESULTS, log, machine, median, start, stop_all, stop_on_signals

# Benchmarks 1-3 measure the publish path: pipes may grow without bound (in messages
# and in bytes: at the default 64 MiB a batched run fills its pipe in a fraction of a
# second and then measures skipping copies, not placing them) and nothing goes to
# disk for room (benchmark 6 measures that, with the default settings). Each run
# checks, on /metrics (open to loopback here), that no copy was skipped.
# wrk is one principal (the loopback guest): without RESTMS_RATE_LIMIT=0 its default
# limit answers most requests 429 and the figures would count refusals.
GATEWAY_ENV = {
    "RESTMS_MAX_PIPE_MESSAGES": "5000000",
    "RESTMS_MAX_PIPE_BYTES": str(16 * 1024**3),
    "RESTMS_METRICS_ACCESS": "loopback",
    "RESTMS_MEMORY_BUDGET": "0",
    "RESTMS_RATE_LIMIT": "0",
}


def _raise_nofile() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _med(runs: list[dict[str, Any]], key: str) -> float | None:
    return median([r[key] for r in runs if r.get(key) is not None])


def section_throughput(args: argparse.Namespace) -> dict[str, Any]:
    throughput.ensure_wrk()
    gateway = start("gateway", GATEWAY_ENV)
    bare = start("bare")
    try:
        return throughput.run(gateway, bare, args.rounds, args.duration)
    finally:
        gateway.stop()
        bare.stop()


def section_latency(args: argparse.Namespace) -> dict[str, Any]:
    gateway = start("gateway", GATEWAY_ENV)
    bare = start("bare")
    try:
        return latency.run(gateway, bare, args.rounds, args.latency_count)
    finally:
        gateway.stop()
        bare.stop()


def section_asynclets(args: argparse.Namespace) -> dict[str, Any]:
    return asynclets.run(args.rss_rounds, args.asynclets)


def section_backlog(args: argparse.Namespace) -> dict[str, Any]:
    return backlog.run(args.backlog_rounds, args.backlog, args.backlog_pipes)


def section_auth(args: argparse.Namespace) -> dict[str, Any]:
    throughput.ensure_wrk()
    return auth_cost.run(GATEWAY_ENV, args.rounds, args.duration)


def section_amqp(args: argparse.Namespace) -> dict[str, Any]:
    return amqp_bridge.run(args.rounds, args.amqp_count, memory_round=not args.quick)


def section_zeromq(args: argparse.Namespace) -> dict[str, Any]:
    return zeromq_bridge.run(args.rounds, args.zmq_count, args.zmq_durable)


def section_webhooks(args: argparse.Namespace) -> dict[str, Any]:
    return webhooks.run(args.webhook_rounds, args.webhook_count, args.webhook_samples)


def section_mirror(args: argparse.Namespace) -> dict[str, Any]:
    return mirror.run(GATEWAY_ENV, args.rounds, args.duration)


def section_analytics(args: argparse.Namespace) -> dict[str, Any]:
    return analytics.run(args.analytics_events, args.analytics_rounds)


def section_cost(args: argparse.Namespace) -> dict[str, Any]:
    return cost.run(GATEWAY_ENV, args.rounds, args.cost_steps, args.cost_requests)


def section_memory(args: argparse.Namespace) -> dict[str, Any]:
    return memory.run(args.memory_cycles, args.memory_pipes)


def section_websocket(args: argparse.Namespace) -> dict[str, Any]:
    return websocket_fanout.run(
        args.ws_rounds, args.ws_pipes, args.ws_rate, args.ws_seconds, args.ws_burst
    )


def summarize(results: dict[str, Any]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    rows.extend(_backlog_rows(results.get("backlog", {})))
    tp = results.get("throughput", {})
    if "single" in tp:
        g, b = _med(tp["single"]["gateway"], "req_per_s"), _med(tp["single"]["bare"], "req_per_s")
        ratio = g / b if g and b else None
        rows.append(
            {
                "benchmark": "1. single publish (1 KiB, XML)",
                "unit": "req/s",
                "gateway": g,
                "bare": b,
                "ratio": ratio,
                "target": ">= 50% of bare",
                "pass": ratio is not None and ratio >= 0.5,
            }
        )
    for case, label in (("batch_xml", "XML"), ("batch_json", "JSON")):
        if case in tp:
            g, b = _med(tp[case]["gateway"], "msg_per_s"), _med(tp[case]["bare"], "msg_per_s")
            rows.append(
                {
                    "benchmark": f"2. batched publish, 100 x 1 KiB, {label}",
                    "unit": "msg/s",
                    "gateway": g,
                    "bare": b,
                    "ratio": g / b if g and b else None,
                    "target": ">= 100,000 msg/s",
                    "pass": g is not None and g >= 100_000,
                }
            )
    for case, plain, label in (
        ("single_durable", "single", "single publish"),
        ("batch_durable", "batch_xml", "batched publish 100 x 1 KiB, XML"),
    ):
        if case in tp and plain in tp:
            g, b = _med(tp[case]["gateway"], "msg_per_s"), _med(tp[plain]["gateway"], "msg_per_s")
            ratio = g / b if g and b else None
            rows.append(
                {
                    "benchmark": f"5. persistent {label} (baseline: the same, non-persistent)",
                    "unit": "msg/s",
                    "gateway": g,
                    "bare": b,
                    "ratio": ratio,
                    "target": ">= 30% of non-persistent",
                    "pass": ratio is not None and ratio >= 0.3,
                }
            )
    lat = results.get("latency", {})
    if lat.get("gateway"):
        for key, label, target in (("p50_ms", "p50", "<= 2 ms"), ("p99_ms", "p99", "(none)")):
            g, b = _med(lat["gateway"], key), _med(lat["bare"], key)
            rows.append(
                {
                    "benchmark": f"3. publish->asynclet latency {label} (bare: POST round trip)",
                    "unit": "ms",
                    "gateway": g,
                    "bare": b,
                    "ratio": g / b if g and b else None,
                    "target": target,
                    "pass": (g is not None and g <= 2.0) if label == "p50" else None,
                }
            )
    rows.extend(_auth_rows(results.get("auth", {})))
    rows.extend(_amqp_rows(results.get("amqp", {})))
    rows.extend(_zeromq_rows(results.get("zeromq", {})))
    rows.extend(_webhook_rows(results.get("webhooks", {})))
    rows.extend(_websocket_rows(results.get("websocket", {})))
    rows.extend(_cost_rows(results.get("cost", {})))
    rows.extend(_memory_rows(results.get("memory", {})))
    rss = results.get("asynclets", {})
    if rss.get("gateway"):
        n = rss["count"]
        g, b = _med(rss["gateway"], "extra_mb"), _med(rss["bare"], "extra_mb")
        rows.append(
            {
                "benchmark": f"4. extra RSS, {n} waiting asynclets (bare: {n} idle conns)",
                "unit": "MB",
                "gateway": g,
                "bare": b,
                "ratio": g / b if g and b else None,
                "target": "<= 150 MB",
                "pass": g is not None and g <= 150,
            }
        )
        all_ok = all(r["received_ok"] == n and r["publish_reply_count_ok"] for r in rss["gateway"])
        rows.append(
            {
                "benchmark": f"4. fan-out to {n} waiters: time until all received",
                "unit": "s",
                "gateway": _med(rss["gateway"], "all_delivered_s"),
                "bare": None,
                "ratio": None,
                "target": f"all {n} received",
                "pass": all_ok,
            }
        )
        rows.append(
            {
                "benchmark": f"4. create {n} pipes + {n} joins (64 concurrent)",
                "unit": "s",
                "gateway": median(
                    [r["create_pipes_s"] + r["create_joins_s"] for r in rss["gateway"]]
                ),
                "bare": None,
                "ratio": None,
                "target": "(none)",
                "pass": None,
            }
        )
    return rows


def _memory_rows(data: dict[str, Any]) -> list[dict[str, Any]]:
    """Benchmark 16: the last cycle's RSS against the first's."""
    if not data.get("cycles"):
        return []
    first, last = data["cycles"][0], data["cycles"][-1]
    return [
        {
            "benchmark": f"16. RSS after {len(data['cycles'])} cycles of {data['pipes']:,} "
            "pipes made and deleted (baseline: after the first)",
            "unit": "MB",
            "gateway": last["freed_mb"],
            "bare": first["freed_mb"],
            "ratio": data["max_ratio"],
            "target": "every cycle <= 110% of the first",
            "pass": data["pass"],
        }
    ]


def _cost_rows(data: dict[str, Any]) -> list[dict[str, Any]]:
    """Benchmark 15: counts, not a target (benchmark 1's ratio is the target)."""
    rows: list[dict[str, Any]] = []
    steps = data.get("steps", {})
    if "gateway" in steps and "bare" in steps:
        g, b = steps["gateway"]["per_request"], steps["bare"]["per_request"]
        rows.append(
            {
                "benchmark": "15. Python steps a single publish takes (main thread)",
                "unit": "steps",
                "gateway": g,
                "bare": b,
                "ratio": g / b,
                "target": "(diagnostic)",
                "pass": None,
            }
        )
    for key in ("instructions", "cycles"):
        g, b = cost.medians(data, "gateway")[key], cost.medians(data, "bare")[key]
        if g is not None and b is not None:
            rows.append(
                {
                    "benchmark": f"15. CPU {key} a single publish takes (main thread)",
                    "unit": key,
                    "gateway": g,
                    "bare": b,
                    "ratio": g / b,
                    "target": "(diagnostic)",
                    "pass": None,
                }
            )
    return rows


def _auth_rows(data: dict[str, Any]) -> list[dict[str, Any]]:
    """Benchmark 8; its ratio is the median of per-round ratios, not a ratio of medians."""
    if not data.get(auth_cost.BASELINE):
        return []
    guest = _med(data[auth_cost.BASELINE], "req_per_s")
    rows: list[dict[str, Any]] = []
    for variant, label, target in (
        ("bearer", "bearer JWT, same token (cached)", f">= {auth_cost.TARGET:.0%} of guest"),
        ("basic", "Basic guest:guest", "(none)"),
    ):
        ratio = data.get(f"{variant}_ratio")
        verdict = ratio is not None and ratio >= auth_cost.TARGET if variant == "bearer" else None
        rows.append(
            {
                "benchmark": f"8. single publish, {label} (baseline: guest, same gateway)",
                "unit": "req/s",
                "gateway": _med(data[variant], "req_per_s"),
                "bare": guest,
                "ratio": ratio,
                "target": target,
                "pass": verdict,
            }
        )
    return rows


def _amqp_rows(data: dict[str, Any]) -> list[dict[str, Any]]:
    """Benchmark 9; its ratio is the median of per-round ratios, not a ratio of medians."""
    if not data.get("sqlite"):
        return []
    rows: list[dict[str, Any]] = []
    for direction, label in (("out", "gateway -> broker"), ("in", "broker -> gateway")):
        ratio = data[f"{direction}_ratio"]
        rows.append(
            {
                "benchmark": f"9. AMQP 1.0 bridge, {label}, 1 KiB (baseline: raw proton)",
                "unit": "msg/s",
                "gateway": data[f"{direction}_bridge_median"],
                "bare": data[f"{direction}_raw_median"],
                "ratio": ratio,
                "target": f">= {amqp_bridge.TARGET:.0%} of raw",
                "pass": ratio >= amqp_bridge.TARGET,
            }
        )
    return rows


def _zeromq_rows(data: dict[str, Any]) -> list[dict[str, Any]]:
    """Benchmark 10; its ratio is the median of per-round ratios, not a ratio of medians."""
    if not data.get("rounds"):
        return []
    raw3, raw1 = data["raw3_median"], data["raw1_median"]
    rows: list[dict[str, Any]] = [
        {
            "benchmark": "10. raw pyzmq PUSH -> PULL, 1 frame (baseline: the same, 3 frames)",
            "unit": "msg/s",
            "gateway": raw1,
            "bare": raw3,
            "ratio": raw1 / raw3 if raw1 and raw3 else None,
            "target": "(none)",
            "pass": None,
        }
    ]
    for path, label in (
        ("b", "B: PUSH -> pull -> feed -> push -> PULL"),
        ("a", "A: PUSH -> pull -> feed -> pub -> SUB"),
    ):
        rows.append(
            {
                "benchmark": f"10. ZeroMQ bridge, {label}, 1 KiB (baseline: raw, 3 frames)",
                "unit": "msg/s",
                "gateway": data[f"{path}_median"],
                "bare": raw3,
                "ratio": data[f"{path}_ratio"],
                "target": f">= {zeromq_bridge.TARGET:.0%} of raw, none lost",
                "pass": data[f"{path}_pass"],
            }
        )
    return rows


def _webhook_rows(data: dict[str, Any]) -> list[dict[str, Any]]:
    """Benchmark 11; ratios are medians of per-round ratios. No target: information."""
    if not data.get("rounds"):
        return []
    rows: list[dict[str, Any]] = []
    for lanes in (1, 8):
        rows.append(
            {
                "benchmark": f"11. webhook delivery, concurrency {lanes}, 1 KiB "
                f"(baseline: plain client, {lanes} at a time)",
                "unit": "msg/s",
                "gateway": data[f"gw{lanes}_median"],
                "bare": data[f"base{lanes}_median"],
                "ratio": data[f"c{lanes}_ratio"],
                "target": "all delivered, once" + (", in order" if lanes == 1 else ""),
                "pass": not data["problems"],
            }
        )
    for key in ("p50", "p99"):
        rows.append(
            {
                "benchmark": f"11. publish->receiver latency {key} (baseline: POST->receiver)",
                "unit": "ms",
                "gateway": data[f"gwlat_{key}_ms"],
                "bare": data[f"baselat_{key}_ms"],
                "ratio": data[f"{key}_ratio"],
                "target": "(none)",
                "pass": None,
            }
        )
    return rows


def _row(
    benchmark: str,
    unit: str,
    figures: tuple[float | None, float | None, float | None],
    target: str = "(none)",
    passed: bool | None = None,
) -> dict[str, Any]:
    """One line of the summary table; ``figures``: gateway, baseline, ratio."""
    gateway, bare, ratio = figures
    return {
        "benchmark": benchmark,
        "unit": unit,
        "gateway": gateway,
        "bare": bare,
        "ratio": ratio,
        "target": target,
        "pass": passed,
    }


def _websocket_rows(data: dict[str, Any]) -> list[dict[str, Any]]:
    """Benchmark 12; ratios are medians of per-round ratios. No target: information."""
    if not data.get("rounds"):
        return []
    settings = data["settings"]
    fanout = f"12. WebSocket fan-out to {settings['pipes']:,}"
    baseline = "(baseline: bare aiohttp broadcast)"
    rows = [
        _row(
            f"{fanout}, {settings['rate']} msg/s: publish->client {key} {baseline}",
            "ms",
            (
                data[f"gateway_steady_{key}_ms"],
                data[f"bare_steady_{key}_ms"],
                data[f"ratio_steady_{key}_ms_median"],
            ),
        )
        for key in ("p50", "p99")
    ]
    sound = not any(
        data[f"gateway_{p}_{k}"] for p in ("steady", "burst") for k in ("lost", "unordered")
    )
    burst = (
        data["gateway_burst_deliveries_per_s"],
        data["bare_burst_deliveries_per_s"],
        data["ratio_burst_deliveries_per_s_median"],
    )
    rows.append(
        _row(
            f"{fanout}, burst of {settings['burst']}: deliveries {baseline}",
            "msg/s",
            burst,
            "none lost, in order",
            sound,
        )
    )
    return rows


def _backlog_rows(data: dict[str, Any]) -> list[dict[str, Any]]:
    runs = data.get("rounds", [])
    if not runs:
        return []
    n = runs[0]["count"]
    full, idle = _med(runs, "backlog_rss_mb"), _med(runs, "idle_rss_mb")
    recovery, empty = _med(runs, "recovery_s"), _med(runs, "empty_start_s")
    return [
        {
            "benchmark": f"6. RSS with {n:,} queued 1 KiB persistent messages (bare: idle)",
            "unit": "MB",
            "gateway": full,
            "bare": idle,
            "ratio": full / idle if full and idle else None,
            "target": "< 300 MB",
            "pass": full is not None and full < 300,
        },
        {
            "benchmark": f"6. drain all {n:,} (list + acknowledge), in order, once",
            "unit": "msg/s",
            "gateway": _med(runs, "drain_msg_per_s"),
            "bare": None,
            "ratio": None,
            "target": "all drained",
            "pass": all(r["drained_in_order"] for r in runs),
        },
        {
            "benchmark": "7. recovery: start-up with that backlog (bare: empty data dir)",
            "unit": "s",
            "gateway": recovery,
            "bare": empty,
            "ratio": recovery / empty if recovery and empty else None,
            "target": "(none)",
            "pass": None,
        },
        {
            "benchmark": "7. RSS after recovery with that backlog",
            "unit": "MB",
            "gateway": _med(runs, "recovered_rss_mb"),
            "bare": None,
            "ratio": None,
            "target": "< 300 MB",
            "pass": (_med(runs, "recovered_rss_mb") or 999) < 300,
        },
    ]


def _fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit in ("ms", "s"):
        return f"{value:.3f}"
    if unit == "MB":
        return f"{value:.1f}"
    return f"{value:,.0f}"


def print_table(rows: list[dict[str, Any]]) -> None:
    header = ("benchmark", "unit", "gateway", "bare", "ratio", "target", "result")
    lines = [header]
    for row in rows:
        verdict = {True: "PASS", False: "FAIL", None: "-"}[row["pass"]]
        ratio = "-" if row["ratio"] is None else f"{row['ratio']:.2f}"
        lines.append(
            (
                row["benchmark"],
                row["unit"],
                _fmt(row["gateway"], row["unit"]),
                _fmt(row["bare"], row["unit"]),
                ratio,
                row["target"],
                verdict,
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    for n, line in enumerate(lines):
        print("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)))
        if n == 0:
            print("  ".join("-" * w for w in widths))


def print_notes(results: dict[str, Any]) -> None:
    amqp = results.get("amqp", {})
    if amqp.get("sqlite"):
        print("  amqp settings: " + ", ".join(f"{k}={v}" for k, v in amqp["settings"].items()))
    for store in ("sqlite", "memory"):
        for r in amqp.get(store, []):
            o, i = r["out_bridge"], r["in_bridge"]
            print(
                f"  amqp {store} round {r['round'] + 1}: out bridge/raw "
                f"{o['msg_per_s']:,.0f}/{r['out_raw']['msg_per_s']:,.0f} msg/s = "
                f"{r['out_ratio']:.3f} (HTTP {o['http_msg_per_s']:,.0f} msg/s); in bridge/raw "
                f"{i['msg_per_s']:,.0f}/{r['in_raw']['msg_per_s']:,.0f} msg/s = "
                f"{r['in_ratio']:.3f}; gateway CPU-us/msg out "
                f"{o['gateway_cpu_us_per_msg']:.0f}, in {i['gateway_cpu_us_per_msg']:.0f}"
            )
    zmq = results.get("zeromq", {})
    for r in zmq.get("rounds", []):
        runs = r["runs"]
        print(
            f"  zeromq round {r['round'] + 1}: raw 3 frames {runs['raw3']['msg_per_s']:,.0f}, "
            f"1 frame {runs['raw1']['msg_per_s']:,.0f} msg/s; B {runs['b']['msg_per_s']:,.0f} "
            f"= {r['ratios']['b']:.3f} ({runs['b']['gateway_cpu_us_per_msg']:.0f} gateway "
            f"CPU-us/msg); A {runs['a']['msg_per_s']:,.0f} = {r['ratios']['a']:.3f} "
            f"({runs['a']['gateway_cpu_us_per_msg']:.0f} CPU-us/msg); lost, repeated or bad: "
            + (", ".join(f"{k}: {'; '.join(v)}" for k, v in r["problems"].items()) or "none")
        )
    for pair in results.get("websocket", {}).get("rounds", []):
        for kind in websocket_fanout.KINDS:
            print(f"  websocket {websocket_fanout.describe(pair[kind])}")
    authn = results.get("auth", {})
    for variant in auth_cost.VARIANTS if authn.get(auth_cost.BASELINE) else ():
        runs = authn[variant]
        per_round = " ".join(f"{r['req_per_s']:,.0f}" for r in runs)
        ratios = " ".join(f"{x:.3f}" for x in authn.get(f"{variant}_ratios", []))
        cpu = authn.get(f"{variant}_cpu_ratio")
        print(
            f"  auth {variant:6s}: req/s per round {per_round}"
            + (f"; ratios to guest {ratios}" if ratios else "")
            + f"; server {_med(runs, 'server_cpu_us_per_req') or 0:.1f} CPU-us per request"
            + (f" (req per CPU-s: {cpu:.3f} of guest)" if cpu else "")
        )
    if authn.get("in_process"):
        cost = authn["in_process"]
        print(
            "  auth middleware alone, in process: "
            + ", ".join(f"{v} {cost[f'{v}_us']:.2f} us" for v in auth_cost.VARIANTS)
            + " per request; a full JWT check (first use of a token) "
            + f"{cost['jwt_verify_us']:.0f} us"
        )
    tp = results.get("throughput", {})
    for case, data in tp.items():
        for kind in ("gateway", "bare"):
            runs = data[kind]
            if not runs:  # a gateway-only case
                continue
            per_cpu = _med(runs, "msg_per_server_cpu_s") or 0
            print(
                f"  {case:10s} {kind:7s}: {per_cpu:9,.0f} msg per server CPU-second; "
                f"server CPU {_med(runs, 'server_cpu_util') or 0:.2f} "
                f"core, wrk CPU {_med(runs, 'wrk_cpu_util') or 0:.2f} core, machine busy "
                f"{_med(runs, 'machine_busy') or 0:.0%}, errors {sum(r['errors'] for r in runs)}"
            )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5, help="rounds for benchmarks 1-3")
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per wrk run")
    parser.add_argument("--latency-count", type=int, default=1000, help="samples per round")
    parser.add_argument("--asynclets", type=int, default=10_000, help="waiting asynclets")
    parser.add_argument("--rss-rounds", type=int, default=3, help="rounds for benchmark 4")
    parser.add_argument("--backlog", type=int, default=1_000_000, help="queued messages")
    parser.add_argument("--backlog-pipes", type=int, default=100, help="pipes they wait in")
    parser.add_argument("--backlog-rounds", type=int, default=1, help="rounds for 6-7")
    parser.add_argument("--amqp-count", type=int, default=20_000, help="messages per run, #9")
    parser.add_argument("--zmq-count", type=int, default=100_000, help="messages per run, #10")
    parser.add_argument("--webhook-count", type=int, default=10_000, help="messages per run, #11")
    parser.add_argument("--webhook-samples", type=int, default=1000, help="latency samples, #11")
    parser.add_argument("--webhook-rounds", type=int, default=3, help="rounds for #11")
    parser.add_argument("--ws-rounds", type=int, default=3, help="rounds for #12")
    parser.add_argument("--ws-pipes", type=int, default=1000, help="WebSocket clients, #12")
    parser.add_argument("--ws-rate", type=int, default=5, help="steady msg/s, #12")
    parser.add_argument("--ws-seconds", type=int, default=10, help="steady seconds, #12")
    parser.add_argument("--ws-burst", type=int, default=100, help="burst messages, #12")
    parser.add_argument("--analytics-events", type=int, default=10_000_000, help="events, #14")
    parser.add_argument("--analytics-rounds", type=int, default=3, help="rounds for #14")
    parser.add_argument(
        "--cost-steps", type=int, default=3_000, help="#15: publishes whose steps are counted"
    )
    parser.add_argument(
        "--cost-requests", type=int, default=20_000, help="#15: publishes per perf stat round"
    )
    parser.add_argument("--memory-cycles", type=int, default=5, help="cycles for #16")
    parser.add_argument("--memory-pipes", type=int, default=10_000, help="pipes a cycle, #16")
    parser.add_argument(
        "--zmq-durable", action="store_true", help="#10: bridge pipes store every message"
    )
    parser.add_argument(
        "--only",
        nargs="*",
        choices=[
            "throughput",
            "latency",
            "asynclets",
            "backlog",
            "auth",
            "amqp",
            "zeromq",
            "webhooks",
            "websocket",
            "mirror",
            "analytics",
            "cost",
            "memory",
        ],
        default=None,
    )
    parser.add_argument("--quick", action="store_true", help="1 round, short runs")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.duration, args.latency_count = 1, 2.0, 200
        args.rss_rounds, args.asynclets = 1, min(args.asynclets, 2000)
        args.backlog = min(args.backlog, 100_000)
        args.amqp_count = min(args.amqp_count, 5_000)
        args.zmq_count = min(args.zmq_count, 20_000)
        args.webhook_rounds = 1
        args.webhook_count = min(args.webhook_count, 2_000)
        args.webhook_samples = min(args.webhook_samples, 200)
        args.ws_rounds, args.ws_seconds = 1, min(args.ws_seconds, 3)
        args.ws_burst = min(args.ws_burst, 20)
        args.analytics_events = min(args.analytics_events, 1_000_000)
        args.analytics_rounds = 1
        args.cost_steps, args.cost_requests = 1_000, 5_000
        args.memory_cycles, args.memory_pipes = 3, min(args.memory_pipes, 2_000)
    stop_on_signals()
    _raise_nofile()
    started = datetime.now(UTC)
    results: dict[str, Any] = {
        "started": started.isoformat(timespec="seconds"),
        "machine": machine(),
        "settings": vars(args),
        "gateway_env": GATEWAY_ENV,
        "errors": {},
    }
    sections = {
        "throughput": section_throughput,
        "latency": section_latency,
        "asynclets": section_asynclets,
        "backlog": section_backlog,
        "auth": section_auth,
        "amqp": section_amqp,
        "zeromq": section_zeromq,
        "webhooks": section_webhooks,
        "websocket": section_websocket,
        "mirror": section_mirror,
        "analytics": section_analytics,
        "cost": section_cost,
        "memory": section_memory,
    }
    t0 = time.monotonic()
    try:
        for name, section in sections.items():
            if args.only and name not in args.only:
                continue
            log(f"== {name}")
            try:
                results[name] = section(args)
            except Exception as exc:
                log(f"!! {name} failed: {exc!r}")
                results["errors"][name] = traceback.format_exc()
    finally:
        stop_all()
    results["seconds"] = time.monotonic() - t0
    results["machine"]["loadavg_end"] = os.getloadavg()
    results["summary"] = summarize(results)
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"results-{started.strftime('%Y%m%d-%H%M%S')}.json"
    text = json.dumps(results, indent=2)
    path.write_text(text)
    (RESULTS / "latest.json").write_text(text)
    m = results["machine"]
    print()
    print(f"machine: {m['nproc']} x {m['cpu_model']}, {m['mem_gib']} GiB, Python {m['python']}")
    print(
        f"rounds: {args.rounds} x {args.duration:g} s wrk runs, {args.latency_count} latency "
        f"samples/round, {args.rss_rounds} x {args.asynclets} asynclets; figures are medians"
    )
    print()
    print_table(results["summary"])
    print()
    print_notes(results)
    if "mirror" in results:
        for line in mirror.describe(results["mirror"]):
            print(f"  mirror {line}")
    if "analytics" in results:
        for line in analytics.describe(results["analytics"]):
            print(f"  analytics {line}")
    if "cost" in results:
        for line in cost.describe(results["cost"]):
            print(f"  cost {line}")
    if "memory" in results:
        for line in memory.describe(results["memory"]):
            print(f"  memory {line}")
    for name, error in results["errors"].items():
        print(f"\n{name} FAILED:\n{error}")
    print(f"\nraw results: {path.relative_to(RESULTS.parent.parent)}")
    return 1 if results["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
