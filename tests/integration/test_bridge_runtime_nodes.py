"""A run-time bridge on a cluster, with real processes: three ``main.py serve --engine
redis`` nodes, an outbound AMQP 1.0 bridge to the local RabbitMQ made through the admin
resource of one node (docs/CLUSTER.md, "Bridges"; docs/ADMIN.md).

Made through the first node, it is listed by every node within seconds and run by one
of them: before the kill every message reaches the queue once, not once per node. Its
owner is killed (SIGKILL); another node takes it once the dead node's claim runs out
and sends what waited in its pipe, every message published reaching the queue. Deleted
through a third node, it is gone from every node, its pipe with it, and nobody claims
it any more. And deleted right after its node was killed, the delete waits for the
dead node's claim to run out before it drops the pipe.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from redis.asyncio.cluster import RedisCluster

import bridges.registry
from tests import nodes
from tests.app.test_node_kill import JSON, three_nodes
from tests.integration.broker import Broker
from tests.integration.gw import AMQP
from tests.integration.owner_kill import Traffic, hand_over

pytestmark = pytest.mark.integration

DEADLINE = 60.0  # seconds for the whole exchange (the claim alone takes 5 to run out)
ADMIN = "/admin/bridges"


def config(path: Path) -> Path:
    path.write_text(
        """
guest_scopes = "restms:admin restms:read restms:publish restms:subscribe"
bridge_allow = "127.0.0.1"  # the broker, for a bridge made at run time

