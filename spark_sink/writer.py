"""The mirror's background writer: events off the queue into Parquet files in the lake.

Theory of operation
-------------------
One thread. Each time it wakes (every ``poll_seconds``, on a flush and on stop) it
takes every event queued so far and files each under the
partition of its timestamp (``date=YYYY-MM-DD/hour=HH``). Each partition has at most
one open file: rows wait in memory until ``batch_rows`` of them make one record batch,
written as one Parquet row group.

A file is written under a hidden name (``.tmp-part-...``) and renamed to its final
name once closed, so a reader listing the lake never sees half a file. It is closed
when it reaches ``rotate_bytes`` on disk, when it is ``rotate_seconds`` old, on a
flush and on stop. On a local disk the rename is atomic; on object stores (S3,
GCS) the move is a copy under the final name, which appears whole or not at all.

Errors (an unwritable lake, a full disk, an unreachable store) never end the thread
and never reach the engine: the rows of the file that failed are counted as
``lost``, the error is counted and kept as ``last_error``, and a warning is logged
at most once a minute with the number of errors since the last one.

The lake is a local directory or a URI: ``file://``, ``s3://`` (``s3a://`` and
``s3n://``, the names Spark uses, mean the same store), ``gs://``, ``hdfs://``,
``abfs://``, as far as this pyarrow build supports them. Credentials come from the
environment of the process (the usual variables of each store), never the logs.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections import deque
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from .schema import SCHEMA, TS, Event, part_name, partition, temporary

log = logging.getLogger(__name__)

LOG_EVERY = 60.0  # seconds between warnings about write errors at most
MAX_ERROR = 500  # characters of an error kept in the status

FileErrors = (OSError, pa.ArrowException, ValueError, TypeError)


@dataclass(slots=True)
class Counters:
    """What the mirror did since it started (see :mod:`spark_sink.mirror`)."""

    emitted: int = 0  # events the engine offered
    dropped: int = 0  # ... of which the queue was full: not kept
    written: int = 0  # rows in complete files in the lake
    files: int = 0  # complete files in the lake
    bytes: int = 0  # ... and their size
    errors: int = 0  # files that failed
    lost: int = 0  # rows of those files
    last_error: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class WriterConfig:
    lake: str
    rotate_bytes: int
    rotate_seconds: float
    batch_rows: int
    poll_seconds: float


def lake_filesystem(uri: str) -> tuple[pafs.FileSystem, str]:
    """The filesystem and base path of a lake URI (a plain path is a local directory)."""
    if "://" not in uri:
        return pafs.LocalFileSystem(), os.path.abspath(uri)
    scheme, rest = uri.split("://", 1)
    if scheme.lower() in ("s3a", "s3n"):
        uri = "s3://" + rest
    fs, path = pafs.FileSystem.from_uri(uri)
    return fs, path.rstrip("/")


class _File:
    """One open data file of one partition."""

    __slots__ = ("final", "fs", "opened", "rows", "sink", "tmp", "waiting", "writer")

    def __init__(self, fs: pafs.FileSystem, directory: str, now: float) -> None:
        name = part_name(now)
        self.fs = fs
        self.final = f"{directory}/{name}"
        self.tmp = f"{directory}/{temporary(name)}"
        self.opened = time.monotonic()
        self.rows = 0  # rows written into the file
        self.waiting: list[Event] = []  # rows not yet in a record batch
        fs.create_dir(directory, recursive=True)
        self.sink = fs.open_output_stream(self.tmp)
        self.writer = pq.ParquetWriter(self.sink, SCHEMA)

    def write(self) -> None:
        """The waiting rows as one record batch (one row group)."""
        rows, self.waiting = self.waiting, []
        if rows:
            self.writer.write_batch(record_batch(rows))
            self.rows += len(rows)

    @property
    def size(self) -> int:
        return int(self.sink.tell())

    def close(self) -> int:
        """Write what waits, close and rename; the file's size in bytes."""
        self.write()
        self.writer.close()
        size = self.size
        self.sink.close()
        self.fs.move(self.tmp, self.final)
        return size

    def abandon(self) -> None:
        """After an error: close what can be closed and remove the hidden file."""
        for step in (self.writer.close, self.sink.close, lambda: self.fs.delete_file(self.tmp)):
            with contextlib.suppress(*FileErrors):
                step()


def record_batch(rows: list[Event]) -> pa.RecordBatch:
    """Event tuples as one Arrow record batch of :data:`~spark_sink.schema.SCHEMA`."""
    columns = list(zip(*rows, strict=True))
    arrays = [pa.array([round(ts * 1_000_000) for ts in columns[TS]], pa.int64())]
    arrays[0] = arrays[0].cast(SCHEMA.field(TS).type)
    for index in range(1, len(SCHEMA)):
        arrays.append(pa.array(columns[index], SCHEMA.field(index).type))
    return pa.RecordBatch.from_arrays(arrays, schema=SCHEMA)


