"""A gateway in its own process (``python main.py serve``) on a port of its own, that
the tests can stop and start again on the same port and data directory: what a
client sees of a real restart."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT = 30.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class GatewayProcess:
    """``main.py serve`` on 127.0.0.1:``port`` with ``data_dir``; settings by env."""

    def __init__(
        self, data_dir: Path, env: dict[str, str] | None = None, args: tuple[str, ...] = ()
    ) -> None:
        self.data_dir = data_dir
        self.args = args
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        clean = {k: v for k, v in os.environ.items() if not k.startswith("RESTMS_")}
        self.env = {**clean, **(env or {})}
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        self.starts += 1
        log = self.data_dir.parent / f"gateway-{self.port}-{self.starts}.log"
        self.log = log
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    str(ROOT / "main.py"),
                    "serve",
                    "--port",
                    str(self.port),
                    "--data-dir",
                    str(self.data_dir),
                    "--log-level",
                    "INFO",
                    *self.args,
                ],
                cwd=ROOT,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the gateway exited: {log.read_text()[-2000:]}")
            # its own line, not a connect: another process could hold the port
            if f"listening on {self.url}/" in log.read_text(errors="replace"):
                return
            time.sleep(0.05)
        raise RuntimeError(f"the gateway did not listen within {START_TIMEOUT} s")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """Stop it as an operator does (SIGTERM: drain, answer 503, commit, exit)."""
        if self.proc is None:
            return
        proc, self.proc = self.proc, None
        if proc.poll() is None:
            proc.send_signal(sig)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
