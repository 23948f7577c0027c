"""A small synthetic lake whose every answer is known, and reference answers computed
from the same rows in plain Python (an implementation independent of Spark's)."""

from __future__ import annotations

import datetime
import math
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from spark_sink import schema
from spark_sink.params import UTC, Params, iso

T0 = datetime.datetime(2026, 11, 21, 10, 0, tzinfo=UTC).timestamp()
Row = schema.Event


def ev(
    ts: float,
    event: str,
    feed: str = "orders",
    *,
    address: str | None = "eu.new",
    principal: str | None = None,
    size: int = 100,
    outcome: str = "ok",
    latency: float | None = None,
    bridge: str | None = None,
    pipe: str | None = None,
) -> Row:
    kind = "fanout" if feed == "alerts" else "topic"
    return (ts, event, "default", feed, kind, address, pipe, "m", size, principal, outcome,
            latency, bridge)  # fmt: skip


def rows() -> list[Row]:
    """Two feeds over two hours, with every kind of event, and one a day earlier."""
    found: list[Row] = []
    latency = 0.0
    for i in range(6):  # orders: two publishes a minute, minutes 0-2 of hour 10
        ts = T0 + i * 30
        who, where = ("alice", "eu.new") if i < 4 else ("bob", "us.new")
        found.append(ev(ts, schema.PUBLISH, address=where, principal=who, size=100 + i))
        for pipe in ("sha256 aaaaaaaaaaaa", "sha256 bbbbbbbbbbbb"):
            latency += 1.25
            found.append(ev(ts + 0.1, schema.ROUTE, address=where, pipe=pipe))
            found.append(ev(ts + 1, schema.DELIVER, address=where, pipe=pipe, latency=latency))
            found.append(ev(ts + 2, schema.ACK, address=where, pipe=pipe, latency=latency + 0.5))
    found += [
        ev(T0 + 5, schema.PUBLISH, principal="alice", outcome="duplicate"),
        ev(T0 + 40, schema.REDELIVER),
        ev(T0 + 41, schema.EXPIRE, outcome="expired"),
        ev(T0 + 42, schema.DEAD_LETTER, outcome="max-deliveries"),
        ev(T0 + 43, schema.DROP, outcome="full"),
        ev(T0 + 44, schema.WEBHOOK_ATTEMPT, outcome="503"),
        ev(T0 + 45, schema.WEBHOOK_ATTEMPT),
        ev(T0 + 60, schema.BRIDGE_IN, bridge="amqp-in", size=7),
        ev(T0 + 61, schema.BRIDGE_IN, bridge="amqp-in", size=8),
    ]
    for i, ms in enumerate((100.0, 300.0, 200.0)):  # alerts: hour 11
        ts = T0 + 3600 + 120 + i
        found.append(ev(ts, schema.PUBLISH, "alerts", address=None, principal="carol", size=10))
        found.append(ev(ts + 0.5, schema.DELIVER, "alerts", address=None, latency=ms))
    found.append(ev(T0 + 3600 + 10, schema.BRIDGE_OUT, "alerts", bridge="zmq-out", size=9))
    found.append(ev(T0 - 86_400, schema.PUBLISH, principal="old"))  # a day earlier
    return found


def params(**given: Any) -> Params:
    values: dict[str, Any] = {
        "since": datetime.datetime.fromtimestamp(T0 - 600, UTC),
        "until": datetime.datetime.fromtimestamp(T0 + 7200, UTC),
        "bucket": 60,
    }
    values.update(given)
    return Params(**values)


def _within(r: Row, p: Params) -> bool:
    ok = p.since.timestamp() <= r[0] < p.until.timestamp()
    return ok and p.feed in (None, r[3])


def _when(ts: float, bucket: int) -> str:
    start = math.floor(ts / bucket) * bucket
    return iso(datetime.datetime.fromtimestamp(start, UTC))


def nearest_rank(values: Sequence[float], share: float) -> float:
    """The smallest value with at least ``share`` of the values at or below it."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(share * len(ordered)) - 1)]


def expected(query: str, found: list[Row], p: Params) -> list[tuple[Any, ...]]:
    """The reference answer of ``query`` over ``found``."""
    inside = [r for r in found if _within(r, p)]
    published = [r for r in inside if r[1] == schema.PUBLISH and r[10] == schema.OK]
    if query == "throughput":
        acc: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0, 0])
        for r in inside:
            if r[1] == schema.PUBLISH and r[10] == schema.OK:
                cell = acc[_when(r[0], p.bucket), r[3]]
                cell[0] += 1
                cell[2] += r[8]
            elif r[1] == schema.DELIVER:
                acc[_when(r[0], p.bucket), r[3]][1] += 1
        return [(b, f, *v) for (b, f), v in sorted(acc.items())]
    if query == "latency":
        out = []
        for feed in sorted({r[3] for r in inside if r[1] in (schema.DELIVER, schema.ACK)}):
            d = [r[11] for r in inside if r[3] == feed and r[1] == schema.DELIVER]
            a = [r[11] for r in inside if r[3] == feed and r[1] == schema.ACK]
            ps = (0.5, 0.9, 0.99)
            out.append(
                (feed, len(d), *(nearest_rank(d, s) for s in ps), max(d), sum(d) / len(d),
                 len(a), *((nearest_rank(a, s) for s in ps) if a else (None,) * 3))
            )  # fmt: skip
        return out
    if query in ("addresses", "principals"):
        column = 5 if query == "addresses" else 9
        tops: dict[tuple[Any, ...], list[int]] = defaultdict(lambda: [0, 0])
        for r in published:
            if r[column] is not None:
                key = (r[3], r[5]) if query == "addresses" else (r[9],)
                tops[key][0] += 1
                tops[key][1] += r[8]
        ranked = sorted(tops.items(), key=lambda kv: (-kv[1][0], -kv[1][1], kv[0]))
        return [(*k, *v) for k, v in ranked[: p.limit]]
    if query == "failures":
        out = []
        for feed in sorted({r[3] for r in inside}):
            mine = [r for r in inside if r[3] == feed]

            def n(event: str, rows: list[Row] = mine) -> int:
                return sum(1 for r in rows if r[1] == event)

            pub = sum(1 for r in mine if r[1] == schema.PUBLISH and r[10] == schema.OK)
            hook = sum(1 for r in mine if r[1] == schema.WEBHOOK_ATTEMPT and r[10] != "ok")
            routed, dropped, dead = n(schema.ROUTE), n(schema.DROP), n(schema.DEAD_LETTER)
            lost = n(schema.EXPIRE) + dead + dropped

            def rate(a: int, b: int) -> float | None:
                return a / b if b else None

            out.append(
                (feed, pub, routed, n(schema.DELIVER), n(schema.ACK), n(schema.REDELIVER),
                 n(schema.EXPIRE), dead, dropped, hook, rate(lost, routed + dropped),
                 rate(dead, routed), rate(n(schema.REDELIVER), n(schema.DELIVER)))
            )  # fmt: skip
        return out
    if query == "bridges":
        acc = defaultdict(lambda: [0, 0, 0, 0])
        for r in inside:
            if r[12] is None or r[1] not in (schema.BRIDGE_IN, schema.BRIDGE_OUT):
                continue
            cell = acc[_when(r[0], p.bucket), r[12]]
            side = 0 if r[1] == schema.BRIDGE_IN else 1
            cell[side] += 1
            cell[2 + side] += r[8]
        return [(b, name, *v) for (b, name), v in sorted(acc.items())]
    raise AssertionError(query)
