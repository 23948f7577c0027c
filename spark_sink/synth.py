"""Synthetic traffic events written to a lake, for tests and benchmarks.

Theory of operation. The files are laid out exactly as the mirror lays them out
(:mod:`spark_sink.schema`: ``date=/hour=`` partitions, written under a hidden name and
renamed), so the queries cannot tell them from real traffic. :func:`write` takes
event tuples as the engine emits them. :func:`generate` makes a large lake fast with
pyarrow alone: one block of random events is built in Python once, then copied with
its timestamps shifted, one file per hour.
"""

from __future__ import annotations

import os
import random
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from . import schema
from .lake import SCHEMA

BLOCK = 100_000  # events built in Python; the rest are shifted copies


def _put(table: pa.Table, directory: Path, start: float) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    name = schema.part_name(start)
    hidden = directory / schema.temporary(name)
    pq.write_table(table, hidden)
    os.replace(hidden, directory / name)
    return directory / name


def table(rows: Sequence[schema.Event]) -> pa.Table:
    """Event tuples as an Arrow table of the lake's schema."""
    columns: list[Any] = list(zip(*rows, strict=True)) if rows else [[]] * len(schema.COLUMNS)
    micros = [round(ts * 1_000_000) for ts in columns[schema.TS]]
    arrays = [pa.array(micros, pa.int64()).cast(SCHEMA.field("ts").type)]
    for index, name in enumerate(schema.COLUMNS[1:], start=1):
        arrays.append(pa.array(columns[index], SCHEMA.field(name).type))
    return pa.Table.from_arrays(arrays, schema=SCHEMA)


def write(lake: Path, rows: Iterable[schema.Event]) -> list[Path]:
    """Write events into the lake, one new file per partition they fall in."""
    parts: dict[str, list[schema.Event]] = defaultdict(list)
    for row in rows:
        parts[schema.partition(row[schema.TS])].append(row)
    return [
        _put(table(found), lake / part, min(r[schema.TS] for r in found))
        for part, found in sorted(parts.items())
    ]


FEED_TYPES = ("topic", "fanout", "direct", "headers")
KINDS = (  # (event, weight): roughly what busy traffic looks like
    (schema.PUBLISH, 30),
    (schema.ROUTE, 30),
    (schema.DELIVER, 25),
    (schema.ACK, 10),
    (schema.REDELIVER, 1),
    (schema.DEAD_LETTER, 1),
    (schema.DROP, 1),
    (schema.BRIDGE_IN, 1),
    (schema.BRIDGE_OUT, 1),
)


def block(seconds: float, *, feeds: int = 20, seed: int = 8) -> pa.Table:
    """:data:`BLOCK` random events with ``ts`` spread over ``[0, seconds)``."""
    rng = random.Random(seed)  # noqa: S311 - synthetic traffic, not a secret
    names, weights = zip(*KINDS, strict=True)
    rows: list[schema.Event] = []
    for _ in range(BLOCK):
        event = rng.choices(names, weights)[0]
        feed = rng.randrange(feeds)
        timed = event in (schema.DELIVER, schema.ACK)
        bridged = event in (schema.BRIDGE_IN, schema.BRIDGE_OUT)
        rows.append(
            (
                rng.random() * seconds,
                event,
                "default",
                f"feed-{feed}",
                FEED_TYPES[feed % len(FEED_TYPES)],
                f"address.{rng.randrange(500)}",
                f"sha256 {rng.getrandbits(48):012x}" if event != schema.PUBLISH else None,
                f"m-{rng.getrandbits(64):016x}",
                rng.randrange(64, 4096),
                f"client-{rng.randrange(50)}",
                schema.OK,
                rng.expovariate(1 / 5.0) if timed else None,
                f"bridge-{feed % 3}" if bridged else None,
            )
        )
    return table(rows)


def generate(lake: Path, count: int, *, start: float, hours: int, seed: int = 8) -> list[Path]:
    """Write ``count`` events spread evenly over ``hours`` whole hours from ``start``
    (a whole hour, UTC), one file per hour."""
    if start % 3600:
        raise ValueError("start must be a whole hour")
    base = block(3600.0, seed=seed)
    ts = pc.cast(base.column("ts"), pa.int64())
    per_hour, extra = divmod(count, hours)
    paths = []
    for hour in range(hours):
        wanted = per_hour + (1 if hour < extra else 0)
        shifted = pc.cast(pc.add(ts, int((start + hour * 3600) * 1_000_000)), pa.int64())
        one = base.set_column(0, "ts", shifted.cast(SCHEMA.field("ts").type))
        copies = [one] * (wanted // BLOCK) + (
            [one.slice(0, wanted % BLOCK)] if wanted % BLOCK else []
        )
        if copies:
            directory = lake / schema.partition(start + hour * 3600)
            paths.append(_put(pa.concat_tables(copies), directory, start + hour * 3600))
    return paths
