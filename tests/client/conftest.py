"""Fixtures of the client library's tests: a real gateway process on 127.0.0.1.

The library is used as its users use it, from outside the gateway's process: a
synchronous client would block a gateway running on the test's own event loop, and a
restart needs a process to stop and start again.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import httpcore2  # noqa: F401  (imported here, not on a test's loop: it reads its metadata)
import pytest

from tests.client.gateway import ROOT, GatewayProcess

MakeProcess = Callable[..., GatewayProcess]


@pytest.fixture
def make_process(tmp_path: Path) -> Iterator[MakeProcess]:
    """Start gateway processes (``env``: ``RESTMS_*`` settings); stopped at the end."""
    started: list[GatewayProcess] = []

    def start(
        env: dict[str, str] | None = None, *, args: tuple[str, ...] = (), start: bool = True
    ) -> GatewayProcess:
        gateway = GatewayProcess(tmp_path / f"var{len(started)}", env, args)
        started.append(gateway)
        if start:
            gateway.start()
        return gateway

    yield start
    for gateway in started:
        gateway.stop()


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """A gateway process with the default settings, shared by a module's tests (a
    process takes seconds to start): they name their feeds with :func:`unique`."""
    process = GatewayProcess(tmp_path_factory.mktemp("shared") / "var")
    process.start()
    yield process
    process.stop()


def unique(name: str) -> str:
    """``name`` with a random suffix: a public feed of this test's own."""
    return f"{name}-{uuid.uuid4().hex[:8]}"


def main_py(gateway: GatewayProcess, *args: str, stdin: str = "") -> str:
    """What ``python main.py ARGS`` prints, run with ``gateway``'s environment."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "main.py"), *args],
        cwd=ROOT,
        env=gateway.env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout


def add_client(gateway: GatewayProcess, name: str, scopes: str) -> str:
    """Add an OAuth client to ``gateway``'s data directory (offline); its secret."""
    out = main_py(
        gateway, "client", "add", name, "--scopes", scopes, "--data-dir", str(gateway.data_dir)
    )
    for line in out.splitlines():
        if line.startswith("client_secret:"):
            return line.partition(":")[2].strip()
    raise AssertionError(f"no secret in {out!r}")
