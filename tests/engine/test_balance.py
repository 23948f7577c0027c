"""The webhook pipes and bridges shared out evenly among the live nodes
(feeds/redis/owners.py, "Balance"): three Redis engines on one namespace, each with a
webhook listener as a gateway node's delivery registry has, and, for bridges, a
follower per claim that acts as the bridge registry does (starts the bridge when its
node takes the claim, stops it, which takes a moment, when the node loses it).

Redis-only: an embedded engine is the one node there is.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import pytest
from blockbuster import BlockBuster

from feeds.config import EngineConfig
from feeds.redis import RedisEngine
from feeds.redis.owners import Owners, RedisSolo
from feeds.service import Webhook
from restms.webhook import WebhookOptions
from tests.nodes import CLUSTER_URL

from .conftest import SWEEP, forget_namespace
from .helpers import new_pipe

HOOK = WebhookOptions(callback="http://127.0.0.1:9/hook", secret="s" * 32)
TTL = 0.6  # seconds a lock lives unless renewed (5 in a gateway)
RENEW = 0.05
STOPPING = 0.1  # seconds a follower's bridge takes to stop
SETTLE = 5.0  # seconds the nodes get to share things out (a few dozen rounds here)


@dataclass
class Node:
    engine: RedisEngine
    news: list[tuple[str, Webhook | None]] = field(default_factory=list)
    running: set[str] = field(default_factory=set)  # bridges its followers run now
    followers: list[asyncio.Task[None]] = field(default_factory=list)

    def runs(self) -> set[str]:
        """The pipes this node's registry was last told to run."""
        state: dict[str, bool] = {}
        for key, hook in self.news:
            state[key] = hook is not None
        return {key for key, on in state.items() if on}

    async def bridge(self, name: str, overlaps: list[str], nodes: list[Node]) -> None:
        """Claim the bridge ``name`` and follow the claim as the bridge registry does;
        a bridge found running on another node as this one starts it is an overlap."""
        solo = self.engine.owners.solo(name)
        held = await solo.take()
        self.followers.append(asyncio.create_task(self._follow(solo, held, overlaps, nodes)))

    async def _follow(
        self, solo: RedisSolo, held: bool, overlaps: list[str], nodes: list[Node]
    ) -> None:
        name = solo.name
        if held:
            self._start(name, overlaps, nodes)
        while True:
            now = await solo.changed()
            if now == held:
                continue
            held = now
            if held:
                self._start(name, overlaps, nodes)
            else:
                await asyncio.sleep(STOPPING)  # a bridge's stop takes a moment
                self.running.discard(name)

    def _start(self, name: str, overlaps: list[str], nodes: list[Node]) -> None:
        if any(name in other.running for other in nodes if other is not self):
            overlaps.append(name)
        self.running.add(name)


async def node(namespace: str) -> Node:
    config = EngineConfig()
    engine = RedisEngine.open(config, CLUSTER_URL, namespace=namespace, sweep_interval=SWEEP)
    engine.owners = Owners(engine, ttl=TTL, renew=RENEW)
    made = Node(engine)
    await engine.start()
    engine.watch_webhooks(lambda key, hook: made.news.append((key, hook)))
    return made


async def close(made: Node) -> None:
    for task in made.followers:
        task.cancel()
    await asyncio.gather(*made.followers, return_exceptions=True)
    await made.engine.close()


@pytest.fixture
async def namespace(blockbuster: BlockBuster) -> AsyncIterator[str]:
    name = f"restms-test-{secrets.token_hex(6)}"
    yield name
    await forget_namespace(name)


async def settled(check: Callable[[], bool], what: str, timeout: float = SETTLE) -> float:
    """Wait until ``check()`` holds; how long it took."""
    started = time.monotonic()
    while not check():
        assert time.monotonic() - started < timeout, f"never {what}"
        await asyncio.sleep(0.02)
    return time.monotonic() - started


def shared(nodes: list[Node], things: set[str], low: int, high: int) -> bool:
    """Each thing run by exactly one node, each node running between low and high."""
    runs = [made.runs() | made.running for made in nodes]
    every = [key for run in runs for key in run]
    return sorted(every) == sorted(things) and all(low <= len(run) <= high for run in runs)


async def alone(namespace: str, count: int, overlaps: list[str]) -> tuple[list[Node], list[str]]:
    """One node, and ``count`` bridges it claims alone: it runs them all."""
    nodes = [await node(namespace)]
    names = [f"bridge:b{i}" for i in range(count)]
    try:
        for name in names:
            await nodes[0].bridge(name, overlaps, nodes)
        await settled(lambda: nodes[0].running == set(names), "all run by the one node")
    except BaseException:
        await close(nodes[0])
        raise
    return nodes, names


