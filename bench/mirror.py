"""Benchmark 13: what the traffic mirror costs the publish path (docs/ANALYTICS.md).

Two gateways run side by side, one with the mirror on (``RESTMS_MIRROR=1``, the
default) and one with it off, with the same settings otherwise. The single and XML
batch cases of benchmarks 1-2 (:mod:`bench.throughput`: wrk, a fresh fanout feed with
one joined pipe per run, so each message makes a publish and a route event) run on
both in alternating rounds, the order flipped every round; figures are medians over
rounds and the ratio is mirror-on over mirror-off (target: at least 0.90).

At the end the mirror's own counters (``GET /admin/mirror``) say how many events it
took, dropped and wrote, in how many files and bytes.
"""

from __future__ import annotations

import json
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

from bench import throughput
from bench.common import ROOT, Server, log, median, start

CASES = ("single", "batch_xml")
ADMIN = "restms:read restms:publish restms:subscribe restms:admin"


def switched(base: dict[str, str], mirror: bool) -> dict[str, str]:
    """The same settings but the switch; no rate limit (wrk is one principal)."""
    switch = {"RESTMS_MIRROR": "1" if mirror else "0", "RESTMS_RATE_LIMIT": "0"}
    return {**base, **switch, "RESTMS_GUEST_SCOPES": ADMIN}


def _status(server: Server) -> dict[str, Any]:
    with urllib.request.urlopen(f"{server.base}/admin/mirror", timeout=10) as reply:
        found: dict[str, Any] = json.loads(reply.read())
        return found


def _brief(result: dict[str, Any]) -> str:
    keys = ("msg_per_s", "errors", "server_cpu_util")
    return " ".join(f"{key}={result[key]:.6g}" for key in keys)


def _schedule(rounds: int) -> list[tuple[int, str, str]]:
    """(round, case, mirror on/off) in the order they run: on first in even rounds."""
    return [
        (n, case, kind)
        for n in range(rounds)
        for case in CASES
        for kind in (("on", "off") if n % 2 == 0 else ("off", "on"))
    ]


def run(
    base_env: dict[str, str],
    rounds: int,
    duration: float,
    *,
    root: Path = ROOT,
    name: str = "gateway",
) -> dict[str, Any]:
    """The mirror-on and mirror-off gateways of the checkout ``root`` side by side (their
    logs: ``<name>-mirror-on`` and ``-off``)."""
    throughput.ensure_wrk()
    servers = {
        kind: start(
            "gateway", switched(base_env, kind == "on"), root=root, name=f"{name}-mirror-{kind}"
        )
        for kind in ("on", "off")
    }
    out: dict[str, Any] = {case: {"on": [], "off": []} for case in CASES}
    try:
        with tempfile.TemporaryDirectory(prefix="restms-bench-mirror-") as tmp:
            files = {}
            for case in CASES:
                files[case] = Path(tmp) / f"{case}.body"
                files[case].write_bytes(throughput.cases()[case][0])
                for kind, server in servers.items():  # warm-up, not recorded
                    throughput.measure("gateway", server, case, files[case], 1.0, f"w{kind}{case}")
            for serial, (round_no, case, kind) in enumerate(_schedule(rounds)):
                server, body = servers[kind], files[case]
                found = throughput.measure("gateway", server, case, body, duration, f"m{serial}")
                out[case][kind].append({"round": round_no, **found})
                log(f"  round {round_no + 1}/{rounds} {case} mirror {kind}: {_brief(found)}")
        out["mirror_status"] = _status(servers["on"])
        out["off_status"] = _status(servers["off"])
    finally:
        for server in servers.values():
            server.stop()
    for case in CASES:
        on, off = out[case]["on"], out[case]["off"]
        summary: dict[str, Any] = {}
        for key in ("msg_per_s", "msg_per_server_cpu_s"):
            a = median([r[key] for r in on if r.get(key)])
            b = median([r[key] for r in off if r.get(key)])
            summary[key] = {"on": a, "off": b, "ratio": a / b if a and b else None}
        out[case]["summary"] = summary
    return out


def describe(results: dict[str, Any]) -> list[str]:
    """One line per case, and the mirror's counters."""
    lines = []
    for case in CASES:
        s = results[case]["summary"]["msg_per_s"]
        c = results[case]["summary"]["msg_per_server_cpu_s"]
        lines.append(
            f"{case}: mirror on {s['on']:.0f} msg/s, off {s['off']:.0f} msg/s, "
            f"ratio {s['ratio']:.3f} (per server CPU-second: {c['ratio']:.3f})"
        )
    status = results.get("mirror_status", {})
    keys = ("emitted", "dropped", "written", "files", "bytes", "errors")
    lines.append("mirror: " + ", ".join(f"{k} {status.get(k)}" for k in keys))
    return lines
