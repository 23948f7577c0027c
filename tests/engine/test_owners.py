"""One node runs each webhook pipe (feeds/redis/owners.py): two Redis engines on one
namespace, each with a webhook listener as a gateway node's delivery registry has.

The node that made a webhook pipe runs it and the other is not told of it; the other
takes it when the first stops (at once) or dies (once the lock runs out); and a node
that lost a pipe while it was not looking (a paused process) can no longer write the
pipe's delivery state once the new owner has written it. Redis-only: an embedded
engine is the one node there is.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
from blockbuster import BlockBuster

from feeds.config import EngineConfig
from feeds.redis import RedisEngine
from feeds.redis.owners import Owners
from feeds.service import Webhook, WebhookAttempts
from restms.errors import NotFound
from restms.specs import Update
from restms.webhook import WebhookOptions
from tests.nodes import CLUSTER_URL

from .conftest import SWEEP, forget_namespace
from .helpers import ME, eventually, msg, new_pipe, publish

HOOK = WebhookOptions(callback="http://127.0.0.1:9/hook", secret="s" * 32)
TTL = 1.5  # seconds a lock lives unless renewed (5 in a gateway); a loop stall under
# a busy machine must stay well under it, or the other node takes a lock still held
RENEW = 0.05


@dataclass
class Node:
    engine: RedisEngine
    news: list[tuple[str, Webhook | None]] = field(default_factory=list)

    def runs(self) -> set[str]:
        """The pipes this node's registry was last told to run."""
        running: dict[str, bool] = {}
        for key, hook in self.news:
            running[key] = hook is not None
        return {key for key, on in running.items() if on}


@pytest.fixture
async def pair(blockbuster: BlockBuster) -> AsyncIterator[tuple[Node, Node]]:
    namespace = f"restms-test-{secrets.token_hex(6)}"
    made = []
    for _ in range(2):
        engine = RedisEngine.open(
            EngineConfig(), CLUSTER_URL, namespace=namespace, sweep_interval=SWEEP
        )
        engine.owners = Owners(engine, ttl=TTL, renew=RENEW)
        node = Node(engine)
        await engine.start()
        engine.watch_webhooks(lambda key, hook, news=node.news: news.append((key, hook)))
        made.append(node)
    yield made[0], made[1]
    for node in made:
        await node.engine.close()
    await forget_namespace(namespace)


async def rounds(count: int = 3) -> None:
    """Long enough for each engine to look ``count`` times."""
    await asyncio.sleep(RENEW * count + 0.05)


async def test_the_node_that_made_a_webhook_pipe_runs_it_and_the_other_is_not_told(
    pair: tuple[Node, Node],
) -> None:
    first, second = pair
    pipe = await new_pipe(first.engine, "webhook", webhook=HOOK)
    assert first.runs() == {pipe.key}  # told before the create returned
    await rounds()
    assert second.runs() == set()
    assert [hook.pipe for hook in await first.engine.webhooks()] == [pipe.key]
    assert await second.engine.webhooks() == ()
    with pytest.raises(NotFound, match="another gateway node runs"):
        await second.engine.webhook_verified(pipe.key, True, "200", "")
    await first.engine.webhook_verified(pipe.key, True, "200", "")
    assert (await second.engine.webhook(pipe.key)).state.state == "active"  # both read it


async def test_a_put_on_another_node_restarts_the_owners_worker(
    pair: tuple[Node, Node],
) -> None:
    first, second = pair
    pipe = await new_pipe(first.engine, "webhook", webhook=HOOK)
    other = WebhookOptions(callback="http://127.0.0.1:9/other")
    await second.engine.update_pipe(ME, pipe.key, Update(webhook=other))

    async def heard() -> bool:
        last = first.news[-1][1]
        return last is not None and last.generation == 1

    await eventually(heard, timeout=5.0)
    last = first.news[-1][1]
    assert last is not None
    assert last.options.callback == other.callback
    assert second.runs() == set()


async def test_a_node_that_stops_hands_its_webhook_pipes_over_at_once(
    pair: tuple[Node, Node],
) -> None:
    first, second = pair
    second.engine.owners.ttl = 30.0  # were its lock to run out, the test would fail
    first.engine.owners.ttl = 30.0
    pipes = [await new_pipe(first.engine, "webhook", webhook=HOOK) for _ in range(3)]
    await rounds()
    assert first.runs()  # shared out, 2 and 1: each pipe run by one of them
    assert first.runs().isdisjoint(second.runs())
    started = time.monotonic()
    await first.engine.close()

    async def taken() -> bool:
        return second.runs() == {pipe.key for pipe in pipes}

    await eventually(taken, timeout=5.0)
    assert time.monotonic() - started < 2.0  # a round or two, not the lock's 30 s
    await second.engine.webhook_verified(pipes[0].key, True, "200", "")


async def test_a_dead_nodes_webhook_pipes_are_taken_once_their_locks_run_out(
    pair: tuple[Node, Node],
) -> None:
    first, second = pair
    pipe = await new_pipe(first.engine, "webhook", webhook=HOOK)
    await first.engine.crash()  # nothing freed: the lock runs out
    started = time.monotonic()

    async def taken() -> bool:
        return second.runs() == {pipe.key}

    await eventually(taken, timeout=5.0)
    assert time.monotonic() - started >= TTL * 0.5  # it waited for the lock
    await second.engine.webhook_verified(pipe.key, True, "200", "")
    assert (await second.engine.webhook(pipe.key)).delivering


async def test_a_node_that_lost_its_pipe_while_paused_cannot_write_its_state(
    pair: tuple[Node, Node],
) -> None:
    first, second = pair
    pipe = await new_pipe(first.engine, "webhook", webhook=HOOK)
    (renewing,) = [t for t in first.engine._tasks if t.get_name() == "redis-engine-owners"]
    renewing.cancel()  # paused: it renews nothing, yet believes it holds the pipe

    async def taken() -> bool:
        return second.runs() == {pipe.key}

    await eventually(taken, timeout=5.0)
    assert pipe.key in first.engine.owners.held
    await second.engine.webhook_verified(pipe.key, True, "200", "")
    default = await second.engine.feed(ME, "default")
    assert await publish(second.engine, default, msg("one", pipe.key)) == [1]
    cursor = second.engine.cursor(None, pipe.key)
    (message,) = await cursor.take(1)
    await cursor.close()
    position = message.position
    later = time.time() + 60
    with pytest.raises(NotFound, match="another gateway node runs"):
        await first.engine.webhook_failed(pipe.key, position, 1, "500", "stale", later)
    made = await second.engine.webhook_attempts(pipe.key, position)
    assert made == WebhookAttempts(made=0, due=0.0)  # the stale attempt was not kept
    assert await second.engine.webhook_failed(pipe.key, position, 1, "500", "boom", later)
    assert await second.engine.webhook_attempts(pipe.key, position) == WebhookAttempts(
        made=1, due=later
    )


async def test_a_bridge_runs_on_one_node_and_moves_when_that_node_stops_or_dies(
    pair: tuple[Node, Node],
) -> None:
    first, second = pair
    here, there = first.engine.solo("bridge:out"), second.engine.solo("bridge:out")
    assert await here.take()
    assert not await there.take()
    await here.release()  # a node that stops: the other takes it in its next round
    async with asyncio.timeout(2.0):
        assert await there.changed()
    again = first.engine.solo("bridge:out")
    assert not await again.take()
    await second.engine.crash()  # nothing freed: the lock runs out
    started = time.monotonic()
    async with asyncio.timeout(5.0):
        assert await again.changed()
    assert time.monotonic() - started >= TTL * 0.5
