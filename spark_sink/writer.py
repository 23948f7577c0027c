"""The mirror's writer: a thread that hands queued events to the writer process.

Theory of operation
-------------------
Turning event tuples into Arrow arrays and Parquet pages takes about two
microseconds of Python per event, with the GIL held: in the gateway's process that
time would be taken from the event loop. So the files are written by a separate
process (:func:`spark_sink.lake.serve`, forked from a fork server: it inherits no
loop, socket or lock), and this thread only takes every event queued so far, every
``poll_seconds``, and sends them down a pipe as one ``marshal`` frame (a fifth of a
microsecond an event; the pipe write itself releases the GIL).

The process answers with its counters whenever they change (among them the frames it
has taken in), and after each flush or stop request; the thread keeps them in
:class:`Counters`. At most :data:`IN_FLIGHT` frames are on their way to the process:
when it is behind, the thread appends what it takes to a :class:`~spark_sink.spill.Spill`
on the local disk instead of waiting on the pipe, and hands the spilled frames over,
oldest first, as the process catches up. The thread never waits for the process, so
the queue only has to hold what arrives between two polls; when a poll finds more
than a sixteenth of the queue's capacity, the next comes ten times sooner. Rows that fit neither in
the queue nor in the spill are dropped; the thread then writes one ``mirror_lost`` row
into the lake (:func:`spark_sink.schema.lost_event`), so that the queries of the range
say how many events they miss. If the process dies
(or cannot be started) the events in hand are counted as ``lost``, the failure as
an error, and a new process is started at the next batch, at most once every
``RESTART`` seconds. Errors are logged at most once every ``LOG_EVERY`` seconds,
with the number of errors since the last warning.
"""

from __future__ import annotations

import itertools
import logging
import marshal
import multiprocessing
import operator
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from .schema import REQUEST, ROUTED, ROUTED_ROWS, ROWS, Event, Request, Routed, lost_event
from .spill import Spill

MAX_ERROR = 500  # characters of an error kept in the status
STOP = "stop"  # the last request; any other string asks for a flush


@dataclass(frozen=True, slots=True, kw_only=True)
class WriterConfig:
    """The settings of the writer process (``mirror_*``; see :mod:`spark_sink.mirror`)."""

    lake: str
    rotate_bytes: int
    rotate_seconds: float
    batch_rows: int
    poll_seconds: float
    spill_dir: str = ""  # where frames wait while the process is behind ("": no spill)
    spill_bytes: int = 0  # ... at most this many bytes of them
    compact_after: float = 0.0  # seconds before a file is compacted (0: never)
    retention_days: float = 0.0  # files of hours older than this are deleted (0: kept)
    queue: int = 100_000  # the queue's capacity (a poll that takes much of it: poll sooner)


_MARK = operator.itemgetter(1)  # an event's kind, or a request record's mark


def count_rows(items: list[Event | Request | Routed]) -> int:
    """The rows a batch of events and records stands for."""
    marks = list(map(_MARK, items))  # the common batch (events, Routed records): in C
    count = len(items) + marks.count(ROUTED) * (ROUTED_ROWS - 1)
    if REQUEST not in marks:
        return count
    extra = [item[ROWS] for item in items if item[1] == REQUEST]
    return count - len(extra) + sum(extra)  # type: ignore[arg-type]  # ints by the mark


def serve(conn: Connection, config: WriterConfig) -> None:
    """The writer process's entry: :func:`spark_sink.lake.serve`, imported there (the
    fork server has it loaded) so that the gateway's process never loads pyarrow."""
    from .lake import serve as write

    write(conn, config)


log = logging.getLogger(__name__)

LOG_EVERY = 60.0  # seconds between warnings about write errors at most
RESTART = 1.0  # seconds between attempts at starting the writer process at least
ANSWER_WAIT = 60.0  # seconds a flush or stop request waits for the process at most
FLUSH = "flush"
IN_FLIGHT = 2  # frames handed to the process and not yet taken in, at most
BUSY = 16  # a poll that took more than 1/BUSY of the queue's capacity: a burst


@dataclass(slots=True)
class Counters:
    """What the mirror did since it started (see :mod:`spark_sink.mirror`)."""

    offered: int = 0  # events the engine queued
    taken: int = 0  # events the writer thread took off the queue
    dropped: int = 0  # events the engine offered when the queue was full: not kept
    overflow: int = 0  # events taken that fitted in no spill: not kept either
    spilled: int = 0  # events waiting on disk for the process now
    spill_bytes: int = 0  # ... and the bytes they take
    spilled_total: int = 0  # events that ever waited on disk
    written: int = 0  # rows in complete files in the lake
    files: int = 0  # complete files in the lake
    bytes: int = 0  # ... and their size
    errors: int = 0  # failed attempts at writing a file (or at running the writer)
    lost: int = 0  # rows those failures lost
    last_error: str = ""
    open_files: int = 0  # files being written (hidden until complete)
    lake: dict[str, int] = field(default_factory=dict)  # compaction and retention


