"""Compaction and retention of the lake, and which of its files a query reads
(docs/ANALYTICS.md, "Compaction and retention").

Theory of operation
-------------------
The mirror closes a file every few seconds (``mirror_rotate_seconds``), so that new
traffic shows soon; left alone, an hour of traffic would be a thousand small files,
and a query would spend its time opening them. A :class:`Compactor` thread in the
mirror's writer process therefore copies, once a minute, the *raw* files of each hour
partition (``part-<start>-...``) that were started more than ``compact_after`` seconds
ago into one *compacted* file of that partition, then deletes them. Its name says which
raw files it holds::

    compact-<after>-<upto>-<node>-<random>.parquet

holds every raw file of its partition whose start (the time in its name, to the
second) is after ``<after>`` and at most ``<upto>``. Each round starts where the
previous one ended, so the ranges of one partition follow each other; once the hour is
over, its compacted files are merged into one (up to ``rotate_bytes``), whose range
spans theirs. Rows are copied a row group at a time: memory stays bounded whatever the
size of an hour.

Readers must never count a row twice or miss one while a round runs: the compacted
file is renamed into place *before* its inputs are deleted, and :func:`select` picks,
from one listing of a partition, the compacted files whose range no other compacted
file's range contains, and the raw files that none of those ranges holds. Whatever
moment a listing sees (before the rename, between the rename and the deletes, after),
the selected files hold each row once. A file deleted between a query's listing and
its reading makes the query fail; the queries list again and retry
(:func:`spark_sink.queries.run`).

Retention: partitions whose hour ended more than ``retention_days`` ago are deleted
whole. A round takes an exclusive lock on ``<lake>/_compaction.lock``, so the writer
processes of several gateways sharing one local lake never compact the same partition
at once. Both are done on local lakes only; on an object store, its own lifecycle rules
are the way to expire files (a rename there is a copy, and listings may lag).

The streaming job reads raw files only (Spark's ``pathGlobFilter``): a compacted file
holds rows it has counted already. ``compact_after`` (five minutes by default) is its
margin to have seen a raw file before it goes; see docs/ANALYTICS.md for what a worker
stopped longer than that misses.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import os
import re
import shutil
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .schema import node_id
from .writer import MAX_ERROR, WriterConfig

if TYPE_CHECKING:
    import pyarrow.parquet as pq

RAW = "part-"
COMPACTED = "compact-"
LOCK = "_compaction.lock"
STAMP = "%Y%m%dT%H%M%SZ"
EPOCH = "19700101T000000Z"
_RAW_NAME = re.compile(r"part-(\d{8}T\d{6}Z)-.*\.parquet")
_COMPACTED_NAME = re.compile(r"compact-(\d{8}T\d{6}Z)-(\d{8}T\d{6}Z)-.*\.parquet")
_PARTITION = re.compile(r"date=(\d{4}-\d{2}-\d{2})/hour=(\d{2})")
MIN_FILES = 2  # raw files a round compacts at least in an hour still running
BATCH_ROWS = 65_536  # rows copied at a time


def local_lake(lake: str) -> Path | None:
    """The directory of a local lake; None for a remote one."""
    if "://" not in lake:
        return Path(lake)
    if lake.startswith("file://"):
        return Path(lake.removeprefix("file://"))
    return None


@dataclass(frozen=True, slots=True)
class Compacted:
    name: str
    after: str
    upto: str


def select(names: Iterable[str]) -> list[str]:
    """The data files of one partition a reader reads, from one listing of it: the
    compacted files no other compacted file's range contains, and the raw files none of
    their ranges holds. Names starting with a dot or an underscore (files being
    written, the lock) are left out; other names are not the mirror's and are read."""
    raw: list[tuple[str, str]] = []
    compacted: list[Compacted] = []
    other: list[str] = []  # not the mirror's: read as Spark would (it skips . and _)
    for name in names:
        if found := _RAW_NAME.fullmatch(name):
            raw.append((found[1], name))
        elif found := _COMPACTED_NAME.fullmatch(name):
            compacted.append(Compacted(name, found[1], found[2]))
        elif not name.startswith((".", "_")):
            other.append(name)
    kept = [
        c
        for c in compacted
        if not any(
            o is not c
            and o.after <= c.after
            and c.upto <= o.upto
            and (o.after, o.upto) != (c.after, c.upto)
            for o in compacted
        )
    ]
    chosen = [c.name for c in kept] + other
    chosen += [name for start, name in raw if not any(c.after < start <= c.upto for c in kept)]
    return sorted(chosen)


def _hour_start(date: str, hour: str) -> float:
    day = datetime.datetime.strptime(date, "%Y-%m-%d").replace(tzinfo=datetime.UTC)
    return day.timestamp() + int(hour) * 3600


def partitions(root: Path) -> list[tuple[Path, float]]:
    """The lake's partition directories and the start of their hours, oldest first."""
    found = []
    for day in sorted(root.glob("date=*")):
        for hour in sorted(day.glob("hour=*")):
            match = _PARTITION.fullmatch(f"{day.name}/{hour.name}")
            if match is not None and hour.is_dir():
                found.append((hour, _hour_start(match[1], match[2])))
    return found


