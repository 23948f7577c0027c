"""The lake's files, written by the mirror's writer process (docs/ANALYTICS.md).

Theory of operation
-------------------
Rows arrive in batches (:func:`serve` reads them from the gateway's writer thread,
:mod:`spark_sink.writer`) and are filed under the partition of their timestamp
(``date=YYYY-MM-DD/hour=HH``). Each partition has at most one open file: rows wait
in memory until ``batch_rows`` of them make one record batch, written as one Parquet
row group. A row is an event tuple, or one of the rows of a publish request's record
(:data:`~spark_sink.schema.Request`): those are expanded into column lists with
C-level list operations (:class:`RequestRows`) and converted a column at a time; or
the two events of a :data:`~spark_sink.schema.Routed` record, kept as events.

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
from array import array
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Final

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from .schema import (
    COLUMNS,
    DROP,
    FULL,
    OK,
    PUBLISH,
    REQUEST,
    ROUTE,
    ROUTED,
    ROUTED_ROWS,
    ROWS,
    TS,
    Event,
    Request,
    Routed,
    part_name,
    partition,
    routed_events,
    temporary,
)
from .writer import MAX_ERROR, STOP, WriterConfig
from .writer import count_rows as rows

SCHEMA: Final = pa.schema(
    [
        pa.field("ts", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("event", pa.string(), nullable=False),
        pa.field("domain", pa.string(), nullable=False),
        pa.field("feed", pa.string(), nullable=False),
        pa.field("feed_type", pa.string(), nullable=False),
        pa.field("address", pa.string()),
        pa.field("pipe", pa.string()),
        pa.field("message_id", pa.string()),
        pa.field("size", pa.int64(), nullable=False),
        pa.field("principal", pa.string()),
        pa.field("outcome", pa.string(), nullable=False),
        pa.field("latency_ms", pa.float64()),
        pa.field("bridge", pa.string()),
    ]
)
if tuple(SCHEMA.names) != COLUMNS:
    raise ImportError("spark_sink.lake.SCHEMA does not name spark_sink.schema.COLUMNS")

# The partition columns Spark derives from the directory names.
PARTITIONS: Final = pa.schema([pa.field("date", pa.string()), pa.field("hour", pa.int32())])

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


def lake_filesystem(uri: str) -> tuple[pafs.FileSystem, str]:
    """The filesystem and base path of a lake URI (a plain path is a local directory)."""
    if "://" not in uri:
        return pafs.LocalFileSystem(), os.path.abspath(uri)
    scheme, rest = uri.split("://", 1)
    if scheme.lower() in ("s3a", "s3n"):
        uri = "s3://" + rest
    fs, path = pafs.FileSystem.from_uri(uri)
    return fs, path.rstrip("/")


def _ints(codes: array[int]) -> pa.Array:
    """An ``array('i')`` as an Arrow int32 array, without a copy."""
    return pa.Array.from_buffers(pa.int32(), len(codes), [None, pa.py_buffer(codes)])


def _run(code: int, count: int) -> array[int]:
    return array("i", (code,)) * count


class _Codes:
    """The distinct values of a column of few values (None among them), numbered as
    they come."""

    __slots__ = ("numbers", "values")

    def __init__(self, *values: str | None) -> None:
        self.numbers: dict[str | None, int] = {}
        self.values: list[str | None] = []
        for value in values:
            self.code(value)

    def code(self, value: str | None) -> int:
        number = self.numbers.get(value)
        if number is None:
            number = self.numbers[value] = len(self.values)
            self.values.append(value)
        return number

    def take(self, codes: array[int]) -> pa.Array:
        """The column whose rows have these codes."""
        return pc.take(pa.array(self.values, pa.string()), _ints(codes))


class RequestRows:
    """The rows of publish request records, in columns: what is the same for all the
    rows of a request once per request (``owner`` says which request a row is of),
    columns of few values as codes (``array('i')``, repeated in C), addresses, ids
    and sizes as lists. A column at a time at the end (latency and bridge are null in
    every row)."""

    __slots__ = (
        "address",
        "event",
        "message_id",
        "outcome",
        "outcomes",
        "owner",
        "pipe",
        "pipes",
        "principal",
        "principals",
        "requests",
        "rows",
        "size",
    )

    def __init__(self) -> None:
        self.rows = 0
        self.requests: list[tuple[float, str, str, str]] = []
        self.owner = array("i")  # the request of each row
        self.principals = _Codes(None)
        self.principal = array("i")
        self.event = array("i")  # 0 publish, 1 route, 2 drop (as batch() names them)
        self.outcomes = _Codes(OK)
        self.outcome = array("i")
        self.pipes = _Codes(None)
        self.pipe = array("i")
        self.address: list[str | None] = []
        self.message_id: list[str | None] = []
        self.size: list[int] = []

    def add(self, request: Request) -> None:
        """The record's publish rows (one a message), its route rows (one a copy
        placed in a pipe), then its drop rows (one a copy a full pipe skipped),
        exactly as the events would have been."""
        ts, _, rows, domain, feed, feed_type, principal, n, where, ids, sizes = request[:11]
        outcome, pipes, each, route_sizes, drops = request[11:]
        copies = rows - n - (len(drops) if drops else 0)
        self.owner += _run(len(self.requests), rows)
        self.requests.append((ts, domain, feed, feed_type))
        self.rows += rows
        self.principal += _run(self.principals.code(principal), n)
        self.principal += _run(0, rows - n)  # None: route and drop rows
        self.event += _run(0, n)
        self.event += _run(1, copies)
        code = self.outcomes.code
        if isinstance(outcome, list):
            self.outcome += array("i", [code(value) for value in outcome])
        else:
            self.outcome += _run(code(outcome), n)
        self.outcome += _run(0, copies)  # OK
        self.pipe += _run(0, n)  # None
        if isinstance(pipes, list):
            self.pipe += array("i", [self.pipes.code(pipe) for pipe in pipes])
        else:
            self.pipe += _run(self.pipes.code(pipes), copies)
        addresses = where if isinstance(where, list) else [where] * n
        message_ids: list[str | None] = ids if ids is not None else [None] * n
        self.address += addresses
        self.message_id += message_ids
        self.size += sizes
        copied = route_sizes if route_sizes is not None else sizes
        if each is None:  # one copy of each message, in order
            self.address += addresses
            self.message_id += message_ids
            self.size += copied
        else:  # each message's copies, in order
            which = [m for m, count in enumerate(each) for _ in range(count)]
            self.address += [addresses[m] for m in which]
            self.message_id += [message_ids[m] for m in which]
            self.size += [copied[m] for m in which]
        if drops:  # copies full pipes skipped: "drop" rows, outcome "full"
            self.event += _run(2, len(drops))
            self.outcome += _run(self.outcomes.code(FULL), len(drops))
            self.pipe += array("i", [self.pipes.code(pipe) for _, pipe, _ in drops])
            self.address += [addresses[m] for m, _, _ in drops]
            self.message_id += [message_ids[m] for m, _, _ in drops]
            self.size += [size for _, _, size in drops]

    def batch(self) -> pa.RecordBatch:
        owner = _ints(self.owner)
        per_request = [pa.array(column) for column in zip(*self.requests, strict=True)]
        ts, domain, feed, feed_type = (pc.take(column, owner) for column in per_request)
        events = _Codes(PUBLISH, ROUTE, DROP)
        nulls = pa.nulls(self.rows)
        columns = [
            _timestamps(ts.cast(pa.float64())),
            events.take(self.event),
            domain.cast(pa.string()),
            feed.cast(pa.string()),
            feed_type.cast(pa.string()),
            pa.array(self.address, pa.string()),
            self.pipes.take(self.pipe),
            pa.array(self.message_id, pa.string()),
            pa.array(self.size, pa.int64()),
            self.principals.take(self.principal),
            self.outcomes.take(self.outcome),
            nulls.cast(SCHEMA.field("latency_ms").type),
            nulls.cast(SCHEMA.field("bridge").type),
        ]
        return pa.RecordBatch.from_arrays(columns, schema=SCHEMA)


class _File:
    """One open data file of one partition."""

    __slots__ = (
        "final",
        "fs",
        "opened",
        "pending",
        "requests",
        "rows",
        "sink",
        "tmp",
        "waiting",
        "writer",
    )

    def __init__(self, fs: pafs.FileSystem, directory: str, now: float) -> None:
        name = part_name(now)
        self.fs = fs
        self.final = f"{directory}/{name}"
        self.tmp = f"{directory}/{temporary(name)}"
        self.opened = time.monotonic()
        self.rows = 0  # rows written into the file
        self.waiting: list[Event] = []  # event rows not yet in a record batch
        self.requests: RequestRows | None = None  # request rows not yet in one
        self.pending = 0  # rows waiting, of both kinds
        fs.create_dir(directory, recursive=True)
        self.sink = fs.open_output_stream(self.tmp)
        self.writer = pq.ParquetWriter(self.sink, SCHEMA, use_dictionary=DICTIONARY)

    def add(self, item: Event | Request | Routed) -> int:
        """Keep one event or record until the next write; the rows waiting."""
        mark = item[1]
        if mark == ROUTED:
            self.waiting += routed_events(item)  # type: ignore[arg-type]  # Routed by its mark
            self.pending += ROUTED_ROWS
        elif mark == REQUEST:
            if self.requests is None:
                self.requests = RequestRows()
            self.requests.add(item)  # type: ignore[arg-type]  # a Request by its mark
            self.pending += item[ROWS]  # type: ignore[operator]
        else:
            self.waiting.append(item)  # type: ignore[arg-type]  # an Event
            self.pending += 1
        return self.pending

    def write(self) -> None:
        """The waiting rows as one row group."""
        events, requests = self.waiting, self.requests
        self.waiting, self.requests, self.pending = [], None, 0
        batches = [record_batch(events)] if events else []
        if requests is not None and requests.rows:
            batches.append(requests.batch())
        if batches:
            self.writer.write_table(pa.Table.from_batches(batches, schema=SCHEMA))
            self.rows += sum(batch.num_rows for batch in batches)

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
    ts = _timestamps(batch.column(TS))
    return pa.RecordBatch.from_arrays([ts, *batch.columns[1:]], schema=SCHEMA)


def _timestamps(seconds: pa.Array) -> pa.Array:
    """Float seconds since the epoch as ``ts`` (microseconds, rounded half to even)."""
    micros = pc.round(pc.multiply(seconds, 1_000_000))
    return pc.cast(micros, pa.int64()).cast(TS_TYPE)


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

    def add(self, items: list[Event | Request | Routed]) -> None:
        fs = self._filesystem()
        if fs is None:
            self.counters.lost += rows(items)
            return
        batch = self.config.batch_rows
        for item in items:
            directory = self._directory(item[TS])
            file = self._files.get(directory)
            if file is None:
                try:
                    file = _File(fs[0], f"{fs[1]}/{directory}", time.time())
                except FileErrors as exc:
                    self._failed(exc, rows([item]))
                    continue
                self._files[directory] = file
            if file.add(item) >= batch:
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
        rows = file.rows + file.pending
        size = file.close()
        del self._files[directory]
        counters = self.counters
        counters.written += rows
        counters.files += 1
        counters.bytes += size

    def _abandon(self, directory: str, file: _File, exc: BaseException) -> None:
        self._files.pop(directory, None)
        file.abandon()
        self._failed(exc, file.rows + file.pending)

    def _failed(self, exc: BaseException, rows: int) -> None:
        counters = self.counters
        counters.errors += 1
        counters.lost += rows
        counters.last_error = f"{type(exc).__name__}: {exc}"[:MAX_ERROR]


def serve(conn: Connection, config: WriterConfig) -> None:
    """The writer process: rows and requests from the gateway's end of ``conn``
    (marshalled), answered with the counters (and the number of frames taken in, so
    that the gateway's thread knows how far behind this process is) after each request
    and whenever they change. Ends on "stop" or when the gateway's end closes. A
    :class:`~spark_sink.compact.Compactor` thread keeps the lake compact and within its
    retention meanwhile."""
    from .compact import Compactor

    # Signals are the gateway's to handle: a Ctrl-C or a SIGTERM sent to the whole
    # process group must not end this process before the gateway asks it to stop
    # (it would lose its open files); if the gateway dies, the pipe's end says so.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    lake = Lake(config)
    compactor = Compactor.for_lake(config)
    sent: tuple[object, ...] = ()
    frames = 0
    try:
        while True:
            request: str | None = None
            if conn.poll(config.poll_seconds):
                message = marshal.loads(conn.recv_bytes())  # noqa: S302 - our own pipe
                if isinstance(message, list):
                    lake.add(message)
                    frames += 1
                else:
                    request = message
            lake.rotate(everything=request is not None)
            done = compactor.counters() if compactor is not None else {}
            state = (*dataclasses.astuple(lake.counters), lake.open_files, frames, done)
            if request is not None or state != sent:
                conn.send_bytes(marshal.dumps((request, state)))
                sent = state
            if request == STOP:
                return
    except (EOFError, OSError):
        lake.rotate(everything=True)  # the gateway went away: keep what was written
    finally:
        if compactor is not None:
            compactor.stop()
