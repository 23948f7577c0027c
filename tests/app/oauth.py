"""Helpers for tests with principals: clients of the built-in server, tokens, requests."""

from __future__ import annotations

import asyncio
import base64
import json
from dataclasses import dataclass
from typing import Any

import aiohttp

from auth.clients import Client, hash_secret
from tests.conftest import Gateway

JSON = "application/restms+json"
DOMAIN = "/restms/domain/default"


async def clients(**scopes: str) -> tuple[tuple[Client, ...], dict[str, str]]:
    """Configured clients named as the keywords, with those scopes; and their secrets."""
    secrets = {name: f"secret-of-{name}" for name in scopes}
    hashes = await asyncio.gather(
        *(asyncio.to_thread(hash_secret, secrets[name]) for name in scopes)
    )
    configured = tuple(
        Client(client_id=name, secret_hash=h, scopes=tuple(scopes[name].split()))
        for name, h in zip(scopes, hashes, strict=True)
    )
    return configured, secrets


async def token(gw: Gateway, client_id: str, secret: str, scope: str | None = None) -> str:
    form = {"grant_type": "client_credentials"}
    if scope is not None:
        form["scope"] = scope
    basic = base64.b64encode(f"{client_id}:{secret}".encode()).decode()
    async with gw.http.post(
        "/oauth/token", data=form, headers={"Authorization": f"Basic {basic}"}
    ) as r:
        reply = await r.json()
        assert r.status == 200, reply
        return str(reply["access_token"])


@dataclass
class As:
    """Requests to one gateway made as one principal (a bearer token, or other headers)."""

    gw: Gateway
    auth: dict[str, str]

    @classmethod
    def bearer(cls, gw: Gateway, token: str) -> As:
        return cls(gw, {"Authorization": f"Bearer {token}"})

    async def call(
        self, method: str, uri: str, document: dict[str, Any] | None = None, **headers: str
    ) -> tuple[int, Any, Any]:
        """(status, parsed JSON or text, headers) of one request."""
        sent = {"Accept": JSON, **self.auth, **headers}
        data = None
        if document is not None:
            data = json.dumps({"restms": document}).encode()
            sent["Content-Type"] = JSON
        async with self.gw.http.request(method, uri, data=data, headers=sent) as r:
            text = await r.text()
            parsed = json.loads(text) if r.content_type == JSON and text else text
            return r.status, parsed, r.headers

    async def ok(self, method: str, uri: str, document: dict[str, Any] | None = None) -> Any:
        status, reply, headers = await self.call(method, uri, document)
        assert status in (200, 201), (status, reply)
        return reply, headers

    async def pipe(self) -> str:
        _, headers = await self.ok("POST", DOMAIN, {"pipe": [{}]})
        return str(headers["Location"])

    async def feed(self, name: str | None = None) -> str:
        spec = {"type": "fanout"} | ({"name": name} if name is not None else {})
        _, headers = await self.ok("POST", DOMAIN, {"feed": [spec]})
        return str(headers["Location"])


async def open_sse(gw: Gateway, who: As, pipe: str) -> aiohttp.ClientResponse:
    """An SSE response on ``pipe``, its first line read."""
    reply = await gw.http.get(
        pipe,
        headers={**who.auth, "Accept": "text/event-stream"},
        timeout=aiohttp.ClientTimeout(total=30),
    )
    assert reply.status == 200
    assert await reply.content.readline() == b"retry: 2000\n"
    return reply


async def open_stream(gw: Gateway, who: As) -> aiohttp.ClientResponse:
    """The reply of a new stream pipe's asynclet, its first delimiter read."""
    _, created = await who.ok("POST", DOMAIN, {"pipe": [{"type": "stream"}]})
    listed, _ = await who.ok("GET", created["Location"])
    reply = await gw.http.get(
        listed["restms"]["pipe"][0]["message"][-1]["href"],
        headers={**who.auth, "Accept": "application/restms+json"},
        timeout=aiohttp.ClientTimeout(total=30),
    )
    assert reply.content_type == "multipart/mixed"
    boundary = reply.headers["Content-Type"].partition("boundary=")[2].encode()
    assert await reply.content.readexactly(len(boundary) + 2) == b"--" + boundary
    return reply
