"""Benchmark 13: what the traffic mirror costs the publish path (docs/ANALYTICS.md).

Two gateways run side by side, one with the mirror on (``RESTMS_MIRROR=1``, the
default) and one with it off, with the same settings otherwise. The single and XML
batch cases of benchmarks 1-2 (:mod:`bench.throughput`: wrk, a fresh fanout feed with
one joined pipe per run, so each message makes a publish and a route event) run on
both in alternating rounds, the order flipped every round; figures are medians over
rounds and the ratio is mirror-on over mirror-off (target: at least 0.90).

At the end the mirror's own counters (``GET /admin/mirror``) say how many events it
took, dropped and wrote, in how many files and bytes.

:func:`drops` (``python -m bench.mirror --drops``) asks whether the mirror keeps up: the
batched case, the gateway's fastest, on two mirror-on gateways, one with the spill
(``mirror_spill_bytes``, the default) and one without (``0``, the queue alone, as before
the spill existed), in alternating rounds. Each round reports the events emitted,
dropped and spilled, the backlog (queued and spilled events) when the load ended, and
how long the mirror took to write it all once the load was over.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
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


DRAIN_WAIT = 300.0  # seconds the mirror may take to write its backlog after a round
SPILL = {"spill": str(1024**3), "no-spill": "0"}


def _drain(server: Server) -> float:
    """Seconds until nothing is queued or spilled (a flush is not asked for: the writer
    catches up on its own)."""
    began = time.monotonic()
    while time.monotonic() - began < DRAIN_WAIT:
        status = _status(server)
        if status["queued"] == 0 and status["spilled"] == 0:
            return time.monotonic() - began
        time.sleep(0.1)
    raise RuntimeError(f"the mirror of {server.base} did not catch up in {DRAIN_WAIT:g} s")


def drops(base_env: dict[str, str], rounds: int, duration: float) -> dict[str, Any]:
    """The batched case on a mirror-on gateway with the spill and one without
    (environment: ``ROUNDS``, ``SECONDS`` a round, ``QUEUE`` for ``mirror_queue``)."""
    throughput.ensure_wrk()
    servers = {
        kind: start(
            "gateway",
            {**switched(base_env, True), "RESTMS_MIRROR_SPILL_BYTES": spill},
            name=f"gateway-mirror-{kind}",
        )
        for kind, spill in SPILL.items()
    }
    out: dict[str, Any] = {kind: [] for kind in servers}
    out["load_average"] = [os.getloadavg()[0]]
    try:
        with tempfile.TemporaryDirectory(prefix="restms-bench-drops-") as tmp:
            body = Path(tmp) / "batch.body"
            body.write_bytes(throughput.cases()["batch_xml"][0])
            for n in range(rounds):
                for kind in tuple(SPILL) if n % 2 == 0 else tuple(reversed(SPILL)):
                    server = servers[kind]
                    before = _status(server)
                    found = throughput.measure(
                        "gateway", server, "batch_xml", body, duration, f"d{n}"
                    )
                    after = _status(server)
                    row = {
                        "round": n,
                        "msg_per_s": found["msg_per_s"],
                        "wrk_errors": found["errors"],
                        "emitted": after["emitted"] - before["emitted"],
                        "dropped": after["dropped"] - before["dropped"],
                        "spilled": after["spilled_total"] - before["spilled_total"],
                        "backlog": after["queued"] + after["spilled"],
                        "drain_s": _drain(server),
                    }
                    out[kind].append(row)
                    log(f"  round {n + 1}/{rounds} {kind}: " + " ".join(
                        f"{k}={v:.6g}" for k, v in row.items() if k != "round"))  # fmt: skip
            out["load_average"].append(os.getloadavg()[0])
            out["status"] = {kind: _status(server) for kind, server in servers.items()}
    finally:
        for server in servers.values():
            server.stop()
    return out


def describe_drops(results: dict[str, Any]) -> list[str]:
    lines = []
    for kind in SPILL:
        rows = results[kind]
        rate = median([r["msg_per_s"] for r in rows])
        total = {k: sum(r[k] for r in rows) for k in ("emitted", "dropped", "spilled")}
        lines.append(
            f"{kind}: batched {rate:.0f} msg/s (median), events {total['emitted']}, dropped "
            f"{total['dropped']}, spilled {total['spilled']}, backlog at the end of a round "
            f"at most {max(r['backlog'] for r in rows)}, written within "
            f"{max(r['drain_s'] for r in rows):.1f} s after it"
        )
    return lines


if __name__ == "__main__":
    if "--drops" in sys.argv:
        from bench.run_all import GATEWAY_ENV

        env = dict(GATEWAY_ENV)
        if "QUEUE" in os.environ:  # a smaller queue: the same pressure sooner
            env["RESTMS_MIRROR_QUEUE"] = os.environ["QUEUE"]
        rounds, duration = int(os.environ.get("ROUNDS", "3")), float(os.environ.get("SECONDS", "5"))
        result = drops(env, rounds=rounds, duration=duration)
        print(json.dumps(result, indent=1, default=str))
        print("\n".join(describe_drops(result)))
