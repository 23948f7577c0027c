"""The gateway as a user runs it: ``python main.py serve`` in its own process."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import aiohttp

from tests.app.process import listening_port, start


async def test_serve_answers_then_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    data = tmp_path / "data"
    proc = await start("--port", "0", "--data-dir", str(data))
    try:
        port = await listening_port(proc)
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"http://127.0.0.1:{port}/restms/domain/default") as r,
        ):
            assert r.status == 200
            assert f"http://127.0.0.1:{port}/restms/feed/default" in await r.text()
        assert data.is_dir()  # the data directory is created on start
        proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(15):
            assert await proc.wait() == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_sigint_also_stops_cleanly(tmp_path: Path) -> None:
    proc = await start("--port", "0", "--data-dir", str(tmp_path))
    try:
        await listening_port(proc)
        proc.send_signal(signal.SIGINT)
        async with asyncio.timeout(15):
            assert await proc.wait() == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_flags_beat_environment(tmp_path: Path) -> None:
    proc = await start(
        "--port",
        "0",
        "--data-dir",
        str(tmp_path),
        env={"RESTMS_PORT": "1", "RESTMS_LEGACY_DEFAULT_FEED_TYPE": "direct"},
    )
    try:
        port = await listening_port(proc)  # port 1 would have failed: the flag won
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"http://127.0.0.1:{port}/restms/feed/default") as r,
        ):
            assert 'type="direct"' in await r.text()  # the env var still applied
    finally:
        proc.terminate()
        await proc.wait()
