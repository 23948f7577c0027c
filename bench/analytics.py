"""Benchmark 14: Spark query time over 10 million traffic events (docs/ANALYTICS.md).

A synthetic lake of ``--analytics-events`` events (10 million by default) spread over
24 hours, in the mirror's layout (one Parquet file per hour, :mod:`spark_sink.synth`),
is generated once with pyarrow and kept under the temporary directory for later runs.
One SparkSession (``local[*]``, as the gateway's worker builds it) then runs every
batch query over the whole day, and ``throughput`` over one hour (partition pruning),
in rounds; the first round warms the JVM and is reported apart. Two references run in
the same rounds on the same files:

* Spark's own ``count(*)`` over the day: the cost of starting a job and listing the
  lake with almost no work per row;
* the ``throughput`` aggregation (publish and deliver counts per feed per 5-minute
  bucket) done with plain pyarrow compute in this process: a scan and hash
  aggregation without Spark.

Figures are medians over the rounds after the first.

:func:`masters` (``python -m bench.analytics --masters [EVENTS]``) times the gateway's own
worker process (:class:`spark_sink.service.Worker`, no streaming job) on ``local[*]``
and on a Spark standalone cluster on 127.0.0.1 (one master, one worker of 1 GiB and
one core, :mod:`bench.standalone`) over the same lake: the worker's start, its first
query and the same query warm, for each batch query.
"""

from __future__ import annotations

import datetime
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from bench.common import log
from spark_sink import queries, schema, session, synth
from spark_sink.params import UTC, Params

START = datetime.datetime(2026, 1, 5, tzinfo=UTC)  # a whole hour, UTC
HOURS = 24
BUCKET = 300


def lake_for(count: int) -> Path:
    """The cached lake of ``count`` events (made now if missing or incomplete)."""
    lake = Path(tempfile.gettempdir()) / f"restms-bench-lake-{count}"
    done = lake / "_COMPLETE"  # an underscore name: Spark and pyarrow skip it
    if done.exists():
        return lake
    log(f"analytics: generating {count:,} events into {lake}")
    t0 = time.perf_counter()
    if lake.exists():
        for old in sorted(lake.rglob("*"), reverse=True):
            old.unlink() if old.is_file() else old.rmdir()
    synth.generate(lake, count, start=START.timestamp(), hours=HOURS)
    done.write_text(str(count))
    log(f"analytics: generated in {time.perf_counter() - t0:.1f} s")
    return lake


def _size(lake: Path) -> int:
    return sum(f.stat().st_size for f in lake.rglob("*.parquet"))


def pyarrow_throughput(lake: Path) -> int:
    """The throughput aggregation in plain pyarrow; returns its number of rows."""
    table = ds.dataset(lake, format="parquet", partitioning="hive").to_table(
        columns=["ts", "event", "feed", "outcome"],
        filter=pc.field("event").isin([schema.PUBLISH, schema.DELIVER]),
    )
    micros = pc.cast(table["ts"], pa.int64())
    bucket = pc.multiply(pc.divide(micros, BUCKET * 1_000_000), BUCKET)
    published = pc.and_(
        pc.equal(table["event"], schema.PUBLISH), pc.equal(table["outcome"], schema.OK)
    )
    delivered = pc.equal(table["event"], schema.DELIVER)
    frame = pa.table(
        {
            "bucket": bucket,
            "feed": table["feed"],
            "published": pc.cast(published, pa.int64()),
            "delivered": pc.cast(delivered, pa.int64()),
        }
    )
    grouped = frame.group_by(["bucket", "feed"]).aggregate(
        [("published", "sum"), ("delivered", "sum")]
    )
    return int(grouped.num_rows)


def _time(what: Any) -> tuple[float, Any]:
    t0 = time.perf_counter()
    answer = what()
    return time.perf_counter() - t0, answer


