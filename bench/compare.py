"""Benchmarks side by side against an earlier commit, in one run.

    .venv/bin/python -m bench.compare BASE_COMMIT [--only throughput,latency,asynclets,mirror]
                                      [--rounds N] [--duration S] [--latency-count N]
                                      [--asynclets N]

The machine the benchmarks run on is shared and its load drifts: a figure measured
yesterday and one measured today differ by more than most changes do. So the base is
measured in the same run as the change: a git worktree of BASE_COMMIT under /tmp
(removed at exit), whose gateway runs on this checkout's virtualenv, beside this tree.
Every benchmark runs on both sides in ABBA order (base first in even rounds, current
first in odd ones), so a drift in load weighs on both alike, and each figure is the
median of its rounds on each side with the ratio current/base. The load generators
(wrk, the benchmark clients) are this checkout's for both sides.

Benchmarks: ``throughput`` (1 and 2: single publish, batched XML and JSON, msg/s and
msg per server CPU-second), ``latency`` (3: publish -> asynclet delivery, ms),
``asynclets`` (4: RSS with N waiting asynclets, the fan-out to all of them; a fresh
gateway a round) and ``mirror`` (13: publish with the traffic mirror on and off).
The raw samples and the table go to ``bench/results/compare-<time>.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from bench import asynclets, latency, mirror, throughput
from bench.common import (
    RESULTS,
    ROOT,
    Server,
    log,
    machine,
    median,
    start,
    stop_all,
    stop_on_signals,
)
from bench.run_all import GATEWAY_ENV

SIDES = ("base", "current")


@dataclass(frozen=True, slots=True)
class Figure:
    """One number a benchmark reports, and which way is better."""

    name: str
    unit: str
    higher_is_better: bool = True


Sample = dict[Figure, float]


class Benchmark(Protocol):
    """A benchmark both sides run: ``runs`` are its parts (each measured on both sides
    in turn), ``measure`` one part on one side, between ``start`` and ``stop``."""

    runs: tuple[str, ...]

    def start(self, roots: Mapping[str, Path]) -> None: ...

    def measure(self, side: str, run: str, round_no: int) -> Sample: ...

    def stop(self) -> None: ...


# ---------------------------------------------------------------- pure parts
def schedule(rounds: int, runs: tuple[str, ...]) -> list[tuple[int, str, str]]:
    """(round, run, side) in the order they are measured: every run on both sides each
    round, the base first in even rounds and last in odd ones (ABBA)."""
    return [
        (n, run, side)
        for n in range(rounds)
        for run in runs
        for side in (SIDES if n % 2 == 0 else SIDES[::-1])
    ]


def table(samples: list[tuple[str, Sample]]) -> list[dict[str, Any]]:
    """Per figure, in the order first seen: the median of each side's values and the
    ratio current/base (None when a side has none, or the base's median is 0)."""
    values: dict[Figure, dict[str, list[float]]] = {}
    for side, sample in samples:
        for figure, value in sample.items():
            values.setdefault(figure, {name: [] for name in SIDES})[side].append(value)
    rows = []
    for figure, by_side in values.items():
        base, current = median(by_side["base"]), median(by_side["current"])
        rows.append(
            {
                "figure": figure.name,
                "unit": figure.unit,
                "higher_is_better": figure.higher_is_better,
                "base": base,
                "current": current,
                "ratio": current / base if base and current is not None else None,
                "n": {side: len(by_side[side]) for side in SIDES},
            }
        )
    return rows


def _number(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"


def format_table(rows: list[dict[str, Any]]) -> list[str]:
    """The table as text lines; the last column says which way is better."""
    header = ("figure", "unit", "base", "current", "current/base", "")
    cells = [
        (
            row["figure"],
            row["unit"],
            _number(row["base"]),
            _number(row["current"]),
            "-" if row["ratio"] is None else f"{row['ratio']:.3f}",
            "higher is better" if row["higher_is_better"] else "lower is better",
        )
        for row in rows
    ]
    widths = [max(len(line[i]) for line in (header, *cells)) for i in range(len(header))]
    lines = []
    for line in (header, *cells):
        left = [line[i].ljust(widths[i]) for i in range(2)]
        right = [line[i].rjust(widths[i]) for i in range(2, 5)]
        lines.append("  ".join([*left, *right, line[5]]).rstrip())
    return lines


# ---------------------------------------------------------------- benchmarks
def _start(servers: dict[str, Server], roots: Mapping[str, Path]) -> None:
    """A gateway of each side's checkout into ``servers`` (so a stop finds those that
    started when a later one fails)."""
    for side, root in roots.items():
        servers[side] = start("gateway", GATEWAY_ENV, root=root, name=f"gateway-{side}")


def _stop(servers: dict[str, Server]) -> None:
    for server in servers.values():
        server.stop()
    servers.clear()


THROUGHPUT = {
    "single": "1. single publish, XML",
    "batch_xml": "2. batched publish 100 x 1 KiB, XML",
    "batch_json": "2. batched publish 100 x 1 KiB, JSON",
}


class Throughput:
    """Benchmarks 1 and 2 (:mod:`bench.throughput`) on one gateway a side."""

    runs = tuple(THROUGHPUT)

    def __init__(self, duration: float) -> None:
        self.duration = duration
        self.servers: dict[str, Server] = {}
        self.tmp = tempfile.TemporaryDirectory(prefix="restms-compare-bodies-")
        self.files = {run: Path(self.tmp.name) / f"{run}.body" for run in self.runs}
        self.serial = 0

    def start(self, roots: Mapping[str, Path]) -> None:
        throughput.ensure_wrk()
        for run, path in self.files.items():
            path.write_bytes(throughput.cases()[run][0])
        _start(self.servers, roots)
        for side in roots:  # warm-up, not recorded
            for run in self.runs:
                self._measure(side, run, 1.0)

    def _measure(self, side: str, run: str, duration: float) -> dict[str, Any]:
        self.serial += 1
        server, body = self.servers[side], self.files[run]
        return throughput.measure("gateway", server, run, body, duration, f"c{self.serial}")

    def measure(self, side: str, run: str, round_no: int) -> Sample:
        found = self._measure(side, run, self.duration)
        label = THROUGHPUT[run]
        log(
            f"  round {round_no + 1} {run:10s} {side:7s} {found['msg_per_s']:10.0f} msg/s "
            f"server_cpu={found['server_cpu_util']:.2f}"
        )
        sample = {Figure(label, "msg/s"): found["msg_per_s"]}
        if found["msg_per_server_cpu_s"]:
            per_cpu = Figure(f"{label}, per server CPU-s", "msg/CPU-s")
            sample[per_cpu] = found["msg_per_server_cpu_s"]
        return sample

    def stop(self) -> None:
        _stop(self.servers)
        self.tmp.cleanup()


PERCENTILES = ("p50", "p90", "p99")


class Latency:
    """Benchmark 3 (:mod:`bench.latency`) on one gateway a side."""

    runs = ("latency",)

    def __init__(self, count: int) -> None:
        self.count = count
        self.servers: dict[str, Server] = {}

    def start(self, roots: Mapping[str, Path]) -> None:
        _start(self.servers, roots)
        for side, server in self.servers.items():  # warm-up, not recorded
            latency.gateway_run(server, 50, f"warm{side}")

    def measure(self, side: str, run: str, round_no: int) -> Sample:
        found = latency.gateway_run(self.servers[side], self.count, f"lat{round_no}{side}")
        log(
            f"  round {round_no + 1} latency {side:7s} "
            f"p50={found['p50_ms']:.3f} ms p99={found['p99_ms']:.3f} ms"
        )
        label = "3. publish -> asynclet latency"
        return {Figure(f"{label}, {p}", "ms", False): found[f"{p}_ms"] for p in PERCENTILES}

    def stop(self) -> None:
        _stop(self.servers)


class _OwnGateways:
    """A benchmark that starts the gateways of a side's checkout in each measure."""

    roots: Mapping[str, Path]

    def start(self, roots: Mapping[str, Path]) -> None:
        self.roots = roots

    def stop(self) -> None:
        pass


class Asynclets(_OwnGateways):
    """Benchmark 4 (:mod:`bench.asynclets`): a fresh gateway a round, as there."""

    runs = ("asynclets",)

    def __init__(self, count: int) -> None:
        self.count = count

    def measure(self, side: str, run: str, round_no: int) -> Sample:
        log(f"  round {round_no + 1} asynclets {side}:")
        found = asynclets.gateway_round(
            self.count, round_no, root=self.roots[side], name=f"gateway-{side}"
        )
        if found["received_ok"] != self.count:
            raise RuntimeError(f"{side}: {found['received_ok']} of {self.count} delivered")
        label = f"4. {self.count} asynclets"
        sample = {
            Figure(f"{label}: RSS with their pipes, before", "MB", False): found["rss_before_mb"],
            Figure(f"{label}: extra RSS while waiting", "MB", False): found["extra_mb"],
            Figure(f"{label}: pipes made", "s", False): found["create_pipes_s"],
            Figure(f"{label}: joins made", "s", False): found["create_joins_s"],
        }
        if found["all_delivered_s"] is not None:
            sample[Figure(f"{label}: fan-out to all", "s", False)] = found["all_delivered_s"]
        return sample


class Mirror(_OwnGateways):
    """Benchmark 13 (:mod:`bench.mirror`): a mirror-on and a mirror-off gateway of the
    side's checkout, one round of it a measure."""

    runs = ("mirror",)

    def __init__(self, duration: float) -> None:
        self.duration = duration

    def measure(self, side: str, run: str, round_no: int) -> Sample:
        log(f"  round {round_no + 1} mirror {side}:")
        found = mirror.run(
            GATEWAY_ENV, 1, self.duration, root=self.roots[side], name=f"gateway-{side}"
        )
        sample: Sample = {}
        for case in mirror.CASES:
            summary = found[case]["summary"]["msg_per_s"]
            label = f"13. {case} publish"
            sample[Figure(f"{label}, mirror on", "msg/s")] = summary["on"]
            sample[Figure(f"{label}, mirror off", "msg/s")] = summary["off"]
            if summary["ratio"] is not None:
                sample[Figure(f"{label}, on/off", "ratio")] = summary["ratio"]
        return sample


BENCHMARKS = ("throughput", "latency", "asynclets", "mirror")


def benchmark(name: str, args: argparse.Namespace) -> Benchmark:
    if name == "throughput":
        return Throughput(args.duration)
    if name == "latency":
        return Latency(args.latency_count)
    if name == "asynclets":
        return Asynclets(args.asynclets)
    if name == "mirror":
        return Mirror(args.duration)
    raise ValueError(name)


def compare(bench: Benchmark, roots: Mapping[str, Path], rounds: int) -> list[dict[str, Any]]:
    """Every (round, run, side) of :func:`schedule`, measured: the raw samples."""
    try:
        bench.start(roots)
        measured = []
        for round_no, run, side in schedule(rounds, bench.runs):
            sample = bench.measure(side, run, round_no)
            measured.append({"round": round_no, "run": run, "side": side, "sample": sample})
        return measured
    finally:
        bench.stop()


# ---------------------------------------------------------------- the base checkout
def _git(*argv: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(ROOT), *argv], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"git {' '.join(argv)}: {done.stderr.strip()}")
    return done.stdout.strip()


@contextlib.contextmanager
def worktree(commit: str) -> Iterator[Path]:
    """A detached worktree of ``commit`` under /tmp, removed (and pruned) at exit."""
    path = Path(tempfile.mkdtemp(prefix="restms-compare-base-"))
    try:
        _git("worktree", "add", "--quiet", "--detach", str(path), commit)
        yield path
    finally:
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(path)],
            capture_output=True,
            check=False,
        )
        shutil.rmtree(path, ignore_errors=True)
        subprocess.run(["git", "-C", str(ROOT), "worktree", "prune"], check=False)


