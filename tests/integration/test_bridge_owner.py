"""A bridge's owner node killed (SIGKILL), on the cluster engine, with real processes:
three ``main.py serve --engine redis`` nodes with one configuration file declaring an
outbound AMQP 1.0 bridge to the local RabbitMQ.

One node runs the bridge at a time (docs/CLUSTER.md, "Webhook pipes and bridges on a
cluster"): before the kill every message reaches the queue once, not once per node.
The node running it is killed; another takes the bridge once the dead node's lock runs
out (5 s) and sends what waited in the bridge's pipe: every message published reaches
the queue, those published after the kill exactly once.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections import Counter
from pathlib import Path

import aiohttp
import orjson
import pytest

from tests import nodes
from tests.app.test_node_kill import JSON, three_nodes
from tests.integration.broker import Broker
from tests.integration.gw import AMQP

pytestmark = pytest.mark.integration

BEFORE, AFTER = 10, 20  # messages published before the kill and after it
DEADLINE = 45.0  # seconds for the whole exchange (the lock alone takes 5 to run out)


def config(path: Path, queue: str) -> Path:
    path.write_text(
        f"""
[[feeds]]
name = "orders"
type = "fanout"

[[bridges]]
name = "out"
direction = "out"
urls = ["{AMQP}"]
feed = "orders"
target = "/queue/{queue}"
reconnect_max = 1.0
""",
        encoding="utf-8",
    )
    return path


async def test_a_killed_owner_hands_its_bridge_to_another_node(
    tmp_path: Path, broker: Broker, queue_name: str
) -> None:
    await asyncio.to_thread(broker.declare_queue, queue_name)
    conf = config(tmp_path / "gateway.toml", queue_name)
    got: list[str] = []

    async def receive(count: int, within: float) -> None:
        """Take messages from the queue until ``count`` were taken in all."""
        deadline = time.monotonic() + within
        while len(got) < count and time.monotonic() < deadline:
            taken = await asyncio.to_thread(broker.get_all, queue_name, count - len(got), 0.5)
            got.extend(properties.message_id for _, properties, _ in taken)

    async with (
        three_nodes(tmp_path, args=("--config", str(conf))) as running,
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http,
    ):
        urls = running.urls

        async def publish(i: int, through: list[str]) -> None:
            message = {"message_id": f"m{i}", "delivery_mode": "2"}
            body = {"restms": {"message": [{**message, "content": [{"value": f"m{i}"}]}]}}
            url = through[i % len(through)]
            async with http.post(
                url + "/restms/feed/orders", data=orjson.dumps(body), headers=JSON
            ) as r:
                assert r.status == 200, await r.text()
                assert orjson.loads(await r.read())["restms"]["message"][0]["count"] == "1"

        async with asyncio.timeout(DEADLINE):
            pids = [proc.pid for proc in running.procs]
            owner = pids.index(await nodes.owner_pid(running.namespace, "out", kind="bridge"))
            alive = [url for i, url in enumerate(urls) if i != owner]
            for i in range(BEFORE):
                await publish(i, urls)
            await receive(BEFORE, 10)
            await asyncio.sleep(0.5)  # were other nodes sending too, their copies land
            await receive(BEFORE + 1, 0.5)
            assert Counter(got) == Counter(f"m{i}" for i in range(BEFORE)), got
            running.procs[owner].send_signal(signal.SIGKILL)
            for i in range(BEFORE, BEFORE + AFTER):
                await publish(i, alive)
            await receive(BEFORE + AFTER, 30)
            await receive(len(got) + 1, 0.5)  # and nothing more
        assert await running.procs[owner].wait() == -signal.SIGKILL
        now_owner = pids.index(await nodes.owner_pid(running.namespace, "out", kind="bridge"))
        assert now_owner != owner
        # a message the dead node had in flight may come again (at least once): only those
        later = Counter(m for m in got[BEFORE:] if int(m[1:]) >= BEFORE)
        assert later == Counter(f"m{i}" for i in range(BEFORE, BEFORE + AFTER)), got
