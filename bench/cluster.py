"""Benchmark 17: the cluster engine (Redis Cluster, docs/CLUSTER.md) in one run.

    .venv/bin/python -m bench.cluster [--only engines,cross_node,pipes,workers]
                                      [--rounds N] [--duration S] [--latency-count N]
                                      [--pipes N] [--base COMMIT]

Every figure is compared with a baseline measured in the same run, in alternating
order (ABBA), because the machine is shared and its load drifts:

- ``engines``: single and batched (100-message XML) publish, msg/s, on a gateway with
  the Redis engine against one with the embedded engine (memory store, as the
  throughput benchmark runs it). Reported: the medians and their ratio, and the CPU
  the gateway and the cluster's six redis-server processes used.
- ``cross_node``: publish on node A to an asynclet waiting on node B (two gateways on
  the Redis engine), ms from the publish written to the asynclet's reply read (the
  latency benchmark's method); baseline: publish and wait on one embedded gateway.
- ``pipes``: the cluster's memory (``used_memory`` summed over the masters) for N
  empty pipes, made through the engine service in this process; bytes a pipe. Then,
  each round, another node's engine starting on that catalogue (bench/node_start.py,
  a process of its own): how long it takes and the longest its event loop stalled,
  at its start, when, running, it reads the whole catalogue again, for its stats
  (the census of every pipe that each scrape of /metrics takes) and for every pipe's
  state (the admin API's list of pipes and its overview).
- ``workers``: ``serve --workers 2`` against ``--workers 1`` on the Redis engine:
  total msg/s (single publish) and msg per gateway CPU-second (all workers' CPU).
  wrk, the gateways and Redis share the machine's cores, so on two cores the
  efficiency per CPU-second is the figure to watch; on more cores the same run shows
  the total scaling.

With ``--base COMMIT``, ``engines``, ``cross_node`` and ``pipes`` (its node starts)
also run the Redis engine of that commit (a git worktree, as :mod:`bench.compare`
makes) in the same rounds, the sides' order turning each round, and report
current/base ratios: a change is measured against what it changes in one run.

Needs the project's cluster (``scripts/cluster up``: it is started if it is not up).
Each gateway runs on a namespace of its own, deleted afterwards. The raw samples go to
``bench/results/cluster-<time>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import uvloop

from bench import latency, throughput
from bench.common import (
    HOST,
    RESULTS,
    ROOT,
    Server,
    cpu_seconds,
    free_port,
    log,
    machine,
    median,
    start,
    stop_all,
    stop_on_signals,
)
from bench.run_all import GATEWAY_ENV

# The project's cluster (scripts/cluster), or one moved as the script moves it.
CLUSTER_BASE = int(os.environ.get("RESTMS_CLUSTER_BASE_PORT", "7100"))
CLUSTER_PORTS = range(CLUSTER_BASE + 1, CLUSTER_BASE + 7)
CLUSTER_URL = f"redis://127.0.0.1:{CLUSTER_PORTS[0]}"
CLUSTER_DIR = Path(os.environ.get("RESTMS_CLUSTER_DIR", "/var/tmp/restms-cluster"))
PARTS = ("engines", "cross_node", "pipes", "workers")


def redis_env(namespace: str) -> dict[str, str]:
    return {
        **GATEWAY_ENV,
        "RESTMS_ENGINE": "redis",
        "RESTMS_REDIS_URL": CLUSTER_URL,
        "RESTMS_REDIS_NAMESPACE": namespace,
    }


def embedded_env() -> dict[str, str]:
    return {**GATEWAY_ENV, "RESTMS_STORE": "memory"}


def cluster_up() -> None:
    subprocess.run([str(ROOT / "scripts" / "cluster"), "up"], check=True)


def redis_pids() -> list[int]:
    return [int((CLUSTER_DIR / str(port) / "redis.pid").read_text()) for port in CLUSTER_PORTS]


def redis_cpu() -> float:
    return sum(cpu_seconds(pid) for pid in redis_pids())


async def forget(namespace: str) -> None:
    """Delete a namespace's keys on every master (as tests/nodes.py does)."""
    from redis.asyncio import Redis
    from redis.asyncio.cluster import RedisCluster

    cluster = RedisCluster.from_url(CLUSTER_URL)
    try:
        await cluster.initialize()
        for node in cluster.get_primaries():
            async with Redis(host=node.host, port=node.port) as master:
                keys = [k async for k in master.scan_iter(match=f"{{{namespace}:*", count=1000)]
            for key in keys:
                await cluster.unlink(key)
    finally:
        await cluster.aclose()


