"""Pull links reading a backlog from their remote pipe's event stream, between
gateways in processes of their own (tests/sites.py): every message arrives once, in
the order published, and a puller killed with SIGKILL while it drains loses and
repeats nothing; from a RestMS server without event streams (a gateway behind a
proxy that refuses them), the link reads a message at a time.

The reader pipe on B is durable and the messages persistent, so it keeps what came
across B's restarts (and B's deduplication windows are refilled from it); it is read
through its event stream, as a listing shows at most 1,000 messages.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from auth.clients import hash_secret
from tests.sites import JSON, SECRET, Client, Link, Site, free_port, sites, write_configs

pytestmark = pytest.mark.timeout(240)

WITHIN = 60.0  # seconds a backlog may take to reach B (a loaded machine)
QUIET = 2.0  # seconds B is watched after delivery: nothing more may come
PULL = Link("B", "A", direction="in", extra=(("batch", 50),))


@pytest.fixture
async def client() -> Any:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http:
        yield Client(http)


async def durable_reader(client: Client, site: Site) -> str:
    """A durable pipe on ``site`` joined to its news feed (it outlives a restart)."""
    body = b'{"restms":{"pipe":[{"durable":"1"}]}}'
    async with client.http.post(site.url + "/restms/domain/default", data=body, headers=JSON) as r:
        assert r.status == 201, await r.text()
        pipe = str(r.headers["Location"])
    join = {"restms": {"join": [{"feed": f"{site.url}/restms/feed/news", "address": "#"}]}}
    async with client.http.post(pipe, data=orjson.dumps(join), headers=JSON) as r:
        assert r.status == 201, await r.text()
    return pipe


async def backlog(client: Client, site: Site, count: int) -> list[str]:
    """``count`` persistent messages published to ``site``'s news feed in documents of
    100, every third with a message_id (the others are named by the link); their
    contents, in order."""
    sent: list[str] = []
    for start in range(0, count, 100):
        batch = []
        for i in range(start, min(start + 100, count)):
            message: dict[str, Any] = {
                "address": f"news.b{i}",
                "delivery_mode": "2",
                "content": [{"value": f"m{i}"}],
            }
            if i % 3 == 0:
                message["message_id"] = f"id-{i}"
            batch.append(message)
        await client.publish(site, batch)
        sent += [m["content"][0]["value"] for m in batch]
    return sent


async def streamed(client: Client, pipe: str, count: int, within: float) -> list[str]:
    """The contents of the messages the pipe holds, oldest first, read from its event
    stream until ``count`` came and then :data:`QUIET` seconds more (nothing more
    may come), or until ``within`` seconds passed."""
    got: list[str] = []
    headers = {"Accept": "text/event-stream"}
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    async with client.http.get(pipe, headers=headers, timeout=aiohttp.ClientTimeout()) as r:
        assert r.status == 200, await r.text()
        while True:
            left = deadline - loop.time() if len(got) < count else QUIET
            try:
                async with asyncio.timeout(max(left, 0.0)):
                    line = await r.content.readline()
            except TimeoutError:
                return got
            if line.startswith(b"data: "):
                document = orjson.loads(line[6:])
                got.append(document["restms"]["message"][0]["content"][0]["value"])
            if len(got) == count:
                deadline = loop.time() + QUIET


async def waiting(client: Client, a: Site, b: Site, count: int) -> tuple[str, list[str]]:
    """A durable reader pipe on B, and ``count`` messages published to A while B is
    stopped (they wait in B's pipe on A); B started again. The pipe, and what was
    sent in order."""
    pipe = await durable_reader(client, b)
    await b.stop()
    sent = await backlog(client, a, count)
    await b.start()
    return pipe, sent


async def test_a_large_backlog_is_drained_in_order_exactly_once(
    tmp_path: Path, client: Client
) -> None:
    async with sites(tmp_path, "AB", [PULL]) as running:
        b = running["B"]
        pipe, sent = await waiting(client, running["A"], b, 5000)
        got = await streamed(client, pipe, len(sent), WITHIN)
        counters = await client.counters(b)
    assert len(got) == len(sent)
    assert got == sent  # each once, in the order published
    assert counters[("received", "in-A")] == len(sent)
    assert counters[("published", "in-A")] == len(sent)
    assert counters[("acked", "in-A")] == len(sent)


async def test_the_puller_killed_while_it_drains_loses_and_repeats_nothing(
    tmp_path: Path, client: Client
) -> None:
    async with sites(tmp_path, "AB", [PULL]) as running:
        b = running["B"]
        pipe, sent = await waiting(client, running["A"], b, 6000)
        published = 0.0
        async with asyncio.timeout(WITHIN):
            while published < 300:
                published = (await client.counters(b)).get(("published", "in-A"), 0.0)
                await asyncio.sleep(0.01)
        await b.stop(kill=True)
        assert published < len(sent), "drained before the kill: nothing was tested"
        await b.start()
        got = await streamed(client, pipe, len(sent), WITHIN)
        counters = await client.counters(b)
    held = Counter(got)
    assert [m for m in sent if held[m] != 1] == []  # each once: none lost, none twice
    assert len(got) == len(sent)
    assert got == sent  # and in the order published
    # B's link, restarted, acknowledged on A what it had not before the kill (all of
    # it when the kill came before the first acknowledgement was answered).
    assert 0 < counters[("acked", "in-A")] <= len(sent)


class NoStreams:
    """A reverse proxy on 127.0.0.1 in front of ``target`` that answers a request for
    an event stream with 406, as a RestMS server without that extension may, and
    passes everything else on, the target's URLs in replies named by the proxy's."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.url = ""
        self.refused = 0  # event stream requests
        self.messages = 0  # GETs of one message
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        # A request its client left (a long-poll given up) is not waited for at the end.
        self._runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=1.0)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if "text/event-stream" in request.headers.get("Accept", ""):
            self.refused += 1
            return web.Response(status=406, text="no event streams here")
        if request.method == "GET" and "." in request.path.rpartition("/")[2]:
            self.messages += 1
        dropped = ("host", "content-length", "accept-encoding")  # (bodies are rewritten)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in dropped}
        async with (
            aiohttp.ClientSession() as http,
            http.request(
                request.method,
                self.target + request.path_qs,
                data=await request.read(),
                headers=headers,
                allow_redirects=False,
            ) as r,
        ):
            body = (await r.read()).replace(self.target.encode(), self.url.encode())
            kept = ("Content-Type", "Retry-After", "RestMS-Earliest-Position")
            out = {k: r.headers[k] for k in kept if k in r.headers}
            if "Location" in r.headers:
                out["Location"] = r.headers["Location"].replace(self.target, self.url)
            return web.Response(status=r.status, body=body, headers=out)


async def test_a_remote_without_event_streams_is_read_a_message_at_a_time(
    tmp_path: Path, client: Client
) -> None:
    async with sites(tmp_path, "A", []) as running:
        a = running["A"]
        proxy = NoStreams(a.url)
        await proxy.start()
        b = Site("B", free_port(), tmp_path / "B", tmp_path / "B.toml")
        there = (
            ("remote", f"{proxy.url}/restms/feed/news"),
            ("token_url", f"{proxy.url}/oauth/token"),
        )
        link = Link("B", "A", direction="in", extra=(("batch", 10), *there))
        await asyncio.to_thread((tmp_path / "B").mkdir)
        write_configs({"A": a, "B": b}, [link], await asyncio.to_thread(hash_secret, SECRET))
        try:
            await b.start()
            pipe = await client.reader(b)
            sent = await backlog(client, a, 60)
            got = await streamed(client, pipe, len(sent), WITHIN)
        finally:
            await b.stop()
            await proxy.stop()
            await asyncio.to_thread((tmp_path / "B.log").write_bytes, b"".join(b.logs))
    assert got == sent  # each once, in order
    assert proxy.refused == 1  # asked once (again only after 300 s)
    assert proxy.messages >= len(sent)  # a GET each
