"""The analytics worker process and the service in front of it (spark_sink.service).

Decided behaviour under test (docs/ANALYTICS.md, "How the gateway runs Spark",
"The streaming job", "Caching and timeouts"):

* The worker starts on the first request and answers exactly what the same query
  answers in-process.
* Bad parameters are refused before they reach the worker; the worker refuses what
  it is sent that is malformed, and carries on.
* Identical requests at the same time share one computation; a repeat within the
  cache time is a hit.
* The streaming job takes in new files; its per-minute aggregates equal the batch
  throughput query at one-minute buckets and its latency sums the batch mean.
* After the worker is stopped, a new one answers the same aggregates at once (from
  the snapshot) and counts a file written meanwhile exactly once (the checkpoint).
* A query that outlives its timeout fails (the gateway answers 504) and its worker
  is stopped.
"""

from __future__ import annotations

import asyncio
import datetime
from pathlib import Path

import pytest

from spark_sink import queries, schema, synth
from spark_sink.params import UTC, Params
from spark_sink.service import Analytics, Refused, TimedOut, Worker, WorkerConfig
from tests.spark import lake
from tests.spark.conftest import PARTITIONS

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]

RANGE = {"since": "2026-11-21T09:50:00Z", "until": "2026-11-21T12:00:00Z", "bucket": "1m"}


def worker_config(root: Path) -> WorkerConfig:
    return WorkerConfig(
        lake=str(root / "lake"),
        checkpoint=str(root / "analytics" / "checkpoint"),
        snapshot=str(root / "analytics" / "rolling.json"),
        master="local[2]",
        partitions=PARTITIONS,
        interval=1.0,  # sync() waits for the next trigger: keep it short
        log_file=str(root / "analytics" / "worker.log"),
    )


def rolling_sums(result: dict) -> tuple[int, int, float, int]:
    columns = result["columns"]
    rows = [dict(zip(columns, row, strict=True)) for row in result["rows"]]
    return (
        sum(r["published"] for r in rows),
        sum(r["delivered"] for r in rows),
        sum(r["deliver_latency_sum_ms"] for r in rows),
        sum(r["deliver_latency_count"] for r in rows),
    )


async def test_worker_queries_streaming_and_restart(spark, tmp_path, blockbuster):
    events = lake.rows()
    await asyncio.to_thread(synth.write, tmp_path / "lake", events)
    service = Analytics(Worker(worker_config(tmp_path)), cache_seconds=60, timeout=120)
    try:
        with pytest.raises(Refused, match="since must be before until"):
            await service.query("throughput", {"since": "1h", "until": "2h"})
        assert service.worker.starts == 0  # refused before the worker was needed

        # Identical requests at once share one computation; the answer is Spark's.
        answers = await asyncio.gather(*(service.query("latency", RANGE) for _ in range(3)))
        assert sorted(how for _, how in answers) == ["miss", "shared", "shared"]
        assert service.counters.computed == 1
        assert service.worker.starts == 1
        p = Params.from_wire(answers[0][0])
        local = await asyncio.to_thread(queries.run, spark, str(tmp_path / "lake"), "latency", p)
        assert answers[0][0]["rows"] == [list(r) for r in local.rows]
        assert answers[0][0]["columns"] == list(local.columns)
        again, how = await service.query("latency", dict(RANGE))
        assert how == "hit"
        assert again == answers[0][0]
        got, _ = await service.query("failures", RANGE)
        assert got["rows"] == [list(r) for r in lake.expected("failures", events, p)]

        # The worker refuses a malformed request itself, and carries on.
        with pytest.raises(Refused, match="bucket and limit must be integers"):
            await service.worker.ask({"op": "query", "query": "latency", "params": {}}, 30)

        # The streaming job: its aggregates equal the batch answers.
        await service.sync()
        rolling, _ = await service.query("rolling", RANGE)
        batch, _ = await service.query("throughput", RANGE)
        by_minute = {(r[0], r[1]): (r[2], r[3]) for r in batch["rows"]}
        assert {(r[0], r[1]): (r[2], r[3]) for r in rolling["rows"]} == by_minute
        deliver = [r[11] for r in events if r[1] == schema.DELIVER and r[0] >= p.since.timestamp()]
        assert rolling_sums(rolling) == (9, 15, pytest.approx(sum(deliver)), 15)

        # A new file is taken in by the running job.
        later = lake.T0 + 600
        more = [lake.ev(later, schema.PUBLISH), lake.ev(later + 1, schema.DELIVER, latency=4.0)]
        await asyncio.to_thread(synth.write, tmp_path / "lake", more)
        await service.sync()
        fresh = {"since": RANGE["since"], "until": RANGE["until"], "feed": "orders"}
        rolling, _ = await service.query("rolling", fresh)
        assert rolling_sums(rolling)[:2] == (7, 13)
        before = rolling["rows"]
    finally:
        await service.stop()

    # A new worker: the same aggregates at once, then a file written meanwhile once.
    await asyncio.to_thread(
        synth.write, tmp_path / "lake", [lake.ev(lake.T0 + 900, schema.PUBLISH)]
    )
    service = Analytics(Worker(worker_config(tmp_path)), cache_seconds=0, timeout=120)
    try:
        rolling, _ = await service.query("rolling", fresh)
        assert rolling["rows"] == before
        await service.sync()
        rolling, _ = await service.query("rolling", fresh)
        assert rolling_sums(rolling)[:2] == (8, 13)
        minute = datetime.datetime.fromtimestamp(lake.T0 + 900, UTC).strftime("%H:%M")
        assert [r[2] for r in rolling["rows"] if minute in r[0]] == [1]

        # A query that outlives its timeout: 504, and its worker is stopped (the next
        # request starts a new one).
        service.timeout = 0.001
        with pytest.raises(TimedOut, match=r"longer than 0\.001 s"):
            await service.query("addresses", RANGE)
        assert service.worker.running is False
        assert service.counters.failed == 1
    finally:
        await service.stop()
