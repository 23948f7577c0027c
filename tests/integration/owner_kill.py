"""The exchange both bridge-owner tests run on three cluster nodes (real processes, the
real RabbitMQ): persistent messages published through the nodes in turn reach the
broker's queue once each, not once per node; the node running the bridge is killed
with SIGKILL; the messages published through the others after it all reach the queue
(one the dead node had in flight may come twice: at least once), and another node
runs the bridge."""

from __future__ import annotations

import asyncio
import signal
import time
from collections import Counter
from dataclasses import dataclass, field

import aiohttp
import orjson

from tests import nodes
from tests.app.test_node_kill import JSON, Nodes
from tests.integration.broker import Broker

BEFORE, AFTER = 10, 20  # messages published before the kill and after it


@dataclass
class Traffic:
    """Messages ``m<i>`` published to the feed ``orders``, taken from ``queue``."""

    http: aiohttp.ClientSession
    broker: Broker
    queue: str
    got: list[str] = field(default_factory=list)  # message ids, as taken from the queue

    async def publish(self, i: int, through: list[str]) -> None:
        message = {"message_id": f"m{i}", "delivery_mode": "2"}
        body = {"restms": {"message": [{**message, "content": [{"value": f"m{i}"}]}]}}
        url = through[i % len(through)]
        async with self.http.post(
            url + "/restms/feed/orders", data=orjson.dumps(body), headers=JSON
        ) as r:
            assert r.status == 200, await r.text()
            assert orjson.loads(await r.read())["restms"]["message"][0]["count"] == "1"

    async def receive(self, count: int, within: float) -> None:
        """Take messages from the queue until ``count`` were taken in all."""
        deadline = time.monotonic() + within
        while len(self.got) < count and time.monotonic() < deadline:
            wanted = count - len(self.got)
            taken = await asyncio.to_thread(self.broker.get_all, self.queue, wanted, 0.5)
            self.got.extend(properties.message_id for _, properties, _ in taken)


async def hand_over(running: Nodes, bridge: str, traffic: Traffic) -> tuple[int, int]:
    """The exchange of the module docstring; (the killed node's index, the new owner's)."""
    urls, got = running.urls, traffic.got
    pids = [proc.pid for proc in running.procs]
    owner = pids.index(await nodes.owner_pid(running.namespace, bridge, kind="bridge"))
    alive = [url for i, url in enumerate(urls) if i != owner]
    for i in range(BEFORE):
        await traffic.publish(i, urls)
    await traffic.receive(BEFORE, 10)
    await asyncio.sleep(0.5)  # were other nodes sending too, their copies land
    await traffic.receive(BEFORE + 1, 0.5)
    assert Counter(got) == Counter(f"m{i}" for i in range(BEFORE)), got
    running.procs[owner].send_signal(signal.SIGKILL)
    for i in range(BEFORE, BEFORE + AFTER):
        await traffic.publish(i, alive)
    await traffic.receive(BEFORE + AFTER, 30)
    await traffic.receive(len(got) + 1, 0.5)  # and nothing more
    assert await running.procs[owner].wait() == -signal.SIGKILL
    now_owner = pids.index(await nodes.owner_pid(running.namespace, bridge, kind="bridge"))
    assert now_owner != owner
    # a message the dead node had in flight may come again (at least once): only those
    later = Counter(m for m in got[BEFORE:] if int(m[1:]) >= BEFORE)
    assert later == Counter(f"m{i}" for i in range(BEFORE, BEFORE + AFTER)), got
    return owner, now_owner
