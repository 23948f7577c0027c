"""A publish's mirror record belongs to that publish alone.

Decided behaviour under test: a publish collects what it did with its copies (the
pipe of each copy, the copies full pipes skipped) for one mirror record. A full pipe's
"pipe.full" event is routed to the system feed *during* that publish, as a publish of
its own: its copies are mirrored as the system feed's own route events, never folded
into the outer publish's record, and the outer record still stands for exactly the
outer publish's events. The same holds for a one-message publish (its one-copy record).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from feeds import EngineConfig
from feeds.config import SYSTEM_FEED
from feeds.engine import Engine
from feeds.mirroring import digest
from feeds.model import Pipe
from restms.specs import FeedSpec, JoinSpec, MessageSpec, PipeOptions, PipeSpec
from spark_sink import schema
from spark_sink.lake import RequestRows

OWNER = "alice"


def _rows(items: list[tuple[Any, ...]]) -> Counter[tuple[str, str, str | None]]:
    """(event, feed, pipe digest) of every row the mirrored items stand for."""
    found: Counter[tuple[str, str, str | None]] = Counter()
    requests = RequestRows()
    for item in items:
        if item[1] == schema.REQUEST:
            requests.add(item)  # type: ignore[arg-type]
        elif item[1] == schema.ROUTED:
            for event in schema.routed_events(item):  # type: ignore[arg-type]
                found[event[1], event[3], event[6]] += 1
        else:
            found[item[1], item[3], item[6]] += 1
    if requests.rows:
        for row in requests.batch().to_pylist():
            found[row["event"], row["feed"], row["pipe"]] += 1
    return found


def _engine() -> tuple[Engine, list[Pipe], Pipe, Pipe]:
    """Two watchers of the system feed (so each system event has two copies), a feed
    ``orders`` with a full drop-oldest pipe and a roomy one, a feed ``tiny`` whose one
    join is that full pipe; every time the pipe is full a "pipe.full" event is routed."""
    e = Engine(EngineConfig())
    domain = e.domain("default")
    watchers = [e.create_pipe(domain, PipeSpec(), OWNER) for _ in range(2)]
    for watcher in watchers:
        e.create_join(watcher, JoinSpec(feed_path=f"/restms/feed/{SYSTEM_FEED}", address="#"))
    assert e.events is not None
    e.events.coalescer.interval = 0  # every time it is full, not coalesced
    e.create_feed(domain, FeedSpec(name="orders", type="fanout"), OWNER)
    e.create_feed(domain, FeedSpec(name="tiny", type="fanout"), OWNER)
    full = e.create_pipe(
        domain, PipeSpec(options=PipeOptions(max_messages=1, overflow="drop-oldest")), OWNER
    )
    roomy = e.create_pipe(domain, PipeSpec(), OWNER)
    for pipe in (full, roomy):
        e.create_join(pipe, JoinSpec(feed_path="/restms/feed/orders"))
    e.create_join(full, JoinSpec(feed_path="/restms/feed/tiny"))
    e.publish(e.public_feed("tiny"), [MessageSpec(address="first")], OWNER)  # now full
    return e, watchers, full, roomy


def test_a_batch_whose_pipe_full_event_is_routed_meanwhile_mirrors_both_as_their_own() -> None:
    e, watchers, full, roomy = _engine()
    items: list[tuple[Any, ...]] = []
    e.mirror = lambda item, rows=1: items.append(item)
    counts = e.publish(
        e.public_feed("orders"), [MessageSpec(address="a"), MessageSpec(address="b")], OWNER
    )
    e.mirror = None
    assert counts == [2, 2]
    (request,) = [item for item in items if item[1] == schema.REQUEST]
    assert request[schema.ROWS] == 6  # two publish events, four copies: nothing else
    f, r = digest(full.key), digest(roomy.key)
    w1, w2 = (digest(w.key) for w in watchers)
    assert _rows(items) == Counter(
        {
            ("publish", "orders", None): 2,
            ("route", "orders", f): 2,
            ("route", "orders", r): 2,
            # the oldest (of its own feed), dropped to make room each time
            ("drop", "tiny", f): 1,
            ("drop", "orders", f): 1,
            # each "pipe.full" event, its copy to each watcher, as the system feed's own
            ("route", SYSTEM_FEED, w1): 2,
            ("route", SYSTEM_FEED, w2): 2,
        }
    )
    system = [item for item in items if item[3] == SYSTEM_FEED]
    assert all(item[1] == "route" for item in system)  # tuples of their own


def test_a_one_message_publish_whose_pipe_full_event_is_routed_meanwhile() -> None:
    e, watchers, full, _ = _engine()
    items: list[tuple[Any, ...]] = []
    e.mirror = lambda item, rows=1: items.append(item)
    assert e.publish(e.public_feed("tiny"), [MessageSpec(address="c")], OWNER) == [1]
    e.mirror = None
    kinds = [item[1] for item in items]
    assert kinds == ["drop", "route", "route", schema.ROUTED]
    (routed,) = [item for item in items if item[1] == schema.ROUTED]
    route, publish = schema.routed_events(routed)
    assert (route[3], route[6], publish[3]) == ("tiny", digest(full.key), "tiny")
    w1, w2 = (digest(w.key) for w in watchers)
    assert [(item[3], item[6]) for item in items if item[1] == "route"] == [
        (SYSTEM_FEED, w1),
        (SYSTEM_FEED, w2),
    ]
