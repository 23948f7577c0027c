"""Benchmark 15: the work one single-message publish takes, counted instead of timed.

The gateway (a fanout feed with one joined pipe, as in benchmark 1) and the bare aiohttp
server are each sent the same 1 KiB publish over one keep-alive connection, one request
at a time, each request written in one piece as wrk writes it. Two counts per request:

* **Python steps** (bytecode instructions) of the server's main thread: exact and the
  same from run to run (bench/stepcount.py counts them over ``steps`` requests after a
  warm-up), by package (aiohttp, gateway, restms, feeds, ...) and by function.
* **CPU instructions and cycles** of the server's main thread in user space, from
  ``perf stat`` (Debian's linux-perf, installed if missing): instructions repeat to
  about 1 %; cycles move with what else runs on the machine, so the median is taken.

Unlike req/s, neither count depends much on what else the machine runs. Benchmark 1's
ratio is the target; this one says where a request's work goes and whether a change
removed some. Its ratios are of gateway to bare (lower is better).

What the traffic mirror costs the event loop in a batched publish (benchmark 13's
second case) is counted the same way, outside the suite:

    .venv/bin/python -m bench.cost --mirror-batch [MESSAGES] [REQUESTS]

counts the main thread's Python steps per publish of MESSAGES (100) messages, over
REQUESTS (200) publishes, on a gateway with the mirror on and on one with it off, and
prints both and the functions whose counts differ; then the CPU instructions per
publish of each thread of the gateway's process, under callgrind (bench/callgrind.py;
valgrind installed if missing), which Python steps do not measure: a step may be a
C call that does a dictionary lookup, and C-level passes take no step at all.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import uvloop

from bench import rest
from bench.common import (
    BENCH,
    HOST,
    ROOT,
    XML,
    Server,
    ensure_tool,
    log,
    median,
    start,
    xml_messages,
)

WARM_UP = 500  # requests before counting: caches filled, code paths taken once
SIGNAL_WAIT = 0.3  # seconds for the server to act on a signal (its loop is idle)
DUMP_WAIT = 20.0  # seconds for the step counts to be written


def _target(server: Server) -> str:
    """The path to publish to: a fresh fanout feed with one joined pipe on the gateway
    (checked with one publish and one read), any path on the bare server."""
    if server.kind == "bare":
        return "/restms/feed/cost"
    feed = uvloop.run(rest.fanout_fixture(server.base, f"cost{server.pid}"))["feed"]
    return "/" + feed.split("/", 3)[3]


def _publisher(
    server: Server, path: str, messages: int = 1
) -> tuple[Callable[[], None], socket.socket]:
    """One publish, sent in one write, its whole 200 reply read: a function for it."""
    body = xml_messages(messages)
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {HOST}:{server.port}\r\n"
        f"Content-Type: {XML}\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    request = head.encode() + body
    sock = socket.create_connection((HOST, server.port), timeout=30)
    pending = bytearray()

    def publish() -> None:
        sock.sendall(request)
        while True:
            end = pending.find(b"\r\n\r\n")
            if end >= 0:
                lines = bytes(pending[:end]).split(b"\r\n")
                if not lines[0].startswith(b"HTTP/1.1 200"):
                    raise RuntimeError(f"publish answered {lines[0]!r}")
                length = next(
                    int(line.split(b":", 1)[1])
                    for line in lines
                    if line.lower().startswith(b"content-length:")
                )
                if len(pending) >= end + 4 + length:
                    del pending[: end + 4 + length]
                    return
            chunk = sock.recv(65536)
            if not chunk:
                raise RuntimeError("the server closed the connection")
            pending.extend(chunk)

    return publish, sock


def _steps(
    kind: str,
    env: dict[str, str] | None,
    requests: int,
    messages: int = 1,
    top: int | None = 25,
) -> dict[str, Any]:
    """Python steps per request of one server, by package and by function (the ``top``
    functions; None: all)."""
    with tempfile.TemporaryDirectory(prefix="restms-bench-steps-") as tmp:
        out = Path(tmp) / "steps.json"
        server = start(kind, env, wrap=[str(BENCH / "stepcount.py"), str(out)])
        try:
            publish, sock = _publisher(server, _target(server), messages)
            with sock:
                for _ in range(WARM_UP):
                    publish()
                server.proc.send_signal(signal.SIGUSR1)
                time.sleep(SIGNAL_WAIT)
                for _ in range(requests):
                    publish()
                server.proc.send_signal(signal.SIGUSR2)
                deadline = time.monotonic() + DUMP_WAIT
                while not out.exists() or not out.stat().st_size:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"{kind}: no step counts in {DUMP_WAIT:g} s")
                    time.sleep(0.05)
                time.sleep(SIGNAL_WAIT)  # written in one go, but let the writer finish
                counted = json.loads(out.read_text())
        finally:
            server.stop()
    packages: Counter[str] = Counter()
    functions: Counter[str] = Counter()
    for (filename, line, name), steps in counted:
        where = _short(filename)
        packages[where.split("/", 1)[0] if "/" in where else where] += steps
        functions[f"{where}:{line} {name}"] += steps
    total = sum(packages.values())
    return {
        "requests": requests,
        "per_request": total / requests,
        "packages": {k: v / requests for k, v in packages.most_common()},
        "functions": {k: v / requests for k, v in functions.most_common(top)},
    }


def _short(filename: str) -> str:
    """A file as a path inside the project or inside site-packages / the stdlib."""
    for marker in ("site-packages/", str(ROOT) + "/"):
        if marker in filename:
            return filename.split(marker, 1)[1]
    return "(stdlib) " + Path(filename).name if filename.startswith("/") else filename


def _perf(kind: str, env: dict[str, str] | None, requests: int) -> dict[str, Any]:
    """User-space CPU instructions and cycles per request of the server's main thread."""
    try:
        perf = ensure_tool("perf", "linux-perf")
    except (OSError, RuntimeError, subprocess.CalledProcessError) as exc:
        return {"error": f"no perf: {exc}"}
    server = start(kind, env)
    try:
        publish, sock = _publisher(server, _target(server))
        with sock:
            for _ in range(WARM_UP):
                publish()
            events = "instructions:u,cycles:u"
            argv = [perf, "stat", "-x", ",", "-e", events, "-t", str(server.pid)]
            counting = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True)
            time.sleep(SIGNAL_WAIT)  # perf attached; the server idles meanwhile
            for _ in range(requests):
                publish()
            counting.send_signal(signal.SIGINT)
            _, report = counting.communicate(timeout=30)
    finally:
        server.stop()
    counts: dict[str, int] = {}
    for line in report.splitlines():
        fields = line.split(",")
        if len(fields) > 2 and fields[0].strip().isdigit():
            counts[fields[2].split(":")[0]] = int(fields[0])
    if set(counts) != {"instructions", "cycles"}:
        return {"error": f"perf stat gave no counts: {report.strip()[-300:]}"}
    return {name: value / requests for name, value in counts.items()}


