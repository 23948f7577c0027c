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
from pathlib import Path

import aiohttp
import pytest

from tests.app.test_node_kill import three_nodes
from tests.integration.broker import Broker
from tests.integration.gw import AMQP
from tests.integration.owner_kill import Traffic, hand_over

pytestmark = pytest.mark.integration

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
    async with (
        three_nodes(tmp_path, args=("--config", str(conf))) as running,
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http,
        asyncio.timeout(DEADLINE),
    ):
        await hand_over(running, "out", Traffic(http, broker, queue_name))
