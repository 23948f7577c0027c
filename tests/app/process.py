"""The gateway in its own process, as a user runs it: ``python main.py serve``."""

from __future__ import annotations

import asyncio
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# A gateway a test starts runs no Spark worker unless the test asks for one (a JVM each
# would cost the suite minutes of CPU).
NO_PRELOAD = {"RESTMS_ANALYTICS_PRELOAD": "0"}


async def start(*args: str, env: dict[str, str] | None = None) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        str(ROOT / "main.py"),
        "serve",
        *args,
        cwd=ROOT,
        env={**os.environ, **NO_PRELOAD, **(env or {})},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


async def main_py(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of ``python main.py ARGS`` run to its end, with no
    ``RESTMS_*`` variable of ours but those in ``env``."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RESTMS_")}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(ROOT / "main.py"),
        *args,
        cwd=ROOT,
        env={**clean, **NO_PRELOAD, **(env or {})},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    async with asyncio.timeout(60):
        out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def listening_port(proc: asyncio.subprocess.Process) -> int:
    assert proc.stderr is not None
    printed: list[str] = []  # what the gateway said, for the failure message
    async with asyncio.timeout(20):
        while True:
            line = (await proc.stderr.readline()).decode()
            assert line, "the gateway exited before it listened:\n" + "".join(printed[-40:])
            printed.append(line)
            found = re.search(r"listening on http://127\.0\.0\.1:(\d+)/", line)
            if found:
                return int(found.group(1))
