"""Fixtures of the client library's tests: a real gateway process on 127.0.0.1.

The library is used as its users use it, from outside the gateway's process: a
synchronous client would block a gateway running on the test's own event loop, and a
restart needs a process to stop and start again.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.client.gateway import ROOT, GatewayProcess

MakeProcess = Callable[..., GatewayProcess]


@pytest.fixture
def make_process(tmp_path: Path) -> Iterator[MakeProcess]:
    """Start gateway processes (``env``: ``RESTMS_*`` settings); stopped at the end."""
    started: list[GatewayProcess] = []

    def start(env: dict[str, str] | None = None, *, start: bool = True) -> GatewayProcess:
        gateway = GatewayProcess(tmp_path / f"var{len(started)}", env)
        started.append(gateway)
        if start:
            gateway.start()
        return gateway

    yield start
    for gateway in started:
        gateway.stop()


@pytest.fixture
def gateway(make_process: MakeProcess) -> GatewayProcess:
    """A gateway process with the default settings."""
    return make_process()


def add_client(gateway: GatewayProcess, name: str, scopes: str) -> str:
    """Add an OAuth client to ``gateway``'s data directory (offline); its secret."""
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "main.py"),
            "client",
            "add",
            name,
            "--scopes",
            scopes,
            "--data-dir",
            str(gateway.data_dir),
        ],
        cwd=ROOT,
        env=gateway.env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    for line in done.stdout.splitlines():
        if line.startswith("client_secret:"):
            return line.partition(":")[2].strip()
    raise AssertionError(f"no secret in {done.stdout!r}")
