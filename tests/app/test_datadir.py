"""The data directory is private whatever the umask, and one it cannot use is refused
with one line (docs/OPERATIONS.md, "The data directory").

* Started under umask 022, after a persistent publish, a webhook pipe and a clean
  stop, the data directory and every directory in it are 0700 and every file 0600:
  the store and its -wal and -shm (created by SQLite), the OAuth keys, the lake
  files the mirror's process wrote.
* Files an older version left 0644 in a 0755 directory are tightened at start.
* A directory others may write into is refused, naming it and the chmod to run.
* A data directory the gateway cannot write into is refused with one line and no
  traceback. The tests run as root, for whom mode bits stop no write, so the
  unwritable directory is ``/proc`` (no file can be created there by anyone), and a
  path whose parent is a regular file.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import stat
import sys
from pathlib import Path

import aiohttp

from tests.app.jsonapi import DOMAIN, HJ
from tests.app.process import ROOT, listening_port, main_py, start
from tests.app.test_webhooks import SECRET, Receiver, until

ENV = {"RESTMS_WEBHOOK_ALLOW": "127.0.0.1"}


async def serve_under_umask_022(data: Path) -> asyncio.subprocess.Process:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RESTMS_")}
    return await asyncio.create_subprocess_exec(
        "sh",
        "-c",
        'umask 022 && exec "$@"',
        "sh",
        sys.executable,
        str(ROOT / "main.py"),
        "serve",
        "--port",
        "0",
        "--data-dir",
        str(data),
        cwd=ROOT,
        env={**clean, **ENV},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


def modes(data: Path) -> dict[str, str]:
    """Relative path: octal mode, of the directory and everything in it."""
    found = {".": oct(stat.S_IMODE(data.stat().st_mode))}
    for top, dirs, files in os.walk(data):
        for name in [*dirs, *files]:
            path = Path(top, name)
            found[str(path.relative_to(data))] = oct(stat.S_IMODE(path.lstat().st_mode))
    return found


def private(found: dict[str, str], data: Path) -> dict[str, str]:
    """The entries whose mode is not 0700 for a directory, 0600 for a file."""
    return {
        name: mode
        for name, mode in found.items()
        if mode != ("0o700" if (data / name).is_dir() else "0o600")
    }


async def test_everything_is_private_under_umask_022(tmp_path: Path) -> None:
    data = tmp_path / "data"
    receiver = await Receiver().start()
    proc = await serve_under_umask_022(data)
    try:
        port = await listening_port(proc)
        assert proc.stderr is not None
        drain = asyncio.create_task(proc.stderr.read())
        url = f"http://127.0.0.1:{port}"
        async with aiohttp.ClientSession() as http:
            spec = {"type": "webhook", "callback": receiver.url, "secret": SECRET, "durable": 1}
            body = json.dumps({"restms": {"pipe": [spec]}})
            async with http.post(url + DOMAIN, data=body, headers=HJ) as r:
                assert r.status == 201, await r.text()
                pipe = json.loads(await r.text())["restms"]["pipe"][0]
            message = {"address": pipe["name"], "message_id": "m1", "delivery_mode": 2}
            body = json.dumps({"restms": {"message": [message]}})
            async with http.post(url + "/restms/feed/default", data=body, headers=HJ) as r:
                assert r.status == 200, await r.text()
            await until(lambda: len(receiver.deliveries) >= 1, "the delivery", 10)
            while_running = modes(data)
        proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(30):
            await proc.wait()
        assert proc.returncode == 0, await drain
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await receiver.stop()
    stopped = modes(data)
    names = set(while_running) | set(stopped)
    for expected in ("gateway.sqlite3-wal", "gateway.sqlite3-shm", "oauth"):
        assert any(name.endswith(expected) for name in names), (expected, names)
    assert any(name.startswith("lake/") and name.endswith(".parquet") for name in stopped)
    assert private(while_running, data) == {}
    assert private(stopped, data) == {}


async def test_an_older_versions_readable_files_are_tightened(tmp_path: Path) -> None:
    data = tmp_path / "data"
    (data / "oauth").mkdir(parents=True)
    (data / "oauth" / "old.json").write_text("{}")
    (data / "oauth" / "old.json").chmod(0o644)
    for directory in (data, data / "oauth"):
        directory.chmod(0o755)
    proc = await start("--port", "0", "--data-dir", str(data))
    try:
        await listening_port(proc)
    finally:
        proc.kill()
        await proc.wait()
    assert private(modes(data), data) == {}


async def test_a_directory_others_can_write_is_refused(tmp_path: Path) -> None:
    for where, mode in (("data", 0o777), ("data/oauth", 0o770)):
        data = tmp_path / "data"
        (data / "oauth").mkdir(parents=True, exist_ok=True)
        data.chmod(0o700)
        (tmp_path / where).chmod(mode)
        code, _, err = await main_py("serve", "--port", "0", "--data-dir", str(data))
        assert code == 2, err
        lines = err.splitlines()
        assert lines == [
            f"main.py: data directory {tmp_path / where} is writable by others"
            f" (mode {mode:04o}); check what is in it, then run 'chmod 700 {tmp_path / where}'"
        ], err
        assert stat.S_IMODE((tmp_path / where).stat().st_mode) == mode  # left as it was
        (tmp_path / where).chmod(0o700)


async def test_an_unwritable_data_directory_is_one_line(tmp_path: Path) -> None:
    code, _, err = await main_py("serve", "--port", "0", "--data-dir", "/proc")
    assert code == 2
    assert err.splitlines() == [
        "main.py: data directory /proc is not writable (No such file or directory); the"
        " gateway needs to write its store there: give its user write access, or choose"
        " another data_dir"
    ], err
    (tmp_path / "file").write_text("")
    code, _, err = await main_py("serve", "--data-dir", str(tmp_path / "file" / "data"))
    assert code == 2
    assert err.splitlines() == [
        f"main.py: data directory {tmp_path / 'file' / 'data'} cannot be created: Not a directory"
    ], err
