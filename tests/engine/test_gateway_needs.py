"""What the gateway's RestMS handlers ask of an engine besides the resources themselves:
what their access checks look at (the default and system feeds, a resource's domain,
quotas, a join's feed), a HEAD's look, U12's existence, and evented GETs' waits (H9-H11).
"""

from __future__ import annotations

import asyncio

import pytest

from feeds.service import ContentRef, EngineService, FeedInfo, Owned, PipeInfo, Slot
from restms.errors import BadRequest, NotCommitted, NotFound, ServiceUnavailable
from restms.specs import Duplicate, FeedSpec, Update
from restms.webhook import WebhookOptions

from .conftest import MakeEngine, refuse_commits
from .helpers import DOMAIN, ME, OTHER, join, msg, new_feed, new_pipe, path, publish, text


async def _news(engine: EngineService) -> tuple[FeedInfo, PipeInfo]:
    feed = await new_feed(engine, "news", "fanout")
    pipe = await new_pipe(engine)
    await join(engine, pipe, feed)
    return feed, pipe


# ---------------------------------------------------------------- access checks
async def test_the_default_and_system_feeds_are_told_apart(engine: EngineService) -> None:
    default = await engine.feed(ME, "default")
    assert (default.default, default.system) == (True, False)
    system = await engine.feed(ME, "restms.system")
    assert (system.default, system.system) == (False, True)
    mine = await new_feed(engine, "news")
    assert (mine.default, mine.system) == (False, False)
    private = await new_feed(engine)
    found = await engine.resolve(ME, private.key)
    assert isinstance(found, FeedInfo)
    assert not (found.default)
    assert not (found.system)


async def test_a_system_feed_named_otherwise_is_still_the_system_feed(
    make_engine: MakeEngine,
) -> None:
    engine = await make_engine(system_feed="events")
    assert (await engine.feed(ME, "events")).system
    with pytest.raises(NotFound):
        await engine.feed(ME, "restms.system")


async def test_what_names_a_pipe_carries_its_domain(engine: EngineService) -> None:
    feed, pipe = await _news(engine)
    await publish(engine, feed, msg("one"))
    slot = await engine.resolve(ME, f"{pipe.key}.1")
    assert slot == Slot(pipe=pipe.key, position=1, domain=DOMAIN, pipe_type=pipe.type)
    ref = await engine.resolve(ME, f"{pipe.key}.1.0")
    assert ref == ContentRef(pipe=pipe.key, position=1, index=0, domain=DOMAIN)
    joins = (await engine.pipe(ME, pipe.key)).joins
    assert [one.domain for one in joins] == [DOMAIN, DOMAIN]
    assert (await engine.join(ME, joins[-1].key)).domain == DOMAIN
    staged = await engine.stage(ME, feed.key, b"x", "text/plain")
    assert (staged.domain, staged.feed, staged.feed_public) == (DOMAIN, "news", True)
    private = await new_feed(engine)
    hidden = await engine.stage(ME, private.key, b"x", "text/plain")
    assert (hidden.feed, hidden.feed_public) == (private.key, False)


async def test_owned_counts_what_a_principal_has(engine: EngineService) -> None:
    assert await engine.owned(ME) == Owned(feeds=0, pipes=0, joins=0)
    _feed, pipe = await _news(engine)
    await new_feed(engine)  # a private one counts too
    others = await new_pipe(engine, owner=OTHER)
    # Each pipe has its default join (F15) besides the one made here.
    assert await engine.owned(ME) == Owned(feeds=2, pipes=1, joins=2)
    assert await engine.owned(OTHER) == Owned(feeds=0, pipes=1, joins=1)
    await engine.delete_pipe(ME, pipe.key)
    assert await engine.owned(ME) == Owned(feeds=2, pipes=0, joins=0)
    await engine.delete_feed(ME, "news")
    assert await engine.owned(ME) == Owned(feeds=1, pipes=0, joins=0)
    assert [p.key for p in await engine.pipes(OTHER)] == [others.key]
    assert await engine.pipes(ME) == ()


