"""The analytics on a real Spark cluster: a standalone master and one worker (1 GiB,
one core) started from the PySpark distribution on 127.0.0.1 (bench/standalone.py).

Decided behaviour under test (docs/ANALYTICS.md, "Running on a cluster"): with
``analytics_master`` a ``spark://`` URL, the gateway's worker process runs its queries
as an application of that cluster (its executor, not the driver, reads the lake) and
every query answers what ``local[*]`` answers on the same lake. What the test started,
it stops: the cluster's JVMs are gone at the end.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from bench.standalone import Cluster
from spark_sink import queries, synth
from spark_sink.service import Worker, WorkerConfig
from spark_sink.session import APP_NAME
from tests.spark import lake
from tests.spark.conftest import PARTITIONS
from tests.spark.processes import gone

pytestmark = [pytest.mark.spark, pytest.mark.timeout(420)]


async def test_a_standalone_cluster_answers_as_local(spark, tmp_path: Path) -> None:
    events = lake.rows()
    root = tmp_path / "lake"
    await asyncio.to_thread(synth.write, root, events)
    cluster = Cluster(tmp_path / "spark-logs")
    await asyncio.to_thread(cluster.start)
    pids = [process.pid for process in cluster._processes]
    try:
        worker = Worker(
            WorkerConfig(
                lake=str(root),
                checkpoint=str(tmp_path / "analytics" / "checkpoint"),
                snapshot=str(tmp_path / "analytics" / "rolling.json"),
                master=cluster.url,
                partitions=PARTITIONS,
                stream=False,
                log_file=str(tmp_path / "analytics" / "worker.log"),
            )
        )
        p = lake.params()
        seconds = {}
        try:
            for name in sorted(queries.BATCH):
                began = time.perf_counter()
                request = {"op": "query", "query": name, "params": p.wire()}
                got = await worker.ask(request, 300)
                seconds[name] = time.perf_counter() - began
                local = await asyncio.to_thread(queries.run, spark, str(root), name, p)
                assert got["rows"] == [list(r) for r in local.rows], name
                assert got["rows"] == [list(r) for r in lake.expected(name, events, p)], name
                assert got["lost"] == local.lost == 0
            state = await asyncio.to_thread(cluster.state)
            (app,) = state["activeapps"]
            assert app["name"] == APP_NAME
            assert state["aliveworkers"] == 1
            assert state["coresused"] == 1  # the query ran on the worker's executor
        finally:
            await worker.stop()
    finally:
        await asyncio.to_thread(cluster.stop)
    assert all(map(gone, pids))
    print(f"standalone: {', '.join(f'{n} {s:.2f} s' for n, s in seconds.items())}")
