"""The traffic mirror: a bounded queue of events between the engine and the lake writer.

Theory of operation
-------------------
The engine calls :meth:`Mirror.offer` with one plain tuple per event
(:data:`spark_sink.schema.Event`), or one record for all the events of an accepted
publish (:data:`spark_sink.schema.Request`, or :data:`~spark_sink.schema.Routed` for
one message in one pipe, with the number of rows it stands for),
on the event loop's thread. ``offer`` never waits, never raises and never takes a
lock: it appends to a ``collections.deque`` (whose ``append`` and ``popleft`` are
safe between threads) unless that would put more than ``queue`` events in it, in
which case the events are dropped and counted (a request's all together). It does
not wake the writer either (that would take a lock the writer may hold): the writer
looks at the queue every ``poll_seconds`` and takes all of it.
Publishing therefore costs the same whether the lake keeps up or not; what the lake
misses shows in ``dropped``.

A background thread (:class:`spark_sink.writer.Writer`) takes events off the queue
and hands them to a writer process (:mod:`spark_sink.lake`), which turns them into
Arrow record batches and writes Parquet files into the lake. Each counter is written
by one thread only: ``offered`` (events queued) and ``dropped`` by the loop, the
others by the writer thread (``taken`` as it takes events, ``overflow`` and the spill's
counters as it spills, ``written``, ``files``, ``bytes``, ``errors`` and ``lost`` as the
process reports them). The status's ``dropped`` is ``dropped + overflow``: events the
queue refused, and events taken that found no room in the spill. What waits is
``offered - taken`` (never less than the truth: the writer counts what it took
after taking it), and ``emitted`` is ``offered + dropped``.

When the mirror is off there is no :class:`Mirror` at all: the engine's sink is
``None`` and each emission point costs one ``is None`` test.
"""

from __future__ import annotations

import logging
import urllib.parse
from collections import deque
from dataclasses import dataclass
from typing import Any, Protocol

from .schema import Event, Request, Routed
from .writer import Counters, Writer, WriterConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class MirrorConfig:
    """How the mirror queues and writes (the ``mirror_*`` settings)."""

    lake: str  # a local directory, or a URI pyarrow can write (s3://, s3a://, gs://, hdfs://)
    queue: int = 100_000  # events waiting for the writer at most; more are dropped
    rotate_bytes: int = 64 * 1024 * 1024  # a file is closed once it is this big
    rotate_seconds: float = 3.0  # ... or this old
    batch_rows: int = 8192  # rows per record batch (one Parquet row group)
    poll_seconds: float = 0.05  # the writer looks at the queue this often
    spill_dir: str = ""  # where events wait on disk while the writer is behind ("": none)
    spill_bytes: int = 0  # ... at most this many bytes of them (0: no spill)
    compact_after: float = 0.0  # seconds before a lake file is compacted (0: never)
    retention_days: float = 0.0  # lake files of older hours are deleted (0: kept)

    def __post_init__(self) -> None:
        if not self.lake:
            raise ValueError("mirror_lake must name a directory or URI")
        for key in ("queue", "rotate_bytes", "batch_rows"):
            if getattr(self, key) < 1:
                raise ValueError(f"mirror_{key} must be at least 1")
        for key in ("rotate_seconds", "poll_seconds"):
            if getattr(self, key) <= 0:
                raise ValueError(f"mirror_{key} must be positive")
        for key in ("spill_bytes", "compact_after", "retention_days"):
            if getattr(self, key) < 0:
                raise ValueError(f"mirror_{key} must not be negative")


class Mirror:
    """The queue, its counters and the writer thread behind it."""

    def __init__(self, config: MirrorConfig) -> None:
        self.config = config
        self.counters = Counters()
        self._queue: deque[Event | Request | Routed] = deque()
        self._capacity = config.queue
        self.sink = _offer(self._queue, config.queue, self.counters)
        self._writer = Writer(
            WriterConfig(
                lake=config.lake,
                rotate_bytes=config.rotate_bytes,
                rotate_seconds=config.rotate_seconds,
                batch_rows=config.batch_rows,
                poll_seconds=config.poll_seconds,
                spill_dir=config.spill_dir,
                spill_bytes=config.spill_bytes,
                compact_after=config.compact_after,
                retention_days=config.retention_days,
                queue=config.queue,
            ),
            self._queue,
            self.counters,
        )

    def offer(self, item: Event | Request | Routed, rows: int = 1) -> None:
        """Queue one event (or a request record of ``rows`` events), or drop it
        (counted) when the queue has no room for it. Never blocks: the writer is not
        woken (that takes a lock), it looks every ``poll_seconds``. The engine is given
        :attr:`sink`, the same thing made cheaper to call."""
        self.sink(item, rows)

    def start(self) -> None:
        self._writer.start()

    def flush(self, timeout: float) -> bool:
        """Blocking: write everything queued so far and close every open file, so it is
        in the lake. False when that took longer than ``timeout`` seconds."""
        return self._writer.flush(timeout)

    def stop(self, timeout: float) -> bool:
        """Blocking: write what is queued, close every file and end the thread."""
        done = self._writer.stop(timeout)
        if not done:
            log.warning("the mirror's writer did not finish within %.1f s", timeout)
        return done

    @property
    def emitted(self) -> int:
        """Events the engine offered: taken by the writer, waiting, or dropped."""
        counters = self.counters
        return counters.offered + counters.dropped

    def status(self) -> dict[str, Any]:
        """The counters and settings, as ``GET /admin/mirror`` shows them."""
        counters = self.counters
        return {
            "enabled": True,
            "lake": redact(self.config.lake),
            "queue": self._capacity,
            "queued": counters.offered - counters.taken,
            "emitted": self.emitted,
            "dropped": counters.dropped + counters.overflow,
            "spilled": counters.spilled,
            "spill_bytes": counters.spill_bytes,
            "spilled_total": counters.spilled_total,
            "written": counters.written,
            "files": counters.files,
            "bytes": counters.bytes,
            "open_files": counters.open_files,
            "errors": counters.errors,
            "lost": counters.lost,
            "last_error": counters.last_error,
            "rotate_bytes": self.config.rotate_bytes,
            "rotate_seconds": self.config.rotate_seconds,
            "spill_limit": self.config.spill_bytes,
            "compact_after": self.config.compact_after,
            "retention_days": self.config.retention_days,
            **{key: counters.lake.get(key, 0) for key in LAKE_KEYS},
        }


LAKE_KEYS = ("compactions", "compacted_files", "expired_partitions", "compaction_errors")


class Offer(Protocol):
    """The sink's signature: one event, or a request record of ``rows`` events."""

    def __call__(self, item: Event | Request | Routed, rows: int = 1, /) -> None: ...


def _offer(queue: deque[Event | Request | Routed], capacity: int, counters: Counters) -> Offer:
    """:meth:`Mirror.offer` as a closure (no attribute lookups but the counters): it is
    called for every event on the event loop's thread."""
    append = queue.append

    def offer(item: Event | Request | Routed, rows: int = 1) -> None:
        if counters.offered - counters.taken + rows <= capacity:
            counters.offered += rows  # before the writer can take it: never negative
            append(item)
        else:
            counters.dropped += rows

    return offer


def redact(uri: str) -> str:
    """A lake URI without any credentials it carries (``s3://key:secret@bucket/``)."""
    parts = urllib.parse.urlsplit(uri)
    if not parts.scheme or "@" not in parts.netloc:
        return uri
    host = parts.netloc.rsplit("@", 1)[1]
    return urllib.parse.urlunsplit(parts._replace(netloc=f"***@{host}"))
