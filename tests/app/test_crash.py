"""Crash safety: the real server, killed with SIGKILL at a random moment, then restarted.

* Publishing: several clients publish persistent messages concurrently; every one the
  gateway answered 200 must be in every pipe after the restart, in each publisher's
  order, once. The only other message a publisher may find is the one it had in
  flight when the process died.
* Acknowledging: a reader DELETEs messages one by one; after the restart none it saw
  acknowledged comes back, and none it had not acknowledged is lost (the DELETE in
  flight may have happened or not).

The seed of the random moment is in every failure message.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from tests.app.process import listening_port, start

JSON = "application/restms+json"
HJ = {"Content-Type": JSON, "Accept": JSON}
PUBLISHERS = 4
PIPES = 3


class Server:
    def __init__(self, proc: asyncio.subprocess.Process, port: int) -> None:
        self.proc = proc
        self.url = f"http://127.0.0.1:{port}"
        assert proc.stderr is not None
        self.log: list[str] = []
        self.killed = False  # set just before SIGKILL: a dropped connection is then expected
        self._drain = asyncio.create_task(self._read(proc.stderr))

    async def _read(self, stream: asyncio.StreamReader) -> None:
        while line := await stream.readline():
            self.log.append(line.decode(errors="replace"))

    async def kill(self) -> None:
        self.killed = True
        self.proc.send_signal(signal.SIGKILL)
        await self.proc.wait()
        await self._drain

    async def stop(self) -> None:
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            async with asyncio.timeout(15):
                await self.proc.wait()
        await self._drain


@contextlib.asynccontextmanager
async def server(data: Path, **more: str) -> AsyncIterator[Server]:
    """The gateway on ``data``, with these ``RESTMS_*`` variables besides ours."""
    env = {"RESTMS_LISTING_CAP": "1000000", "RESTMS_MAX_PIPE_MESSAGES": "1000000", **more}
    proc = await start("--port", "0", "--data-dir", str(data), env=env)
    try:
        running = Server(proc, await listening_port(proc))
        yield running
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def path(uri: str) -> str:
    """A URI's path: the restarted server listens on another port."""
    return urlsplit(uri).path


async def call(http: aiohttp.ClientSession, method: str, url: str, doc: Any = None) -> Any:
    data = json.dumps({"restms": doc}) if doc is not None else None
    async with http.request(method, url, data=data, headers=HJ) as r:
        text = await r.text()
        assert r.status in (200, 201), (method, url, r.status, text)
        return (json.loads(text) if text and r.content_type == JSON else None), r.headers


async def attempt(
    http: aiohttp.ClientSession, gw: Server, method: str, where: str, doc: Any
) -> bool:
    """Send a request of a loop that runs until the kill: True once it is answered 2xx,
    False when the connection is refused or reset after the kill. A retriable refusal
    (503 or 429 with ``Retry-After``: nothing was done, DURABILITY.md) is sent again;
    any other answer, or a connection lost while the gateway lives, fails the test."""
    data = json.dumps({"restms": doc}) if doc is not None else None
    while True:
        try:
            async with http.request(method, gw.url + where, data=data, headers=HJ) as r:
                text = await r.text()
                if r.status in (200, 201):
                    return True
                retry = r.headers.get("Retry-After")
                assert r.status in (429, 503), (method, where, r.status, text)
                assert retry is not None, (method, where, r.status, "no Retry-After", text)
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError):
            assert gw.killed, f"{method} {where}: the connection was lost before the kill"
            return False
        await asyncio.sleep(min(float(retry), 1.0))


async def set_up(http: aiohttp.ClientSession, url: str) -> tuple[str, list[str]]:
    feed = {"feed": [{"name": "crash", "type": "fanout"}]}
    _, headers = await call(http, "POST", f"{url}/restms/domain/default", feed)
    feed_uri = headers["Location"]
    pipes = []
    for _ in range(PIPES):
        _, headers = await call(http, "POST", f"{url}/restms/domain/default", {"pipe": [{}]})
        pipes.append(path(headers["Location"]))
        await call(http, "POST", headers["Location"], {"join": [{"feed": feed_uri}]})
    return path(feed_uri), pipes


async def listing(http: aiohttp.ClientSession, url: str, pipe: str) -> list[dict[str, str]]:
    doc, _ = await call(http, "GET", url + pipe)
    return [m for m in doc["restms"]["pipe"][0].get("message", []) if m.get("async") != "1"]


def persistent(mid: str) -> dict[str, Any]:
    return {"message_id": mid, "delivery_mode": "2", "content": [{"value": f"payload {mid}"}]}


