"""One gateway per data directory, enforced (docs/OPERATIONS.md), on real processes.

Decided behaviour under test:

* A second ``main.py serve`` on a data directory a gateway holds exits at once,
  non-zero, naming the directory and the holder's PID; the first keeps serving.
* The lock dies with its holder: after ``kill -9`` of the first gateway a new one
  starts on the directory.
* The offline ``main.py client`` verbs do not take the lock and are safe beside a
  running gateway: a client added while it runs gets a token from it at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from gateway.server.datalock import LOCK_FILE
from tests.app.process import listening_port, main_py, start

pytestmark = pytest.mark.app


@contextlib.asynccontextmanager
async def gateway(data: Path) -> AsyncIterator[tuple[asyncio.subprocess.Process, str]]:
    """``main.py serve`` on ``data``: the process and its base URL; killed at the end."""
    proc = await start("--port", "0", "--data-dir", str(data))
    try:
        port = await listening_port(proc)
        yield proc, f"http://127.0.0.1:{port}"
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()


async def healthy(url: str) -> bool:
    async with aiohttp.ClientSession() as http, http.get(f"{url}/healthz") as r:
        return r.status == 200


async def test_a_second_gateway_refuses_the_directory_until_the_first_is_killed(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    async with gateway(data) as (first, url):
        second = await start("--port", "0", "--data-dir", str(data))
        try:
            async with asyncio.timeout(30):
                _, err = await second.communicate()
        finally:
            if second.returncode is None:  # it started: the failure is reported above
                second.kill()
                await second.wait()
        assert second.returncode == 1, err
        said = err.decode()
        assert f"a gateway (pid {first.pid}) holds the data directory {data.resolve()}" in said
        assert "listening" not in said
        assert await healthy(url)  # the first is untouched
        assert (data / LOCK_FILE).read_text() == f"{first.pid}\n"
        assert (data / LOCK_FILE).stat().st_mode & 0o777 == 0o600

        first.send_signal(signal.SIGKILL)
        await first.wait()

    async with gateway(data) as (third, url):
        assert await healthy(url)
        assert (data / LOCK_FILE).read_text() == f"{third.pid}\n"


async def test_client_verbs_are_safe_beside_a_running_gateway(tmp_path: Path) -> None:
    data = tmp_path / "data"
    where = ("--data-dir", str(data))
    async with gateway(data) as (_, url):
        code, out, err = await main_py("client", "add", "robot", "--scopes", "restms:read", *where)
        assert (code, err) == (0, "")
        secret = out.split("client_secret: ", 1)[1].split()[0]
        auth = {"Authorization": aiohttp.encode_basic_auth("robot", secret)}
        form = {"grant_type": "client_credentials"}
        async with (
            aiohttp.ClientSession() as http,
            http.post(f"{url}/oauth/token", data=form, headers=auth) as r,
        ):
            assert r.status == 200, await r.text()
    code, _, err = await main_py("client", "remove", "robot", *where)  # and with none running
    assert (code, err) == (0, "")
