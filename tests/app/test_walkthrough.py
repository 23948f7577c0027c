"""The README's curl walkthrough, run as a new user would, against ``main.py serve``."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

from tests.app.process import ROOT, listening_port, start


async def test_examples_walkthrough_passes_twice_against_a_real_gateway(tmp_path: Path) -> None:
    assert shutil.which("curl"), "the walkthrough needs curl on PATH"
    proc = await start("--port", "0", "--data-dir", str(tmp_path))
    try:
        port = await listening_port(proc)
        for _ in range(2):  # it cleans up after itself, so a second run passes too
            run = await asyncio.create_subprocess_exec(
                "bash",
                str(ROOT / "examples" / "walkthrough.sh"),
                env={**os.environ, "RESTMS_URL": f"http://127.0.0.1:{port}"},
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
            )
            async with asyncio.timeout(60):
                out, _ = await run.communicate()
            assert run.returncode == 0, out.decode(errors="replace")[-3000:]
    finally:
        proc.terminate()
        await proc.wait()
