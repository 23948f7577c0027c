"""The traffic mirror's events (docs/ANALYTICS.md, "Event schema"), as each engine offers
them to its sink: the same rows, whichever engine runs, for what the traffic did.

The sink here keeps what it is offered; the rows are what the lake's writer makes of it
(a request or routed record expanded as ``spark_sink`` expands it). Each test compares
them, row by row, with the rows the traffic must make: every column but the time and
the latency, which are checked apart (the time of the test; a latency on every
delivery and acknowledgement and on nothing else).
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections import Counter
from typing import Any

import pyarrow as pa
import pytest

from feeds.service import EngineService, FeedInfo, PipeInfo
from restms.errors import ServiceUnavailable
from restms.specs import EmbeddedContent, LinkedContent, MessageSpec
from spark_sink import schema
from spark_sink.lake import RequestRows

from .conftest import MakeEngine
from .helpers import DOMAIN, ME, join, msg, new_feed, new_pipe, publish, texts

# An event without its time and latency: event, domain, feed, feed_type, address, pipe,
# message_id, size, principal, outcome, bridge.
Row = tuple[
    str, str, str, str, str | None, str | None, str | None, int, str | None, str, str | None
]
TIMED = ("deliver", "ack")  # the events that carry a latency


class Sink:
    """A mirror sink that keeps what it is offered, as the gateway's queue would."""

    def __init__(self) -> None:
        self.items: list[tuple[tuple[Any, ...], int]] = []
        self.since = time.time()

    def __call__(self, item: tuple[Any, ...], rows: int = 1, /) -> None:
        self.items.append((item, rows))

    def kinds(self) -> list[str]:
        """What each item offered since the last :meth:`rows` is: an event's name, or a
        record's mark."""
        return [item[1] for item, _ in self.items]

    def rows(self) -> Counter[Row]:
        """The rows offered since the last call, each checked for its time and latency."""
        items, self.items = self.items, []
        until = time.time()
        found: Counter[Row] = Counter()
        for item, rows in items:
            expanded = _expand(item)
            assert rows == len(expanded), item
            for ts, *row, latency, bridge in expanded:
                assert self.since - 1 <= ts <= until + 1
                assert (latency is not None) == (row[0] in TIMED), (row, latency)
                assert latency is None or latency >= 0
                found[(*row, bridge)] += 1
        self.since = until
        return found


def _expand(item: tuple[Any, ...]) -> list[tuple[Any, ...]]:
    """The events an item stands for, as the lake's writer makes them."""
    if item[1] == schema.ROUTED:
        return list(schema.routed_events(item))
    if item[1] != schema.REQUEST:
        assert len(item) == len(schema.COLUMNS), item
        return [item]
    rows = RequestRows()
    rows.add(item)
    batch = rows.batch()
    # The times as microseconds: a timestamp with its zone would read the zone database.
    columns = [batch.column(0).cast(pa.int64()).to_pylist()]
    columns += [batch.column(i).to_pylist() for i in range(1, batch.num_columns)]
    return [(us / 1e6, *rest) for us, *rest in zip(*columns, strict=True)]


def digest(key: str) -> str:
    """How an event names a pipe: never by its name, a capability."""
    return hashlib.sha256(key.encode()).hexdigest()[:12]


def size(spec: MessageSpec) -> int:
    """A message's bytes: its address, properties and headers, and its contents."""
    contents = spec.contents
    return spec.head_size + sum(len(c.value) for c in contents if isinstance(c, EmbeddedContent))


def row(
    event: str,
    feed: FeedInfo | str,
    spec: MessageSpec,
    pipe: PipeInfo | None = None,
    principal: str | None = None,
    outcome: str = "ok",
    *,
    bridge: str | None = None,
    address: str | None = None,
    weight: int = 0,
) -> Row:
    """The row an event about ``spec`` makes (a feed of this test's domain, by value or
    as name and type: ``"dead-letter/rotator"``; a private one by the digest of its key).
    ``address``: as shown, where it is not the message's own (the default feed's);
    ``weight``: bytes beyond its own (the staged contents a copy links)."""
    if isinstance(feed, str):
        name, feed_type = feed.split("/")
    else:
        name = feed.name if feed.name is not None else digest(feed.key)
        feed_type = feed.type
    return (
        event,
        DOMAIN,
        name,
        feed_type,
        address or spec.address or None,
        None if pipe is None else digest(pipe.key),
        spec.prop("message_id"),
        size(spec) + weight,
        principal,
        outcome,
        bridge,
    )


