"""The supervisor reads a killed worker's exit code as soon as its sentinel is ready.

The kernel closes a dying process's files (which readies the sentinel) a moment before
the process can be reaped, so ``exitcode`` read at once was often None: the supervisor
then logged "exit code None" and a test waiting for "-9" timed out under load.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from multiprocessing.connection import wait

from gateway.server.workers import exit_code


def _sleep() -> None:
    time.sleep(60)


def test_a_killed_process_has_its_signal_as_exit_code_as_soon_as_its_sentinel_is_ready() -> None:
    context = multiprocessing.get_context("spawn")
    codes = []
    for _ in range(12):
        process = context.Process(target=_sleep)
        process.start()
        assert process.pid is not None
        os.kill(process.pid, signal.SIGKILL)
        assert wait([process.sentinel], timeout=30) == [process.sentinel]
        codes.append(exit_code(process))
    assert codes == [-signal.SIGKILL] * 12
