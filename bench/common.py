"""Shared helpers for the benchmarks: server processes, payloads, statistics, /proc reads.

Everything here runs on 127.0.0.1 only. Every server process started through
:class:`Server` is registered so that :func:`stop_all` can stop it, and run_all.py
calls that on every exit path.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
RESULTS = BENCH / "results"
PYTHON = str(ROOT / ".venv" / "bin" / "python")
HOST = "127.0.0.1"
PAYLOAD_SIZE = 1024
XML = "application/restms+xml"
JSON = "application/restms+json"
NS = "http://www.restms.org/schema/restms"
CLK_TCK = os.sysconf("SC_CLK_TCK")

_running: list[Server] = []


def log(*parts: object) -> None:
    print(*parts, file=sys.stderr, flush=True)


# ---------------------------------------------------------------- payloads
def payload(size: int = PAYLOAD_SIZE, tag: str = "") -> str:
    """Printable, XML- and JSON-safe text of exactly ``size`` characters (= bytes)."""
    unit = "restms benchmark payload 0123456789 abcdefghijklmnopqrstuvwxyz. "
    text = (tag + " " if tag else "") + unit * (size // len(unit) + 1)
    return text[:size]


def xml_messages(
    count: int, *, address: str = "", tag: str = "", persistent: bool = False
) -> bytes:
    mode = ' delivery_mode="2"' if persistent else ""
    one = (
        f'<message address="{address}"{mode}>'
        f'<content type="text/plain" encoding="plain">{payload(tag=tag)}</content></message>'
    )
    return f'<restms xmlns="{NS}">{one * count}</restms>'.encode()


def json_messages(count: int, *, address: str = "", tag: str = "") -> bytes:
    one = {
        "address": address,
        "content": [{"type": "text/plain", "encoding": "plain", "value": payload(tag=tag)}],
    }
    return json.dumps({"restms": {"message": [one] * count}}, separators=(",", ":")).encode()


# ---------------------------------------------------------------- statistics
def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def percentile(values: list[float], p: float) -> float | None:
    """Nearest-rank percentile (p in 0..100)."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, round(p / 100 * len(ordered) + 0.5 - 1e-9))
    return ordered[min(rank, len(ordered)) - 1]


# ---------------------------------------------------------------- /proc
def rss_mb(pid: int) -> float:
    """VmRSS of a process in MiB (from /proc/PID/status)."""
    text = Path(f"/proc/{pid}/status").read_text()
    match = re.search(r"^VmRSS:\s+(\d+)\s+kB", text, re.MULTILINE)
    if match is None:
        raise RuntimeError(f"no VmRSS for pid {pid}")
    return int(match.group(1)) / 1024


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process so far, in seconds (from /proc/PID/stat)."""
    raw = Path(f"/proc/{pid}/stat").read_text()
    fields = raw[raw.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def system_ticks() -> list[int]:
    """The aggregate "cpu" line of /proc/stat."""
    with open("/proc/stat") as f:
        return [int(x) for x in f.readline().split()[1:]]


def machine_busy(before: list[int], after: list[int]) -> float:
    """Fraction of all cores' time that was not idle/iowait between two samples."""
    delta = [b - a for a, b in zip(before, after, strict=True)]
    total = sum(delta[:8])  # guest times are already included in user/nice
    idle = delta[3] + delta[4]
    return (total - idle) / total if total else 0.0


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def machine() -> dict[str, Any]:
    model = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem = None
    with contextlib.suppress(OSError, AttributeError):
        found = re.search(r"MemTotal:\s+(\d+)", Path("/proc/meminfo").read_text())
        mem = round(int(found.group(1)) / 1024 / 1024, 1) if found else None  # type: ignore[union-attr]
    return {
        "nproc": os.cpu_count(),
        "cpu_model": model,
        "mem_gib": mem,
        "kernel": os.uname().release,
        "python": sys.version.split()[0],
        "loadavg_start": os.getloadavg(),
    }


