"""The lake kept up: the spill while the writer process is behind, compaction and
retention (spark_sink.spill, spark_sink.compact), with real files and processes.

Decided behaviour under test (docs/ANALYTICS.md, "The mirror", "Compaction and
retention"):

* While the writer process cannot take events (stopped here with SIGSTOP), the writer
  thread keeps emptying the queue into the spill on disk: nothing is dropped, and once
  the process runs again every event reaches the lake, once.
* A spill that is full drops (counted) and the drop is said in the lake.
* :func:`select` picks, from any listing a reader can see while a compaction runs
  (before its rename, between the rename and the deletes, after), files that hold
  every row exactly once.
* A compaction round turns old raw files into one compacted file per partition with
  the same rows, leaves young raw files alone, merges the compacted files of an hour
  that is over, and deletes partitions older than the retention.
"""

from __future__ import annotations

import datetime
import os
import signal
import time
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from spark_sink import compact, schema, synth
from spark_sink.mirror import Mirror, MirrorConfig
from spark_sink.spill import Spill

WAIT = 30.0
NOW = datetime.datetime(2026, 11, 27, 12, 30, tzinfo=datetime.UTC).timestamp()
HOUR = 3600.0


def ev(ts: float, n: int) -> schema.Event:
    return (ts, schema.PUBLISH, "default", "orders", "topic", f"a.{n}", None, f"m{n}", n,
            "alice", schema.OK, None, None)  # fmt: skip


def rows_of(paths: list[Path] | list[str]) -> Counter[tuple[object, ...]]:
    found: Counter[tuple[object, ...]] = Counter()
    for path in paths:
        for row in pq.read_table(path).to_pylist():
            found[row["message_id"], row["size"]] += 1
    return found


def test_the_spill_keeps_its_frames_in_order_within_its_limit(tmp_path: Path) -> None:
    spill = Spill(str(tmp_path / "spill"), limit=100)
    assert spill.push(b"a" * 40, 3)
    assert spill.push(b"b" * 40, 4)
    assert not spill.push(b"c" * 40, 5)  # past the limit: refused, nothing written
    assert (len(spill), spill.rows) == (2, 7)
    assert spill.pop() == (b"a" * 40, 3)
    assert spill.push(b"d" * 10, 1)
    assert [spill.pop(), spill.pop(), spill.pop()] == [(b"b" * 40, 4), (b"d" * 10, 1), None]
    assert (spill.rows, spill.size, spill.total_rows) == (0, 0, 8)
    assert os.listdir(tmp_path / "spill") == []  # an unnamed file: nothing to clean up
    spill.close()


def test_the_spill_file_never_grows_past_its_limit(tmp_path: Path) -> None:
    """A spill that is never empty (handed over a frame at a time while new ones come)
    reuses the head of its file: it stays within its limit and keeps every frame."""
    spill = Spill(str(tmp_path / "spill"), limit=1000)
    frames = [bytes([n % 256]) * 92 for n in range(100)]  # 100 bytes a frame on disk
    for frame in frames[:9]:
        assert spill.push(frame, 1)
    got = []
    for frame in frames[9:]:
        got.append(spill.pop())
        assert spill.push(frame, 1)
        assert spill._end <= 1000
        assert os.fstat(spill._file.fileno()).st_size <= 1000  # type: ignore[union-attr]
    while (found := spill.pop()) is not None:
        got.append(found)
    assert got == [(frame, 1) for frame in frames]
    spill.close()


def _stopped_writer(mirror: Mirror) -> int:
    """Start the writer process (one event), then stop it: it takes nothing more."""
    mirror.offer(ev(NOW, -1))
    assert mirror.flush(WAIT)
    process = mirror._writer._process
    assert process is not None
    assert process.pid is not None
    os.kill(process.pid, signal.SIGSTOP)
    return process.pid


def _spilling(tmp_path: Path, spill_bytes: int) -> Mirror:
    mirror = Mirror(
        MirrorConfig(
            lake=str(tmp_path / "lake"),
            queue=1000,
            poll_seconds=0.01,
            spill_dir=str(tmp_path / "spill"),
            spill_bytes=spill_bytes,
            rotate_seconds=3600,
        )
    )
    mirror.start()
    return mirror


