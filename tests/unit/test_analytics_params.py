"""Analytics query parameters (spark_sink.params): what is accepted and what is refused.

Decided behaviour under test (docs/ANALYTICS.md, "Queries"): times are ISO 8601 (UTC
when no offset is given) or a span back from now; since defaults to an hour before
until; buckets are spans from 1 s to 1 day; a range holds at most 10,000 buckets and
spans at most 366 days; unknown parameters, bad values and reversed ranges are
refused with a reason naming the parameter; the cache key is the normalised request.
"""

from __future__ import annotations

import datetime

import pytest

from spark_sink.params import UTC, Params, cache_key, check_query, iso, parse

NOW = datetime.datetime(2026, 11, 21, 12, 0, tzinfo=UTC)


def test_defaults_and_relative_times():
    p = parse({}, NOW)
    assert (p.since, p.until, p.feed, p.bucket, p.limit) == (
        NOW - datetime.timedelta(hours=1), NOW, None, 60, 20
    )  # fmt: skip
    p = parse({"since": "90m", "until": "30s", "bucket": "5m", "feed": "orders"}, NOW)
    assert p.since == NOW - datetime.timedelta(minutes=90)
    assert p.until == NOW - datetime.timedelta(seconds=30)
    assert (p.bucket, p.feed) == (300, "orders")


def test_iso_times_are_utc_and_round_trip():
    p = parse({"since": "2026-11-21T10:00:00", "until": "2026-11-21T12:30:00+02:00"}, NOW)
    assert p.since == datetime.datetime(2026, 11, 21, 10, tzinfo=UTC)
    assert iso(p.until) == "2026-11-21T10:30:00Z"
    assert Params.from_wire(p.wire()) == p


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        ({"sinse": "1h"}, "unknown parameter 'sinse'"),
        ({"since": "yesterday"}, "since must be an ISO 8601 time"),
        ({"since": "1h", "until": "2h"}, "since must be before until"),
        ({"bucket": "0m"}, "bucket must be a span"),
        ({"bucket": "2d"}, "bucket must be from 1 second"),
        ({"since": "30d", "bucket": "1s"}, "more than 10000 buckets"),
        ({"since": "400d", "bucket": "1d"}, "more than 366 days"),
        ({"limit": "0"}, "limit must be from 1"),
        ({"limit": "ten"}, "limit must be a whole number"),
        ({"feed": "x" * 201}, "feed is longer than 200"),
    ],
)
def test_bad_parameters_are_refused_with_a_reason(raw, reason):
    with pytest.raises(ValueError, match=reason):
        parse(raw, NOW)


def test_query_names_and_cache_keys():
    assert check_query("latency") == "latency"
    with pytest.raises(ValueError, match="no query 'latencies'"):
        check_query("latencies")
    assert cache_key("latency", {"since": " 1h", "feed": "", "bucket": "1m"}) == (
        "latency", "bucket=1m", "since=1h"
    )  # fmt: skip