def files_between(root: Path, since: float, until: float) -> list[str]:
    """The files a query of ``[since, until)`` reads in a local lake (:func:`select` of
    each partition whose hour meets the range)."""
    found: list[str] = []
    for directory, start in partitions(root):
        if start + 3600 <= since or start >= until:
            continue
        with contextlib.suppress(FileNotFoundError):  # deleted by retention meanwhile
            names = [entry.name for entry in os.scandir(directory)]
            found += [str(directory / name) for name in select(names)]
    return found


def stamp(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts, datetime.UTC).strftime(STAMP)


class Compactor:
    """The thread that compacts the lake and applies its retention."""

    def __init__(
        self, root: Path, *, compact_after: float, retention_days: float, rotate_bytes: int
    ) -> None:
        self.root = root
        self.compact_after = compact_after
        self.retention = retention_days * 86_400
        self.rotate_bytes = rotate_bytes
        self.interval = min(60.0, compact_after / 2) if compact_after > 0 else 60.0
        self.done = {"compactions": 0, "compacted_files": 0, "expired_partitions": 0}
        self.done["compaction_errors"] = 0
        self.last_error = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lake-compactor", daemon=True)

    @classmethod
    def for_lake(cls, config: WriterConfig) -> Compactor | None:
        """A started compactor for a local lake that has something to do, else None."""
        root = local_lake(config.lake)
        if root is None or (config.compact_after <= 0 and config.retention_days <= 0):
            return None
        compactor = cls(
            root,
            compact_after=config.compact_after,
            retention_days=config.retention_days,
            rotate_bytes=config.rotate_bytes,
        )
        compactor._thread.start()
        return compactor

    def counters(self) -> dict[str, int]:
        return dict(self.done)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.round(time.time())
            except OSError as exc:  # the lake itself (its lock, its listing)
                self._failed(exc)

    def _failed(self, exc: BaseException) -> None:
        self.done["compaction_errors"] += 1
        self.last_error = f"{type(exc).__name__}: {exc}"[:MAX_ERROR]

    def round(self, now: float) -> None:
        """One pass over the lake, under its lock (skipped when another holds it)."""
        if not self.root.is_dir():
            return
        with open(self.root / LOCK, "a") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return
            for directory, start in partitions(self.root):
                if self._stop.is_set():
                    return
                if self.retention > 0 and start + 3600 + self.retention <= now:
                    shutil.rmtree(directory, ignore_errors=True)
                    self.done["expired_partitions"] += 1
                    continue
                if self.compact_after > 0:
                    try:
                        self._compact(directory, now, over=start + 3600 + self.compact_after <= now)
                    except (OSError, ValueError) as exc:  # pyarrow's errors are both
                        self._failed(exc)  # counted; the other partitions go on

    def _compact(self, directory: Path, now: float, *, over: bool) -> None:
        names = [entry.name for entry in os.scandir(directory)]
        for name in names:  # under the lock, a compaction's hidden file is a dead round's
            if name.startswith(f".tmp-{COMPACTED}"):
                (directory / name).unlink(missing_ok=True)
        chosen = select(names)
        kept = [c for c in map(_COMPACTED_NAME.fullmatch, chosen) if c is not None]
        after = max((c[2] for c in kept), default=EPOCH)
        upto = stamp(now - self.compact_after)
        raw = [
            name
            for name in chosen
            if (m := _RAW_NAME.fullmatch(name)) is not None and after < m[1] <= upto
        ]
        if len(raw) >= MIN_FILES or (over and raw and kept):
            self._write(directory, after, upto, raw)
        elif over and len(kept) > 1:
            self._merge(directory, kept)

    def _merge(self, directory: Path, kept: list[re.Match[str]]) -> None:
        """An hour that is over: its compacted files as one (as far as ``rotate_bytes``
        allows), so that a day is read as 24 files."""
        kept.sort(key=lambda c: c[1])
        group: list[re.Match[str]] = []
        size = 0
        for c in kept:
            size += (directory / c[0]).stat().st_size
            if group and size > self.rotate_bytes:
                break
            group.append(c)
        if len(group) > 1:
            self._write(directory, group[0][1], max(c[2] for c in group), [c[0] for c in group])

    def _write(self, directory: Path, after: str, upto: str, inputs: list[str]) -> None:
        """Copy ``inputs`` into one compacted file of range (after, upto], rename it into
        place, then delete them (in that order: see the module's docstring)."""
        import pyarrow.parquet as pq

        from .lake import DICTIONARY, SCHEMA

        name = f"{COMPACTED}{after}-{upto}-{node_id(os.uname().nodename, os.getpid())}"
        name += f"-{os.urandom(6).hex()}.parquet"
        hidden = directory / f".tmp-{name}"
        try:
            with pq.ParquetWriter(hidden, SCHEMA, use_dictionary=DICTIONARY) as out:
                for source in inputs:
                    _copy(pq.ParquetFile(directory / source), out)
            os.replace(hidden, directory / name)
        except BaseException:
            hidden.unlink(missing_ok=True)
            raise
        for source in inputs:
            (directory / source).unlink(missing_ok=True)
        self.done["compactions"] += 1
        self.done["compacted_files"] += len(inputs)


def _copy(source: pq.ParquetFile, out: pq.ParquetWriter) -> None:
    import pyarrow as pa

    for batch in source.iter_batches(batch_size=BATCH_ROWS):
        out.write_table(pa.Table.from_batches([batch]))