def rows(*made: Row) -> Counter[Row]:
    return Counter(made)


def lettered(spec: MessageSpec, reason: str, feed: str, *why: tuple[str, str]) -> MessageSpec:
    """The copy a dead-letter feed gets of ``spec``, with the headers saying why."""
    headers = (*spec.headers, ("x-death-reason", reason), *why, ("x-original-feed", feed))
    return MessageSpec(
        address=spec.address, props=spec.props, headers=headers, contents=spec.contents
    )


@pytest.fixture
def sink(engine: EngineService) -> Sink:
    made = Sink()
    engine.mirror_to(made)
    return made


# ---------------------------------------------------------------- publish, deliver, ack
async def test_a_publish_its_routes_deliveries_and_acks_are_mirrored(
    engine: EngineService, sink: Sink
) -> None:
    """One message routed to one pipe is one routed record; a batch, one request record
    (a duplicate in it, a message two joins of one pipe match: one copy); every lease
    taken is a delivery; a cumulative acknowledgement, one row a message it removes."""
    news = await new_feed(engine, "news", "fanout")
    orders = await new_feed(engine, "orders", "topic")
    first, second = await new_pipe(engine), await new_pipe(engine)
    await join(engine, first, news)
    await join(engine, first, orders, "eu.*")
    await join(engine, second, orders, "#")
    await join(engine, second, orders, "*.1")

    one = msg("one", mid="m1")
    assert await publish(engine, news, one) == [1]
    assert sink.kinds() == [schema.ROUTED]
    assert sink.rows() == rows(
        row("publish", news, one, principal=ME), row("route", news, one, first)
    )

    eu, us = msg("x", "eu.1", mid="o1"), msg("y", "us.2")
    assert await publish(engine, orders, eu, us, eu) == [3, 1, 3]
    assert sink.kinds() == [schema.REQUEST]
    assert sink.rows() == rows(
        row("publish", orders, eu, principal=ME),
        row("publish", orders, us, principal=ME),
        row("publish", orders, eu, principal=ME, outcome="duplicate"),
        row("route", orders, eu, first),
        row("route", orders, eu, second),
        row("route", orders, us, second),
    )

    assert await engine.read(ME, first.key, 1, lease=True) is not None
    assert await engine.read(ME, first.key, 2) is not None  # no lease: no delivery
    assert sink.rows() == rows(row("deliver", news, one, first, ME))
    assert await engine.ack(ME, first.key, 2) == 2
    assert sink.rows() == rows(row("ack", news, one, first, ME), row("ack", orders, eu, first, ME))

    # A private feed is named by a digest of its key; its messages in a pipe, as
    # "(private)". The default feed's addresses are pipe names: shown as digests.
    private = await new_feed(engine, None, "fanout")
    await join(engine, second, private)
    alone = msg("alone")
    await publish(engine, private, alone)
    default = await engine.feed(ME, "default")
    direct = msg("direct", first.key)
    await publish(engine, default, direct)
    shown = digest(first.key)
    assert sink.rows() == rows(
        row("publish", private, alone, principal=ME),
        row("route", private, alone, second),
        row("publish", default, direct, principal=ME, address=shown),
        row("route", default, direct, first, address=shown),
    )
    # A cursor's leases are deliveries too; a purge acknowledges all a pipe holds.
    cursor = engine.cursor(ME, second.key, lease=True)
    try:
        assert len(await cursor.take(10)) == 3
    finally:
        await cursor.close()
    assert await engine.purge(None, second.key) == 3
    unnamed = "(private)/"
    assert sink.rows() == rows(
        *(row(kind, orders, eu, second, ME) for kind in ("deliver", "ack")),
        *(row(kind, orders, us, second, ME) for kind in ("deliver", "ack")),
        *(row(kind, unnamed, alone, second, ME) for kind in ("deliver", "ack")),
    )

    engine.mirror_to(None)
    await publish(engine, news, msg("unseen"))
    await engine.ack(ME, first.key, 4)
    assert sink.rows() == rows()