def ensure_tool(command: str, package: str) -> str:
    """``command`` from PATH, installing its Debian ``package`` if it is missing."""
    found = shutil.which(command)
    if found:
        return found
    log(f"{command} not found; installing {package} with apt-get")
    install = ["apt-get", "install", "-y", "-q", package]
    if subprocess.run(install, check=False, stdout=subprocess.DEVNULL).returncode != 0:
        subprocess.run(["apt-get", "update", "-q"], check=True, stdout=subprocess.DEVNULL)
        subprocess.run(install, check=True, stdout=subprocess.DEVNULL)
    found = shutil.which(command)
    if not found:
        raise RuntimeError(f"{command} is still missing after apt-get install {package}")
    return found


# ---------------------------------------------------------------- server processes
class Server:
    """A gateway or bare server child process, listening on 127.0.0.1 on a free port."""

    def __init__(
        self,
        kind: str,
        env: dict[str, str] | None = None,
        data_dir: str | None = None,
        wrap: list[str] | None = None,
        *,
        root: Path = ROOT,
        name: str | None = None,
        port: int = 0,
        extra: tuple[str, ...] = (),
    ) -> None:
        """``data_dir``: use (and keep) this data directory instead of a fresh one;
        ``wrap``: a script (and its arguments) that runs the server script for us;
        ``root``: the checkout whose gateway runs (another commit's worktree, say: it
        runs on this checkout's virtualenv); ``name``: of the log file, when several
        servers of one kind run at once (``kind`` by default); ``port``: a gateway's
        fixed port (0: one the system picks); ``extra``: more arguments for a gateway's
        ``main.py serve`` (``--config FILE``)."""
        self.kind = kind
        self.port = 0
        RESULTS.mkdir(parents=True, exist_ok=True)
        self.logfile = RESULTS / f"{name or kind}-server.log"
        self.keep = data_dir is not None
        self.data_dir = data_dir or tempfile.mkdtemp(prefix=f"restms-bench-{kind}-")
        if kind == "gateway":
            argv = [
                PYTHON,
                str(root / "main.py"),
                "serve",
                "--host",
                HOST,
                "--port",
                str(port),
                "--data-dir",
                self.data_dir,
                *extra,
            ]
        elif kind == "bare":
            argv = [PYTHON, str(BENCH / "bare_server.py"), "--host", HOST, "--port", "0"]
        else:
            raise ValueError(kind)
        if wrap:
            argv[1:1] = wrap
        full_env = dict(os.environ)
        full_env["RESTMS_ANALYTICS_PRELOAD"] = "0"  # no JVM beside what is measured
        full_env.update(env or {})
        self._log = self.logfile.open("wb")
        self.proc = subprocess.Popen(
            argv, cwd=root, env=full_env, stdout=self._log, stderr=subprocess.STDOUT
        )
        _running.append(self)

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def base(self) -> str:
        return f"http://{HOST}:{self.port}"

    def wait_ready(self, timeout: float = 20.0) -> Server:
        """Both servers log "listening on http://127.0.0.1:PORT/..." once bound."""
        deadline = time.monotonic() + timeout
        pattern = re.compile(rb"listening on http://127\.0\.0\.1:(\d+)/")
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.kind} server exited with {self.proc.returncode}: "
                    + self.logfile.read_text(errors="replace")[-2000:]
                )
            found = pattern.search(self.logfile.read_bytes())
            if found:
                self.port = int(found.group(1))
                return self
            time.sleep(0.05)
        raise RuntimeError(f"{self.kind} server did not report its port in {timeout}s")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                log(f"{self.kind} server ignored SIGTERM for 10 s; killing it")
                self.proc.kill()
                self.proc.wait(5)
        self._log.close()
        with contextlib.suppress(ValueError):
            _running.remove(self)
        if not self.keep:
            subprocess.run(["rm", "-rf", self.data_dir], check=False)
        return self.proc.returncode