[[feeds]]
name = "orders"
type = "fanout"
""",
        encoding="utf-8",
    )
    return path


def definition(queue: str) -> dict[str, Any]:
    return {
        "name": "rt",
        "direction": "out",
        "urls": [AMQP.replace("guest:guest@", "")],
        "feed": "orders",
        "target": f"/queue/{queue}",
        "reconnect_max": 1.0,
        "password": "guest",  # a secret the definition keeps and never shows
        "user": "guest",
    }


async def until(check: Callable[[], Awaitable[bool]], what: str, within: float = 10) -> None:
    deadline = time.monotonic() + within
    while not await check():
        assert time.monotonic() < deadline, f"not within {within} s: {what}"
        await asyncio.sleep(0.2)


async def claimed(namespace: str, name: str) -> bool:
    cluster = RedisCluster.from_url(nodes.CLUSTER_URL, driver_info=nodes.DRIVER)
    try:
        return bool(await cluster.exists(f"{{{namespace}:own}}:bridge:{name}"))
    finally:
        await cluster.aclose()


async def test_a_run_time_bridge_is_shared_handed_over_and_deleted_through_any_node(
    tmp_path: Path, broker: Broker, queue_name: str
) -> None:
    await asyncio.to_thread(broker.declare_queue, queue_name)
    conf = config(tmp_path / "gateway.toml")
    async with (
        three_nodes(tmp_path, args=("--config", str(conf))) as running,
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http,
    ):
        urls = running.urls

        async def listed(url: str) -> list[dict[str, Any]]:
            async with http.get(url + ADMIN) as r:
                assert r.status == 200, await r.text()
                return list(orjson.loads(await r.read())["bridges"])

        async with asyncio.timeout(DEADLINE):
            made = definition(queue_name)
            async with http.post(urls[0] + ADMIN, json=made) as r:
                assert r.status == 201, await r.text()
            # The same definition again, through another node: already there (200);
            # a different one under its name: 409, from any node.
            async with http.post(urls[1] + ADMIN, json=made) as r:
                assert r.status == 200, await r.text()
            async with http.post(urls[2] + ADMIN, json={**made, "target": "/queue/x"}) as r:
                assert r.status == 409, await r.text()
                assert r.content_type == "text/plain"

            async def on_every_node() -> bool:
                names = [[b["name"] for b in await listed(url)] for url in urls]
                return names == [["rt"]] * len(urls)

            await until(on_every_node, "the bridge listed by every node")
            for url in urls:
                (shown,) = await listed(url)
                assert shown["configured"] is False
                assert shown["definition"]["password"] == "***"

            async def one_runs() -> bool:
                states = [(await listed(url))[0]["state"] for url in urls]
                return states.count("up") == 1 and states.count("stopped") == 2

            await until(one_runs, "one node running the bridge, two standing by")
            traffic = Traffic(http, broker, queue_name)
            owner, now_owner = await hand_over(running, "rt", traffic)
            alive = [url for i, url in enumerate(urls) if i != owner]

            # Sent is not yet settled: the pipe holds a message until the broker has
            # taken it, which the node running the bridge shows as its backlog.
            async def settled() -> bool:
                async with http.get(urls[now_owner] + ADMIN + "/rt") as r:
                    return bool((await r.json())["backlog"] == 0)

            await until(settled, "every message sent settled")
            # Deleted through a node that does not run it.
            third = next(i for i in range(len(urls)) if i not in (owner, now_owner))
            async with http.delete(urls[third] + ADMIN + "/rt") as r:
                assert r.status == 200, await r.text()
                assert orjson.loads(await r.read()) == {"deleted": "rt", "discarded": 0}
            async with http.delete(urls[third] + ADMIN + "/rt") as r:
                assert r.status == 404, await r.text()

            async def gone_everywhere() -> bool:
                return [await listed(url) for url in alive] == [[]] * len(alive)

            await until(gone_everywhere, "the bridge gone from every node")
            assert not await claimed(running.namespace, "rt")
            for url in alive:
                async with http.get(url + ADMIN + "/rt") as r:
                    assert r.status == 404
            # Its pipe went with it: a message published now reaches no pipe.
            body = {"restms": {"message": [{"content": [{"value": "after"}]}]}}
            async with http.post(
                alive[0] + "/restms/feed/orders", data=orjson.dumps(body), headers=JSON
            ) as r:
                assert r.status == 200, await r.text()
                assert orjson.loads(await r.read())["restms"]["message"][0]["count"] == "0"


async def test_a_bridge_whose_node_was_just_killed_is_deleted_through_another(
    tmp_path: Path,
) -> None:
    """No broker: the bridge points at a port nothing listens on, so what is published
    waits in its pipe. Its node killed, a delete through another node waits until the
    dead node's claim runs out (nobody runs the bridge then), drops the pipe with the
    two waiting messages, and the bridge is gone from both nodes left."""
    conf = config(tmp_path / "gateway.toml")
    nowhere = {**definition("unused"), "urls": ["amqp://127.0.0.1:1"]}
    async with (
        three_nodes(tmp_path, args=("--config", str(conf))) as running,
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http,
    ):
        urls = running.urls

        async def publish(url: str) -> str:
            body = {"restms": {"message": [{"delivery_mode": "2", "content": [{"value": "x"}]}]}}
            async with http.post(
                url + "/restms/feed/orders", data=orjson.dumps(body), headers=JSON
            ) as r:
                assert r.status == 200, await r.text()
                return str(orjson.loads(await r.read())["restms"]["message"][0]["count"])

        async with asyncio.timeout(DEADLINE):
            async with http.post(urls[0] + ADMIN, json=nowhere) as r:
                assert r.status == 201, await r.text()

            async def joined() -> bool:
                return await publish(urls[0]) == "1"

            await until(joined, "the bridge's pipe joined to its feed")
            assert await publish(urls[1]) == "1"
            pids = [proc.pid for proc in running.procs]
            owner = pids.index(await nodes.owner_pid(running.namespace, "rt", kind="bridge"))
            alive = [url for i, url in enumerate(urls) if i != owner]
            running.procs[owner].send_signal(signal.SIGKILL)
            assert await running.procs[owner].wait() == -signal.SIGKILL
            async with http.delete(alive[0] + ADMIN + "/rt") as r:
                assert r.status == 409, await r.text()  # two wait, whoever runs it
                assert "has 2 messages waiting" in await r.text()
            began = time.monotonic()
            async with http.delete(alive[0] + ADMIN + "/rt?discard=true") as r:
                assert r.status == 200, await r.text()
                assert orjson.loads(await r.read()) == {"deleted": "rt", "discarded": 2}
            # It waited for the dead node's claim to run out (5 s at most), not past
            # the wait a delete gives a node that still runs the bridge.
            assert time.monotonic() - began < bridges.registry.CLAIM_WAIT
            assert not await claimed(running.namespace, "rt")
            assert await publish(alive[1]) == "0"  # its pipe is gone

            async def gone() -> bool:
                for url in alive:
                    async with http.get(url + ADMIN) as r:
                        if orjson.loads(await r.read())["bridges"]:
                            return False
                return True

            await until(gone, "the bridge gone from both nodes left")
