"""The traffic mirror alone (spark_sink): queue, writer thread, files in the lake.

Decided behaviour under test:

* Events offered are written as Parquet files of exactly the documented schema, under
  ``date=YYYY-MM-DD/hour=HH`` directories derived from ``ts`` in UTC, and read back
  with pyarrow's Hive partitioning as they were offered.
* Files appear whole: after a flush no hidden ``.tmp-`` file is left, and a reader
  listing the lake while it is written only ever finds files it can read whole.
* Files rotate by size and by time.
* A full queue drops events (counted) without waiting; an unwritable lake counts
  errors and lost rows, warns at most once a minute and keeps the thread alive.
"""

from __future__ import annotations

import datetime
import logging
import multiprocessing
import os
import re
import socket
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from feeds import EngineConfig
from feeds.config import SYSTEM_FEED
from feeds.engine import Engine
from feeds.mirroring import emit_feed, emit_publish
from feeds.model import Feed, StagedContent
from restms.specs import (
    EmbeddedContent,
    FeedSpec,
    JoinSpec,
    LinkedContent,
    MessageSpec,
    PipeOptions,
    PipeSpec,
)
from spark_sink import schema, writer
from spark_sink.lake import SCHEMA, RequestRows, record_batch
from spark_sink.mirror import Mirror, MirrorConfig, redact
from spark_sink.schema import Event

WAIT = 30.0  # seconds a flush or stop may take at most (loaded machines start writers slowly)
OWNER = "alice"
T0 = datetime.datetime(2026, 3, 4, 5, 59, 59, 250_000, tzinfo=datetime.UTC).timestamp()


def event(ts: float, n: int = 0, kind: str = schema.PUBLISH) -> Event:
    return (
        ts,
        kind,
        "default",
        "orders",
        "topic",
        f"eu.{n}",
        None if kind == schema.PUBLISH else "0123456789ab",
        f"id-{n}",
        n,
        "alice",
        schema.OK,
        1.5 if kind == schema.DELIVER else None,
        None,
    )


def started(lake: Path, **settings: float) -> Mirror:
    mirror = Mirror(MirrorConfig(lake=str(lake), **settings))  # type: ignore[arg-type]
    mirror.start()
    return mirror


def parquet_files(lake: Path) -> list[Path]:
    return sorted(p for p in lake.rglob("*") if p.is_file())


def read_lake(lake: Path) -> pa.Table:
    dataset = ds.dataset(lake, format="parquet", partitioning="hive")
    return dataset.to_table().sort_by([("ts", "ascending"), ("message_id", "ascending")])


def test_partition_and_names() -> None:
    assert schema.partition(T0) == "date=2026-03-04/hour=05"
    assert schema.partition(T0 + 1) == "date=2026-03-04/hour=06"
    name = schema.part_name(T0)
    node = schema.node_id(socket.gethostname(), os.getpid())
    assert re.fullmatch(rf"part-20260304T055959Z-{node}-[0-9a-f]{{12}}\.parquet", name)
    assert schema.temporary(name) == ".tmp-" + name
    assert schema.part_name(T0) != name  # a random tail
    assert schema.part_name(T0, "b-7").startswith("part-20260304T055959Z-b-7-")


@pytest.mark.parametrize(
    ("host", "node"),
    [
        ("gw1.example.com", "gw1-example-com-42"),
        ("../../etc/passwd", "etc-passwd-42"),
        ("nöde_1 ", "n-de-1-42"),
        ("", "host-42"),
        ("...", "host-42"),
        ("a" * 60, "a" * 40 + "-42"),
    ],
)
def test_node_ids_are_safe_in_file_names(host: str, node: str) -> None:
    assert schema.node_id(host, 42) == node
    assert set(schema.EVENTS) == {
        "publish",
        "route",
        "deliver",
        "ack",
        "redeliver",
        "expire",
        "dead_letter",
        "drop",
        "bridge_in",
        "bridge_out",
        "webhook_attempt",
        "mirror_lost",
    }


