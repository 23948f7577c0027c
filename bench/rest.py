"""Small RestMS client helpers used to set up benchmark fixtures, plus a raw HTTP/1.1 client.

The setup helpers use aiohttp and speak the JSON form (digest §2.4). The raw client
(:class:`Conn`) is a minimal keep-alive HTTP/1.1 connection over asyncio streams, so
latency figures carry as little client overhead as possible and are the same for the
gateway and the bare server.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from bench.common import JSON, XML


class SetupError(RuntimeError):
    pass


async def _json(r: aiohttp.ClientResponse, expect: tuple[int, ...]) -> Any:
    body = await r.read()
    if r.status not in expect:
        raise SetupError(f"{r.method} {r.url} -> {r.status}: {body[:300]!r}")
    return json.loads(body) if body else None


async def create_feed(
    http: aiohttp.ClientSession, base: str, name: str, feed_type: str = "fanout"
) -> str:
    doc = {"restms": {"feed": [{"name": name, "type": feed_type}]}}
    async with http.post(
        f"{base}/restms/domain/default",
        data=json.dumps(doc),
        headers={"Content-Type": JSON, "Accept": JSON},
    ) as r:
        await _json(r, (200, 201))
        return r.headers["Location"]


async def create_pipe(http: aiohttp.ClientSession, base: str) -> tuple[str, str]:
    """A default-type pipe: (its URI, its asynclet URI)."""
    async with http.post(
        f"{base}/restms/domain/default",
        data=b'{"restms":{"pipe":[{}]}}',
        headers={"Content-Type": JSON, "Accept": JSON},
    ) as r:
        doc = await _json(r, (201,))
        location = r.headers["Location"]
    last = doc["restms"]["pipe"][0]["message"][-1]
    if last.get("async") != "1":
        raise SetupError(f"pipe listing does not end with an asynclet: {doc}")
    return location, last["href"]


async def asynclet_of(http: aiohttp.ClientSession, pipe_uri: str) -> str:
    async with http.get(pipe_uri, headers={"Accept": JSON}) as r:
        doc = await _json(r, (200,))
    last = doc["restms"]["pipe"][0]["message"][-1]
    if last.get("async") != "1":
        raise SetupError("pipe listing has no asynclet (capped?)")
    return last["href"]


async def join(http: aiohttp.ClientSession, pipe_uri: str, feed_uri: str) -> str:
    doc = {"restms": {"join": [{"feed": feed_uri, "address": ""}]}}
    async with http.post(
        pipe_uri, data=json.dumps(doc), headers={"Content-Type": JSON, "Accept": JSON}
    ) as r:
        await _json(r, (200, 201))
        return r.headers["Location"]


async def delete(http: aiohttp.ClientSession, uri: str) -> None:
    async with http.delete(uri) as r:
        await r.read()
        if r.status != 200:
            raise SetupError(f"DELETE {uri} -> {r.status}")


async def publish(
    http: aiohttp.ClientSession, feed_uri: str, body: bytes, content_type: str = XML
) -> str:
    async with http.post(feed_uri, data=body, headers={"Content-Type": content_type}) as r:
        text = await r.text()
        if r.status != 200:
            raise SetupError(f"publish -> {r.status}: {text[:300]}")
        return text


async def fanout_fixture(base: str, feed_name: str) -> dict[str, str]:
    """A fanout feed with one joined default-type pipe, checked with one publish + GET."""
    async with aiohttp.ClientSession() as http:
        feed = await create_feed(http, base, feed_name)
        pipe, _ = await create_pipe(http, base)
        await join(http, pipe, feed)
        # sanity: one message goes in (count 1) and comes out of the asynclet
        asynclet = await asynclet_of(http, pipe)
        reply = await publish(
            http, feed, b"<restms><message><content>check</content></message></restms>"
        )
        if 'count="1"' not in reply:
            raise SetupError(f"fixture publish did not reach exactly one pipe: {reply}")
        async with http.get(asynclet, headers={"Accept": XML}) as r:
            got = await r.text()
            if r.status != 200 or "check" not in got:
                raise SetupError(f"fixture asynclet GET -> {r.status}: {got[:300]}")
        await delete(http, asynclet)
        return {"feed": feed, "pipe": pipe, "asynclet": await asynclet_of(http, pipe)}


async def skipped_full(base: str) -> int:
    """Copies the gateway could not place because their pipe was full, from /metrics
    (the benchmarks open it to loopback): a publish run must not add to it."""
    async with aiohttp.ClientSession() as http, http.get(f"{base}/metrics") as r:
        text = await r.text()
        if r.status != 200:
            raise SetupError(f"GET /metrics -> {r.status}: {text[:300]}")
    for line in text.splitlines():
        if line.startswith("restms_messages_skipped_full_total "):
            return int(float(line.split()[1]))
    raise SetupError("GET /metrics has no restms_messages_skipped_full_total")


async def drop_fixture(base: str, fixture: dict[str, str]) -> None:
    async with aiohttp.ClientSession() as http:
        await delete(http, fixture["pipe"])
        await delete(http, fixture["feed"])


# ---------------------------------------------------------------- raw keep-alive client
class Conn:
    """One keep-alive HTTP/1.1 connection; requests are written and read separately."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str):
        self.reader = reader
        self.writer = writer
        self.host = host

    @classmethod
    async def open(cls, url: str) -> Conn:
        parts = urlsplit(url)
        reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
        return cls(reader, writer, parts.netloc)

    def send(
        self, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
    ) -> None:
        lines = [f"{method} {path} HTTP/1.1", f"Host: {self.host}"]
        for name, value in (headers or {}).items():
            lines.append(f"{name}: {value}")
        if body or method in ("POST", "PUT"):
            lines.append(f"Content-Length: {len(body)}")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode()
        self.writer.write(head + body if body else head)

    async def recv(self) -> tuple[int, bytes]:
        head = await self.reader.readuntil(b"\r\n\r\n")
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        status = int(status_line.split(" ", 2)[1])
        headers: dict[str, str] = {}
        for line in header_lines:
            if line:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
        if "content-length" in headers:
            return status, await self.reader.readexactly(int(headers["content-length"]))
        if headers.get("transfer-encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16)
                chunk = await self.reader.readexactly(size + 2)
                if size == 0:
                    break
                chunks.append(chunk[:-2])
            return status, b"".join(chunks)
        return status, b""

    async def request(
        self, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
    ) -> tuple[int, bytes]:
        self.send(method, path, body, headers)
        return await self.recv()

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await self.writer.wait_closed()


def path_of(uri: str) -> str:
    parts = urlsplit(uri)
    return parts.path + (f"?{parts.query}" if parts.query else "")