def ratio(current: float | None, base: float | None) -> float | None:
    return current / base if current is not None and base else None


@contextlib.contextmanager
def base_root(args: argparse.Namespace) -> Iterator[Path | None]:
    """The worktree of ``--base`` (None without it), removed at exit."""
    if not args.base:
        yield None
        return
    from bench.compare import worktree

    with worktree(args.base) as path:
        yield path


def turned(sides: list[str], round_no: int) -> list[str]:
    """The sides' order in a round: each goes first in turn, and the order reverses
    every other round (ABBA for two sides)."""
    shift = round_no // 2 % len(sides)
    order = sides[shift:] + sides[:shift]
    return order[::-1] if round_no % 2 else order


# ---------------------------------------------------------------- engines
def engines(args: argparse.Namespace) -> dict[str, Any]:
    with base_root(args) as base:
        return _engines(args, base)


def _engines(args: argparse.Namespace, base: Path | None) -> dict[str, Any]:
    namespace = f"bench-{secrets.token_hex(4)}"
    servers = {
        "embedded": start("gateway", env=embedded_env(), name="gateway-embedded"),
        "redis": start("gateway", env=redis_env(namespace), name="gateway-redis"),
    }
    if base is not None:  # on a namespace of its own: no news of the other's feeds
        servers["redis_base"] = start(
            "gateway", env=redis_env(f"{namespace}-base"), root=base, name="gateway-redis-base"
        )
    cases = ("single", "batch_xml")
    samples: dict[str, dict[str, list[dict[str, Any]]]] = {
        case: {side: [] for side in servers} for case in cases
    }
    try:
        with tempfile.TemporaryDirectory(prefix="restms-bench-cluster-") as tmp:
            files = {}
            for case in cases:
                files[case] = Path(tmp) / f"{case}.body"
                files[case].write_bytes(throughput.cases()[case][0])
            for case in cases:  # warm-up, not recorded
                for side, server in servers.items():
                    throughput.measure("gateway", server, case, files[case], 1.0, f"w{side}{case}")
            serial = 0
            for round_no in range(args.rounds):
                for case in cases:
                    for side in turned(list(servers), round_no):
                        server = servers[side]
                        serial += 1
                        before = redis_cpu()
                        result = throughput.measure(
                            "gateway", server, case, files[case], args.duration, f"c{serial}"
                        )
                        result["redis_cpu_s"] = redis_cpu() - before
                        samples[case][side].append(result)
                        log(
                            f"  round {round_no + 1}/{args.rounds} {case:9s} {side:10s} "
                            f"{result['msg_per_s']:9.0f} msg/s "
                            f"gateway_cpu={result['server_cpu_util']:.2f} "
                            f"redis_cpu={result['redis_cpu_s'] / args.duration:.2f}"
                        )
    finally:
        for server in servers.values():
            server.stop()
        uvloop.run(forget(namespace))
        if base is not None:
            uvloop.run(forget(f"{namespace}-base"))
    summary = {}
    for case in cases:
        medians = {side: median([r["msg_per_s"] for r in samples[case][side]]) for side in servers}
        summary[case] = {
            "msg_per_s": medians,
            "ratio_redis_to_embedded": ratio(medians["redis"], medians["embedded"]),
            "gateway_cpu_util": {
                side: median([r["server_cpu_util"] for r in samples[case][side]])
                for side in servers
            },
            "redis_cpu_util": {
                side: median([r["redis_cpu_s"] / args.duration for r in samples[case][side]])
                for side in servers
                if side != "embedded"
            },
        }
        if base is not None:
            summary[case]["ratio_base_to_embedded"] = ratio(
                medians["redis_base"], medians["embedded"]
            )
            summary[case]["ratio_current_to_base"] = ratio(medians["redis"], medians["redis_base"])
    return {"summary": summary, "samples": samples}


