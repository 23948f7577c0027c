"""``main.py serve --workers N``: several gateway processes on one port.

Above one worker the engine must be shared by the processes (``engine = "redis"``); the
embedded engine's pipes live in one process, so asking for more is refused before
anything starts. On the cluster engine the workers share the port and the pipes: a
worker killed is started again, SIGTERM stops them all, and workers that cannot start
stop the command rather than being restarted for ever.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from tests import nodes
from tests.app.process import main_py, start

DOMAIN = "/restms/domain/default"
JSON_TYPE = {"Content-Type": "application/restms+json"}
PIPE = b'{"restms":{"pipe":[{}]}}'
ACCESS = re.compile(r'worker (\d) gateway: .*"POST /restms/feed/default')


def message(pipe: str, i: int) -> bytes:
    return orjson.dumps(
        {"restms": {"message": [{"address": pipe, "content": [{"value": f"m{i}"}]}]}}
    )


async def test_workers_with_the_embedded_engine_are_refused_at_once(tmp_path: Path) -> None:
    code, _, err = await main_py(
        "serve", "--port", "8199", "--data-dir", str(tmp_path), "--workers", "2"
    )
    assert code == 2
    assert err.splitlines() == [
        'main.py: workers above 1 need engine = "redis": the embedded engine\'s pipes live in'
        " one process, so a second process would serve other pipes (docs/CLUSTER.md)"
    ], err
    assert not (tmp_path / "gateway.sqlite3").exists()  # refused before the store opened


async def test_the_environment_asks_for_workers_too(tmp_path: Path) -> None:
    code, _, err = await main_py(
        "serve", "--port", "8199", "--data-dir", str(tmp_path), env={"RESTMS_WORKERS": "3"}
    )
    assert code == 2
    assert 'workers above 1 need engine = "redis"' in err


# ---------------------------------------------------------------- on the cluster engine


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Log:
    """A process's standard error, read as it comes."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stderr is not None
        self.lines: list[str] = []
        self._stream = proc.stderr
        self._grew = asyncio.Event()
        self._reading = asyncio.create_task(self._read())

    async def _read(self) -> None:
        while line := await self._stream.readline():
            self.lines.append(line.decode(errors="replace"))
            self._grew.set()

    async def until(self, pattern: str, count: int = 1, within: float = 30) -> list[str]:
        """The first ``count`` lines that match ``pattern``, once logged."""
        async with asyncio.timeout(within):
            while len(found := [x for x in self.lines if re.search(pattern, x)]) < count:
                self._grew.clear()
                await self._grew.wait()
        return found[:count]

    async def close(self) -> None:
        async with asyncio.timeout(30):
            await self._reading


@contextlib.asynccontextmanager
async def workers(
    tmp_path: Path, count: int, **env: str
) -> AsyncIterator[tuple[asyncio.subprocess.Process, str, Log]]:
    """``main.py serve --engine redis --workers count`` on a namespace of its own, its
    URL and its log as it grows; stopped with SIGTERM (and its keys deleted) after."""
    name = nodes.namespace()
    port = free_port()
    proc = await start(
        "--engine",
        "redis",
        "--workers",
        str(count),
        "--port",
        str(port),
        "--data-dir",
        str(tmp_path / "data"),
        env={
            "RESTMS_REDIS_URL": nodes.CLUSTER_URL,
            "RESTMS_REDIS_NAMESPACE": name,
            "RESTMS_ACCESS_LOG": "1",
            **env,
        },
    )
    log = Log(proc)
    try:
        yield proc, f"http://127.0.0.1:{port}", log
    finally:
        if proc.returncode is None:
            proc.terminate()
            async with asyncio.timeout(30):
                await proc.wait()
        await log.close()
        await nodes.forget(name)


async def fresh(url: str, method: str, path: str, **kwargs: Any) -> tuple[int, bytes]:
    """One request on a connection of its own (so the kernel may pick any worker)."""
    async with aiohttp.ClientSession() as http, http.request(method, url + path, **kwargs) as r:
        return r.status, await r.read()


async def test_workers_share_the_port_and_the_pipes(tmp_path: Path) -> None:
    async with workers(tmp_path, 2) as (_, url, log):
        await log.until(r"worker \d gateway: listening on", count=2)
        status, body = await fresh(url, "POST", DOMAIN, data=PIPE, headers=JSON_TYPE)
        assert status == 201, body
        pipe = orjson.loads(body)["restms"]["pipe"][0]["name"]
        for i in range(20):  # each on a new connection: both workers take some
            status, body = await fresh(
                url, "POST", "/restms/feed/default", data=message(pipe, i), headers=JSON_TYPE
            )
            assert status == 200, body
        answered = {m.group(1) for m in map(ACCESS.search, log.lines) if m}
        assert answered == {"0", "1"}, log.lines[-5:]
        for i in range(20):  # in order, whichever worker each read goes to
            status, body = await fresh(url, "GET", f"/restms/resource/{pipe}.{i + 1}")
            assert status == 200, body
            assert f"m{i}".encode() in body


async def test_a_killed_worker_is_started_again_and_sigterm_stops_them_all(
    tmp_path: Path,
) -> None:
    async with workers(tmp_path, 2) as (proc, url, log):
        started = await log.until(r"worker \d started \(pid \d+\)", count=2)
        pids = [int(line.rsplit("pid ", 1)[1].split(")")[0]) for line in started]
        await log.until(r"worker \d gateway: listening on", count=2)
        os.kill(pids[1], signal.SIGKILL)
        await log.until(r"worker 1 \(pid \d+\) ended with exit code -9: starting it again")
        await log.until(r"worker 1 gateway: listening on", count=2)
        for _ in range(6):
            status, _ = await fresh(url, "GET", DOMAIN)
            assert status == 200
        proc.terminate()
        async with asyncio.timeout(30):
            assert await proc.wait() == 0
        await log.until("all 2 workers stopped")
        with pytest.raises(ProcessLookupError):
            os.kill(pids[0], 0)


async def test_workers_that_cannot_reach_the_cluster_stop_the_command(tmp_path: Path) -> None:
    dead = f"redis://127.0.0.1:{free_port()}"
    async with workers(tmp_path, 2, RESTMS_REDIS_URL=dead, RESTMS_REDIS_START_WAIT="1") as (
        proc,
        _,
        log,
    ):
        async with asyncio.timeout(60):
            assert await proc.wait() == 1
        await log.until(r"ended with exit code \d+ .* after its start: stopping")
