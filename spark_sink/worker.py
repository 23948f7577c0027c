"""The analytics worker: a process that hosts Spark for the gateway (docs/ANALYTICS.md,
"How the gateway runs Spark").

Theory of operation. The gateway never starts a JVM in its own process: it spawns
``python -m spark_sink.worker`` (:mod:`spark_sink.service`) and talks to it in JSON
lines. The worker builds the SparkSession, starts the streaming job, runs a query once
(a JVM's first jobs are its slowest: that is start-up time, not the first user's),
then prints one line, ``{"ready": true}`` (or ``{"ready": false, "error": ...}`` and exits), and
answers requests one at a time, in order, each with one line carrying the request's
``id``::

    {"id": 7, "op": "query", "query": "latency", "params": {"since": ..., ...}}
    {"id": 7, "result": {"query": "latency", "columns": [...], "rows": [...], ...}}
    {"id": 8, "op": "sync"}        the streaming job takes in every file there now
    {"id": 8, "result": {"batches": 3}}
    {"id": 9, "error": "since must be before until", "status": 400}

Spark and the JVM write logs to standard output and error; so that nothing but answers
reaches the gateway, the protocol uses a copy of the original standard output and
file descriptor 1 is pointed at standard error before Spark starts. A request line
longer than :data:`MAX_LINE` is refused. The worker ends when its standard input
closes (the gateway stopping) and stops the streaming job first.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
from pathlib import Path
from typing import IO, Any

from .params import QUERIES, ROLLING, Params, check_query

# The worker process has no handler of its own: logging's last resort writes a warning
# to stderr, which the gateway keeps in the worker's log file.
log = logging.getLogger(__name__)

MAX_LINE = 64 * 1024


def _answer(out: IO[str], message: dict[str, Any]) -> None:
    out.write(json.dumps(message, separators=(",", ":")) + "\n")
    out.flush()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="spark_sink.worker")
    parser.add_argument("--lake", required=True)
    parser.add_argument("--master", default="local[*]")
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--snapshot", required=True, help="file of the rolling aggregates")
    parser.add_argument("--interval", type=float, default=10.0)
    parser.add_argument("--max-files", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--memory", default="1g")
    parser.add_argument("--no-stream", action="store_true", help="no streaming job")
    return parser


def _short(exc: BaseException) -> str:
    """The first line of a Spark error (its JVM stack trace stays in the log)."""
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:500]


def serve(args: argparse.Namespace, requests: IO[str], out: IO[str]) -> int:
    from . import session, streaming

    try:
        session.check_java()
        spark = session.build(args.master, shuffle_partitions=args.partitions, memory=args.memory)
        rolling = streaming.Rolling(
            spark,
            args.lake,
            args.checkpoint,
            Path(args.snapshot),
            interval=args.interval,
            max_files=args.max_files,
        )
        if not args.no_stream:
            rolling.start()
    except Exception as exc:  # reported to the gateway, which logs it
        _answer(out, {"ready": False, "error": _short(exc)})
        return 1
    _warm_up(spark, args.lake)
    _answer(out, {"ready": True, "queries": list(QUERIES)})
    try:
        for line in requests:
            _answer(out, _handle(line, spark, rolling, args.lake))
    finally:
        rolling.stop()
        spark.stop()
    return 0


def _warm_up(spark: Any, lake: str) -> None:
    """Run a query once over the last minute before saying ready: a JVM's first jobs
    (class loading, code generation) take many times longer than the next, and that
    time belongs to starting, not to the first user's query."""
    import datetime

    from . import queries
    from .params import UTC

    until = datetime.datetime.now(UTC)
    params = Params(since=until - datetime.timedelta(minutes=1), until=until)
    try:
        queries.run(spark, lake, "throughput", params)
    except Exception as exc:  # the query will say it again when asked; not fatal
        log.warning("warm-up query failed: %s", _short(exc))


def _handle(line: str, spark: Any, rolling: Any, lake: str) -> dict[str, Any]:
    from . import queries

    if len(line) > MAX_LINE:
        return {"id": None, "error": f"a request is longer than {MAX_LINE} bytes", "status": 400}
    try:
        request = json.loads(line)
        ident = request.get("id")
        op = request.get("op")
    except (ValueError, AttributeError):
        return {"id": None, "error": "a request is not a JSON object", "status": 400}
    if op not in ("query", "sync"):
        return {"id": ident, "error": f"unknown op {op!r}", "status": 400}
    try:
        name = check_query(str(request.get("query"))) if op == "query" else ROLLING
        params = Params.from_wire(request.get("params") or {}) if op == "query" else None
    except ValueError as exc:
        return {"id": ident, "error": str(exc), "status": 400}
    try:
        if params is None:
            rolling.sync()
            return {"id": ident, "result": {"batches": rolling.batches}}
        if name == ROLLING:
            lost = queries.retried(lambda: queries.lost(spark, lake, params))
            result = dataclasses.replace(rolling.result(params), lost=lost)
        else:
            result = queries.run(spark, lake, name, params)
    except Exception as exc:  # a Spark failure: answered, and the worker carries on
        return {"id": ident, "error": _short(exc), "status": 500}
    return {"id": ident, "result": result.wire()}


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    out = os.fdopen(os.dup(sys.stdout.fileno()), "w", encoding="utf-8")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # Spark's chatter goes to stderr
    sys.stdout = sys.stderr
    return serve(args, sys.stdin, out)


if __name__ == "__main__":
    sys.exit(main())
