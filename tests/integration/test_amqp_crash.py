"""A gateway killed (SIGKILL) while its inbound bridge consumes: nothing the broker
handed over is lost, because a delivery is accepted only once it is on disk."""

from __future__ import annotations

import asyncio
import json
import random
import signal
from pathlib import Path

import aiohttp
import pika
import pytest

from tests.app.process import listening_port, start
from tests.integration.broker import Broker
from tests.integration.gw import AMQP

pytestmark = pytest.mark.integration

JSON = "application/restms+json"
HJ = {"Content-Type": JSON, "Accept": JSON}
TOTAL = 3000


def config(path: Path, queue: str) -> Path:
    text = f"""
listing_cap = 100000
[[feeds]]
name = "incoming"
type = "fanout"

[[bridges]]
name = "in"
direction = "in"
urls = ["{AMQP}"]
feed = "incoming"
source = "/queue/{queue}"
window = 64
reconnect_max = 1.0
"""
    path.write_text(text, encoding="utf-8")
    return path


DRAINS: set[asyncio.Task[None]] = set()  # keeps the stderr readers alive


async def serve(conf: Path, data: Path) -> tuple[asyncio.subprocess.Process, str]:
    proc = await start("--port", "0", "--data-dir", str(data), "--config", str(conf))
    port = await listening_port(proc)
    assert proc.stderr is not None

    async def drain(stream: asyncio.StreamReader) -> None:
        while await stream.readline():
            pass

    task = asyncio.create_task(drain(proc.stderr))
    DRAINS.add(task)
    task.add_done_callback(DRAINS.discard)
    return proc, f"http://127.0.0.1:{port}"


async def ids_in(http: aiohttp.ClientSession, pipe: str) -> list[str]:
    async with http.get(pipe, headers={"Accept": JSON}) as r:
        assert r.status == 200, await r.text()
        doc = await r.json(content_type=None)
    listed = doc["restms"]["pipe"][0].get("message", [])
    return [m["message_id"] for m in listed if "async" not in m]


async def test_a_crash_mid_stream_loses_nothing(
    tmp_path: Path, broker: Broker, queue_name: str
) -> None:
    seed = random.randrange(1 << 30)
    chance = random.Random(seed)
    await asyncio.to_thread(broker.declare_queue, queue_name)
    conf, data = config(tmp_path / "gateway.toml", queue_name), tmp_path / "var"
    proc, url = await serve(conf, data)
    async with aiohttp.ClientSession() as http:
        try:
            doc = json.dumps({"restms": {"pipe": [{"durable": "1"}]}})
            async with http.post(f"{url}/restms/domain/default", data=doc, headers=HJ) as r:
                assert r.status == 201
                pipe_path = r.headers["Location"].removeprefix(url)
            join = {"join": [{"feed": f"{url}/restms/feed/incoming"}]}
            async with http.post(
                url + pipe_path, data=json.dumps({"restms": join}), headers=HJ
            ) as r:
                assert r.status == 201

            def feed_the_queue() -> None:
                for i in range(TOTAL):
                    props = pika.BasicProperties(message_id=f"c-{i}", delivery_mode=2)
                    broker.publish("", queue_name, b"x" * 512, props)

            feeding = asyncio.create_task(asyncio.to_thread(feed_the_queue))
            target = chance.randrange(50, 1000)  # kill once this many have arrived
            before: list[str] = []
            for _ in range(6000):  # bounded: a minute at most
                before = await ids_in(http, url + pipe_path)
                if len(before) >= target:
                    break
                await asyncio.sleep(0.01)
            proc.send_signal(signal.SIGKILL)
            await proc.wait()
            await feeding
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        assert 0 < len(before) < TOTAL, f"the kill should come mid-stream (seed {seed})"
        proc, url = await serve(conf, data)
        try:
            pipe = url + pipe_path
            deadline = asyncio.get_running_loop().time() + 60
            ids: list[str] = []
            while len(set(ids)) < TOTAL and asyncio.get_running_loop().time() < deadline:
                ids = await ids_in(http, pipe)
                await asyncio.sleep(0.2)
            assert sorted(set(ids)) == sorted(f"c-{i}" for i in range(TOTAL)), f"seed {seed}"
            assert len(ids) == TOTAL, f"duplicates after the restart (seed {seed})"
            assert await asyncio.to_thread(broker.depth, queue_name) == 0
        finally:
            proc.send_signal(signal.SIGTERM)
            async with asyncio.timeout(20):
                await proc.wait()
