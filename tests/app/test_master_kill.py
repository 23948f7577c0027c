"""The Redis master holding a pipe killed (SIGKILL) during persistent publishing, with
real processes: two gateway nodes on the cluster engine, the project's cluster.

While the cluster fails over (its node timeout, then the replica takes over) and until
the killed instance is back as a replica (``scripts/cluster up``, as a supervisor
would restart it), a persistent publish into that shard is answered 503, never 200:
with no replica to confirm it, it could be lost. Then publishing resumes, and every
message answered 200 is in the pipe, once, in the order it was sent.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import aiohttp
import orjson
import pytest

from feeds.redis.catalogue import Keys
from tests.app.test_node_kill import JSON, persistent, three_nodes
from tests.cluster_state import NODE_TIMEOUT, cluster_up, instance_pid, master_port

# Alone: a master of the cluster is killed.
pytestmark = [pytest.mark.app, pytest.mark.alone]

EACH = 60
KILL_AFTER = 15
RESUMED_WITHIN = NODE_TIMEOUT + 12.0  # failover, the killed one back as a replica


async def test_a_master_killed_during_publishing_refuses_never_lies(tmp_path: Path) -> None:
    async with (
        three_nodes(tmp_path) as running,
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http,
    ):
        urls = running.urls
        async with http.post(
            urls[0] + "/restms/domain/default", data=b'{"restms":{"pipe":[{}]}}', headers=JSON
        ) as r:
            assert r.status == 201, await r.text()
            pipe = orjson.loads(await r.read())["restms"]["pipe"][0]["name"]
        _, _, tag = Keys(running.namespace).pipe(pipe)
        port = await master_port(tag)
        pid = instance_pid(port)
        acked: list[int] = []
        refused: list[float] = []  # when each 503 came
        answered: list[float] = []  # when each 200 came
        killed_at = 0.0
        restart: asyncio.Task[None] | None = None

        async def back_as_replica() -> None:
            await asyncio.sleep(NODE_TIMEOUT + 2.0)  # past the node timeout: a failover
            await asyncio.to_thread(cluster_up)

        turn = 0
        async with asyncio.timeout(120):
            for i in range(EACH):
                body = persistent(pipe, f"m-{i}")
                while True:
                    url = urls[turn % len(urls)]
                    turn += 1
                    async with http.post(
                        url + "/restms/feed/default", data=body, headers=JSON
                    ) as r:
                        if r.status == 200:
                            acked.append(i)
                            answered.append(time.monotonic())
                            break
                        assert r.status == 503, await r.text()  # refused, never lied
                        assert "Retry-After" in r.headers
                        refused.append(time.monotonic())
                    await asyncio.sleep(0.05)
                if len(acked) == KILL_AFTER:
                    os.kill(pid, signal.SIGKILL)
                    killed_at = time.monotonic()
                    restart = asyncio.create_task(back_as_replica())
            assert restart is not None
            await restart
        assert refused, "the failover refused nothing: the kill did not reach the pipe's shard"
        resumed = min(t for t in answered if t > killed_at) - killed_at
        assert resumed <= RESUMED_WITHIN, f"publishing resumed {resumed:.1f} s after the kill"
        async with http.get(urls[1] + f"/restms/resource/{pipe}", headers=JSON) as r:
            assert r.status == 200
            listing = orjson.loads(await r.read())["restms"]["pipe"][0]
        held = [m for m in listing.get("message", []) if m.get("async") != "1"]
        seen = []
        for message in held:
            path = message["href"][message["href"].index("/restms/") :]
            async with http.get(urls[0] + path, headers=JSON) as r:
                assert r.status == 200, await r.text()
                seen.append(
                    orjson.loads(await r.read())["restms"]["message"][0]["content"][0]["value"]
                )
        assert seen == [f"m-{i}" for i in acked], "lost, repeated or out of order"