# ---------------------------------------------------------------- overflow (Q2, F8)
async def test_copies_full_pipes_skip_or_drop_and_refused_publishes_are_mirrored(
    make_engine: MakeEngine,
) -> None:
    engine = await make_engine(max_feed_queue=1)
    sink = Sink()
    engine.mirror_to(sink)
    tiny = await new_feed(engine, "tiny", "fanout")
    full = await new_pipe(engine, max_messages=1)
    oldest = await new_pipe(engine, max_messages=2, overflow="drop-oldest")
    await join(engine, full, tiny)
    await join(engine, oldest, tiny)

    t1, t2, t3 = msg("1"), msg("2"), msg("3")
    assert await publish(engine, tiny, t1, t2, t3) == [2, 1, 1]
    assert sink.rows() == rows(
        *(row("publish", tiny, spec, principal=ME) for spec in (t1, t2, t3)),
        row("route", tiny, t1, full),
        *(row("route", tiny, spec, oldest) for spec in (t1, t2, t3)),
        row("drop", tiny, t2, full, outcome="full"),
        row("drop", tiny, t3, full, outcome="full"),
        row("drop", tiny, t1, oldest, ME, "dropped-oldest"),  # placed a moment before
    )
    t4 = msg("4")
    assert await publish(engine, tiny, t4) == [1]
    assert sink.rows() == rows(
        row("drop", tiny, t4, full, outcome="full"),
        row("route", tiny, t4, oldest),
        row("drop", tiny, t2, oldest, ME, "dropped-oldest"),  # held before
        row("publish", tiny, t4, principal=ME),
    )

    strict = await new_feed(engine, "strict", "fanout")
    refusing = await new_pipe(engine, max_messages=1, overflow="reject")
    await join(engine, refusing, strict)
    r1, r2 = msg("r1"), msg("r2")
    await publish(engine, strict, r1)
    with pytest.raises(ServiceUnavailable):
        await publish(engine, strict, r2)
    assert sink.rows() == rows(
        row("publish", strict, r1, principal=ME),
        row("route", strict, r1, refusing),
        row("drop", strict, r2, outcome="refused"),  # by the pipe: nobody's
    )

    jobs = await new_feed(engine, "jobs", "rotator")
    j1, j2 = msg("j1"), msg("j2")
    assert await publish(engine, jobs, j1) == [0]  # queued
    with pytest.raises(ServiceUnavailable):
        await publish(engine, jobs, j2)  # the queue is full
    assert sink.rows() == rows(
        row("publish", jobs, j1, principal=ME),
        row("drop", jobs, j2, principal=ME, outcome="refused"),  # by the feed: the publisher's
    )
    worker = await new_pipe(engine)
    await join(engine, worker, jobs)  # handed out of the queue now
    assert sink.rows() == rows(row("route", jobs, j1, worker))
    j3 = msg("j3")
    assert await publish(engine, jobs, j3) == [1]
    assert sink.kinds() == [schema.ROUTED]
    assert sink.rows() == rows(
        row("publish", jobs, j3, principal=ME), row("route", jobs, j3, worker)
    )


async def test_each_pipe_a_publish_makes_drop_its_oldest_mirrors_its_own_drop(
    engine: EngineService, sink: Sink
) -> None:
    # More pipes than the Redis engine has buckets (64), so that some share one: it
    # places a bucket's copies in one call, whose answer gives each pipe's drops.
    wide = await new_feed(engine, "wide", "topic")
    pipes = [await new_pipe(engine, max_messages=1, overflow="drop-oldest") for _ in range(65)]
    own = [msg(f"own {i}", f"p{i}", mid=f"own-{i}") for i in range(len(pipes))]
    for i, pipe in enumerate(pipes):
        await join(engine, pipe, wide, f"p{i}")
        await join(engine, pipe, wide, "all")
    assert await publish(engine, wide, *own) == [1] * len(pipes)
    sink.rows()
    everyone = msg("everyone", "all", mid="all")
    assert await publish(engine, wide, everyone) == [len(pipes)]
    assert sink.rows() == rows(
        row("publish", wide, everyone, principal=ME),
        *(row("route", wide, everyone, pipe) for pipe in pipes),
        *(
            row("drop", wide, held, pipe, ME, "dropped-oldest")
            for held, pipe in zip(own, pipes, strict=True)
        ),
    )


