"""Ownership (digest Q7): another principal cannot see or use a private resource, and
cannot tell it from one never issued; public feeds change only for their creator.

The same rules as tests/app/test_access.py asserts over HTTP (there, with the scopes
and tenants the gateway adds on top).
"""

from __future__ import annotations

from collections.abc import Awaitable

import pytest

from feeds.service import ContentRef, EngineService
from restms.errors import BadRequest, Forbidden, NotFound
from restms.specs import FeedSpec, JoinSpec, LinkedContent, MessageSpec, PipeSpec, Update

from .helpers import ME, OTHER, join, msg, new_feed, new_pipe, path, publish

NEVER = "x" * 22  # a key never issued


async def _reason(call: Awaitable[object]) -> str:
    with pytest.raises(NotFound) as hidden:
        await call
    return hidden.value.reason


async def test_another_principals_pipe_is_not_there(engine: EngineService) -> None:
    feed = await new_feed(engine, "orders", "fanout")
    pipe = await new_pipe(engine)
    made = await join(engine, pipe, feed)
    await publish(engine, feed, msg("secret"))
    for key in (pipe.key, NEVER):  # the same answer for both: nothing to probe
        reasons = {
            await _reason(engine.pipe(OTHER, key)),
            await _reason(engine.listing(OTHER, key)),
            await _reason(engine.read(OTHER, key, 1)),
            await _reason(engine.ack(OTHER, key, 1)),
            await _reason(engine.update_pipe(OTHER, key, Update(title="x", tag="pipe"))),
            await _reason(engine.delete_pipe(OTHER, key)),
            await _reason(engine.create_join(OTHER, key, JoinSpec(feed_path=path(feed)))),
            await _reason(engine.content(OTHER, ContentRef(pipe=key, position=1, index=0))),
            await _reason(engine.dead_letter(OTHER, key, 1, "x")),
            await _reason(engine.resolve(OTHER, key)),
            await _reason(engine.resolve(OTHER, f"{key}.1")),
        }
        assert reasons == {"no such resource"}, key
    with pytest.raises(NotFound):
        await anext(engine.cursor(OTHER, pipe.key))
    for key in (made.key, NEVER):
        assert await _reason(engine.join(OTHER, key)) == "no such resource"
        assert await _reason(engine.delete_join(OTHER, key)) == "no such resource"
    assert await engine.pipes(OTHER) == ()
    # Nothing bob tried changed anything of alice's.
    listing = await engine.listing(ME, pipe.key)
    assert [m.position for m in listing.messages] == [1]
    assert [p.key for p in await engine.pipes(ME)] == [pipe.key]


async def test_the_gateway_itself_sees_every_pipe(engine: EngineService) -> None:
    pipe = await new_pipe(engine)
    assert (await engine.pipe(None, pipe.key)).owner == ME
    await engine.delete_pipe(None, pipe.key)  # an admin's clean-up
    with pytest.raises(NotFound):
        await engine.pipe(ME, pipe.key)


async def test_another_principals_private_feed_is_not_there(engine: EngineService) -> None:
    private = await new_feed(engine)  # no name: private
    assert private.name is None
    pipe = await new_pipe(engine, owner=OTHER)
    with pytest.raises(NotFound):
        await engine.feed(OTHER, private.key)
    with pytest.raises(NotFound):
        await engine.publish(OTHER, private.key, [msg("x")])
    for feed_path in (f"/restms/resource/{private.key}", f"/restms/resource/{NEVER}"):
        with pytest.raises(BadRequest) as refused:  # G14, as for a feed never made
            await engine.create_join(OTHER, pipe.key, JoinSpec(feed_path=feed_path))
        assert refused.value.reason == f"join names no existing feed: {feed_path}"
    with pytest.raises(NotFound):
        await engine.stage(OTHER, private.key, b"x", "text/plain")
    assert (await engine.feed(ME, private.key)).owner == ME


async def test_Q7_a_public_feed_changes_only_for_its_creator(engine: EngineService) -> None:
    await new_feed(engine, "orders")
    seen = await engine.feed(OTHER, "orders")  # public: everyone sees it
    assert seen.owner == ME
    with pytest.raises(Forbidden):
        await engine.update_feed(OTHER, "orders", Update(title="mine now"))
    with pytest.raises(Forbidden):
        await engine.delete_feed(OTHER, "orders")
    changed = await engine.update_feed(ME, "orders", Update(title="Orders"))
    assert (changed.title, changed.version > seen.version) == ("Orders", True)
    again, created = await engine.create_feed(OTHER, "default", FeedSpec(name="orders"))
    assert (again.key, again.title, created) == ("orders", "Orders", False)  # C3, C4
    await engine.delete_feed(ME, "orders")
    with pytest.raises(NotFound):
        await engine.feed(ME, "orders")


async def test_F17_configured_feeds_change_for_nobody(engine: EngineService) -> None:
    for who in (ME, None):
        with pytest.raises(Forbidden):
            await engine.update_feed(who, "default", Update(title="x"))
        with pytest.raises(Forbidden):
            await engine.delete_feed(who, "default")
    assert (await engine.feed(ME, "default")).configured


async def test_another_principals_staged_content_cannot_be_used(engine: EngineService) -> None:
    feed = await new_feed(engine, "orders", "fanout")
    staged = await engine.stage(ME, feed.key, b"mine", "text/plain")
    linked = MessageSpec(contents=(LinkedContent(path=f"/restms/resource/{staged.key}"),))
    with pytest.raises(NotFound):
        await engine.publish(OTHER, feed.key, [linked])
    with pytest.raises(NotFound):
        await engine.staged(OTHER, staged.key)
    with pytest.raises(NotFound):
        await engine.delete_staged(OTHER, staged.key)
    assert (await engine.staged(ME, staged.key))[1].data == b"mine"


async def test_C9_pipes_are_always_new_and_private(engine: EngineService) -> None:
    first = await engine.create_pipe(ME, "default", PipeSpec())
    second = await engine.create_pipe(ME, "default", PipeSpec())
    assert first.key != second.key
    assert len(first.key) >= 16
    assert (await engine.resolve(ME, first.key)) == await engine.pipe(ME, first.key)