async def test_acknowledged_publishes_survive_sigkill(tmp_path: Path) -> None:
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    acked: dict[int, list[int]] = {p: [] for p in range(PUBLISHERS)}

    async def publisher(http: aiohttp.ClientSession, gw: Server, feed: str, p: int) -> None:
        for i in range(1_000_000):
            if not await attempt(http, gw, "POST", feed, {"message": [persistent(f"{p}-{i}")]}):
                return  # the server died under this request
            acked[p].append(i)

    async with server(tmp_path) as gw, aiohttp.ClientSession() as http:
        feed, pipes = await set_up(http, gw.url)
        tasks = [asyncio.create_task(publisher(http, gw, feed, p)) for p in range(PUBLISHERS)]
        await asyncio.sleep(rng.uniform(0.5, 2.0))
        await gw.kill()
        async with asyncio.timeout(20):
            await asyncio.gather(*tasks)
    assert all(acked.values()), f"seed {seed}: every publisher got replies before the kill"

    async with server(tmp_path) as gw, aiohttp.ClientSession() as http:
        for pipe in pipes:
            found = [m["message_id"] for m in await listing(http, gw.url, pipe)]
            assert len(found) == len(set(found)), f"seed {seed}: duplicates in {pipe}"
            for p, numbers in acked.items():
                mine = [int(mid.split("-")[1]) for mid in found if mid.startswith(f"{p}-")]
                assert mine == sorted(mine), f"seed {seed}: publisher {p} out of order"
                # every acknowledged one, plus at most the one in flight at the kill
                assert mine[: len(numbers)] == numbers, f"seed {seed}: publisher {p} lost some"
                assert mine[len(numbers) :] in ([], [len(numbers)]), f"seed {seed}: {p} extra"
        # and the restarted gateway carries on where it was
        reply, _ = await call(http, "POST", gw.url + feed, {"message": [persistent("after")]})
        (count,) = reply["restms"]["message"]
        assert count["count"] == str(PIPES)
        await gw.stop()


async def test_acknowledged_deletes_stay_deleted_after_sigkill(tmp_path: Path) -> None:
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    total = 1500
    async with server(tmp_path) as gw, aiohttp.ClientSession() as http:
        feed, pipes = await set_up(http, gw.url)
        for start_at in range(0, total, 50):
            batch = [persistent(f"m-{i}") for i in range(start_at, start_at + 50)]
            await call(http, "POST", gw.url + feed, {"message": batch})
        hrefs = {p: [m["href"] for m in await listing(http, gw.url, p)] for p in pipes}
        assert all(len(h) == total for h in hrefs.values())
        deleted: dict[str, int] = dict.fromkeys(pipes, 0)  # how many were acknowledged

        async def reader(pipe: str) -> None:
            for href in hrefs[pipe]:
                if not await attempt(http, gw, "DELETE", path(href), None):
                    return
                deleted[pipe] += 1

        tasks = [asyncio.create_task(reader(pipe)) for pipe in pipes]
        await asyncio.sleep(rng.uniform(0.1, 0.6))
        await gw.kill()
        async with asyncio.timeout(20):
            await asyncio.gather(*tasks)
    assert any(0 < n < total for n in deleted.values()), f"seed {seed}: not mid-way: {deleted}"

    async with server(tmp_path) as gw, aiohttp.ClientSession() as http:
        for pipe in pipes:
            left = [m["message_id"] for m in await listing(http, gw.url, pipe)]
            done = deleted[pipe]
            expected = [f"m-{i}" for i in range(done, total)]
            # the DELETE in flight at the kill may have been committed or not
            assert left in (expected, expected[1:]), f"seed {seed}: {pipe} after {done} deletes"
        await gw.stop()


async def test_admin_pipe_changes_are_on_disk_before_the_reply(tmp_path: Path) -> None:
    """An admin's pipe provisioning, then its pipe deletion, each survive a SIGKILL
    right after the reply, with the background commit too slow to have written them
    (the loopback guest is the admin here)."""
    admin = {"RESTMS_GUEST_SCOPES": "restms:admin", "RESTMS_JOURNAL_INTERVAL": "30"}
    async with server(tmp_path, **admin) as gw, aiohttp.ClientSession() as http:
        feed, (doomed, kept, _) = await set_up(http, gw.url)
        await call(http, "POST", gw.url + feed, {"message": [persistent("m-1")]})
        _, headers = await call(
            http, "POST", f"{gw.url}/admin/pipes?owner=guest", {"pipe": [{"title": "given"}]}
        )
        given = path(headers["Location"])
        await gw.kill()

    async with server(tmp_path, **admin) as gw, aiohttp.ClientSession() as http:
        doc, _ = await call(http, "GET", gw.url + given)
        assert doc["restms"]["pipe"][0]["title"] == "given"
        doc, _ = await call(http, "GET", gw.url + doomed)
        joins = [path(j["href"]) for j in doc["restms"]["pipe"][0]["join"]]
        async with http.delete(f"{gw.url}/admin/pipes/{doomed.rsplit('/', 1)[1]}") as r:
            assert r.status == 200, await r.text()
        await gw.kill()

    async with server(tmp_path, **admin) as gw, aiohttp.ClientSession() as http:
        for gone in (doomed, *joins):
            async with http.get(gw.url + gone, headers=HJ) as r:
                assert r.status == 404, gone
        assert [m["message_id"] for m in await listing(http, gw.url, kept)] == ["m-1"]
        await gw.stop()


async def test_memory_store_writes_nothing_and_keeps_nothing(
    make_gateway: Any, tmp_path: Path
) -> None:
    data = tmp_path / "mem"
    gw = await make_gateway(store="memory", data_dir=str(data))
    async with gw.http.post(
        "/restms/domain/default", data=json.dumps({"restms": {"pipe": [{}]}}), headers=HJ
    ) as r:
        assert r.status == 201
    assert gw.engine.journal is None  # no journal: the hot path records nothing
    assert await asyncio.to_thread(lambda: data.is_dir() and list(data.iterdir())) == []
