"""The rolling aggregates: a Structured Streaming job over the lake (docs/ANALYTICS.md,
"The streaming job").

Theory of operation. A file source watches the lake with the fixed event schema (no
inference: a file never changes what a column means) and picks up each new Parquet
file once; the mirror's rename makes a file appear whole, and hidden ``.tmp-`` names
are never listed. Every trigger (``analytics_stream_interval`` seconds, at most
``analytics_stream_files`` new files each) folds the new events into per-minute,
per-feed aggregates: publish, deliver and ack counts and the sum and count of
publish->deliver latencies, so a mean over any set of minutes is exact.

Only the mirror's raw files (``part-*``) are read: a compacted file
(:mod:`spark_sink.compact`) holds rows of raw files the job has counted already.

The aggregation runs in complete mode: Spark keeps the running totals in its state
store under ``analytics_checkpoint`` and hands every micro-batch the whole table,
which :class:`Rolling` keeps in memory for the ``rolling`` query and also writes to a
snapshot file beside the checkpoint (written under a temporary name, then renamed).
After a restart the checkpoint tells Spark which files it has read and what the
totals were, and the snapshot answers until the first new file arrives: nothing is
counted twice and nothing is lost. The state grows by one row per feed per minute with
traffic; :data:`KEEP_MINUTES` bounds what is kept in memory and in the snapshot.
"""

from __future__ import annotations

import datetime
import json
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import schema
from .params import ROLLING, UTC, Params, iso
from .queries import Result, bucket_of, count_of, lake_missing, spark_schema

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

COLUMNS = (
    "minute",
    "feed",
    "published",
    "delivered",
    "acked",
    "deliver_latency_sum_ms",
    "deliver_latency_count",
    "deliver_mean_ms",
)
RAW_FILES = "part-*.parquet"  # the mirror's own files (spark_sink.compact: not compacted ones)
KEEP_MINUTES = 7 * 24 * 60  # minutes kept in memory and in the snapshot, the newest
QUERY_NAME = "restms-rolling"


class Rolling:
    """The streaming job and the latest aggregates it produced."""

    def __init__(
        self,
        spark: SparkSession,
        lake: str,
        checkpoint: str,
        snapshot: Path,
        *,
        interval: float = 10.0,
        max_files: int = 100,
    ) -> None:
        self.spark, self.lake, self.checkpoint = spark, lake, checkpoint
        self.snapshot, self.interval, self.max_files = snapshot, interval, max_files
        self._lock = threading.Lock()
        self._rows: list[tuple[Any, ...]] = self._load()
        self.batches = 0
        self.query: StreamingQuery | None = None

    def _load(self) -> list[tuple[Any, ...]]:
        try:
            data = json.loads(self.snapshot.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return []
        return [tuple(row) for row in data["rows"]]

    def start(self) -> None:
        from pyspark.sql import functions as F

        if lake_missing(self.lake):
            Path(self.lake.removeprefix("file:")).mkdir(parents=True, exist_ok=True)
        stream = (
            # With the partition columns: a job started on a lake with no partition
            # directory yet would fail at the first file otherwise (its columns differ).
            self.spark.readStream.schema(spark_schema())
            .option("maxFilesPerTrigger", self.max_files)
            .option("pathGlobFilter", RAW_FILES)  # compacted files hold rows counted already
            .parquet(self.lake)
        )
        deliver = F.col("event") == schema.DELIVER
        measured = deliver & F.col("latency_ms").isNotNull()
        counted = F.col("event").isin(schema.PUBLISH, schema.DELIVER, schema.ACK)
        totals = (
            stream.where(counted)
            .groupBy(bucket_of(60).alias("minute"), "feed")
            .agg(
                count_of(schema.PUBLISH, ok=True).alias("published"),
                count_of(schema.DELIVER).alias("delivered"),
                count_of(schema.ACK).alias("acked"),
                F.sum(F.when(measured, F.col("latency_ms")).otherwise(0.0)).alias("lsum"),
                F.sum(F.when(measured, 1).otherwise(0)).alias("lcount"),
            )
        )
        self.query = (
            totals.writeStream.outputMode("complete")
            .foreachBatch(self._batch)
            .option("checkpointLocation", self.checkpoint)
            .trigger(processingTime=f"{self.interval:g} seconds")
            .queryName(QUERY_NAME)
            .start()
        )

    def _batch(self, frame: DataFrame, batch_id: int) -> None:
        rows = sorted(
            (r.minute, r.feed, r.published, r.delivered, r.acked, r.lsum, r.lcount)
            for r in frame.collect()
        )
        if rows:
            newest = max(r[0] for r in rows)
            rows = [r for r in rows if r[0] > newest - KEEP_MINUTES * 60]
        self.snapshot.parent.mkdir(parents=True, exist_ok=True)
        hidden = self.snapshot.with_name(f".tmp-{self.snapshot.name}")
        hidden.write_text(json.dumps({"batch": batch_id, "rows": rows}), encoding="utf-8")
        os.replace(hidden, self.snapshot)
        with self._lock:
            self._rows = rows
            self.batches += 1

    def sync(self) -> None:
        """Process every file the lake holds now (blocking)."""
        if self.query is not None:
            self.query.processAllAvailable()

    def result(self, params: Params) -> Result:
        """The aggregates of the minutes in the range (and of the feed)."""
        since, until = params.since.timestamp(), params.until.timestamp()
        with self._lock:
            rows = self._rows
        found = []
        for minute, feed, published, delivered, acked, lsum, lcount in rows:
            if not since <= minute < until or params.feed not in (None, feed):
                continue
            when = datetime.datetime.fromtimestamp(minute, UTC)
            mean = lsum / lcount if lcount else None
            found.append((when, feed, published, delivered, acked, lsum, lcount, mean))
        return Result(
            query=ROLLING,
            params=params,
            columns=COLUMNS,
            rows=tuple((iso(r[0]), *r[1:]) for r in found),
        )

    def stop(self) -> None:
        if self.query is not None:
            self.query.stop()