# ---------------------------------------------------------------- cross-node latency
def cross_node(args: argparse.Namespace) -> dict[str, Any]:
    with base_root(args) as base:
        return _cross_node(args, base)


def _cross_node(args: argparse.Namespace, base: Path | None) -> dict[str, Any]:
    namespace = f"bench-{secrets.token_hex(4)}"
    pairs = {
        "a_to_b": (
            start("gateway", env=redis_env(namespace), name="gateway-node-a"),
            start("gateway", env=redis_env(namespace), name="gateway-node-b"),
        )
    }
    if base is not None:  # the base's nodes on a namespace of their own
        other = f"{namespace}-base"
        pairs["a_to_b_base"] = (
            start("gateway", env=redis_env(other), root=base, name="gateway-node-a-base"),
            start("gateway", env=redis_env(other), root=base, name="gateway-node-b-base"),
        )
    embedded = start("gateway", env=embedded_env(), name="gateway-embedded")
    runs: dict[str, list[dict[str, Any]]] = {side: [] for side in [*pairs, "embedded"]}
    try:
        for round_no in range(args.rounds):
            for side in turned(list(runs), round_no):
                feed = f"lat{round_no}{side.replace('_', '')}"
                if side in pairs:
                    a, b = pairs[side]
                    result = latency.gateway_run(b, args.latency_count, feed, publisher=a)
                else:
                    result = latency.gateway_run(embedded, args.latency_count, feed)
                runs[side].append(result)
                log(
                    f"  round {round_no + 1}/{args.rounds} {side:11s} "
                    f"p50={result['p50_ms']:.2f} ms p99={result['p99_ms']:.2f} ms"
                )
    finally:
        for server in [*(s for pair in pairs.values() for s in pair), embedded]:
            server.stop()
        uvloop.run(forget(namespace))
        if base is not None:
            uvloop.run(forget(f"{namespace}-base"))
    p50 = {side: median([r["p50_ms"] for r in results]) for side, results in runs.items()}
    p99 = {side: median([r["p99_ms"] for r in results]) for side, results in runs.items()}
    summary: dict[str, Any] = {
        "p50_ms": p50,
        "p99_ms": p99,
        "ratio_p50": ratio(p50["a_to_b"], p50["embedded"]),
    }
    if base is not None:
        summary["ratio_p50_current_to_base"] = ratio(p50["a_to_b"], p50["a_to_b_base"])
    return {"summary": summary, "samples": runs}


# ---------------------------------------------------------------- memory per pipe
async def _used_memory() -> int:
    from redis.asyncio import Redis
    from redis.asyncio.cluster import RedisCluster

    cluster = RedisCluster.from_url(CLUSTER_URL)
    try:
        await cluster.initialize()
        total = 0
        for node in cluster.get_primaries():
            async with Redis(host=node.host, port=node.port) as master:
                total += int((await master.info("memory"))["used_memory"])
        return total
    finally:
        await cluster.aclose()


async def _make_pipes(namespace: str, count: int) -> float:
    from feeds.redis import RedisEngine
    from feeds.service import EngineConfig, PipeSpec
    from restms.errors import ServiceUnavailable

    engine = RedisEngine.open(EngineConfig(), CLUSTER_URL, namespace=namespace)
    await engine.start()
    started = time.monotonic()
    try:
        made = 0
        batch = 16  # creations in flight: each is a compare-and-set on the one catalogue

        async def one(i: int) -> None:
            for attempt in range(5):  # a 503 (the shared cluster failing over): again
                try:
                    await engine.create_pipe(f"bench-{i % 100}", "default", PipeSpec())
                    return
                except ServiceUnavailable:
                    if attempt == 4:
                        raise
                    await asyncio.sleep(1.0)

        while made < count:
            now = min(batch, count - made)
            await asyncio.gather(*(one(made + i) for i in range(now)))
            made += now
    finally:
        await engine.close()
    return time.monotonic() - started