async def test_a_staged_content_weighs_in_its_copies_not_its_publish(
    engine: EngineService, sink: Sink
) -> None:
    """A publish's size is its message's head and embedded contents; a copy's counts the
    staged contents it links too (DURABILITY.md, "What a message weighs")."""
    news = await new_feed(engine, "news", "fanout")
    pipe = await new_pipe(engine)
    await join(engine, pipe, news)
    for batch in (1, 2):
        blobs = [
            await engine.stage(ME, news.key, b"staged!" * 3, "text/plain") for _ in range(batch)
        ]
        specs = [
            MessageSpec(
                props=(("message_id", f"s{batch}.{i}"),),
                contents=(
                    EmbeddedContent(value="text"),
                    LinkedContent(path=f"/restms/resource/{blob.key}"),
                ),
            )
            for i, blob in enumerate(blobs)
        ]
        await publish(engine, news, *specs)
        assert sink.kinds() == [schema.ROUTED if batch == 1 else schema.REQUEST]
        assert sink.rows() == rows(
            *(row("publish", news, spec, principal=ME) for spec in specs),
            *(row("route", news, spec, pipe, weight=len(b"staged!" * 3)) for spec in specs),
        )


async def test_work_an_ondemand_pipe_takes_is_mirrored_as_a_route(
    engine: EngineService, sink: Sink
) -> None:
    """P3: a message waits in its service feed's queue until an ondemand pipe's reader
    asks for it: then it is routed there."""
    work = await new_feed(engine, "work", "service")
    lazy = await new_pipe(engine, "ondemand")
    await join(engine, lazy, work)
    job = msg("J1", mid="j")
    assert await publish(engine, work, job) == [0]
    assert sink.rows() == rows(row("publish", work, job, principal=ME))
    assert await engine.read(ME, lazy.key, 1, wait=5.0) is not None  # no lease: a look
    assert sink.rows() == rows(row("route", work, job, lazy))


# ---------------------------------------------------------------- expiry (Q30)
async def test_an_expired_message_is_mirrored_when_it_goes(
    engine: EngineService, sink: Sink
) -> None:
    news = await new_feed(engine, "news", "fanout")
    pipe = await new_pipe(engine)
    await join(engine, pipe, news)
    short, long = msg("short", expiration=50), msg("long", expiration=60_000)
    await publish(engine, news, short, long)
    sink.rows()
    await asyncio.sleep(0.1)  # its time passes: nothing tells of it before a reader looks
    assert await texts(engine, pipe) == ["long"]
    assert sink.rows() == rows(row("expire", news, short, pipe, ME, "expired"))


# ---------------------------------------------------------------- leases and dead letters
async def test_redeliveries_and_dead_letters_are_mirrored(
    engine: EngineService, sink: Sink
) -> None:
    news = await new_feed(engine, "news", "fanout")
    pipe = await new_pipe(engine, lease=0.1, max_deliveries=2)
    dead = await new_pipe(engine)
    await join(engine, pipe, news)
    await join(engine, dead, await engine.feed(ME, "dead-letter"))
    job = msg("job", mid="job")
    await publish(engine, news, job)
    sink.rows()

    assert await engine.read(ME, pipe.key, 1, lease=True) is not None
    assert await engine.read(ME, pipe.key, 2, wait=5.0, lease=True) is not None
    assert sink.rows() == rows(
        row("deliver", news, job, pipe, ME),
        row("redeliver", news, job, pipe, ME),
        row("deliver", news, job, pipe, ME),
    )
    letter = await engine.read(ME, dead.key, 1, wait=5.0)  # after the second lease
    assert letter is not None
    copy = lettered(job, "max-deliveries", "news", ("x-delivery-count", "2"))
    assert sink.rows() == rows(
        row("redeliver", news, job, pipe, ME),
        row("dead_letter", news, job, pipe, ME, "max-deliveries"),
        row("route", "dead-letter/rotator", copy, dead),
    )

    bad = msg("bad")
    await publish(engine, news, msg("fine"), bad)
    sink.rows()
    assert await engine.dead_letter(ME, pipe.key, 4, "rejected")
    copy = lettered(bad, "rejected", "news")
    assert sink.rows() == rows(
        row("dead_letter", news, bad, pipe, ME, "rejected"),
        row("route", "dead-letter/rotator", copy, dead),
    )
    assert not await engine.dead_letter(ME, pipe.key, 3, "rejected", feed="no-such-feed")
    assert sink.rows() == rows(row("drop", news, msg("fine"), pipe, ME, "discarded"))