def _jsonable(measured: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {**m, "sample": {figure.name: value for figure, value in m["sample"].items()}}
        for m in measured
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("base", help="the commit to compare this tree with")
    parser.add_argument(
        "--only",
        type=lambda text: [name.strip() for name in text.split(",") if name.strip()],
        default=list(BENCHMARKS),
        help=f"comma-separated, of {','.join(BENCHMARKS)} (default: all)",
    )
    parser.add_argument("--rounds", type=int, default=4, help="rounds a side (4: ABBA twice)")
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per wrk run")
    parser.add_argument("--latency-count", type=int, default=1000, help="samples per round")
    parser.add_argument("--asynclets", type=int, default=10_000, help="waiting asynclets")
    args = parser.parse_args(argv)
    unknown = set(args.only) - set(BENCHMARKS)
    if unknown:
        parser.error(f"unknown benchmarks {', '.join(sorted(unknown))}; use {BENCHMARKS}")
    base = _git("rev-parse", "--verify", f"{args.base}^{{commit}}")
    current = _git("rev-parse", "HEAD")
    dirty = bool(_git("status", "--porcelain", "--untracked-files=no"))
    stop_on_signals()
    started = datetime.now(UTC)
    results: dict[str, Any] = {
        "started": started.isoformat(timespec="seconds"),
        "base": {"commit": base, "subject": _git("log", "-1", "--format=%s", base)},
        "current": {"commit": current, "uncommitted_changes": dirty},
        "settings": vars(args),
        "machine": machine(),
        "gateway_env": GATEWAY_ENV,
        "samples": {},
        "errors": {},
    }
    t0 = time.monotonic()
    all_samples: list[tuple[str, Sample]] = []
    try:
        with worktree(base) as base_root:
            roots = {"base": base_root, "current": ROOT}
            for name in BENCHMARKS:
                if name not in args.only:
                    continue
                log(f"== {name}")
                try:
                    measured = compare(benchmark(name, args), roots, args.rounds)
                except Exception as exc:
                    log(f"!! {name} failed: {exc!r}")
                    results["errors"][name] = traceback.format_exc()
                    continue
                results["samples"][name] = _jsonable(measured)
                all_samples.extend((m["side"], m["sample"]) for m in measured)
    finally:
        stop_all()
    results["seconds"] = time.monotonic() - t0
    results["machine"]["loadavg_end"] = os.getloadavg()
    rows = table(all_samples)
    results["table"] = rows
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"compare-{started.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(results, indent=2))
    mark = " (with uncommitted changes)" if dirty else ""
    print()
    print(f"base:    {base[:12]} {results['base']['subject'][:70]}")
    print(f"current: {current[:12]}{mark}")
    print(
        f"{args.rounds} rounds a side in ABBA order; medians; "
        f"{results['seconds']:.0f} s, load {results['machine']['loadavg_end'][0]:.2f}"
    )
    print()
    for line in format_table(rows):
        print(line)
    for name, error in results["errors"].items():
        print(f"\n{name} FAILED:\n{error}")
    print(f"\nraw results: {path.relative_to(ROOT)}")
    return 1 if results["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