def run(env: dict[str, str], rounds: int, steps: int, requests: int) -> dict[str, Any]:
    out: dict[str, Any] = {"settings": {"steps": steps, "requests": requests, "rounds": rounds}}
    out["steps"] = {}
    for kind, kind_env in (("bare", None), ("gateway", env)):
        log(f"  {kind}: counting Python steps over {steps} publishes")
        out["steps"][kind] = _steps(kind, kind_env, steps)
    out["perf"] = {"bare": [], "gateway": []}
    for round_no in range(rounds):
        order = [("bare", None), ("gateway", env)]
        if round_no % 2:
            order.reverse()
        for kind, kind_env in order:
            found = _perf(kind, kind_env, requests)
            out["perf"][kind].append(found)
            if "error" in found:
                log(f"  {kind}: {found['error']}")
                return out
            log(f"  {kind}: {found['instructions']:,.0f} instructions per request")
    return out


def medians(results: dict[str, Any], kind: str) -> dict[str, float | None]:
    runs = [r for r in results.get("perf", {}).get(kind, []) if "error" not in r]
    return {key: median([r[key] for r in runs]) for key in ("instructions", "cycles")}


def describe(results: dict[str, Any]) -> list[str]:
    """Where a request's Python steps go: by package, then the top functions."""
    lines = []
    for kind in ("bare", "gateway"):
        found = results.get("steps", {}).get(kind)
        if not found:
            continue
        parts = ", ".join(f"{k} {v:,.0f}" for k, v in list(found["packages"].items())[:8])
        lines.append(f"{kind}: {found['per_request']:,.0f} Python steps a publish: {parts}")
    gateway = results.get("steps", {}).get("gateway")
    if gateway:
        top = list(gateway["functions"].items())[:12]
        lines.append("gateway, top functions: " + "; ".join(f"{k} {v:,.0f}" for k, v in top))
    return lines