async def test_a_joins_feed_path_resolves_or_is_400(engine: EngineService) -> None:
    public = await new_feed(engine, "news")
    assert (await engine.feed_at(ME, path(public))).key == "news"
    private = await new_feed(engine)
    assert (await engine.feed_at(ME, path(private))).key == private.key
    assert (await engine.feed_at(None, path(private))).key == private.key
    for who, where in (
        (OTHER, path(private)),  # another's private feed: as if there were none
        (ME, "/restms/feed/nothing"),
        (ME, "/elsewhere"),
    ):
        with pytest.raises(BadRequest):
            await engine.feed_at(who, where)


async def test_a_domain_lists_its_public_feeds_and_the_default_feed(
    make_engine: MakeEngine,
) -> None:
    engine = await make_engine(domains=(("default", "Default"), ("sales", "Sales")))
    await new_feed(engine, "news")
    await new_feed(engine)  # private: never listed
    listed = {feed.key for feed in await engine.listed_feeds(DOMAIN)}
    assert {"news", "default"} <= listed
    assert all(len(key) < 40 for key in listed)
    made, _ = await engine.create_feed(ME, "sales", FeedSpec(name="orders", type="fanout"))
    sales = [feed.key for feed in await engine.listed_feeds("sales")]
    assert sales == [made.key, "default"]  # F14: the default feed is in every domain
    with pytest.raises(NotFound):
        await engine.listed_feeds("nowhere")


# ---------------------------------------------------------------- messages
async def test_a_look_neither_waits_nor_leases(engine: EngineService) -> None:
    feed, pipe = await _news(engine)
    assert await engine.look(ME, pipe.key, 1) is None  # the asynclet: at once
    await publish(engine, feed, msg("one"))
    seen = await engine.look(ME, pipe.key, 1)
    assert seen is not None
    assert text(seen) == "one"
    assert (await engine.stats()).counter("delivered") == 0  # a look delivers nothing
    read = await engine.read(ME, pipe.key, 1, lease=True)
    assert read is not None
    assert (await engine.stats()).counter("delivered") == 1
    await engine.ack(ME, pipe.key, 1)
    assert await engine.look(ME, pipe.key, 1) is None
    with pytest.raises(NotFound):
        await engine.look(OTHER, pipe.key, 1)


async def test_a_look_takes_no_work_from_a_queue(engine: EngineService) -> None:
    feed = await new_feed(engine, "jobs", "rotator")
    pipe = await new_pipe(engine, "ondemand")
    await join(engine, pipe, feed)
    await publish(engine, feed, msg("job"))
    assert await engine.look(ME, pipe.key, 1) is None
    assert (await engine.feed(ME, "jobs")).queued == 1  # still queued
    got = await engine.read(ME, pipe.key, 1, wait=1.0)
    assert got is not None
    assert text(got) == "job"


async def test_exists_says_whether_a_position_or_content_is_there(
    engine: EngineService,
) -> None:
    feed, pipe = await _news(engine)
    await publish(engine, feed, msg("one"))
    key = pipe.key
    assert await engine.exists(ME, Slot(pipe=key, position=1))
    assert await engine.exists(ME, Slot(pipe=key, position=2))  # the asynclet (U12)
    assert not await engine.exists(ME, Slot(pipe=key, position=3))
    # The message's one content is embedded: nothing to fetch at its index.
    assert not await engine.exists(ME, ContentRef(pipe=key, position=1, index=0))
    await engine.ack(ME, key, 1)
    assert not await engine.exists(ME, Slot(pipe=key, position=1))
    with pytest.raises(NotFound):
        await engine.exists(OTHER, Slot(pipe=key, position=2))


async def test_a_webhook_pipe_comes_with_the_secret_made_for_it(engine: EngineService) -> None:
    hook = WebhookOptions(callback="http://127.0.0.1:9/hook")
    pipe = await new_pipe(engine, "webhook", webhook=hook)
    assert pipe.webhook is not None
    made = pipe.webhook.options.secret
    assert made
    assert len(made) >= 32
    assert (await engine.webhook(pipe.key)).options.secret == made
    plain = await new_pipe(engine)
    assert plain.webhook is None


