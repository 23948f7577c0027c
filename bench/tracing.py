"""What tracing costs (docs/BENCHMARKS.md, section 19): benchmarks 1 and 2 (XML) on four
gateways of this tree in one run, the order rotated every round.

    .venv/bin/python -m bench.tracing [--rounds 4] [--duration 5]

- ``off``: ``tracing = false``, the default;
- ``on``: ``tracing = true`` with no ``otlp_endpoint``: every span is made (each request
  a new trace, sampled: wrk sends no ``traceparent``) and dropped;
- ``sampled``: as ``on`` with ``tracing_sample = 0.01``: one new trace in 100 recorded,
  the others made of spans that record nothing (the request ids and message headers
  are still there);
- ``export``: ``tracing = true`` exporting over OTLP/HTTP to a sink process on
  127.0.0.1 that reads each export and answers 200 (the SDK's batch processor, in a
  thread of the gateway's process: its CPU is counted in the gateway's).

Each figure is the median of the rounds, with its ratio to ``off`` measured in the same
rounds. What tracing off costs against the code before it is ``bench.compare``'s work
(``--only throughput`` against the commit before). Raw results go to
``bench/results/tracing-<time>.json``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import throughput
from bench.common import PYTHON, RESULTS, Server, free_port, log, machine, median, start, stop_all
from bench.run_all import GATEWAY_ENV

CASES = ("single", "batch_xml")
SIDES = ("off", "on", "sampled", "export")


def sink_main(port: int) -> None:
    """The OTLP sink: reads every POST's body whole and answers 200, until killed."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Sink(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    ThreadingHTTPServer(("127.0.0.1", port), Sink).serve_forever()


def gateways(sink: int) -> dict[str, Server]:
    endpoint = f"http://127.0.0.1:{sink}/v1/traces"
    envs = {
        "off": GATEWAY_ENV,
        "on": {**GATEWAY_ENV, "RESTMS_TRACING": "true"},
        "sampled": {**GATEWAY_ENV, "RESTMS_TRACING": "true", "RESTMS_TRACING_SAMPLE": "0.01"},
        "export": {**GATEWAY_ENV, "RESTMS_TRACING": "true", "RESTMS_OTLP_ENDPOINT": endpoint},
    }
    started: dict[str, Server] = {}
    for side, env in envs.items():
        started[side] = start("gateway", env, name=f"gateway-tracing-{side}")
    return started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per wrk run")
    args = parser.parse_args()
    throughput.ensure_wrk()
    sink_port = free_port()
    sink = subprocess.Popen([PYTHON, "-m", "bench.tracing", "--sink", str(sink_port)])
    samples: dict[tuple[str, str], list[float]] = {}
    cpu: dict[tuple[str, str], list[float]] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="restms-tracing-bodies-") as tmp:
            bodies = {case: Path(tmp) / f"{case}.body" for case in CASES}
            for case, path in bodies.items():
                path.write_bytes(throughput.cases()[case][0])
            servers = gateways(sink_port)
            serial = 0

            def one(side: str, case: str, duration: float) -> dict[str, Any]:
                nonlocal serial
                serial += 1
                server, body = servers[side], bodies[case]
                return throughput.measure("gateway", server, case, body, duration, f"t{serial}")

            for side in SIDES:  # warm-up, not recorded
                for case in CASES:
                    one(side, case, 1.0)
            for n in range(args.rounds):
                order = SIDES if n % 2 == 0 else SIDES[::-1]
                for case in CASES:
                    for side in order:
                        found = one(side, case, args.duration)
                        samples.setdefault((case, side), []).append(found["msg_per_s"])
                        cpu.setdefault((case, side), []).append(found["msg_per_server_cpu_s"] or 0)
                        log(
                            f"round {n + 1} {case:9s} {side:6s} {found['msg_per_s']:10.0f} msg/s "
                            f"server_cpu={found['server_cpu_util']:.2f}"
                        )
    finally:
        stop_all()
        sink.kill()
        sink.wait(5)
    rows = []
    for case in CASES:
        off, off_cpu = median(samples[(case, "off")]), median(cpu[(case, "off")])
        for side in SIDES:
            rate, per_cpu = median(samples[(case, side)]), median(cpu[(case, side)])
            rows.append(
                {
                    "case": case,
                    "side": side,
                    "msg_per_s": rate,
                    "ratio": rate / off if rate and off else None,
                    "msg_per_server_cpu_s": per_cpu,
                    "cpu_ratio": per_cpu / off_cpu if per_cpu and off_cpu else None,
                    "rounds": samples[(case, side)],
                }
            )
            log(
                f"{case:9s} {side:6s} {rate:10.0f} msg/s ({rows[-1]['ratio']:.3f} of off), "
                f"{per_cpu:10.0f} msg/CPU-s ({rows[-1]['cpu_ratio']:.3f} of off)"
            )
    RESULTS.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out = {"machine": machine(), "args": vars(args), "rows": rows, "time": time.time()}
    (RESULTS / f"tracing-{stamp}.json").write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--sink"]:
        sink_main(int(sys.argv[2]))
    else:
        sys.exit(main())