async def test_webhook_pipes_made_through_one_node_are_shared_out_and_move_back(
    namespace: str,
) -> None:
    nodes = [await node(namespace) for _ in range(3)]
    try:
        first = nodes[0]
        pipes = {(await new_pipe(first.engine, "webhook", webhook=HOOK)).key for _ in range(30)}
        took = await settled(lambda: shared(nodes, pipes, 8, 12), "shared out by three")
        assert first.engine.owners.live == 3
        assert first.engine.owners.share == 10

        await close(nodes.pop())  # a node that stops: its pipes go to the others
        await settled(lambda: shared(nodes, pipes, 14, 16), "shared out by the two left")
        assert [made.engine.owners.live for made in nodes] == [2, 2]

        nodes.append(await node(namespace))  # it comes back: it gets a share again
        again = await settled(lambda: shared(nodes, pipes, 8, 12), "shared out again")
        print(f"settled in {took:.2f} s, then {again:.2f} s after the return")
        # A pipe moved only when its node was over its share by more than one: once
        # shared out, nobody hands anything over (no flapping).
        counts = [len(made.runs()) for made in nodes]
        await asyncio.sleep(RENEW * 10)
        assert [len(made.runs()) for made in nodes] == counts
        assert shared(nodes, pipes, 8, 12)
    finally:
        for made in nodes:
            await close(made)


async def test_bridges_count_and_move_as_webhook_pipes_do(namespace: str) -> None:
    """One node alone takes every bridge; two more come: the bridges spread (a
    bridge's lock goes only once its follower stopped it: never running on two nodes);
    with webhook pipes besides, both count towards one share."""
    overlaps: list[str] = []
    nodes, names = await alone(namespace, 6, overlaps)
    try:
        for _ in range(2):
            nodes.append(await node(namespace))
        for made in nodes[1:]:
            for name in names:
                await made.bridge(name, overlaps, nodes)
        await settled(lambda: shared(nodes, set(names), 2, 2), "bridges shared out")
        assert overlaps == []

        pipes = {(await new_pipe(nodes[1].engine, "webhook", webhook=HOOK)).key for _ in range(9)}
        # 15 things, 3 nodes: a share of 5; one over is let be, two under is not.
        await settled(lambda: shared(nodes, set(names) | pipes, 4, 6), "both shared out")
        shares = [5, 5, 5]  # (once each has seen the 9 pipes: a catalogue change's news)
        await settled(lambda: [made.engine.owners.share for made in nodes] == shares, "5")

        await close(nodes.pop(0))  # the node that had them all stops
        await settled(lambda: shared(nodes, set(names) | pipes, 7, 9), "taken by the two")
        assert overlaps == []
    finally:
        for made in nodes:
            await close(made)


async def test_a_lock_the_shares_leave_free_is_taken_all_the_same(namespace: str) -> None:
    """Nodes that do not know the same things: two know six bridges, the third (its
    configuration differs) only one of its own. Each of the two counts a share of
    ceil(6 / 3) = 2 and the third takes none of the six: two would stay free, so a
    lock found free for a whole round is taken whatever the share, and kept (no
    bridge goes to and fro)."""
    overlaps: list[str] = []
    nodes = [await node(namespace) for _ in range(3)]
    try:
        names = [f"bridge:b{i}" for i in range(6)]
        await nodes[2].bridge("bridge:own", overlaps, nodes)
        for made in nodes[:2]:
            for name in names:
                await made.bridge(name, overlaps, nodes)
        everything = {*names, "bridge:own"}
        await settled(lambda: [m.engine.owners.live for m in nodes] == [3, 3, 3], "3 live")
        await asyncio.sleep(RENEW * 20)  # past the hand-overs of the first rounds
        runs = [set(made.running) for made in nodes]
        for _ in range(20):  # each running the same, every one run
            assert shared(nodes, everything, 1, 4)
            assert [made.running for made in nodes] == runs
            await asyncio.sleep(RENEW)
        assert runs[2] == {"bridge:own"}
        assert [made.engine.owners.share for made in nodes[:2]] == [2, 2]
        assert overlaps == []
    finally:
        for made in nodes:
            await close(made)


async def test_three_bridges_on_three_nodes_run_one_each(namespace: str) -> None:
    """The first node up takes all three; the two that come after get one each (one
    over its share is handed over while another node is under its own)."""
    overlaps: list[str] = []
    nodes, names = await alone(namespace, 3, overlaps)
    try:
        for _ in range(2):
            nodes.append(await node(namespace))
            for name in names:
                await nodes[-1].bridge(name, overlaps, nodes)
        await settled(lambda: shared(nodes, set(names), 1, 1), "one each")
        assert overlaps == []
    finally:
        for made in nodes:
            await close(made)
