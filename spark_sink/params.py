"""Analytics queries by name, and their parameters checked (docs/ANALYTICS.md, "Queries").

Theory of operation. A query is asked for by name with a few text parameters, from an
HTTP query string or the command line; this module turns them into a :class:`Params`
value or refuses them with a :class:`ValueError` whose text names the parameter and
what is wrong (the gateway answers it as a ``400``). It imports neither Spark nor the
gateway: the gateway checks parameters here, on its event loop, before anything is
sent to the Spark worker process, and the worker checks them again with the same code.

Times are ISO 8601 (``2026-11-21T10:00:00Z``; a time without an offset is UTC) or a
span back from now (``90s``, ``15m``, ``6h``, ``7d``). ``since`` defaults to one hour
before ``until``, ``until`` to now; the range is half-open, ``[since, until)``.
Buckets are a span too (``1m``, ``5m``, ``1h``), from 1 second to 1 day, and a range
holds at most :data:`MAX_BUCKETS` of them, so an answer's size is bounded.

:func:`cache_key` is the raw request, normalised: a cached answer for ``since=1h``
serves the same words again for as long as the cache keeps it, so a relative range is
as fresh as the cache allows, never fresher.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

UTC = datetime.UTC

THROUGHPUT: Final = "throughput"  # publish and deliver events per feed per bucket
LATENCY: Final = "latency"  # publish->deliver and publish->ack percentiles per feed
ADDRESSES: Final = "addresses"  # the busiest addresses
PRINCIPALS: Final = "principals"  # messages and bytes published per principal
FAILURES: Final = "failures"  # delivery failure and dead-letter rates per feed
BRIDGES: Final = "bridges"  # bridge_in and bridge_out per bridge per bucket
ROLLING: Final = "rolling"  # the streaming job's per-minute aggregates
QUERIES: Final = (THROUGHPUT, LATENCY, ADDRESSES, PRINCIPALS, FAILURES, BRIDGES, ROLLING)

KEYS: Final = frozenset(("since", "until", "feed", "bucket", "limit"))
DEFAULT_SPAN: Final = 3600.0  # seconds: since defaults to this long before until
DEFAULT_BUCKET: Final = 60
MAX_BUCKET: Final = 86_400
MAX_BUCKETS: Final = 10_000  # buckets in one range at most
MAX_RANGE: Final = 366 * 86_400.0  # seconds a range spans at most
DEFAULT_LIMIT: Final = 20
MAX_LIMIT: Final = 1_000
MAX_TEXT: Final = 200  # characters of one parameter at most

_SPAN = re.compile(r"([1-9][0-9]{0,6})([smhd])")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86_400}


@dataclass(frozen=True, slots=True, kw_only=True)
class Params:
    """One query's parameters, checked: ``[since, until)`` in UTC, an optional feed,
    a bucket size in seconds and a row limit for the top-N queries."""

    since: datetime.datetime
    until: datetime.datetime
    feed: str | None = None
    bucket: int = DEFAULT_BUCKET
    limit: int = DEFAULT_LIMIT

    def __post_init__(self) -> None:
        if self.since.tzinfo is None or self.until.tzinfo is None:
            raise ValueError("since and until must carry a time zone")
        span = (self.until - self.since).total_seconds()
        if span <= 0:
            raise ValueError("since must be before until")
        if span > MAX_RANGE:
            raise ValueError(f"the range spans more than {MAX_RANGE / 86_400:g} days")
        if not 1 <= self.bucket <= MAX_BUCKET:
            raise ValueError(f"bucket must be from 1 second to {MAX_BUCKET} seconds")
        if span / self.bucket > MAX_BUCKETS:
            raise ValueError(f"the range holds more than {MAX_BUCKETS} buckets: use a larger one")
        if not 1 <= self.limit <= MAX_LIMIT:
            raise ValueError(f"limit must be from 1 to {MAX_LIMIT}")
        if self.feed is not None and not 0 < len(self.feed) <= MAX_TEXT:
            raise ValueError(f"feed must be 1 to {MAX_TEXT} characters")

    def wire(self) -> dict[str, object]:
        """The parameters as JSON values (times as ISO 8601 UTC)."""
        return {
            "since": iso(self.since),
            "until": iso(self.until),
            "feed": self.feed,
            "bucket": self.bucket,
            "limit": self.limit,
        }

    @classmethod
    def from_wire(cls, data: Mapping[str, object]) -> Params:
        """The inverse of :meth:`wire` (the worker's side); ValueError when malformed."""
        feed, bucket, limit = data.get("feed"), data.get("bucket"), data.get("limit")
        if not isinstance(bucket, int) or not isinstance(limit, int):
            raise ValueError("bucket and limit must be integers")
        if feed is not None and not isinstance(feed, str):
            raise ValueError("feed must be a string")
        return cls(
            since=_instant(str(data.get("since")), "since"),
            until=_instant(str(data.get("until")), "until"),
            feed=feed,
            bucket=bucket,
            limit=limit,
        )


def iso(when: datetime.datetime) -> str:
    """``when`` in UTC as ISO 8601 with a ``Z`` (microseconds only when it has some)."""
    text = when.astimezone(UTC).isoformat()
    return text.removesuffix("+00:00") + "Z"


def span(text: str, name: str) -> int:
    """Seconds in a span such as ``90s``, ``15m``, ``6h`` or ``7d``."""
    found = _SPAN.fullmatch(text.strip())
    if found is None:
        raise ValueError(f"{name} must be a span such as 30s, 5m, 1h or 1d, not {text!r}")
    return int(found[1]) * _UNIT[found[2]]


def _instant(text: str, name: str, now: datetime.datetime | None = None) -> datetime.datetime:
    text = text.strip()
    if now is not None and _SPAN.fullmatch(text):
        return now - datetime.timedelta(seconds=span(text, name))
    try:
        when = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(
            f"{name} must be an ISO 8601 time (2026-11-21T10:00:00Z) or a span back "
            f"from now (15m, 6h, 7d), not {text!r}"
        ) from None
    return when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)


def check_query(name: str) -> str:
    if name not in QUERIES:
        raise ValueError(f"no query {name!r}: the queries are {', '.join(QUERIES)}")
    return name


def parse(raw: Mapping[str, str], now: datetime.datetime | None = None) -> Params:
    """Check the text parameters of a request; ValueError names the first bad one."""
    unknown = sorted(set(raw) - KEYS)
    if unknown:
        raise ValueError(f"unknown parameter {unknown[0]!r}: use {', '.join(sorted(KEYS))}")
    for key, value in raw.items():
        if len(value) > MAX_TEXT:
            raise ValueError(f"{key} is longer than {MAX_TEXT} characters")
    now = now or datetime.datetime.now(UTC)
    until = _instant(raw["until"], "until", now) if raw.get("until") else now
    if raw.get("since"):
        since = _instant(raw["since"], "since", now)
    else:
        since = until - datetime.timedelta(seconds=DEFAULT_SPAN)
    bucket = span(raw["bucket"], "bucket") if raw.get("bucket") else DEFAULT_BUCKET
    limit_text = raw.get("limit") or str(DEFAULT_LIMIT)
    if not limit_text.isdigit():
        raise ValueError(f"limit must be a whole number, not {limit_text!r}")
    return Params(
        since=since, until=until, feed=raw.get("feed") or None, bucket=bucket, limit=int(limit_text)
    )


def cache_key(query: str, raw: Mapping[str, str]) -> tuple[str, ...]:
    """The request as a cache key: its query and parameters, empty ones left out."""
    return (query, *(f"{k}={raw[k].strip()}" for k in sorted(raw) if raw[k].strip()))
