"""Webhook pipes shared out among the live nodes, on the cluster engine, with real
processes: three ``main.py serve --engine redis`` nodes on one namespace and a real
receiver on 127.0.0.1 (docs/CLUSTER.md, "Webhook pipes and bridges on a cluster").

Thirty webhook pipes are made through one node: within a few seconds each node runs
about a third of them (its share is 10; between 8 and 12). One node stops (SIGTERM):
the two left take its pipes (14 to 16 each). A new node joins: it gets its share
again. Messages are published to every pipe through the nodes in turn all along, and
every one is delivered, each pipe's in order (at least once: a message in flight
when its pipe moved may come twice).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp
import orjson
import pytest
from redis.asyncio.cluster import RedisCluster

from tests import nodes
from tests.app.process import listening_port, start
from tests.app.test_node_kill import JSON, Nodes, three_nodes
from tests.app.test_webhook_owner import until
from tests.app.test_webhooks import Receiver

pytestmark = pytest.mark.app

ENV = {
    "RESTMS_WEBHOOK_ALLOW": "127.0.0.1",
    "RESTMS_WEBHOOK_BACKOFF_BASE": "0.05",
    "RESTMS_WEBHOOK_BACKOFF_CAP": "0.2",
}
PIPES = 30
EACH = 2  # messages published to every pipe in each phase
SETTLE = 8.0  # seconds the nodes get to share the pipes out (rounds are 1 s apart)
DEADLINE = 55.0  # seconds for the whole exchange


async def join(running: Nodes, path: Path) -> asyncio.Task[bytes]:
    """One more node on ``running``'s namespace (stopped with the others); the task
    that reads its log."""
    env = {
        **ENV,
        "RESTMS_REDIS_URL": nodes.CLUSTER_URL,
        "RESTMS_REDIS_NAMESPACE": running.namespace,
    }
    proc = await start("--engine", "redis", "--port", "0", "--data-dir", str(path), env=env)
    running.procs.append(proc)
    running.urls.append(f"http://127.0.0.1:{await listening_port(proc)}")
    assert proc.stderr is not None
    return asyncio.create_task(proc.stderr.read())


async def owners(namespace: str, pipes: list[str]) -> dict[int, int]:
    """How many of ``pipes`` each node (by process id) holds the lock of; a pipe
    nobody holds counts under 0."""
    cluster = RedisCluster.from_url(nodes.CLUSTER_URL, driver_info=nodes.DRIVER)
    try:
        held = await cluster.mget([f"{{{namespace}:own}}:hook:{pipe}" for pipe in pipes])
    finally:
        await cluster.aclose()
    counts: dict[int, int] = {}
    for value in held:
        text = value.decode() if isinstance(value, bytes) else value
        pid = 0 if text is None else int(text.split(" ")[0].split(":")[1])
        counts[pid] = counts.get(pid, 0) + 1
    return counts


async def shared(
    running: Nodes, alive: list[int], pipes: list[str], low: int, high: int, what: str
) -> tuple[float, dict[int, int]]:
    """Wait until the nodes ``alive``, and they alone, hold every pipe, each between
    ``low`` and ``high`` of them: how long it took, and the counts."""
    pids = {running.procs[i].pid for i in alive}
    started = time.monotonic()
    while True:
        counts = await owners(running.namespace, pipes)
        if set(counts) == pids and all(low <= n <= high for n in counts.values()):
            return time.monotonic() - started, counts
        assert time.monotonic() - started < SETTLE, f"never {what}: {counts}"
        await asyncio.sleep(0.1)


async def test_webhook_pipes_are_shared_out_among_the_live_nodes(tmp_path: Path) -> None:
    receiver = await Receiver().start()
    published: dict[str, list[str]] = {}  # pipe -> its message ids, in order
    alive = [0, 1, 2]  # the nodes published through, and expected to hold pipes
    turn = 0
    log: asyncio.Task[bytes] | None = None  # the joining node's
    try:
        async with (
            three_nodes(tmp_path, ENV) as running,
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http,
            asyncio.timeout(DEADLINE),
        ):
            pipes = []
            made = {"restms": {"pipe": [{"type": "webhook", "callback": receiver.url}]}}
            for _ in range(PIPES):
                async with http.post(
                    running.urls[0] + "/restms/domain/default",
                    data=orjson.dumps(made),
                    headers=JSON,
                ) as r:
                    assert r.status == 201, await r.text()
                    pipes.append(orjson.loads(await r.read())["restms"]["pipe"][0]["name"])
            published = {pipe: [] for pipe in pipes}

            async def publish_all() -> None:
                """EACH messages to every pipe, through the live nodes in turn."""
                nonlocal turn
                for _ in range(EACH):
                    for k, pipe in enumerate(pipes):
                        url = running.urls[alive[turn % len(alive)]]
                        turn += 1
                        name = f"p{k}-{len(published[pipe])}"
                        message = {"address": pipe, "message_id": name}
                        body = {"restms": {"message": [{**message, "content": [{"value": name}]}]}}
                        async with http.post(
                            url + "/restms/feed/default", data=orjson.dumps(body), headers=JSON
                        ) as r:
                            assert r.status == 200, await r.text()
                        published[pipe].append(name)

            await publish_all()
            took, counts = await shared(running, alive, pipes, 8, 12, "shared out by three")
            print(f"shared out in {took:.2f} s after the last publish: {counts}")

            alive.remove(2)
            running.procs[2].terminate()  # a clean stop: it frees its locks and leaves
            await publish_all()
            async with asyncio.timeout(30):
                assert await running.procs[2].wait() == 0
            took, counts = await shared(running, alive, pipes, 14, 16, "taken by the two")
            print(f"taken by the two in {took:.2f} s: {counts}")

            log = await join(running, tmp_path / "node3")  # a node joins: it gets a share
            alive.append(3)
            await publish_all()
            took, counts = await shared(running, alive, pipes, 8, 12, "shared out again")
            print(f"shared out again in {took:.2f} s: {counts}")

            everything = {name for names in published.values() for name in names}
            assert len(everything) == PIPES * EACH * 3
            await until(lambda: set(receiver.ids()) == everything, "every delivery", 20)
            ids = receiver.ids()
            for k, pipe in enumerate(pipes):
                mine = [i for i in ids if i.startswith(f"p{k}-")]
                firsts = list(dict.fromkeys(mine))  # each message's first delivery
                assert firsts == published[pipe], f"pipe {k} out of order: {mine}"
            print(f"{len(ids)} deliveries of {len(everything)} messages")
    finally:
        await receiver.stop()
        if log is not None:  # (its process stopped with the others)
            text = await log
            await asyncio.to_thread((tmp_path / "node3.log").write_bytes, text)