def run(count: int, rounds: int, master: str = "local[*]") -> dict[str, Any]:
    lake = lake_for(count)
    spark = session.build(master, shuffle_partitions=4, memory="2g")
    day = Params(
        since=START, until=START + datetime.timedelta(hours=HOURS), bucket=BUCKET, limit=20
    )
    hour = Params(since=START, until=START + datetime.timedelta(hours=1), bucket=BUCKET)
    cases: dict[str, Any] = {name: (lambda n=name: queries.run(spark, str(lake), n, day))
                             for name in queries.BATCH}  # fmt: skip
    cases["throughput_1h"] = lambda: queries.run(spark, str(lake), "throughput", hour)
    cases["spark_count"] = lambda: queries.events(spark, str(lake), day).count()
    cases["pyarrow_throughput"] = lambda: pyarrow_throughput(lake)
    times: dict[str, list[float]] = {name: [] for name in cases}
    answers: dict[str, Any] = {}
    try:
        for n in range(rounds + 1):
            for name, case in cases.items():
                seconds, answer = _time(case)
                times[name].append(seconds)
                answers[name] = answer
                log(f"analytics: round {n} {name} {seconds:.2f} s")
    finally:
        spark.stop()
    total = answers["spark_count"]
    if total != count:
        raise RuntimeError(f"Spark counted {total} events, the lake holds {count}")
    rows = {name: len(a.rows) for name, a in answers.items() if isinstance(a, queries.Result)}
    return {
        "events": count,
        "files": len(list(lake.rglob("*.parquet"))),
        "lake_bytes": _size(lake),
        "master": master,
        "rounds": rounds,
        "first_round_s": {name: t[0] for name, t in times.items()},
        "median_s": {name: statistics.median(t[1:]) for name, t in times.items()},
        "rows": rows,
        "pyarrow_rows": answers["pyarrow_throughput"],
    }


def describe(result: dict[str, Any]) -> list[str]:
    med = result["median_s"]
    lines = [
        f"{result['events']:,} events, {result['files']} files, "
        f"{result['lake_bytes'] / 2**20:.0f} MiB, master {result['master']}, "
        f"median of {result['rounds']} rounds (first round apart)"
    ]
    for name, seconds in med.items():
        first = result["first_round_s"][name]
        lines.append(f"{name:20s} {seconds:7.2f} s   (first {first:.2f} s)")
    ratio = med["throughput"] / med["pyarrow_throughput"]
    lines.append(f"throughput / pyarrow same aggregation: {ratio:.2f}")
    return lines


async def _time_worker(master: str, lake: Path, work: Path) -> dict[str, Any]:
    from spark_sink.service import Worker, WorkerConfig

    worker = Worker(
        WorkerConfig(
            lake=str(lake),
            checkpoint=str(work / "checkpoint"),
            snapshot=str(work / "rolling.json"),
            master=master,
            stream=False,
            log_file=str(work / "worker.log"),
        )
    )
    day = Params(since=START, until=START + datetime.timedelta(hours=HOURS), bucket=BUCKET)
    found: dict[str, Any] = {"master": master}
    try:
        t0 = time.perf_counter()
        await worker.ask({"op": "sync"}, 600)  # starts the worker (no stream: answers at once)
        found["start_s"] = time.perf_counter() - t0
        for name in queries.BATCH:
            request = {"op": "query", "query": name, "params": day.wire()}
            first, _ = await _atime(worker.ask(request, 600))
            warm, answer = await _atime(worker.ask(request, 600))
            found[name] = {"first_s": first, "warm_s": warm, "rows": len(answer["rows"])}
            log(f"analytics: {master} {name} first {first:.2f} s, warm {warm:.2f} s")
    finally:
        await worker.stop()
    return found


async def _atime(what: Any) -> tuple[float, Any]:
    t0 = time.perf_counter()
    answer = await what
    return time.perf_counter() - t0, answer


def masters(count: int) -> dict[str, Any]:
    """The worker on local[*], then on a standalone cluster, over the same lake."""
    import asyncio
    import os

    from bench.standalone import Cluster

    lake = lake_for(count)
    out: dict[str, Any] = {"events": count, "load_average": [os.getloadavg()[0]]}
    with tempfile.TemporaryDirectory(prefix="restms-bench-masters-") as tmp:
        out["local"] = asyncio.run(_time_worker("local[*]", lake, Path(tmp) / "local"))
        cluster = Cluster(Path(tmp) / "spark-logs")
        t0 = time.perf_counter()
        cluster.start()
        out["cluster_start_s"] = time.perf_counter() - t0
        try:
            out["standalone"] = asyncio.run(_time_worker(cluster.url, lake, Path(tmp) / "sa"))
        finally:
            cluster.stop()
    out["load_average"].append(os.getloadavg()[0])
    return out


if __name__ == "__main__":
    import json
    import sys

    if sys.argv[1:2] == ["--masters"]:
        print(json.dumps(masters(int(sys.argv[2]) if len(sys.argv) > 2 else 1_000_000), indent=1))
    else:
        outcome = run(int(sys.argv[1]) if len(sys.argv) > 1 else 10_000_000, 3)
        print("\n".join(describe(outcome)))