# What bench/node_start.py reports of a node, each a median of the rounds.
NODE_FIGURES = (
    "seconds",
    "longest_stall_ms",
    "reload_seconds",
    "reload_longest_stall_ms",
    "stats_seconds",
    "stats_longest_stall_ms",
    "states_seconds",
    "states_longest_stall_ms",
)


def _node_start(root: Path, namespace: str) -> dict[str, Any]:
    """A node of ``root``'s engine started on ``namespace`` (bench/node_start.py)."""
    script = ROOT / "bench" / "node_start.py"
    command = [sys.executable, str(script), "--root", str(root), "--url", CLUSTER_URL]
    done = subprocess.run(
        [*command, "--namespace", namespace],
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return result


def pipes(args: argparse.Namespace) -> dict[str, Any]:
    with base_root(args) as base:
        return _pipes(args, base)


def _pipes(args: argparse.Namespace, base: Path | None) -> dict[str, Any]:
    namespace = f"bench-{secrets.token_hex(4)}"
    roots = {"current": ROOT} | ({"base": base} if base is not None else {})
    starts: dict[str, list[dict[str, Any]]] = {side: [] for side in roots}
    try:
        before = uvloop.run(_used_memory())
        took = uvloop.run(_make_pipes(namespace, args.pipes))
        after = uvloop.run(_used_memory())
        for round_no in range(args.rounds):
            for side in turned(list(roots), round_no):
                started = _node_start(roots[side], namespace)
                starts[side].append(started)
                log(
                    f"  round {round_no + 1}/{args.rounds} {side:8s} ({started['pipes']} "
                    f"pipes) start {started['seconds']:.2f} s, longest stall "
                    f"{started['longest_stall_ms']:.1f} ms; read again "
                    f"{started['reload_seconds']:.2f} s, longest stall "
                    f"{started['reload_longest_stall_ms']:.1f} ms; stats "
                    f"{started['stats_seconds']:.2f} s, longest stall "
                    f"{started['stats_longest_stall_ms']:.1f} ms; pipe states "
                    f"{started['states_seconds']:.2f} s, longest stall "
                    f"{started['states_longest_stall_ms']:.1f} ms"
                )
    finally:
        uvloop.run(forget(namespace))
    per_pipe = (after - before) / args.pipes
    log(f"  {args.pipes} pipes: {after - before} bytes, {per_pipe:.0f} bytes a pipe, {took:.1f} s")
    summary: dict[str, Any] = {"pipes": args.pipes, "bytes_per_pipe": per_pipe, "seconds": took}
    for figure in NODE_FIGURES:
        medians = {side: median([r[figure] for r in rs]) for side, rs in starts.items()}
        summary[f"node_{figure}"] = medians
        if base is not None:
            summary[f"node_{figure}_ratio_current_to_base"] = ratio(
                medians["current"], medians["base"]
            )
    return {
        "summary": summary,
        "used_memory": {"before": before, "after": after},
        "node_starts": starts,
    }


# ---------------------------------------------------------------- workers
class Workers(Server):
    """``main.py serve --workers N`` on the Redis engine, on a fixed port."""

    def __init__(self, count: int, namespace: str) -> None:
        self.count = count
        env = {**redis_env(namespace), "RESTMS_WORKERS": str(count)}
        super().__init__("gateway", env, name=f"gateway-workers-{count}", port=free_port())

    def cpu(self) -> float:
        """CPU seconds of the workers (the supervisor only waits)."""
        children = Path(f"/proc/{self.pid}/task/{self.pid}/children").read_text().split()
        pids = [int(pid) for pid in children] or [self.pid]
        return sum(cpu_seconds(pid) for pid in pids)

    def wait_listening(self, timeout: float = 30.0) -> Workers:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.logfile.read_text(errors="replace")
            if text.count("listening on http://") >= self.count:
                self.port = int(text.split(f"listening on http://{HOST}:", 1)[1].split("/")[0])
                return self
            if self.proc.poll() is not None:
                raise RuntimeError(f"workers exited: {text[-2000:]}")
            time.sleep(0.1)
        raise RuntimeError(f"{self.count} workers did not listen in {timeout} s")


def workers(args: argparse.Namespace) -> dict[str, Any]:
    namespace = f"bench-{secrets.token_hex(4)}"
    sides = {count: Workers(count, namespace).wait_listening() for count in (1, 2)}
    samples: dict[int, list[dict[str, Any]]] = {1: [], 2: []}
    body = throughput.cases()["single"]
    try:
        with tempfile.TemporaryDirectory(prefix="restms-bench-workers-") as tmp:
            file = Path(tmp) / "single.body"
            file.write_bytes(body[0])
            for round_no in range(args.rounds):
                order = [1, 2] if round_no % 2 == 0 else [2, 1]
                for count in order:
                    server = sides[count]
                    cpu0 = server.cpu()
                    result = throughput.measure(
                        "gateway", server, "single", file, args.duration, f"wk{round_no}{count}"
                    )
                    used = server.cpu() - cpu0
                    result["gateway_cpu_s"] = used
                    result["msg_per_gateway_cpu_s"] = (
                        result["msg_per_s"] * result["seconds"] / used if used else None
                    )
                    samples[count].append(result)
                    log(
                        f"  round {round_no + 1}/{args.rounds} workers={count} "
                        f"{result['msg_per_s']:9.0f} msg/s "
                        f"{result['msg_per_gateway_cpu_s'] or 0:9.0f} msg/CPU-s"
                    )
    finally:
        for server in sides.values():
            server.stop()
        uvloop.run(forget(namespace))
    total = {n: median([r["msg_per_s"] for r in s]) for n, s in samples.items()}
    efficiency = {n: median([r["msg_per_gateway_cpu_s"] for r in s]) for n, s in samples.items()}
    return {
        "summary": {
            "msg_per_s": total,
            "msg_per_gateway_cpu_s": efficiency,
            "total_ratio_2_to_1": ratio(total[2], total[1]),
            "efficiency_ratio_2_to_1": ratio(efficiency[2], efficiency[1]),
            "cores": os.cpu_count(),
        },
        "samples": samples,
    }


SECTIONS: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {
    "engines": engines,
    "cross_node": cross_node,
    "pipes": pipes,
    "workers": workers,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--only", default=",".join(PARTS), help="comma-separated parts")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per wrk run")
    parser.add_argument("--latency-count", type=int, default=500, help="samples per round")
    parser.add_argument("--pipes", type=int, default=100_000)
    parser.add_argument(
        "--base",
        help="a commit whose Redis engine runs beside this one (engines, cross_node, pipes)",
    )
    args = parser.parse_args()
    chosen = [part.strip() for part in args.only.split(",") if part.strip()]
    unknown = sorted(set(chosen) - set(PARTS))
    if unknown:
        parser.error(f"unknown parts: {', '.join(unknown)} (known: {', '.join(PARTS)})")
    stop_on_signals()  # a part stopped still forgets its namespace: its keys would stay
    cluster_up()
    results: dict[str, Any] = {"machine": machine(), "started": datetime.now(UTC).isoformat()}
    try:
        for part in chosen:
            log(f"== {part}")
            results[part] = SECTIONS[part](args)
            print(json.dumps({part: results[part]["summary"]}, indent=2), flush=True)
    finally:
        stop_all()
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"cluster-{datetime.now(UTC):%Y%m%dT%H%M%SZ}.json"
    out.write_text(json.dumps(results, indent=2, default=str))
    log(f"results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