class Writer:
    """The thread that drains the queue into the lake."""

    def __init__(self, config: WriterConfig, queue: deque[Event], counters: Counters) -> None:
        self.config = config
        self._queue = queue
        self._counters = counters
        self._wake = threading.Event()
        self._stopping = False
        self._asks: deque[threading.Event] = deque()  # flushes asked for
        self._files: dict[str, _File] = {}  # open files by partition directory
        self._fs: tuple[pafs.FileSystem, str] | None = None
        self._hours: dict[int, str] = {}  # partition directories by hour since the epoch
        self._thread = threading.Thread(target=self._run, name="mirror-writer", daemon=True)
        self._logged = 0.0
        self._unlogged = 0

    @property
    def open_files(self) -> int:
        return len(self._files)

    def start(self) -> None:
        self._thread.start()

    def flush(self, timeout: float) -> bool:
        done = threading.Event()
        self._asks.append(done)
        self._wake.set()
        return done.wait(timeout)

    def stop(self, timeout: float) -> bool:
        self._stopping = True
        self._wake.set()
        if not self._thread.is_alive():
            return True
        self._thread.join(timeout)
        return not self._thread.is_alive()

    # ------------------------------------------------------------ the thread
    def _run(self) -> None:
        while True:
            self._wake.wait(self.config.poll_seconds)
            self._wake.clear()
            stopping = self._stopping
            asks = [self._asks.popleft() for _ in range(len(self._asks))]
            self._drain()
            self._rotate(everything=stopping or bool(asks))
            for done in asks:
                done.set()
            if stopping:
                return

    def _drain(self) -> None:
        queue, batch = self._queue, self.config.batch_rows
        taken = len(queue)
        if not taken:
            return
        fs = self._filesystem()
        for _ in range(taken):
            event = queue.popleft()
            directory = self._directory(event[TS])
            if fs is None:
                self._counters.lost += 1
                continue
            file = self._files.get(directory)
            if file is None:
                try:
                    file = _File(fs[0], f"{fs[1]}/{directory}", time.time())
                    self._files[directory] = file
                except FileErrors as exc:
                    self._failed(exc, 1)
                    continue
            file.waiting.append(event)
            if len(file.waiting) >= batch:
                self._write(directory, file)

    def _directory(self, ts: float) -> str:
        hour = int(ts // 3600)
        found = self._hours.get(hour)
        if found is None:
            if len(self._hours) > 64:
                self._hours.clear()
            found = self._hours[hour] = partition(ts)
        return found

    def _filesystem(self) -> tuple[pafs.FileSystem, str] | None:
        if self._fs is None:
            try:
                self._fs = lake_filesystem(self.config.lake)
            except FileErrors as exc:
                self._failed(exc, 0)
                return None
        return self._fs

    def _write(self, directory: str, file: _File) -> None:
        try:
            file.write()
            if file.size >= self.config.rotate_bytes:
                self._close(directory, file)
        except FileErrors as exc:
            self._abandon(directory, file, exc)

    def _rotate(self, *, everything: bool) -> None:
        """Close files that are old enough (every file when ``everything``)."""
        cutoff = time.monotonic() - self.config.rotate_seconds
        for directory, file in list(self._files.items()):
            if everything or file.opened <= cutoff:
                try:
                    self._close(directory, file)
                except FileErrors as exc:
                    self._abandon(directory, file, exc)

    def _close(self, directory: str, file: _File) -> None:
        rows = file.rows + len(file.waiting)
        size = file.close()
        del self._files[directory]
        counters = self._counters
        counters.written += rows
        counters.files += 1
        counters.bytes += size

    def _abandon(self, directory: str, file: _File, exc: BaseException) -> None:
        self._files.pop(directory, None)
        file.abandon()
        self._failed(exc, file.rows + len(file.waiting))

    def _failed(self, exc: BaseException, rows: int) -> None:
        """Count a failed file and its rows; warn at most once every ``LOG_EVERY`` s."""
        counters = self._counters
        counters.errors += 1
        counters.lost += rows
        counters.last_error = f"{type(exc).__name__}: {exc}"[:MAX_ERROR]
        now = time.monotonic()
        if now - self._logged < LOG_EVERY:
            self._unlogged += 1
            return
        log.warning(
            "the mirror could not write to the lake (%d more errors since the last warning): %s",
            self._unlogged,
            counters.last_error,
        )
        self._logged, self._unlogged = now, 0
