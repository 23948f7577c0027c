"""What the Spark tests ask of processes they started."""

from __future__ import annotations

import os


def gone(pid: int) -> bool:
    """Whether no process has this id any more (it ended and was reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False
