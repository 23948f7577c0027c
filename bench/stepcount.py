"""Run a server script with a counter of the Python steps (bytecode instructions) its
main thread executes, for benchmark 15 (:mod:`bench.cost`).

    .venv/bin/python bench/stepcount.py OUT SCRIPT [ARGS...]

runs ``SCRIPT`` as ``__main__`` with ``ARGS``. Counting starts on SIGUSR1; SIGUSR2 stops
it and writes ``OUT``: a JSON list of ``[[file, first line, function], steps]``. The
count is exact and repeatable, whatever else the machine does: a measure of the work a
request takes that timings on a shared machine cannot give. Tracing slows the server
about a hundredfold, so only counts are read from a traced run, never times.
"""

from __future__ import annotations

import collections
import json
import os
import runpy
import signal
import sys
from types import FrameType
from typing import Any

Key = tuple[str, int, str]


def main() -> None:
    out, script, *args = sys.argv[1:]
    steps: collections.Counter[Key] = collections.Counter()

    def tracer(frame: FrameType, event: str, _arg: Any) -> Any:
        frame.f_trace_opcodes = True
        if event == "opcode":
            code = frame.f_code
            steps[(code.co_filename, code.co_firstlineno, code.co_name)] += 1
        return tracer

    def start(_signum: int, frame: FrameType | None) -> None:
        sys.settrace(tracer)  # new frames; the ones running now are given it below
        while frame is not None:
            frame.f_trace, frame.f_trace_opcodes = tracer, True
            frame = frame.f_back

    def stop(_signum: int, _frame: FrameType | None) -> None:
        sys.settrace(None)
        with open(out, "w", encoding="utf-8") as file:
            json.dump([[list(key), count] for key, count in steps.items()], file)
        steps.clear()

    signal.signal(signal.SIGUSR1, start)
    signal.signal(signal.SIGUSR2, stop)
    sys.argv = [script, *args]
    sys.path[0] = os.path.dirname(os.path.abspath(script))  # as if run directly
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":  # the gateway's forkserver imports this module again
    main()
