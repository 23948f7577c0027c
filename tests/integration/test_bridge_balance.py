"""Bridges shared out among the live nodes, on the cluster engine, with real
processes: three ``main.py serve --engine redis`` nodes with one configuration file
declaring three outbound AMQP 1.0 bridges to the local RabbitMQ (docs/CLUSTER.md,
"Webhook pipes and bridges on a cluster", "Balance").

The first node up takes the three bridges (alone, its share is all of them); as the
two others join, it hands two over: each node runs one. Messages published to each
bridge's feed through the nodes in turn reach that bridge's queue once each.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path

import aiohttp
import orjson
import pytest
from redis.asyncio.cluster import RedisCluster

from tests import nodes
from tests.app.test_node_kill import JSON, three_nodes
from tests.integration.broker import Broker
from tests.integration.gw import AMQP

pytestmark = pytest.mark.integration

BRIDGES = 3
EACH = 5  # messages published to each bridge's feed
SETTLE = 10.0  # seconds the nodes get to share the bridges out
DEADLINE = 50.0


def config(path: Path, queues: list[str]) -> Path:
    text = "".join(
        f"""
[[feeds]]
name = "orders{i}"
type = "fanout"

[[bridges]]
name = "out{i}"
direction = "out"
urls = ["{AMQP}"]
feed = "orders{i}"
target = "/queue/{queue}"
reconnect_max = 1.0
"""
        for i, queue in enumerate(queues)
    )
    path.write_text(text, encoding="utf-8")
    return path


async def holders(namespace: str) -> list[int]:
    """The process id of the node holding each bridge's lock (0: nobody)."""
    cluster = RedisCluster.from_url(nodes.CLUSTER_URL, driver_info=nodes.DRIVER)
    try:
        keys = [f"{{{namespace}:own}}:bridge:out{i}" for i in range(BRIDGES)]
        held = await cluster.mget(keys)
    finally:
        await cluster.aclose()
    found = [value.decode() if isinstance(value, bytes) else value for value in held]
    return [0 if text is None else int(text.split(" ")[0].split(":")[1]) for text in found]


async def test_three_bridges_on_three_nodes_run_one_on_each(
    tmp_path: Path, broker: Broker, queue_name: str
) -> None:
    queues = [broker.track(f"{queue_name}-{i}") for i in range(BRIDGES)]
    for queue in queues:
        await asyncio.to_thread(broker.declare_queue, queue)
    conf = config(tmp_path / "gateway.toml", queues)
    async with three_nodes(tmp_path, args=("--config", str(conf))) as running:
        pids = {proc.pid for proc in running.procs}
        started = time.monotonic()
        while True:
            owners = await holders(running.namespace)
            if set(owners) == pids:
                break
            assert time.monotonic() - started < SETTLE, f"never one each: {owners}"
            await asyncio.sleep(0.2)
        took = time.monotonic() - started
        print(f"one bridge on each node {took:.2f} s after the third node listened")
        async with asyncio.timeout(DEADLINE):
            await publish(running.urls)
            for i, queue in enumerate(queues):
                got = await received(broker, queue)
                assert Counter(got) == Counter(f"b{i}-m{n}" for n in range(EACH)), got


async def publish(urls: list[str]) -> None:
    """EACH messages to each bridge's feed, through the nodes in turn."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
        for n in range(EACH):
            for i in range(BRIDGES):
                message = {"message_id": f"b{i}-m{n}", "delivery_mode": "2"}
                body = {"restms": {"message": [{**message, "content": [{"value": "x"}]}]}}
                url = urls[(n + i) % len(urls)]
                async with http.post(
                    f"{url}/restms/feed/orders{i}", data=orjson.dumps(body), headers=JSON
                ) as r:
                    assert r.status == 200, await r.text()


async def received(broker: Broker, queue: str) -> list[str]:
    """The ids of the messages taken from ``queue``: EACH of them (within 15 s), and
    any that follows within half a second."""
    got: list[str] = []
    deadline = time.monotonic() + 15
    while len(got) < EACH and time.monotonic() < deadline:
        taken = await asyncio.to_thread(broker.get_all, queue, EACH - len(got), 0.5)
        got.extend(properties.message_id for _, properties, _ in taken)
    late = await asyncio.to_thread(broker.get_all, queue, 1, 0.5)  # nothing more
    return got + [properties.message_id for _, properties, _ in late]