LAKE_FIELDS = ("written", "files", "bytes", "errors", "lost")  # the process's counters


def _context() -> multiprocessing.context.ForkServerContext:
    """Where writer processes come from: a fork server (started once per gateway
    process, single-threaded, with pyarrow already imported), so that each writer
    process starts at once and inherits nothing of the gateway's loop or threads."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["spark_sink.lake"])
    return context


class Writer:
    """The thread between the queue and the writer process."""

    def __init__(
        self, config: WriterConfig, queue: deque[Event | Request | Routed], counters: Counters
    ) -> None:
        self.config = config
        self._queue = queue
        self._counters = counters
        self._wake = threading.Event()
        self._stopping = False
        self._asks: deque[threading.Event] = deque()  # flushes asked for
        self._thread = threading.Thread(target=self._run, name="mirror-writer", daemon=True)
        self._process: BaseProcess | None = None
        self._conn: Connection | None = None
        self._base = dict.fromkeys(LAKE_FIELDS, 0)  # what earlier processes did
        self._retry_at = 0.0
        self._logged = 0.0
        self._unlogged = 0
        self._warned_errors = 0
        self._pause = config.poll_seconds  # until the next look at the queue
        self._sent = 0  # frames handed to the current process
        self._taken_in = 0  # ... and taken in by it
        self._marked = 0  # dropped events already written as mirror_lost rows
        spill_dir = config.spill_dir if config.spill_bytes > 0 else ""
        self._spill = Spill(spill_dir, config.spill_bytes) if spill_dir else None

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
        try:
            while True:
                self._wake.wait(self._pause)
                self._wake.clear()
                stopping = self._stopping
                asks = [self._asks.popleft() for _ in range(len(self._asks))]
                self._send_queued()
                if asks or stopping:
                    self._unspill()
                    self._request(STOP if stopping else FLUSH)
                else:
                    self._answers(0)
                for done in asks:
                    done.set()
                if stopping:
                    return
        finally:
            self._end()

    def _send_queued(self) -> None:
        queue = self._queue
        # Only what is queued now: the event loop's thread appends meanwhile. Popped in
        # C, so that this thread holds the GIL as briefly as it can while it takes them.
        items: list[Event | Request | Routed] = list(
            itertools.islice(iter(queue.popleft, None), len(queue))
        )
        counters = self._counters
        rows = count_rows(items) if items else 0
        # Under a burst, poll ten times as often: the queue then holds what arrives in a
        # tenth of the time, far from full (at 200,000 events a second, 50 ms is 10,000).
        busy = rows * BUSY > self.config.queue
        self._pause = self.config.poll_seconds / (10 if busy else 1)
        counters.taken += rows
        spill = self._spill
        while spill is not None and spill and self._room():
            frame, spilled = spill.pop()  # type: ignore[misc]  # not empty
            self._hand(frame, spilled)
        if items:
            frame = marshal.dumps(items)
            if spill is not None and (spill or not self._room()):
                if not spill.push(frame, rows):
                    counters.overflow += rows
            else:
                self._hand(frame, rows)
        if (spill is None or not spill) and self._room():
            self._say_dropped()
        if spill is not None:
            counters.spilled, counters.spill_bytes = spill.rows, spill.size
            counters.spilled_total = spill.total_rows

    def _say_dropped(self) -> None:
        """Hand the process a ``mirror_lost`` row for the events dropped since the last
        one, so that the lake, and the queries of the range, say it. Never spilled (a
        full spill is why there are any): sent when the process has room."""
        counters = self._counters
        dropped = counters.dropped + counters.overflow
        if dropped > self._marked:
            self._hand(marshal.dumps([lost_event(time.time(), dropped - self._marked)]), 0)
            self._marked = dropped

    def _unspill(self) -> None:
        """Hand over everything spilled, waiting on the pipe as need be (a flush or stop
        writes everything taken so far), and say what was dropped."""
        spill = self._spill
        while spill is not None and spill:
            frame, rows = spill.pop()  # type: ignore[misc]  # not empty
            self._hand(frame, rows)
        self._say_dropped()
        if spill is not None:
            self._counters.spilled, self._counters.spill_bytes = spill.rows, spill.size

    def _room(self) -> bool:
        """Whether the process may be handed another frame without waiting."""
        if self._process is None or not self._process.is_alive():
            return True  # a new process will be started, with nothing in flight
        self._answers(0)
        return self._sent - self._taken_in < IN_FLIGHT

    def _hand(self, frame: bytes, rows: int) -> None:
        conn = self._writer_process()
        if conn is None:
            self._counters.lost += rows
            return
        try:
            conn.send_bytes(frame)
            self._sent += 1
        except (OSError, ValueError) as exc:
            self._counters.lost += rows
            self._failed(f"cannot hand rows to the lake writer: {exc}")

    def _request(self, what: str) -> None:
        """Ask the process to close every file (and, for "stop", to end); wait for its
        answer."""
        conn = self._writer_process() if what == FLUSH or self._conn is not None else None
        if conn is None:
            return
        try:
            conn.send_bytes(marshal.dumps(what))
        except OSError as exc:
            self._failed(f"cannot reach the lake writer: {exc}")
            return
        deadline = time.monotonic() + ANSWER_WAIT
        while what not in self._answers(max(0.0, deadline - time.monotonic())):
            if time.monotonic() >= deadline or self._conn is None:
                self._failed(f"the lake writer did not answer a {what} request")
                return

    def _answers(self, timeout: float) -> list[Any]:
        """Read what the process sent (waiting up to ``timeout`` for the first);
        the requests answered."""
        conn, answered = self._conn, []
        try:
            while conn is not None and conn.poll(timeout):
                request, state = marshal.loads(conn.recv_bytes())  # noqa: S302 - our own pipe
                self._apply(state)
                answered.append(request)
                if request == STOP:  # its last word: the pipe's end that follows is no loss
                    break
                timeout = 0
        except (EOFError, OSError):
            self._lost_process()
        return answered

    def _apply(self, state: tuple[Any, ...]) -> None:
        counters = self._counters
        *numbers, last_error, open_files, taken_in, lake = state
        for name, value in zip(LAKE_FIELDS, numbers, strict=True):
            setattr(counters, name, self._base[name] + value)
        counters.open_files = open_files
        counters.lake = lake
        self._taken_in = taken_in
        if last_error:
            counters.last_error = last_error
        if counters.errors > self._warned_errors:
            self._warn(counters.errors - self._warned_errors)
            self._warned_errors = counters.errors

    def _writer_process(self) -> Connection | None:
        """The connection to a live writer process, started if need be; None when it
        cannot be had now."""
        if self._process is not None and self._process.is_alive():
            return self._conn
        if self._process is not None:
            self._lost_process()
        if time.monotonic() < self._retry_at:
            return None
        self._retry_at = time.monotonic() + RESTART
        context = _context()
        ours, theirs = context.Pipe()
        process = context.Process(
            target=serve, args=(theirs, self.config), name="mirror-writer", daemon=True
        )
        try:
            process.start()
        except (OSError, EOFError) as exc:  # EOFError: the forkserver ended meanwhile
            ours.close()
            self._failed(f"cannot start the lake writer: {exc!r}")
            return None
        finally:
            theirs.close()
        self._process, self._conn = process, ours
        self._sent = self._taken_in = 0
        return ours

    def _lost_process(self) -> None:
        """The process ended or its pipe broke: keep what it did, forget it."""
        process, conn = self._process, self._conn
        self._process = self._conn = None
        if conn is not None:
            conn.close()
        for name in LAKE_FIELDS:
            self._base[name] = getattr(self._counters, name)
        self._counters.open_files = 0
        if process is not None:
            process.join(1)
            self._failed(f"the lake writer ended (exit code {process.exitcode})")

    def _end(self) -> None:
        process, conn = self._process, self._conn
        self._process = self._conn = None
        if process is not None:
            process.join(ANSWER_WAIT if not self._stopping else 5)
            if process.is_alive():
                process.kill()
                process.join(5)
        if conn is not None:
            conn.close()
        if self._spill is not None:
            if self._spill.rows:
                self._counters.lost += self._spill.rows
            self._spill.close()

    def _failed(self, error: str) -> None:
        counters = self._counters
        counters.errors += 1
        self._base["errors"] += 1
        counters.last_error = error[:MAX_ERROR]
        self._warn(1)
        self._warned_errors = counters.errors

    def _warn(self, new: int) -> None:
        """Log the last error, at most once every ``LOG_EVERY`` seconds."""
        now = time.monotonic()
        if now - self._logged < LOG_EVERY:
            self._unlogged += new
            return
        log.warning(
            "the mirror could not write to the lake (%d more errors since the last warning): %s",
            self._unlogged + new - 1,
            self._counters.last_error,
        )
        self._logged, self._unlogged = now, 0