# ---------------------------------------------------------------- evented GETs
async def test_changed_answers_at_once_for_an_older_version(engine: EngineService) -> None:
    feed, pipe = await _news(engine)
    seen = await engine.pipe(ME, pipe.key)
    await publish(engine, feed, msg("one"))
    now = await engine.changed(ME, seen, 5.0)
    assert now is not None
    assert now.version > seen.version
    assert now.held == 1


async def test_changed_waits_for_a_change(engine: EngineService) -> None:
    feed = await new_feed(engine, "news")
    seen = await engine.feed(ME, "news")
    waiter = asyncio.create_task(engine.changed(ME, seen, 5.0))
    await asyncio.sleep(0.05)
    assert not waiter.done()
    await engine.update_feed(ME, feed.key, Update(title="Latest"))
    now = await asyncio.wait_for(waiter, 2.0)
    assert now is not None
    assert now.title == "Latest"
    domain = await engine.domain(DOMAIN)
    waiter = asyncio.create_task(engine.changed(None, domain, 5.0))
    await asyncio.sleep(0.05)
    assert not waiter.done()
    await new_feed(engine, "sport")
    changed = await asyncio.wait_for(waiter, 2.0)
    assert changed is not None
    assert "sport" in changed.feeds


async def test_changed_gives_up_after_its_wait(engine: EngineService) -> None:
    _, pipe = await _news(engine)
    seen = await engine.join(ME, (await engine.pipe(ME, pipe.key)).joins[-1].key)
    assert await engine.changed(ME, seen, 0.05) is None
    assert await engine.changed(ME, seen, 0.0) is None


async def test_changed_is_404_once_deleted_and_hidden_from_others(
    engine: EngineService,
) -> None:
    _, pipe = await _news(engine)
    seen = await engine.pipe(ME, pipe.key)
    with pytest.raises(NotFound):
        await engine.changed(OTHER, seen, 1.0)
    waiter = asyncio.create_task(engine.changed(ME, seen, 5.0))
    await asyncio.sleep(0.05)
    await engine.delete_pipe(ME, pipe.key)
    with pytest.raises(NotFound):
        await asyncio.wait_for(waiter, 2.0)


async def test_changed_ends_with_503_when_the_engine_closes(engine: EngineService) -> None:
    seen = await engine.feed(ME, "default")
    waiter = asyncio.create_task(engine.changed(ME, seen, 5.0))
    await asyncio.sleep(0.05)
    await engine.close()
    with pytest.raises(ServiceUnavailable):
        await asyncio.wait_for(waiter, 2.0)


# ---------------------------------------------------------------- publishing
async def test_publish_counts_answers_what_publish_would(engine: EngineService) -> None:
    feed, pipe = await _news(engine)
    counts = await engine.publish_counts(ME, feed.key, [msg("one", mid="m1"), msg("two")])
    assert counts == (1, 1)
    again = await engine.publish_counts(ME, feed.key, [msg("one", mid="m1")])
    assert again == (1,)
    assert isinstance(again[0], Duplicate)  # not routed again: the first's count
    assert not isinstance(counts[0], Duplicate)
    result = await engine.publish(ME, feed.key, [msg("one", mid="m1"), msg("three")])
    assert (result.counts, result.duplicates) == ((1, 1), (True, False))
    assert [text(m) for m in (await engine.listing(ME, pipe.key)).messages] == [
        "one",
        "two",
        "three",
    ]
    with pytest.raises(NotFound):
        await engine.publish_counts(OTHER, (await new_feed(engine)).key, [msg("x")])


@pytest.mark.alone  # the cluster's masters refuse every write meanwhile
async def test_publish_counts_returns_once_persistent_messages_are_committed(
    restart: MakeEngine,
) -> None:
    engine = await restart()
    feed, pipe = await _news(engine)
    async with refuse_commits(engine):
        with pytest.raises(NotCommitted):
            await engine.publish_counts(ME, feed.key, [msg("lost", persistent=True)])
    listing = await engine.listing(ME, pipe.key)
    assert (listing.messages, listing.asynclet) == ((), 1)  # nothing left behind
    assert await engine.publish_counts(ME, feed.key, [msg("kept", persistent=True)]) == (1,)
    engine = await restart(crash=True)  # nothing the engine had not committed is kept
    kept = await engine.read(ME, pipe.key, 1)
    assert kept is not None
    assert text(kept) == "kept"
