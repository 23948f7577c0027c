"""Decoding a batched publish body (restms/fastpath.py), per message, by the shape of
its messages: plain, with a message_id of their own, with one header, with both (what a
federation link sends).

    .venv/bin/python -m bench.decode [--messages N] [--rounds R] [--root DIR]

Prints, per shape, the median time a message took over R fresh bodies (each with ids
never seen before, as a publisher's are) and the Python steps (bytecode instructions)
a message took, counted exactly: the steps stay the same on a busy machine, the times
do not. The last shape is plain messages to an address not seen before, decoded after
all the messages with ids: what is left of the decoder's memo of heads by then.
``--root`` decodes with the project at DIR (a worktree of another commit), so two
commits compare in one run, alternately.
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import statistics
import sys
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

import orjson

SHAPES = {"plain": (False, False), "ids": (True, False), "header": (False, True)}
SHAPES["ids+header"] = (True, True)
# Last, after thousands of messages with ids: plain messages to an address not seen yet
# (the decoder remembers at most 1,024 heads; heads with ids must not fill that room).
SHAPES["new address"] = (False, False)
_serial = itertools.count()


def body(count: int, ids: bool, header: bool, address: str = "news.sport") -> bytes:
    """A JSON publish of ``count`` messages of 1 KiB, ids never used before."""
    run = next(_serial)
    out = []
    for i in range(count):
        message: dict[str, Any] = {
            "address": address,
            "content": [{"type": "text/plain", "value": "x" * 1024}],
        }
        if ids:
            message["message_id"] = f"gw-1:news:{run}:{i}"
        if header:
            message["header"] = [{"name": "x-restms-trail", "value": "gw-1 news 1"}]
        out.append(message)
    return orjson.dumps({"restms": {"message": out}})


def steps(work: Callable[[], object]) -> int:
    """The Python steps ``work`` takes."""
    counted = 0

    def tracer(frame: FrameType, event: str, _arg: Any) -> Any:
        nonlocal counted
        frame.f_trace_opcodes = True
        if event == "opcode":
            counted += 1
        return tracer

    sys.settrace(tracer)
    try:
        work()
    finally:
        sys.settrace(None)
    return counted


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--root", help="the project's directory to decode with")
    args = parser.parse_args()
    if args.root:
        sys.path.insert(0, args.root)
    fastpath = importlib.import_module("restms.fastpath")
    specs = importlib.import_module("restms.specs")
    xmlcodec = importlib.import_module("restms.xmlcodec")
    fmt = importlib.import_module("restms.media").Format.JSON
    codec, limits = xmlcodec.DEFAULT_LIMITS, specs.MessageLimits()
    n = args.messages
    print(f"decoding with {fastpath.__file__}")
    for name, (ids, header) in SHAPES.items():
        address = "news.other" if name == "new address" else "news.sport"
        times = []
        for _ in range(args.rounds):
            data = body(n, ids, header, address)
            began = time.perf_counter()
            fastpath.messages(data, fmt, codec, limits)
            times.append((time.perf_counter() - began) / n * 1e6)
        data = body(n, ids, header, address)
        counted = steps(lambda data=data: fastpath.messages(data, fmt, codec, limits))
        print(f"{name:11s} {statistics.median(times):6.2f} us a message, {counted / n:6.1f} steps")


if __name__ == "__main__":
    main()