def test_events_round_trip_through_the_lake(tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    mirror = started(lake)
    offered = [event(T0, 1), event(T0 + 1, 2, schema.DELIVER), event(T0 + 3601, 3)]
    for item in offered:
        mirror.offer(item)
    assert mirror.stop(WAIT)
    files = parquet_files(lake)
    assert [f.relative_to(lake).parent.as_posix() for f in files] == [
        "date=2026-03-04/hour=05",
        "date=2026-03-04/hour=06",
        "date=2026-03-04/hour=07",
    ]
    assert all(
        re.fullmatch(r"part-\d{8}T\d{6}Z-[A-Za-z0-9-]+-\d+-[0-9a-f]{12}\.parquet", f.name)
        for f in files
    )
    for f in files:
        assert pq.read_schema(f).remove_metadata() == SCHEMA
    table = read_lake(lake)
    assert table.schema.names == [*schema.COLUMNS, "date", "hour"]
    rows = table.to_pylist()
    assert [r["message_id"] for r in rows] == ["id-1", "id-2", "id-3"]
    assert [r["hour"] for r in rows] == [5, 6, 7]
    assert {r["date"] for r in rows} == {"2026-03-04"}
    first, second = rows[0], rows[1]
    assert first["ts"] == datetime.datetime.fromtimestamp(T0, datetime.UTC)
    assert first["ts"].microsecond == 250_000
    assert (first["event"], first["feed"], first["feed_type"]) == ("publish", "orders", "topic")
    assert (first["address"], first["pipe"], first["size"]) == ("eu.1", None, 1)
    assert (first["principal"], first["outcome"], first["latency_ms"]) == ("alice", "ok", None)
    assert (second["pipe"], second["latency_ms"]) == ("0123456789ab", 1.5)
    status = mirror.status()
    assert (status["emitted"], status["dropped"], status["written"]) == (3, 0, 3)
    assert status["files"] == 3
    assert status["bytes"] == sum(f.stat().st_size for f in files)
    assert (status["errors"], status["lost"], status["open_files"]) == (0, 0, 0)


def test_flush_publishes_open_files_and_leaves_no_hidden_ones(tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    mirror = started(lake, rotate_seconds=3600)
    now = time.time()
    for n in range(10):
        mirror.offer(event(now, n))
    assert mirror.flush(WAIT)
    assert len(read_lake(lake)) == 10
    assert not [p for p in lake.rglob(".tmp-*")]
    mirror.offer(event(now, 10))
    assert mirror.flush(WAIT)
    assert len(read_lake(lake)) == 11
    assert mirror.status()["files"] == 2
    assert mirror.stop(WAIT)


def test_rotation_by_size(tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    mirror = started(lake, rotate_bytes=1, batch_rows=10, rotate_seconds=3600)
    for n in range(50):
        mirror.offer(event(T0 - 10, n))
    assert mirror.stop(WAIT)
    files = parquet_files(lake)
    assert len(files) == 5  # each batch of ten passes one byte: a file each
    assert [pq.ParquetFile(f).metadata.num_rows for f in files] == [10] * 5
    assert len(read_lake(lake)) == 50


def test_rotation_by_time(tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    mirror = started(lake, rotate_seconds=0.2, poll_seconds=0.05)
    deadline = time.monotonic() + WAIT
    n = 0
    while mirror.status()["files"] < 3 and time.monotonic() < deadline:
        mirror.offer(event(T0, n))
        n += 1
        time.sleep(0.02)
    files = mirror.status()["files"]
    assert files >= 3  # closed by age alone: no flush, no stop yet
    assert len(list(lake.rglob("part-*.parquet"))) >= files
    assert mirror.stop(WAIT)
    assert len(read_lake(lake)) == n


def test_a_reader_never_sees_a_partial_file(tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    lake.mkdir()
    mirror = started(lake, rotate_bytes=4096, batch_rows=50, poll_seconds=0.01)
    done = threading.Event()

    def produce() -> None:
        for n in range(20_000):
            mirror.offer(event(T0, n))
            if n % 500 == 0:
                time.sleep(0.005)
        done.set()

    producer = threading.Thread(target=produce)
    producer.start()
    reads = 0
    deadline = time.monotonic() + WAIT
    while (not done.is_set() or reads < 20) and time.monotonic() < deadline:
        for f in ds.dataset(lake, format="parquet", partitioning="hive").files:
            assert "/.tmp-" not in f
            pq.read_table(f)  # whole, or it would not be listed
            reads += 1
    producer.join(WAIT)
    assert mirror.stop(WAIT)
    assert reads > 0
    assert mirror.status()["files"] > 1
    assert len(read_lake(lake)) == 20_000


def test_a_full_queue_drops_and_counts_without_waiting(tmp_path: Path) -> None:
    mirror = Mirror(MirrorConfig(lake=str(tmp_path / "lake"), queue=100))  # not started
    began = time.perf_counter()
    for n in range(100_000):
        mirror.offer(event(T0, n))
    spent = time.perf_counter() - began
    status = mirror.status()
    assert (status["emitted"], status["dropped"], status["queued"]) == (100_000, 99_900, 100)
    assert spent < 1.0  # ten microseconds an event at most, full or not
    mirror.start()
    assert mirror.stop(WAIT)
    rows = read_lake(tmp_path / "lake").to_pylist()
    kept = [r for r in rows if r["event"] != schema.MIRROR_LOST]
    assert len(kept) == 100
    # The drop is said in the lake itself, so that a query of the range says it.
    (said,) = [r for r in rows if r["event"] == schema.MIRROR_LOST]
    assert (said["size"], said["outcome"], said["feed"]) == (99_900, "dropped", "")


def test_an_unwritable_lake_counts_errors_and_warns_rarely(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    lake = tmp_path / "lake"
    lake.write_text("a file where the lake's directory should be")
    mirror = started(lake, poll_seconds=0.01)
    with caplog.at_level(logging.WARNING, logger="spark_sink.writer"):
        for round_ in range(3):
            for n in range(5):
                mirror.offer(event(T0 + 3600 * round_, n))
            assert mirror.flush(WAIT)
    status = mirror.status()
    assert status["errors"] >= 3
    assert (status["written"], status["files"], status["lost"]) == (0, 0, 15)
    assert "lake" in status["last_error"]
    warnings = [r for r in caplog.records if r.name == "spark_sink.writer"]
    assert len(warnings) == 1
    lake.unlink()  # the lake comes back: the same thread writes again
    mirror.offer(event(T0, 99))
    assert mirror.stop(WAIT)
    assert mirror.status()["written"] == 1


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="mirror_queue"):
        MirrorConfig(lake="x", queue=0)
    with pytest.raises(ValueError, match="mirror_rotate_seconds"):
        MirrorConfig(lake="x", rotate_seconds=0)
    with pytest.raises(ValueError, match="mirror_lake"):
        MirrorConfig(lake="")


def test_lake_credentials_are_never_shown() -> None:
    assert redact("s3a://KEY:SECRET@bucket/lake") == "s3a://***@bucket/lake"
    assert redact("/var/lake") == "/var/lake"
    assert redact("hdfs://namenode:8020/lake") == "hdfs://namenode:8020/lake"


def test_a_dead_writer_process_is_counted_and_replaced(tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    mirror = started(lake, poll_seconds=0.01)
    mirror.offer(event(T0, 1))
    assert mirror.flush(WAIT)
    process = mirror._writer._process  # the process writing the lake now
    assert process is not None
    process.kill()
    process.join(WAIT)
    time.sleep(writer.RESTART)  # a new process may be started at once
    mirror.offer(event(T0, 2))
    assert mirror.flush(WAIT)
    status = mirror.status()
    assert status["errors"] >= 1
    assert "ended" in status["last_error"]
    assert mirror._writer._process not in (None, process)
    mirror.offer(event(T0, 3))
    assert mirror.stop(WAIT)
    rows = read_lake(lake).to_pylist()
    assert {r["message_id"] for r in rows} >= {"id-1", "id-3"}
    assert mirror.status()["written"] == len(rows)


def test_a_writer_process_that_cannot_start_is_counted_and_tried_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A signal to the gateway's whole process group (a service manager stopping it)
    ends the forkserver too, and a writer process started then fails with EOFError:
    the rows it was for are counted lost, and the mirror goes on, not its thread."""
    start = multiprocessing.process.BaseProcess.start
    failed: list[str] = []

    def start_once_failing(process: multiprocessing.process.BaseProcess) -> None:
        if process.name == "mirror-writer" and not failed:
            failed.append(process.name)
            raise EOFError("unexpected EOF")
        start(process)

    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", start_once_failing)
    lake = tmp_path / "lake"
    mirror = started(lake, poll_seconds=0.01)
    mirror.offer(event(T0, 1))
    mirror.flush(WAIT)
    assert failed
    status = mirror.status()
    assert status["errors"] >= 1
    assert "cannot start the lake writer: EOFError" in status["last_error"]
    assert status["lost"] == 1
    time.sleep(writer.RESTART)  # then a process may be started again
    mirror.offer(event(T0, 2))
    assert mirror.flush(WAIT)
    assert mirror.stop(WAIT)
    assert {r["message_id"] for r in read_lake(lake).to_pylist()} == {"id-2"}


# ---------------------------------------------------------------- publish request records
def _published(
    e: Engine, feed: Feed, messages: list[MessageSpec]
) -> tuple[list[tuple[Any, ...]], list[Event]]:
    """Publish through the engine with a sink that keeps what it is given (a request
    record for a batch, two events for one message); that, and the events the same
    publish means one by one (built with the per-event emitters from what the engine
    holds afterwards)."""
    items: list[tuple[Any, ...]] = []
    e.mirror = lambda item, rows=1: items.append(item)
    pipes = [p for p in e.pipes_of(OWNER)]
    before = {p: set(p.messages) for p in pipes}
    skipped = e.counters.skipped_full
    counts = e.publish(feed, messages, OWNER)
    e.mirror = None
    now = items[0][0]
    expected: list[Event] = []
    emit_publish(expected.append, now, feed, messages, counts, OWNER)
    for pipe in pipes:
        for seq, held in pipe.messages.items():
            if seq not in before[pipe]:
                emit_feed(
                    expected.append, "route", now, feed, held.spec, held.size, None, pipe=pipe
                )
    if e.counters.skipped_full > skipped:  # the copies full pipes skipped, as _room says
        for pipe in pipes:
            if pipe.max_messages == 1:  # the tests' full pipe: every copy past its first
                for spec in messages[1:] if not before[pipe] else messages:
                    # its head and contents, all embedded here
                    size = spec.head_size + sum(len(c.value) for c in spec.contents)
                    emit_feed(expected.append, "drop", now, feed, spec, size, None, "full", pipe)
        assert len(expected) - len(messages) - sum(
            len(p.messages) - len(before[p]) for p in pipes
        ) == (e.counters.skipped_full - skipped)
    if len(messages) > 1:
        (record,) = items
        assert record[1] == schema.REQUEST
        assert record[schema.ROWS] == len(expected)
    if any(item[1] == schema.ROUTED for item in items):  # one message, one copy
        (record,) = items
        published, routed = expected
        assert list(schema.routed_events(record)) == [routed, published]  # in order
    return items, expected


def _expanded(items: list[tuple[Any, ...]]) -> Counter[tuple[Any, ...]]:
    """The rows the items stand for, as the writer process makes them."""
    requests = RequestRows()
    events = []
    for item in items:
        if item[1] == schema.REQUEST:
            requests.add(item)  # type: ignore[arg-type]
        elif item[1] == schema.ROUTED:
            events += schema.routed_events(item)  # type: ignore[arg-type]
        else:
            events.append(item)
    found = _rows(record_batch(events))  # type: ignore[arg-type]
    if requests.rows:
        found += _rows(requests.batch())
    return found


def _rows(batch: pa.RecordBatch) -> Counter[tuple[Any, ...]]:
    return Counter(tuple(row.values()) for row in batch.to_pylist())


def test_a_request_record_expands_to_exactly_the_events_it_stands_for() -> None:
    """Duplicates, a staged content (whose route size counts it), two joins of one pipe
    matching one message (one copy), messages no join matches, headers, a dead letter's
    origin and the default feed (addresses shown as digests), a private feed."""
    e = Engine(EngineConfig())
    domain = e.domain("default")
    orders, _ = e.create_feed(domain, FeedSpec(name="orders", type="topic"), OWNER)
    private, _ = e.create_feed(domain, FeedSpec(name=None, type="fanout"), OWNER)
    first = e.create_pipe(domain, PipeSpec(), OWNER)
    second = e.create_pipe(domain, PipeSpec(), OWNER)
    for pipe, address in ((first, "eu.*"), (first, "*.1"), (second, "#")):
        e.create_join(pipe, JoinSpec(feed_path="/restms/feed/orders", address=address))
    e.create_join(second, JoinSpec(feed_path=f"/restms/resource/{private.key}"))
    staged = e.stage(orders, b"staged bytes", "text/plain", OWNER)
    again = e.stage(orders, b"more staged bytes", "text/plain", OWNER)
    text = (EmbeddedContent(value=b"hello", type="text/plain"),)
    origin = (("x-original-feed", "default"),)

    def linked(content: StagedContent) -> LinkedContent:
        return LinkedContent(path=f"/restms/resource/{content.key}")

    cases = [
        (
            orders,
            [
                MessageSpec(address="eu.1", props=(("message_id", "a"),), contents=text),
                MessageSpec(address="us.2", contents=text),
                MessageSpec(address="eu.1", props=(("message_id", "a"),), contents=text),
                MessageSpec(
                    address="eu.3",
                    contents=(*text, linked(staged)),
                ),
                MessageSpec(address="x.y", headers=(("x-original-feed", "default"),)),
            ],
        ),
        (orders, [MessageSpec(address="eu.9", contents=text)]),  # events: one message
        # one message, each way its publish event differs: a duplicate, a staged content
        # (not in its publish size), an origin header, the default feed's digest
        (orders, [MessageSpec(address="eu.1", props=(("message_id", "a"),), contents=text)]),
        (orders, [MessageSpec(address="eu.4", contents=(*text, linked(again)))]),
        (orders, [MessageSpec(address="x.z", headers=(("x-original-feed", "default"),))]),
        (e.default_feed, [MessageSpec(address=second.key, contents=text)]),
        (orders, [MessageSpec(address="eu.9"), MessageSpec(address="eu.8")]),  # two pipes
        (orders, [MessageSpec(address="eu.1"), MessageSpec(address="eu.1")]),  # one address
        # one address, from the default feed (a digest) or none, with an origin header
        (orders, [MessageSpec(address="eu.7", headers=origin) for _ in range(2)]),
        (orders, [MessageSpec(headers=origin, contents=text) for _ in range(2)]),
        (private, [MessageSpec(contents=text), MessageSpec(address="b")]),
        (e.default_feed, [MessageSpec(address=first.key), MessageSpec(address="nobody")]),
    ]
    # A pipe that holds one message: the first copy fits, every later one is skipped
    # ("drop", outcome "full", in the record too), when it is the only pipe or one of two.
    tiny, _ = e.create_feed(domain, FeedSpec(name="tiny", type="fanout"), OWNER)
    full = e.create_pipe(domain, PipeSpec(options=PipeOptions(max_messages=1)), OWNER)
    e.create_join(full, JoinSpec(feed_path="/restms/feed/tiny"))
    cases += [
        (tiny, [MessageSpec(address="t.1", contents=text), MessageSpec(address="t.2")]),
        (tiny, [MessageSpec(address="t.3", contents=text), MessageSpec(address="t.4")]),
    ]
    # One message object twice in a request (its skipped copies: its first place), and
    # messages two joins of one pipe match (one copy, a count of two) after messages
    # in no pipe, among others: each message's copies are its count, less those joins.
    again_and_again = MessageSpec(address="t.5", contents=text)
    cases.append((tiny, [again_and_again, MessageSpec(address="t.6"), again_and_again]))
    mixed, _ = e.create_feed(domain, FeedSpec(name="mixed", type="topic"), OWNER)
    third = e.create_pipe(domain, PipeSpec(), OWNER)
    for pipe, address in ((third, "eu.*"), (third, "*.1"), (first, "*.1")):
        e.create_join(pipe, JoinSpec(feed_path="/restms/feed/mixed", address=address))
    twice = MessageSpec(address="eu.1", contents=text)
    cases.append(
        (
            mixed,
            [
                MessageSpec(address="eu.2", contents=text),
                MessageSpec(address="no.where"),
                twice,
                MessageSpec(address="no.2"),
                MessageSpec(address="us.1"),
                twice,
                MessageSpec(address="eu.5", props=(("message_id", "m5"),)),
                MessageSpec(address="eu.5", props=(("message_id", "m5"),)),
            ],
        )
    )
    for feed, messages in cases:
        items, expected = _published(e, feed, messages)
        assert _expanded(items) == _rows(record_batch(expected))
    assert first.messages
    assert second.messages


def test_one_message_in_one_pipe_is_one_record_of_its_two_events() -> None:
    """A message whose one copy goes to one pipe: one Routed record (two rows), which
    expands to its route event then its publish event, each way they can differ: a
    message id, a staged content (in the route's size, not the publish's), an origin
    header and the default feed (addresses as digests), a private feed, a queueing
    feed. A duplicate, a copy in no pipe or in two, or a skipped copy: events."""
    e = Engine(EngineConfig())
    domain = e.domain("default")
    orders, _ = e.create_feed(domain, FeedSpec(name="orders", type="topic"), OWNER)
    private, _ = e.create_feed(domain, FeedSpec(name=None, type="fanout"), OWNER)
    work, _ = e.create_feed(domain, FeedSpec(name="work", type="rotator"), OWNER)
    tiny, _ = e.create_feed(domain, FeedSpec(name="tiny", type="fanout"), OWNER)
    first = e.create_pipe(domain, PipeSpec(), OWNER)
    second = e.create_pipe(domain, PipeSpec(), OWNER)
    full = e.create_pipe(domain, PipeSpec(options=PipeOptions(max_messages=1)), OWNER)
    e.create_join(first, JoinSpec(feed_path="/restms/feed/orders", address="eu.*"))
    e.create_join(second, JoinSpec(feed_path="/restms/feed/orders", address="#"))
    e.create_join(second, JoinSpec(feed_path=f"/restms/resource/{private.key}"))
    e.create_join(second, JoinSpec(feed_path="/restms/feed/work"))
    e.create_join(full, JoinSpec(feed_path="/restms/feed/tiny"))
    staged = e.stage(orders, b"staged bytes", "text/plain", OWNER)
    text = (EmbeddedContent(value=b"hello", type="text/plain"),)
    one = [
        (orders, MessageSpec(address="us.1", contents=text)),
        (orders, MessageSpec(address="us.2", props=(("message_id", "m"),), contents=text)),
        (
            orders,
            MessageSpec(
                address="us.3",
                contents=(*text, LinkedContent(path=f"/restms/resource/{staged.key}")),
            ),
        ),
        (orders, MessageSpec(address="x.z", headers=(("x-original-feed", "default"),))),
        (e.default_feed, MessageSpec(address=second.key, contents=text)),
        (private, MessageSpec(contents=text)),
        (work, MessageSpec(address="w", contents=text)),
        (tiny, MessageSpec(address="t.1", contents=text)),
    ]
    for feed, spec in one:
        items, expected = _published(e, feed, [spec])
        assert [item[1] for item in items] == [schema.ROUTED]
        assert _expanded(items) == _rows(record_batch(expected))
    others = [
        (orders, MessageSpec(address="us.2", props=(("message_id", "m"),), contents=text)),
        (orders, MessageSpec(address="eu.1", contents=text)),  # two pipes
        (tiny, MessageSpec(address="t.2", contents=text)),  # skipped: the pipe is full
        (private, MessageSpec(contents=text)),
    ]
    e.delete_join(next(j for j in second.joins.values() if j.feed is private))  # no pipe
    for feed, spec in others:
        items, expected = _published(e, feed, [spec])
        assert schema.ROUTED not in [item[1] for item in items]
        assert _expanded(items) == _rows(record_batch(expected))


def test_request_records_and_events_share_a_file(tmp_path: Path) -> None:
    """Through the queue, the writer thread and process: counted as the rows they
    stand for, written with the events around them."""
    e = Engine(EngineConfig())
    domain = e.domain("default")
    orders, _ = e.create_feed(domain, FeedSpec(name="orders", type="fanout"), OWNER)
    e.create_join(
        e.create_pipe(domain, PipeSpec(), OWNER), JoinSpec(feed_path="/restms/feed/orders")
    )
    mirror = started(tmp_path / "lake")
    e.mirror = mirror.sink
    mirror.offer(event(T0, 1))
    e.publish(orders, [MessageSpec(address=f"a.{n}") for n in range(50)], OWNER)
    for n in range(3):  # one message each: a Routed record of two rows
        e.publish(orders, [MessageSpec(address="b", props=(("message_id", f"b{n}"),))], OWNER)
    mirror.offer(event(T0, 2))
    e.mirror = None
    assert mirror.stop(WAIT)
    status = mirror.status()
    assert (status["emitted"], status["queued"], status["written"]) == (108, 0, 108)
    rows = read_lake(tmp_path / "lake").to_pylist()
    assert Counter(r["event"] for r in rows) == {"publish": 55, "route": 53}
    alone = [r for r in rows if r["message_id"] == "b1"]  # route then publish, as events
    assert [(r["event"], r["principal"], r["pipe"] is None) for r in alone] == [
        ("route", None, False),
        ("publish", OWNER, True),
    ]


def test_a_routed_record_is_queued_and_dropped_as_two_rows(tmp_path: Path) -> None:
    e = Engine(EngineConfig())
    domain = e.domain("default")
    orders, _ = e.create_feed(domain, FeedSpec(name="orders", type="fanout"), OWNER)
    e.create_join(
        e.create_pipe(domain, PipeSpec(), OWNER), JoinSpec(feed_path="/restms/feed/orders")
    )
    mirror = Mirror(MirrorConfig(lake=str(tmp_path / "lake"), queue=3))  # not started
    e.mirror = mirror.sink
    for _ in range(2):  # two rows fit, four do not
        e.publish(orders, [MessageSpec(address="a")], OWNER)
    status = mirror.status()
    assert (status["emitted"], status["dropped"], status["queued"]) == (4, 2, 2)
    mirror.start()
    assert mirror.stop(WAIT)
    assert (mirror.status()["written"], mirror.status()["queued"]) == (3, 0)  # and the mark
    events = sorted(read_lake(tmp_path / "lake")["event"].to_pylist())
    assert events == ["mirror_lost", "publish", "route"]


def test_a_system_event_routed_during_a_publish_is_mirrored_as_its_own() -> None:
    """A full pipe's "pipe.full" event is routed to the system feed at once, while the
    publish that found the pipe full collects its copies (or holds its route event):
    that copy is the system feed's route event, not one of the publish's."""
    e = Engine(EngineConfig())
    domain = e.domain("default")
    watcher = e.create_pipe(domain, PipeSpec(), OWNER)
    e.create_join(watcher, JoinSpec(feed_path=f"/restms/feed/{SYSTEM_FEED}", address="#"))
    orders, _ = e.create_feed(domain, FeedSpec(name="orders", type="fanout"), OWNER)
    options = PipeOptions(max_messages=1, overflow="drop-oldest")
    e.create_join(
        e.create_pipe(domain, PipeSpec(options=options), OWNER),
        JoinSpec(feed_path="/restms/feed/orders"),
    )
    items: list[tuple[Any, ...]] = []
    e.mirror = lambda item, rows=1: items.append(item)
    e.publish(orders, [MessageSpec(address="a"), MessageSpec(address="b")], OWNER)
    e.events.coalescer.interval = 0  # type: ignore[union-attr]  # every time it is full
    e.publish(orders, [MessageSpec(address="c")], OWNER)
    system = [item for item in items if item[3] == SYSTEM_FEED]
    assert [item[1] for item in system] == ["route", "route"]
    kinds = [item[1] for item in items]
    assert kinds == ["drop", "route", schema.REQUEST, "drop", "route", schema.ROUTED]
    assert items[2][schema.ROWS] == 4  # two publish events, two routes: no system copy


def test_a_publish_of_no_message_makes_no_event() -> None:
    """The engine's callers (bridges too) may hand over an empty list: nothing to mirror."""
    e = Engine(EngineConfig())
    feed, _ = e.create_feed(e.domain("default"), FeedSpec(name="quiet", type="fanout"), OWNER)
    items: list[tuple[Any, ...]] = []
    e.mirror = lambda item, rows=1: items.append(item)
    assert e.publish(feed, [], OWNER) == []
    assert items == []
