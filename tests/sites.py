"""Separate gateways ("sites") in processes of their own on 127.0.0.1, linked by
federation links declared in their configuration files (docs/FEDERATION.md).

Each site has its own data directory, a port chosen before it starts (so the links of
the others can name it, and it comes back on the same one after a restart), the
gateway id given as its name, a topic feed ``news``, and a client ``peer`` of its
built-in issuer that the other sites' links get their tokens from.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import socket
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from auth.clients import hash_secret
from tests.app.process import listening_port, start

JSON = {"Content-Type": "application/restms+json", "Accept": "application/restms+json"}
SECRET = "secret-of-peer"  # the client every site's links use
FEED = "news"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclasses.dataclass(frozen=True, slots=True)
class Link:
    """A federation link declared on site ``here``: ``out`` pushes to ``there``, ``in``
    pulls from it."""

    here: str
    there: str
    direction: str = "out"
    max_hops: int = 1
    extra: tuple[tuple[str, Any], ...] = ()


@dataclasses.dataclass
class Site:
    name: str
    port: int
    data: Path
    config: Path
    proc: asyncio.subprocess.Process | None = None
    drain: asyncio.Task[bytes] | None = None
    logs: list[bytes] = dataclasses.field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        proc = await start(
            "--port", str(self.port), "--data-dir", str(self.data), "--config", str(self.config)
        )  # fmt: skip
        self.proc = proc
        await listening_port(proc)
        assert proc.stderr is not None
        self.drain = asyncio.create_task(proc.stderr.read())
        await self.links_up()

    async def links_up(self, within: float = 20.0) -> None:
        """Wait until every link of the site says it is up in /readyz (its pipe is
        joined: what is published from then on travels)."""
        async with aiohttp.ClientSession() as http, asyncio.timeout(within):
            while True:
                async with http.get(self.url + "/readyz") as r:
                    lines = (await r.text()).splitlines()
                states = [line.rpartition(": ")[2] for line in lines if line.startswith("bridge ")]
                if all(state == "up" for state in states):
                    return
                await asyncio.sleep(0.05)

    async def stop(self, *, kill: bool = False) -> None:
        proc = self.proc
        if proc is None:
            return
        if proc.returncode is None:
            proc.kill() if kill else proc.terminate()
        async with asyncio.timeout(30):
            await proc.wait()
        if self.drain is not None:
            with contextlib.suppress(asyncio.CancelledError):
                async with asyncio.timeout(10):
                    self.logs.append(await self.drain)
        self.proc = self.drain = None


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return orjson.dumps(value).decode()


def write_configs(sites: dict[str, Site], links: Iterable[Link], secret_hash: str) -> None:
    for site in sites.values():
        lines = [
            f'gateway_id = "{site.name}"',
            "",
            "[[feeds]]",
            f'name = "{FEED}"',
            'type = "topic"',
            "",
            "[[clients]]",
            'client_id = "peer"',
            f'secret_hash = "{secret_hash}"',
            'scopes = ["restms:publish", "restms:read", "restms:subscribe"]',
        ]
        lines.insert(1, 'metrics_access = "loopback"')
        lines.insert(2, "rate_limit = 0  # the tests read every message, one GET each")
        for link in links:
            if link.here != site.name:
                continue
            there = sites[link.there]
            definition = {
                "name": f"{link.direction}-{link.there}",
                "kind": "federation",
                "direction": link.direction,
                "feed": FEED,
                "remote": f"{there.url}/restms/feed/{FEED}",
                "address": "#",
                "token_url": f"{there.url}/oauth/token",
                "client_id": "peer",
                "client_secret": SECRET,
                "max_hops": link.max_hops,
                "retry_min": 0.1,
                "retry_max": 1.0,
                "wait": 2.0,
                **dict(link.extra),
            }
            lines += ["", "[[bridges]]"]
            lines += [f"{key} = {_toml_value(value)}" for key, value in definition.items()]
        site.config.write_text("\n".join(lines) + "\n", encoding="utf-8")


@contextlib.asynccontextmanager
async def sites(
    tmp_path: Path, names: Iterable[str], links: Iterable[Link]
) -> AsyncIterator[dict[str, Site]]:
    """The named sites, started with ``links`` between them; stopped after (their
    logs kept beside their data directories)."""
    made = {
        name: Site(name, free_port(), tmp_path / name, tmp_path / f"{name}.toml") for name in names
    }
    write_configs(made, list(links), await asyncio.to_thread(hash_secret, SECRET))
    try:
        await asyncio.gather(*(site.start() for site in made.values()))
        yield made
    finally:
        for site in made.values():
            await site.stop()
            log = b"".join(site.logs)
            await asyncio.to_thread((tmp_path / f"{site.name}.log").write_bytes, log)


class Client:
    """Requests to the sites as the loopback guest (what the tests publish and read)."""

    def __init__(self, http: aiohttp.ClientSession) -> None:
        self.http = http

    async def reader(self, site: Site, address: str = "#") -> str:
        """A new pipe on ``site`` joined to its news feed: its URL."""
        async with self.http.post(
            site.url + "/restms/domain/default", data=b'{"restms":{"pipe":[{}]}}', headers=JSON
        ) as r:
            assert r.status == 201, await r.text()
            pipe = r.headers["Location"]
        join = {
            "restms": {"join": [{"feed": f"{site.url}/restms/feed/{FEED}", "address": address}]}
        }
        async with self.http.post(pipe, data=orjson.dumps(join), headers=JSON) as r:
            assert r.status == 201, await r.text()
        return str(pipe)

    async def publish(self, site: Site, messages: list[dict[str, Any]]) -> list[dict[str, str]]:
        body = orjson.dumps({"restms": {"message": messages}})
        async with self.http.post(f"{site.url}/restms/feed/{FEED}", data=body, headers=JSON) as r:
            assert r.status == 200, await r.text()
            return list(orjson.loads(await r.read())["restms"]["message"])

    async def listed(self, pipe: str) -> list[dict[str, Any]]:
        """The pipe's listing of the messages it holds now (href, address), oldest first."""
        async with self.http.get(pipe, headers=JSON) as r:
            assert r.status == 200, await r.text()
            listed = orjson.loads(await r.read())["restms"]["pipe"][0].get("message", [])
        return [entry for entry in listed if entry.get("async") != "1"]

    async def held(self, pipe: str) -> list[dict[str, Any]]:
        """Every message the pipe holds now, oldest first."""
        got = []
        for entry in await self.listed(pipe):
            async with self.http.get(entry["href"], headers=JSON) as r:
                assert r.status == 200, await r.text()
                got.append(orjson.loads(await r.read())["restms"]["message"][0])
        return got

    async def wait_for(self, pipe: str, count: int, within: float) -> list[dict[str, Any]]:
        """The pipe's messages once it holds ``count`` (or what it holds at the end)."""
        deadline = asyncio.get_running_loop().time() + within
        while len(await self.listed(pipe)) < count:
            if asyncio.get_running_loop().time() > deadline:
                break
            await asyncio.sleep(0.1)
        return await self.held(pipe)

    async def counters(self, site: Site) -> dict[tuple[str, str], float]:
        """Every bridge counter of ``site``, by (counter, bridge), from its metrics."""
        async with self.http.get(site.url + "/metrics") as r:
            assert r.status == 200, await r.text()
            text = await r.text()
        found: dict[tuple[str, str], float] = {}
        for line in text.splitlines():
            if line.startswith("restms_bridge_") and "_total{" in line:
                name, _, rest = line.partition("{")
                bridge = rest.split('bridge="', 1)[1].split('"', 1)[0]
                found[(name.removeprefix("restms_bridge_").removesuffix("_total"), bridge)] = float(
                    rest.rpartition(" ")[2]
                )
        return found


def content(message: dict[str, Any]) -> str:
    return str(message["content"][0]["value"])
