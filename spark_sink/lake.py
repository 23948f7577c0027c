"""The lake's files, written by the mirror's writer process (docs/ANALYTICS.md).

Theory of operation
-------------------
Rows arrive in batches (:func:`serve` reads them from the gateway's writer thread,
:mod:`spark_sink.writer`) and are filed under the partition of their timestamp
(``date=YYYY-MM-DD/hour=HH``). Each partition has at most one open file: rows wait
in memory until ``batch_rows`` of them make one record batch, written as one Parquet
row group.

A file is written under a hidden name (``.tmp-part-...``) and renamed to its final
name once closed, so a reader listing the lake never sees half a file. It is closed
when it reaches ``rotate_bytes`` on disk, when it is ``rotate_seconds`` old, on a
flush and on stop. On a local disk the rename is atomic; on object stores (S3,
GCS) the move is a copy under the final name, which appears whole or not at all.

Errors (an unwritable lake, a full disk, an unreachable store) are counted, never
raised: the rows of the file that failed are ``lost``, the error is kept as
``last_error`` and the gateway's side logs it (at most once a minute).

The lake is a local directory or a URI: ``file://``, ``s3://`` (``s3a://`` and
``s3n://``, the names Spark uses, mean the same store), ``gs://``, ``hdfs://``,
``abfs://``, as far as this pyarrow build supports them. Credentials come from the
environment of the process (the usual variables of each store), never the logs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import marshal
import os
import signal
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from .schema import SCHEMA, TS, Event, part_name, partition, temporary

MAX_ERROR = 500  # characters of an error kept in the status
STOP = "stop"  # the last request; any other string asks for a flush

FileErrors = (OSError, pa.ArrowException, ValueError, TypeError)
# Columns with few distinct values, dictionary-encoded; times, ids, sizes and latencies
# are nearly all distinct, and encoding them as dictionaries would only cost time.
DICTIONARY = [n for n in SCHEMA.names if n not in ("ts", "message_id", "size", "latency_ms")]


@dataclass(slots=True)
class LakeCounters:
    """What one writer process did (see :class:`spark_sink.writer.Counters`)."""

    written: int = 0  # rows in complete files in the lake
    files: int = 0  # complete files in the lake
    bytes: int = 0  # ... and their size
    errors: int = 0  # failed attempts at writing a file
    lost: int = 0  # rows those failures lost
    last_error: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class WriterConfig:
    """The settings of the writer process (``mirror_*``; see :mod:`spark_sink.mirror`)."""

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
        self.writer = pq.ParquetWriter(self.sink, SCHEMA, use_dictionary=DICTIONARY)

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


# An event tuple as Arrow reads it in one pass (``ts`` still in float seconds).
ROW = pa.struct(
    [pa.field(f.name, pa.float64(), nullable=False) if f.name == "ts" else f for f in SCHEMA]
)
TS_TYPE = SCHEMA.field(TS).type


def record_batch(rows: list[Event]) -> pa.RecordBatch:
    """Event tuples as one Arrow record batch of :data:`~spark_sink.schema.SCHEMA`:
    converted as one struct array (one pass in C++ over the tuples), then ``ts`` from
    float seconds to microseconds."""
    batch = pa.RecordBatch.from_struct_array(pa.array(rows, type=ROW))
    micros = pc.round(pc.multiply(batch.column(TS), 1_000_000))
    ts = pc.cast(micros, pa.int64()).cast(TS_TYPE)
    return pa.RecordBatch.from_arrays([ts, *batch.columns[1:]], schema=SCHEMA)


class Lake:
    """The open files of the lake and what they have done (used by the writer process).

    :meth:`add` files rows under their partitions and writes full record batches;
    :meth:`rotate` closes files that are old enough (or all of them).
    """

    def __init__(self, config: WriterConfig) -> None:
        self.config = config
        self.counters = LakeCounters()
        self._files: dict[str, _File] = {}  # open files by partition directory
        self._fs: tuple[pafs.FileSystem, str] | None = None
        self._hours: dict[int, str] = {}  # partition directories by hour since the epoch

    @property
    def open_files(self) -> int:
        return len(self._files)

    def add(self, rows: list[Event]) -> None:
        fs = self._filesystem()
        if fs is None:
            self.counters.lost += len(rows)
            return
        batch = self.config.batch_rows
        for event in rows:
            directory = self._directory(event[TS])
            file = self._files.get(directory)
            if file is None:
                try:
                    file = _File(fs[0], f"{fs[1]}/{directory}", time.time())
                except FileErrors as exc:
                    self._failed(exc, 1)
                    continue
                self._files[directory] = file
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

    def rotate(self, *, everything: bool) -> None:
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
        counters = self.counters
        counters.written += rows
        counters.files += 1
        counters.bytes += size

    def _abandon(self, directory: str, file: _File, exc: BaseException) -> None:
        self._files.pop(directory, None)
        file.abandon()
        self._failed(exc, file.rows + len(file.waiting))

    def _failed(self, exc: BaseException, rows: int) -> None:
        counters = self.counters
        counters.errors += 1
        counters.lost += rows
        counters.last_error = f"{type(exc).__name__}: {exc}"[:MAX_ERROR]


def serve(conn: Connection, config: WriterConfig) -> None:
    """The writer process: rows and requests from the gateway's end of ``conn``
    (marshalled), answered with the counters after each request and whenever they
    change. Ends on "stop" or when the gateway's end closes."""
    # Signals are the gateway's to handle: a Ctrl-C or a SIGTERM sent to the whole
    # process group must not end this process before the gateway asks it to stop
    # (it would lose its open files); if the gateway dies, the pipe's end says so.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    lake = Lake(config)
    sent: tuple[object, ...] = ()
    try:
        while True:
            request: str | None = None
            if conn.poll(config.poll_seconds):
                message = marshal.loads(conn.recv_bytes())  # noqa: S302 - our own pipe
                if isinstance(message, list):
                    lake.add(message)
                else:
                    request = message
            lake.rotate(everything=request is not None)
            state = (*dataclasses.astuple(lake.counters), lake.open_files)
            if request is not None or state != sent:
                conn.send_bytes(marshal.dumps((request, state)))
                sent = state
            if request == STOP:
                return
    except (EOFError, OSError):
        lake.rotate(everything=True)  # the gateway went away: keep what was written