CALLGRIND_WARM_UP = 200  # requests before counting instructions (the server is slow)


def _instructions(env: dict[str, str], requests: int, messages: int) -> dict[str, float]:
    """CPU instructions per request of each thread of the gateway ("1" is the event
    loop's), counted by callgrind over ``requests`` publishes after a warm-up."""
    ensure_tool("valgrind", "valgrind")
    control = ensure_tool("callgrind_control", "valgrind")
    with tempfile.TemporaryDirectory(prefix="restms-bench-callgrind-") as tmp:
        out = Path(tmp) / "gateway.out"
        server = Server("gateway", env, None, [str(BENCH / "callgrind.py"), str(out)])
        try:
            server.wait_ready(600)
            publish, sock = _publisher(server, _target(server), messages)
            with sock:
                for _ in range(CALLGRIND_WARM_UP):
                    publish()
                pid = str(server.pid)
                subprocess.run([control, "-i", "on", pid], check=True, capture_output=True)
                for _ in range(requests):
                    publish()
                subprocess.run([control, "-i", "off", pid], check=True, capture_output=True)
                subprocess.run([control, "-d", pid], check=True, capture_output=True)
        finally:
            server.stop()
        threads: dict[str, float] = {}
        for dump in sorted(Path(tmp).glob("gateway.out.*-*")):
            for line in dump.read_text().splitlines():
                if line.startswith("totals:") and int(line.split()[1]):
                    threads[str(int(dump.name.rsplit("-", 1)[1]))] = int(line.split()[1])
    return {thread: count / requests for thread, count in threads.items()}


def mirror_batch(env: dict[str, str], messages: int, requests: int) -> dict[str, Any]:
    """Python steps and CPU instructions per batched publish with the traffic mirror on
    and off (the switch and settings of benchmark 13), and the functions whose steps
    differ, on minus off."""
    from bench.mirror import switched

    found = {
        kind: _steps("gateway", switched(env, kind == "on"), requests, messages, top=None)
        for kind in ("on", "off")
    }
    on, off = found["on"]["functions"], found["off"]["functions"]
    differ = {name: on.get(name, 0.0) - off.get(name, 0.0) for name in {*on, *off}}
    return {
        "messages": messages,
        "requests": requests,
        "on": found["on"]["per_request"],
        "off": found["off"]["per_request"],
        "functions": dict(
            sorted(
                ((k, v) for k, v in differ.items() if abs(v) >= 0.5),
                key=lambda item: -abs(item[1]),
            )
        ),
        "instructions": {
            kind: _instructions(switched(env, kind == "on"), requests, messages)
            for kind in ("on", "off")
        },
    }


def _main(argv: list[str]) -> None:
    if not argv or argv[0] != "--mirror-batch":
        raise SystemExit("usage: python -m bench.cost --mirror-batch [MESSAGES] [REQUESTS]")
    from bench.run_all import GATEWAY_ENV

    messages = int(argv[1]) if len(argv) > 1 else 100
    requests = int(argv[2]) if len(argv) > 2 else 200
    found = mirror_batch(GATEWAY_ENV, messages, requests)
    on, off = found["on"], found["off"]
    print(f"Python steps a publish of {messages} messages, over {requests} publishes:")
    print(f"  mirror on {on:,.1f}, off {off:,.1f}: {(on - off) / messages:.2f} a message")
    for name, steps in found["functions"].items():
        print(f"  {steps:+10,.1f}  {name}")
    print("CPU instructions a publish, by thread (1: the event loop's):")
    for kind, threads in found["instructions"].items():
        shown = ", ".join(f"{thread} {count:,.0f}" for thread, count in threads.items())
        print(f"  mirror {kind}: {shown}")
    loop_on, loop_off = (found["instructions"][kind].get("1", 0.0) for kind in ("on", "off"))
    print(f"  the event loop's, on minus off: {(loop_on - loop_off) / messages:,.0f} a message")


if __name__ == "__main__":
    _main(sys.argv[1:])
