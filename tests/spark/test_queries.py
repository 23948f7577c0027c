"""The batch queries in Spark against a synthetic lake whose answers are known.

Decided behaviour under test (docs/ANALYTICS.md, "Queries"):

* Every query's rows equal a plain-Python reference over the same events: exact
  counts, bytes, rates, and latency percentiles by nearest rank (the documented
  ``percentile_approx`` definition, exact on small data).
* The range is half-open and in UTC; older events, other feeds and duplicates are
  not counted; buckets start at whole multiples of their size.
* Counts agree with pyarrow reading the same files, and a range of one hour reads
  only that hour's partition.
* A lake that does not exist yet answers no rows.
* Every answer says how many events the mirror dropped in its range (``lost``).
* A compaction that deletes the files a query listed does not change its answer.
"""

from __future__ import annotations

import datetime
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.dataset as ds
import pytest

import main
from spark_sink import compact, queries, schema, synth
from spark_sink.params import UTC
from tests.spark import lake

pytestmark = [pytest.mark.spark, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def events() -> list[lake.Row]:
    return lake.rows()


@pytest.fixture(scope="module")
def lake_dir(tmp_path_factory: pytest.TempPathFactory, events: list[lake.Row]) -> Path:
    directory = tmp_path_factory.mktemp("lake")
    synth.write(directory, events)
    return directory


@pytest.mark.parametrize("query", sorted(queries.BATCH))
def test_every_query_matches_the_reference(spark, lake_dir, events, query):
    p = lake.params()
    result = queries.run(spark, str(lake_dir), query, p)
    assert list(result.rows) == lake.expected(query, events, p)
    assert result.rows  # the data set exercises every query
    assert len(result.columns) == len(result.rows[0])


def test_one_feed_one_hour_and_a_bigger_bucket(spark, lake_dir, events):
    hour11 = datetime.datetime.fromtimestamp(lake.T0 + 3600, UTC)
    p = lake.params(since=hour11, until=hour11 + datetime.timedelta(hours=1), bucket=3600)
    got = queries.run(spark, str(lake_dir), "throughput", p)
    assert list(got.rows) == [("2026-11-21T11:00:00Z", "alerts", 3, 3, 30)]
    p = lake.params(feed="orders", bucket=300)
    got = queries.run(spark, str(lake_dir), "throughput", p)
    assert list(got.rows) == [("2026-11-21T10:00:00Z", "orders", 6, 12, 615)]
    assert got.rows == tuple(lake.expected("throughput", events, p))
    latency = queries.run(spark, str(lake_dir), "latency", lake.params(feed="alerts"))
    assert latency.rows == (("alerts", 3, 200.0, 300.0, 300.0, 300.0, 200.0, 0, None, None, None),)
    top = queries.run(spark, str(lake_dir), "addresses", lake.params(limit=1))
    assert top.rows == (("orders", "eu.new", 4, 406),)


def test_the_range_is_half_open_and_excludes_the_day_before(spark, lake_dir):
    start = datetime.datetime.fromtimestamp(lake.T0, UTC)
    p = lake.params(since=start, until=start + datetime.timedelta(seconds=30))
    rows = queries.run(spark, str(lake_dir), "principals", p).rows
    assert rows == (("alice", 1, 100),)  # the publish at T0+30 is the next range's
    everything = lake.params(since=start - datetime.timedelta(days=2))
    rows = queries.run(spark, str(lake_dir), "principals", everything).rows
    assert ("old", 1, 100) in rows


def test_counts_agree_with_pyarrow_and_hours_are_pruned(spark, lake_dir):
    table = ds.dataset(lake_dir, format="parquet", partitioning="hive").to_table()
    assert set(schema.COLUMNS) <= set(table.schema.names)
    delivers = pc.sum(pc.equal(table["event"], schema.DELIVER)).as_py()
    p = lake.params()
    rows = queries.run(spark, str(lake_dir), "throughput", p).rows
    assert sum(r[3] for r in rows) == delivers == 15


def test_other_hours_are_never_opened(spark, tmp_path, events):
    """A range of one hour reads that hour's partition only: a corrupt file in another
    hour breaks a query that reaches it and no other."""
    synth.write(tmp_path, events)
    (tmp_path / "date=2026-11-21" / "hour=11" / "part-corrupt.parquet").write_bytes(b"not parquet")
    hour10 = datetime.datetime.fromtimestamp(lake.T0, UTC)
    p = lake.params(since=hour10, until=hour10 + datetime.timedelta(hours=1))
    rows = queries.run(spark, str(tmp_path), "throughput", p).rows
    assert sum(r[2] for r in rows) == 6
    with pytest.raises(Exception, match=r"(?i)parquet"):
        queries.run(spark, str(tmp_path), "throughput", lake.params())


def test_a_lake_not_made_yet_has_no_rows(spark, tmp_path):
    for query in queries.BATCH:
        assert queries.run(spark, str(tmp_path / "none"), query, lake.params()).rows == ()


def test_the_command_line_prints_a_table(spark, lake_dir, capsys):
    argv = ["analytics", "throughput", "--lake", str(lake_dir), "--bucket", "1h"]
    argv += ["--since", "2026-11-21T10:00:00Z", "--until", "2026-11-21T12:00:00"]
    assert main.main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["bucket", "feed", "published", "delivered", "bytes"]
    assert lines[2].split() == ["2026-11-21T10:00:00Z", "orders", "6", "12", "615"]
    assert lines[3].split() == ["2026-11-21T11:00:00Z", "alerts", "3", "3", "30"]
    assert lines[4] == "(2 rows; 2026-11-21T10:00:00Z to 2026-11-21T12:00:00Z)"
    assert main.main([*argv, "--json"]) == 0
    assert '"published"' in capsys.readouterr().out
    assert main.main(["analytics", "latency", "--since", "soon"]) == 2
    assert "since must be an ISO 8601 time" in capsys.readouterr().err


def test_every_answer_says_what_the_mirror_dropped_in_its_range(spark, tmp_path, events):
    """A ``mirror_lost`` row counts in ``lost`` (whatever the feed asked for) and in no
    query's rows."""
    synth.write(tmp_path, [*events, schema.lost_event(lake.T0 + 50, 7)])
    for query in sorted(queries.BATCH):
        result = queries.run(spark, str(tmp_path), query, lake.params())
        assert list(result.rows) == lake.expected(query, events, lake.params()), query
        assert result.lost == 7
        assert result.wire()["lost"] == 7
    one_feed = queries.run(spark, str(tmp_path), "throughput", lake.params(feed="alerts"))
    assert one_feed.lost == 7
    later = datetime.datetime.fromtimestamp(lake.T0 + 3600, UTC)
    assert queries.run(spark, str(tmp_path), "latency", lake.params(since=later)).lost == 0
    assert "7 events the mirror dropped are not counted" in one_feed.table()


def test_queries_answer_while_the_lake_is_compacted(spark, tmp_path, events, monkeypatch):
    """A compaction round that deletes the files a query listed, between its listing and
    its reading: the query lists again and answers exactly; after the round the
    compacted files give the same answers."""
    for row in events:  # a raw file per event: the lake compaction exists for
        synth.write(tmp_path, [row])
    compactor = compact.Compactor(
        tmp_path, compact_after=60, retention_days=0, rotate_bytes=1 << 30
    )
    listed = compact.files_between
    rounds = []

    def listing_then_compaction(root, since, until):
        found = listed(root, since, until)
        if not rounds:  # the first listing only: then the files it named are gone
            rounds.append(compactor.round(lake.T0 + 3 * 3600))
        return found

    monkeypatch.setattr(compact, "files_between", listing_then_compaction)
    p = lake.params()
    result = queries.run(spark, str(tmp_path), "failures", p)
    assert rounds
    assert compactor.done["compacted_files"] == len(events) - 1  # all but the day before
    assert list(result.rows) == lake.expected("failures", events, p)
    monkeypatch.undo()
    assert not list(tmp_path.rglob("date=2026-11-21/*/part-*"))
    for query in sorted(queries.BATCH):
        assert list(queries.run(spark, str(tmp_path), query, p).rows) == lake.expected(
            query, events, p
        )