def free_port() -> int:
    """A port free on 127.0.0.1 now (a server given it binds it a moment later)."""
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return int(probe.getsockname()[1])


def start(
    kind: str,
    env: dict[str, str] | None = None,
    data_dir: str | None = None,
    wrap: list[str] | None = None,
    *,
    root: Path = ROOT,
    name: str | None = None,
) -> Server:
    """A started :class:`Server` that has reported its port (arguments as there)."""
    server = Server(kind, env, data_dir, wrap, root=root, name=name)
    try:
        return server.wait_ready()
    except BaseException:
        server.stop()
        raise


def stop_all() -> None:
    for server in list(_running):
        with contextlib.suppress(Exception):
            server.stop()


def stop_on_signals() -> None:
    """SIGTERM or SIGHUP stops the servers started and exits through the finally blocks
    that clean up (a namespace forgotten, a worktree removed)."""

    def stop(signum: int, _frame: Any) -> None:
        stop_all()
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGHUP, stop)


class BenchError(RuntimeError):
    """A benchmark run that cannot give a figure (a peer or the gateway failed)."""


class Child:
    """A spawned worker process (no loop or socket state inherited) and the benchmark's
    end of its pipe: ``(tag, value)`` messages from it, ``None`` to it to stop it."""

    def __init__(self, name: str, target: Callable[[Connection], None]) -> None:
        spawn = multiprocessing.get_context("spawn")
        self.conn, child = spawn.Pipe()
        self.proc = spawn.Process(target=target, args=(child,), name=name, daemon=True)
        self.proc.start()
        child.close()
        self.name = name

    def expect(self, what: str, timeout: float) -> Any:
        """The next message, which must be tagged ``what`` and carry no error."""
        if not self.conn.poll(timeout):
            raise BenchError(f"{self.name}: no {what} within {timeout:g} s")
        tag, value = self.conn.recv()
        if tag != what:
            raise BenchError(f"{self.name}: {tag} {value!r} instead of {what}")
        if isinstance(value, dict) and "error" in value:
            raise BenchError(f"{self.name}: {value['error']}")
        return value

    def close(self) -> None:
        if self.proc.is_alive():
            with contextlib.suppress(OSError):
                self.conn.send(None)
            self.proc.join(5)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)
        self.conn.close()


Runs = dict[str, dict[str, Any]]  # one round's figures, by run name


def play_rounds(
    out: dict[str, Any],
    rounds: int,
    names: tuple[str, ...],
    one: Callable[[int, str], dict[str, Any]],
    ratios_of: Callable[[Runs], dict[str, float]],
    problems_of: Callable[[dict[str, Any]], list[str]],
    report: Callable[[str, Runs, dict[str, float]], None],
) -> None:
    """``rounds`` rounds of the runs ``names``, each ``one(round, name)``, in that order
    and every other round backwards; each round's runs, ratios and problems go to
    ``out["rounds"]`` and are logged."""
    out["rounds"] = []
    for n in range(rounds):
        order = names if n % 2 == 0 else names[::-1]
        runs = {name: one(n, name) for name in order}
        ratios = ratios_of(runs)
        problems = {name: p for name in names if (p := problems_of(runs[name]))}
        out["rounds"].append({"round": n, "runs": runs, "ratios": ratios, "problems": problems})
        report(f"round {n + 1}/{rounds}", runs, ratios)
        for name, found in problems.items():
            log(f"  !! {name}: {', '.join(found)}")


async def json_reply(reply: Any, expect: tuple[int, ...]) -> Any:
    """The JSON body of an aiohttp reply with one of the ``expect`` statuses, or
    :class:`BenchError` saying what came instead."""
    data = await reply.read()
    if reply.status not in expect:
        raise BenchError(f"{reply.method} {reply.url} -> {reply.status}: {data[:300]!r}")
    return await reply.json(content_type=None) if data else None
