"""Shutdown and the system feed's announcer, as the gateway uses them: the service's
``shutdown`` ends every wait before the work in flight drains, and what the layers
above announce reaches a pipe joined to the system feed."""

from __future__ import annotations

import asyncio
import json

import pytest

from feeds.service import EngineService
from restms.errors import ServiceUnavailable
from restms.specs import JoinSpec

from .conftest import MakeEngine
from .helpers import ME, msg, new_feed, new_pipe, path, publish, text


async def test_shutdown_ends_every_wait_and_starts_none(make_engine: MakeEngine) -> None:
    engine = await make_engine()
    feed = await new_feed(engine, "news", "fanout")
    pipe = await new_pipe(engine)
    await engine.create_join(ME, pipe.key, JoinSpec(feed_path=path(feed)))
    await publish(engine, feed, msg("1"))
    reader = asyncio.create_task(engine.read(ME, pipe.key, 2, wait=30.0))
    cursor = engine.cursor(ME, pipe.key)
    assert [m.position for m in await cursor.take(10)] == [1]
    taking = asyncio.create_task(cursor.take(10, wait=30.0))
    await asyncio.sleep(0.02)
    assert not reader.done()
    assert not taking.done()
    engine.shutdown()
    with pytest.raises(ServiceUnavailable) as ended:
        await asyncio.wait_for(reader, 1.0)
    assert ended.value.retry_after > 0
    assert await asyncio.wait_for(taking, 1.0) == ()
    assert cursor.ended == "closing"
    with pytest.raises(ServiceUnavailable):  # a wait that starts now is refused at once
        await asyncio.wait_for(engine.read(ME, pipe.key, 2, wait=30.0), 1.0)
    assert (await engine.stats()).closing
    message = await engine.read(ME, pipe.key, 1)  # what is there is still read
    assert message is not None
    assert message.position == 1


async def _events_of(engine: EngineService, pattern: str) -> str:
    events = engine.events
    assert events is not None
    pipe = await new_pipe(engine)
    feed_path = f"/restms/feed/{events.name}"
    await engine.create_join(ME, pipe.key, JoinSpec(feed_path=feed_path, address=pattern))
    return pipe.key


async def _event(engine: EngineService, pipe: str, position: int) -> dict[str, object]:
    message = await engine.read(ME, pipe, position, wait=5.0)
    assert message is not None, "no event came"
    document = json.loads(text(message))
    assert isinstance(document, dict)
    return {"address": message.spec.address, **document}


async def test_announcements_reach_the_system_feed(make_engine: MakeEngine) -> None:
    engine = await make_engine()
    events = engine.events
    assert events is not None
    assert events.name == "restms.system"
    auth, bridges = await _events_of(engine, "auth.*"), await _events_of(engine, "bridge.#")
    events.auth_failed("bearer", "127.0.0.1", "bearer token refused: expired")
    failed = await _event(engine, auth, 1)
    assert failed["address"] == "auth.failed"
    assert failed["details"] == {
        "scheme": "bearer",
        "peer": "127.0.0.1",
        "reason": "bearer token refused: expired",
        "count": 1,
    }
    events.bridge("amqp", "orders", "up", {"url": "amqp://127.0.0.1:5672"})
    bridged = await _event(engine, bridges, 1)
    assert bridged["address"] == "bridge.amqp.up"
    assert bridged["details"] == {"bridge": "orders", "url": "amqp://127.0.0.1:5672"}


async def test_with_the_system_feed_off_there_is_no_announcer(make_engine: MakeEngine) -> None:
    engine = await make_engine(system_feed="")
    assert engine.events is None


async def test_a_durable_engine_tells_how_its_store_commits(restart: MakeEngine) -> None:
    engine = await restart()
    feed = await new_feed(engine, "kept", "fanout")
    pipe = await new_pipe(engine)
    await engine.create_join(ME, pipe.key, JoinSpec(feed_path=path(feed)))
    before = (await engine.stats()).store
    assert before is not None
    assert before.running
    assert not before.failing
    await publish(engine, feed, msg("1", persistent=True))
    after = (await engine.stats()).store
    assert after is not None
    assert after.kind == before.kind
    assert after.commits > before.commits
    assert after.batches >= after.commits
    assert after.commit_seconds > before.commit_seconds
    assert after.failures == before.failures


async def test_the_only_engine_runs_what_it_claims(engine: EngineService) -> None:
    solo = engine.solo("bridge:out")
    assert await solo.take()
    waiting = asyncio.ensure_future(solo.changed())
    await asyncio.sleep(0.05)
    assert not waiting.done()  # nothing takes it away
    waiting.cancel()
    await solo.release()
