"""A webhook pipe's owner node killed (SIGKILL), on the cluster engine, with real
processes: three ``main.py serve --engine redis`` nodes on one namespace and a real
receiver on 127.0.0.1.

One node runs a webhook pipe's deliveries at a time (docs/CLUSTER.md, "Webhook pipes and bridges
on a cluster"). Messages are published through the nodes in turn; the node running
the pipe is killed midway; another takes the pipe once the dead node's lock runs out
(5 s) and delivery goes on: every message published is delivered, in order, and at
most the one in flight at the kill twice.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable
from pathlib import Path

import aiohttp
import orjson
import pytest

from tests import nodes
from tests.app.test_node_kill import JSON, three_nodes
from tests.app.test_webhooks import Receiver

pytestmark = pytest.mark.app

ENV = {
    "RESTMS_WEBHOOK_ALLOW": "127.0.0.1",
    "RESTMS_WEBHOOK_BACKOFF_BASE": "0.05",
    "RESTMS_WEBHOOK_BACKOFF_CAP": "0.2",
}
BEFORE, AFTER = 10, 20  # messages published before the kill and after it
DEADLINE = 45.0  # seconds for the whole exchange (the lock alone takes 5 to run out)


async def until(check: Callable[[], object], what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


async def test_a_killed_owner_hands_its_webhook_pipe_to_another_node(tmp_path: Path) -> None:
    receiver = await Receiver().start()
    try:
        async with (
            three_nodes(tmp_path, ENV) as running,
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http,
        ):
            urls = running.urls
            made = {"restms": {"pipe": [{"type": "webhook", "callback": receiver.url}]}}
            async with http.post(
                urls[0] + "/restms/domain/default", data=orjson.dumps(made), headers=JSON
            ) as r:
                assert r.status == 201, await r.text()
                pipe = orjson.loads(await r.read())["restms"]["pipe"][0]["name"]
            await until(lambda: receiver.verifications, "the verification", 10)
            pids = [proc.pid for proc in running.procs]
            owner = pids.index(await nodes.owner_pid(running.namespace, pipe))
            alive = [url for i, url in enumerate(urls) if i != owner]

            async def publish(i: int, through: list[str]) -> None:
                message = {"address": pipe, "message_id": f"m{i}"}
                body = {"restms": {"message": [{**message, "content": [{"value": f"m{i}"}]}]}}
                url = through[i % len(through)]
                async with http.post(
                    url + "/restms/feed/default", data=orjson.dumps(body), headers=JSON
                ) as r:
                    assert r.status == 200, await r.text()

            async with asyncio.timeout(DEADLINE):
                for i in range(BEFORE):
                    await publish(i, urls)
                await until(lambda: len(set(receiver.ids())) >= BEFORE // 2, "deliveries", 10)
                running.procs[owner].send_signal(signal.SIGKILL)
                killed = time.monotonic()
                for i in range(BEFORE, BEFORE + AFTER):
                    await publish(i, alive)
                everything = [f"m{i}" for i in range(BEFORE + AFTER)]
                await until(lambda: set(receiver.ids()) == set(everything), "all", DEADLINE)
                resumed = time.monotonic() - killed
            assert await running.procs[owner].wait() == -signal.SIGKILL
            now_owner = pids.index(await nodes.owner_pid(running.namespace, pipe))
            assert now_owner != owner
            ids = receiver.ids()
            firsts = list(dict.fromkeys(ids))  # each message's first delivery, in order
            assert firsts == everything, "out of order"
            assert len(ids) - len(firsts) <= 1, f"repeated: {ids}"
            assert resumed < 5.0 + 10.0  # the lock's life, then a round and the backlog
    finally:
        await receiver.stop()
