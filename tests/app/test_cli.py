"""The gateway as a user runs it: ``python main.py serve`` in its own process."""

from __future__ import annotations

import asyncio
import signal
import sys
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


async def test_a_hashed_user_from_the_config_file_logs_in_with_basic(tmp_path: Path) -> None:
    """``user hash`` makes the hash a [[users]] entry keeps; the gateway honours it."""
    hasher = await asyncio.create_subprocess_exec(
        sys.executable,
        "main.py",
        "user",
        "hash",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    async with asyncio.timeout(30):
        out, err = await hasher.communicate(b"correct horse\n")
    assert hasher.returncode == 0, err
    password_hash = out.decode().strip()
    assert password_hash.startswith("scrypt$")
    assert "correct horse" not in password_hash
    config = tmp_path / "gateway.toml"
    config.write_text(
        "anonymous = false\nguest_user = false\n"
        "[[users]]\n"
        f'name = "legacy"\npassword_hash = "{password_hash}"\n'
        'scopes = ["restms:read", "restms:subscribe"]\n',
        encoding="utf-8",
    )
    proc = await start("--port", "0", "--data-dir", str(tmp_path / "d"), "--config", str(config))
    try:
        port = await listening_port(proc)
        url = f"http://127.0.0.1:{port}/restms/domain/default"
        async with aiohttp.ClientSession() as http:
            good = {"Authorization": aiohttp.encode_basic_auth("legacy", "correct horse")}
            wrong = {"Authorization": aiohttp.encode_basic_auth("legacy", "wrong")}
            async with http.get(url, headers=good) as r:
                assert r.status == 200
            async with http.get(url, headers=wrong) as r:
                assert r.status == 401
            async with http.get(url) as r:
                assert r.status == 401  # anonymous is off in this config
            async with http.post(
                url,
                headers={**good, "Content-Type": "text/xml"},
                data=b'<restms><feed name="x"/></restms>',
            ) as r:
                assert r.status == 403  # no publish scope
    finally:
        proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(15):
            await proc.wait()