def _taken(mirror: Mirror) -> None:
    deadline = time.monotonic() + WAIT
    while mirror.status()["queued"] and time.monotonic() < deadline:
        time.sleep(0.005)


def _offer_slowly(mirror: Mirror, count: int, chunk: int) -> None:
    """``count`` events, ``chunk`` at a time, each chunk once the thread took the last
    (the queue holds one chunk at most); returns once it took them all."""
    for start in range(0, count, chunk):
        _taken(mirror)
        for n in range(start, start + chunk):
            mirror.offer(ev(NOW, n))
    _taken(mirror)


def test_a_writer_process_that_is_behind_costs_no_event(tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    mirror = _spilling(tmp_path, 64 * 1024 * 1024)
    pid = _stopped_writer(mirror)
    try:
        _offer_slowly(mirror, 30_000, 1000)  # thirty times the queue
        status = mirror.status()
        assert status["dropped"] == 0
        assert status["spilled"] >= 30_000 - 1000 * 3  # all but what is in flight
        assert status["spill_bytes"] > 0
    finally:
        os.kill(pid, signal.SIGCONT)
    assert mirror.flush(WAIT)
    status = mirror.status()
    assert (status["spilled"], status["spill_bytes"], status["dropped"]) == (0, 0, 0)
    assert status["spilled_total"] >= 27_000
    assert mirror.stop(WAIT)
    got = rows_of(sorted(lake.rglob("part-*.parquet")))
    assert got == Counter({(f"m{n}", n): 1 for n in range(-1, 30_000)})


def test_a_full_spill_drops_counts_and_says_so_in_the_lake(tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    mirror = _spilling(tmp_path, 4096)  # a few frames of a hundred events
    pid = _stopped_writer(mirror)
    try:
        _offer_slowly(mirror, 20_000, 100)
        dropped = mirror.status()["dropped"]
        assert dropped > 0
    finally:
        os.kill(pid, signal.SIGCONT)
    assert mirror.stop(WAIT)
    table = pq.read_table(sorted(lake.rglob("part-*.parquet"))).to_pylist()
    marks = [r for r in table if r["event"] == schema.MIRROR_LOST]
    kept = [r for r in table if r["event"] == schema.PUBLISH]
    assert sum(r["size"] for r in marks) == mirror.status()["dropped"]
    assert len(kept) + sum(r["size"] for r in marks) == 20_001


def _names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def test_select_reads_each_row_once_at_every_moment_of_a_compaction() -> None:
    raw = [
        "part-20261127T100000Z-a-1-000000000001.parquet",
        "part-20261127T100500Z-a-1-000000000002.parquet",
        "part-20261127T101000Z-b-2-000000000003.parquet",
    ]
    hidden = ".tmp-part-20261127T101500Z-a-1-000000000004.parquet"
    first = "compact-19700101T000000Z-20261127T100500Z-a-1-00000000000a.parquet"
    assert compact.select([*raw, hidden]) == sorted(raw)  # before any compaction
    assert compact.select([first, *raw]) == sorted([first, raw[2]])  # renamed, not deleted
    assert compact.select([first, raw[2]]) == [first, raw[2]]  # after
    second = "compact-20261127T100500Z-20261127T101000Z-a-1-00000000000b.parquet"
    merged = "compact-19700101T000000Z-20261127T101000Z-a-1-00000000000c.parquet"
    assert compact.select([first, second]) == [first, second]  # ranges that follow
    assert compact.select([first, second, merged]) == [merged]  # a merge, renamed
    assert compact.select(["_compaction.lock", ".tmp-x", merged]) == [merged]
    assert compact.select(["someone-elses.parquet", merged]) == [merged, "someone-elses.parquet"]


def _lake_with_old_and_young_files(lake: Path) -> dict[str, Counter[tuple[object, ...]]]:
    """Hour 10 (over): six old files. Hour 12 (running): four files started half an hour
    to a quarter of an hour ago and two a minute ago. And a partition 40 days old."""
    n = 0
    rows: dict[str, list[schema.Event]] = {"old": [], "hour10": [], "hour12": []}
    for i in range(6):
        rows["hour10"] += [ev(NOW - 2.5 * HOUR + i * 60, n := n + 1) for _ in range(3)]
        synth.write(lake, rows["hour10"][-3:])
    for start in (NOW - 1790, NOW - 1780, NOW - 1000, NOW - 900, NOW - 60, NOW - 50):
        found = [ev(start, n := n + 1), ev(start + 1, n := n + 1)]
        rows["hour12"] += found
        synth.write(lake, found)
    rows["old"] = [ev(NOW - 40 * 86_400, n := n + 1)]
    synth.write(lake, rows["old"])
    return {key: rows_of_events(found) for key, found in rows.items()}


def rows_of_events(events: list[schema.Event]) -> Counter[tuple[object, ...]]:
    return Counter((e[7], e[8]) for e in events)


def test_a_round_compacts_old_files_merges_hours_that_are_over_and_expires(
    tmp_path: Path,
) -> None:
    lake = tmp_path / "lake"
    before = _lake_with_old_and_young_files(lake)
    hour10 = lake / schema.partition(NOW - 2.5 * HOUR)
    hour12 = lake / schema.partition(NOW)
    compactor = compact.Compactor(lake, compact_after=300, retention_days=30, rotate_bytes=1 << 30)
    every = before["hour10"] + before["hour12"]
    assert rows_of(compact.files_between(lake, NOW - 3 * HOUR, NOW + 1)) == every

    compactor.round(NOW)
    assert not (lake / schema.partition(NOW - 40 * 86_400)).exists()  # retention
    assert compactor.done["expired_partitions"] == 1
    (hour10_file,) = _names(hour10)
    assert hour10_file.startswith("compact-19700101T000000Z-")
    young = [n for n in _names(hour12) if n.startswith("part-")]
    assert len(young) == 2  # started a minute ago: left alone
    assert rows_of(compact.files_between(lake, NOW - 3 * HOUR, NOW + 1)) == every

    # A compacted file is cut at the cutoff; later rounds take what follows, and the
    # compacted files of an hour that is over become one.
    later = NOW + 3600 + 400
    compactor.round(later)
    assert [n[:8] for n in _names(hour12)] == ["compact-", "compact-"]
    compactor.round(later + 1)
    (merged,) = _names(hour12)
    assert merged.startswith("compact-19700101T000000Z-")
    assert rows_of([hour12 / merged]) == before["hour12"]
    assert rows_of(compact.files_between(lake, NOW - 3 * HOUR, NOW + 1)) == every
    assert compactor.done["compaction_errors"] == 0
    assert not list(lake.rglob(".tmp-*"))


def test_a_bad_file_stops_its_partition_only_and_dead_rounds_are_cleared(tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    before = _lake_with_old_and_young_files(lake)
    hour10 = lake / schema.partition(NOW - 2.5 * HOUR)
    hour12 = lake / schema.partition(NOW)
    (hour10 / "part-20261127T100100Z-x-1-0000000000ff.parquet").write_bytes(b"not parquet")
    dead = hour12 / ".tmp-compact-19700101T000000Z-20261127T120000Z-x-1-0000000000ee.parquet"
    dead.write_bytes(b"half a file")
    compactor = compact.Compactor(lake, compact_after=300, retention_days=30, rotate_bytes=1 << 30)
    compactor.round(NOW)
    assert compactor.done["compaction_errors"] == 1
    assert "Parquet magic bytes not found" in compactor.last_error
    assert not dead.exists()
    assert (
        rows_of([hour12 / n for n in _names(hour12) if n.startswith("compact-")])
        + rows_of([hour12 / n for n in _names(hour12) if n.startswith("part-")])
        == before["hour12"]
    )
    assert not list(hour10.glob("compact-*"))  # its inputs are all still there
    assert len(list(hour10.glob("part-*"))) == 7


def test_a_lake_locked_by_another_compactor_is_left_alone(tmp_path: Path) -> None:
    import fcntl

    lake = tmp_path / "lake"
    _lake_with_old_and_young_files(lake)
    files = sorted(lake.rglob("*.parquet"))
    with open(lake / compact.LOCK, "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        compact.Compactor(lake, compact_after=300, retention_days=30, rotate_bytes=1).round(NOW)
    assert sorted(lake.rglob("*.parquet")) == files


@pytest.mark.parametrize("lake", ["s3://bucket/lake", "hdfs://nn:8020/lake"])
def test_remote_lakes_are_not_compacted_here(lake: str) -> None:
    assert compact.local_lake(lake) is None
