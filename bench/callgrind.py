"""Run a server script under valgrind's callgrind, for the mirror's count in
:mod:`bench.cost` (``--mirror-batch``).

    .venv/bin/python bench/callgrind.py OUT SCRIPT [ARGS...]

replaces itself with ``valgrind --tool=callgrind`` running ``SCRIPT`` with this
Python, instrumentation off until ``callgrind_control -i on PID`` and one profile per
thread written to ``OUT.<dump>-<thread>`` on ``callgrind_control -d PID``. The count of
CPU instructions is close to exact from run to run, and counts the work Python steps
do not show (C calls, allocation, the garbage collector). The server runs some
fifty times slower: only counts are read from it.
"""

from __future__ import annotations

import os
import shutil
import sys


def main() -> None:
    out, *argv = sys.argv[1:]
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        raise SystemExit("valgrind not found (Debian package valgrind)")
    options = ["--tool=callgrind", "--instr-atstart=no", "--separate-threads=yes"]
    os.execv(valgrind, [valgrind, *options, f"--callgrind-out-file={out}", sys.executable, *argv])


if __name__ == "__main__":
    main()
