"""examples/walkthrough.py, run as a new user would, against ``main.py serve``."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.client.gateway import ROOT, GatewayProcess


def test_the_python_walkthrough_passes_twice(gateway: GatewayProcess) -> None:
    for _ in range(2):  # it cleans up after itself, so a second run passes too
        run = subprocess.run(
            [sys.executable, str(ROOT / "examples" / "walkthrough.py")],
            env={**os.environ, "RESTMS_URL": gateway.url},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        assert "all steps passed" in run.stdout
        assert "== 8. Clean up" in run.stdout