# ---------------------------------------------------------------- bridges
async def test_what_bridges_bring_in_and_pass_on_is_mirrored(
    engine: EngineService, sink: Sink
) -> None:
    """A bridge's publish is a publish and a bridge_in; what its cursor acknowledges, a
    bridge_out then an ack; a message it rejects, a dead letter then a bridge_out."""
    news = await new_feed(engine, "news", "fanout")
    pipe = await new_pipe(engine)
    await join(engine, pipe, news)
    came = msg("in", mid="far-1")
    await engine.publish(ME, news.key, [came], via="amqp-in")
    assert sink.rows() == rows(
        row("publish", news, came, principal=ME),
        row("route", news, came, pipe),
        row("bridge_in", news, came, principal=ME, bridge="amqp-in"),
    )

    out, refused, kept = msg("out"), msg("refused"), msg("kept")
    await publish(engine, news, out, refused, kept)
    sink.rows()
    cursor = engine.cursor(ME, pipe.key, via="amqp-out")
    try:
        taken = await cursor.take(10)
        assert [m.position for m in taken] == [1, 2, 3, 4]
        assert await cursor.ack(2) == 2
        assert sink.rows() == rows(
            *(row("bridge_out", news, spec, pipe, ME, bridge="amqp-out") for spec in (came, out)),
            row("ack", news, came, pipe, ME),
            row("ack", news, out, pipe, ME),
        )
        assert not await engine.dead_letter(ME, pipe.key, 3, "rejected", feed="no-such-feed")
        assert sink.rows() == rows(
            row("drop", news, refused, pipe, ME, "discarded"),
            row("bridge_out", news, refused, pipe, ME, bridge="amqp-out"),
        )
    finally:
        await cursor.close()


# ---------------------------------------------------------------- webhooks
async def test_webhook_attempts_deliveries_and_give_ups_are_mirrored(
    engine: EngineService, sink: Sink
) -> None:
    from restms.webhook import WebhookOptions

    hook = WebhookOptions(callback="http://127.0.0.1:9/hook", secret="s" * 32)
    news = await new_feed(engine, "news", "fanout")
    pipe = await new_pipe(engine, "webhook", webhook=hook)
    dead = await new_pipe(engine)
    await join(engine, pipe, news)
    await join(engine, dead, await engine.feed(ME, "dead-letter"))
    first, second, third = msg("1"), msg("2"), msg("3")
    await publish(engine, news, first, second, third)
    await engine.webhook_verified(pipe.key, True, "200", "")
    sink.rows()

    retry = time.time() + 60
    assert await engine.webhook_failed(pipe.key, 1, 1, "503", "busy", retry)
    assert await engine.webhook_delivered(pipe.key, 1, "204")
    assert sink.rows() == rows(
        row("webhook_attempt", news, first, pipe, ME, "503"),
        row("webhook_attempt", news, first, pipe, ME, "204"),
        row("deliver", news, first, pipe, ME, "204"),
        row("ack", news, first, pipe, ME),
    )
    assert await engine.webhook_failed(pipe.key, 2, 1, "timeout", "no answer", retry)
    await engine.webhook_give_up(pipe.key, 2, "webhook-max-attempts")
    copy = lettered(
        second,
        "webhook-max-attempts",
        "news",
        ("x-delivery-count", "1"),
        ("x-webhook-status", "timeout"),
    )
    assert sink.rows() == rows(
        row("webhook_attempt", news, second, pipe, ME, "timeout"),
        row("dead_letter", news, second, pipe, ME, "webhook-max-attempts"),
        row("route", "dead-letter/rotator", copy, dead),
    )
    assert await engine.webhook_gone(pipe.key, 3, "410")
    assert sink.rows() == rows(row("webhook_attempt", news, third, pipe, ME, "410"))
