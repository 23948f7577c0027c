"""What the engine counts per principal for its quotas (no HTTP): the feeds each one
created, however they go and over a restart, and the bytes each one has staged."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from feeds import EngineConfig
from feeds.config import FeedConfig
from feeds.engine import Engine
from feeds.store import Store
from restms.errors import PayloadTooLarge, ServiceUnavailable, TooManyRequests
from restms.specs import FeedSpec, JoinSpec, LinkedContent, MessageSpec, PipeSpec


async def opened(path: Path) -> tuple[Engine, Store]:
    store = Store(path)
    engine = Engine()
    engine.restore(await asyncio.to_thread(store.load))
    store.start(asyncio.get_running_loop())
    return engine, store


async def closed(engine: Engine, store: Store) -> None:
    await store.submit(engine.take_journal())
    await asyncio.to_thread(store.close)


def test_feeds_are_counted_by_creator_until_they_go() -> None:
    e = Engine(EngineConfig(feeds=(FeedConfig(name="configured"),)))
    domain = e.domain("default")
    assert e.owned_feeds("") == 0  # configured feeds (and default, dead-letter) are nobody's
    public, _ = e.create_feed(domain, FeedSpec(name="news"), "ann")
    e.create_feed(domain, FeedSpec(name=None), "ann")
    service, _ = e.create_feed(domain, FeedSpec(name="jobs", type="service"), "ann")
    e.create_feed(domain, FeedSpec(name="news"), "ann")  # C3: the same feed again
    e.create_feed(domain, FeedSpec(name="theirs"), "bob")
    assert (e.owned_feeds("ann"), e.owned_feeds("bob")) == (3, 1)
    e.delete_feed(public)
    assert e.owned_feeds("ann") == 2
    pipe = e.create_pipe(domain, PipeSpec(), "bob")
    join, _ = e.create_join(pipe, JoinSpec(feed_path="/restms/feed/jobs"))
    e.delete_join(join)  # F8: a service feed goes with its last join
    assert service.deleted
    assert e.owned_feeds("ann") == 1


async def test_feeds_are_counted_again_after_a_restart(tmp_path: Path) -> None:
    engine, store = await opened(tmp_path)
    domain = engine.domain("default")
    engine.create_feed(domain, FeedSpec(name="news"), "ann")
    engine.create_feed(domain, FeedSpec(name=None), "ann")
    await closed(engine, store)
    again, store = await opened(tmp_path)
    assert again.owned_feeds("ann") == 2
    await closed(again, store)


def test_staged_bytes_are_counted_by_owner() -> None:
    e = Engine(EngineConfig(max_staged_bytes=25, max_staged_bytes_per_principal=10))
    feed = e.default_feed
    first = e.stage(feed, b"x" * 6, "text/plain", "ann")
    e.stage(feed, b"x" * 4, "text/plain", "ann")
    with pytest.raises(TooManyRequests) as refused:
        e.stage(feed, b"x", "text/plain", "ann")
    assert refused.value.status == 429
    with pytest.raises(PayloadTooLarge):
        e.stage(feed, b"x" * 11, "text/plain", "bob")  # more than any share
    e.stage(feed, b"x" * 10, "text/plain", "bob")
    e.stage(feed, b"x" * 5, "text/plain", "cy")
    with pytest.raises(ServiceUnavailable):
        e.stage(feed, b"x", "text/plain", "cy")  # within its share, past the whole budget
    pipe = e.create_pipe(e.domain("default"), PipeSpec(), "ann")
    used = LinkedContent(path=f"/restms/resource/{first.key}")
    e.publish(feed, [MessageSpec(address=pipe.key, contents=(used,))])
    e.stage(feed, b"x" * 6, "text/plain", "ann")  # the used content's bytes came back
