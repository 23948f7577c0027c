"""Gateway-side helpers for the bridge tests: gateways with bridges, pipes, reading."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from typing import Any

from bridges.amqp import AmqpBridge
from bridges.config import parse
from feeds.config import FeedConfig
from gateway.admin.bridging import BRIDGES
from tests.app.jsonapi import AJ, DOMAIN, HJ, body
from tests.conftest import Gateway, MakeGateway

AMQP = "amqp://guest:guest@127.0.0.1:5672"
FEEDS = (
    FeedConfig(name="orders", type="topic"),
    FeedConfig(name="incoming", type="fanout"),
    FeedConfig(name="routed", type="direct"),
)


def outbound(name: str, target: str, **more: Any) -> dict[str, Any]:
    return {"name": name, "direction": "out", "urls": [AMQP], "feed": "orders",
            "address": "#", "target": target, "reconnect_max": 1.0, **more}  # fmt: skip


def inbound(name: str, source: str, **more: Any) -> dict[str, Any]:
    return {"name": name, "direction": "in", "urls": [AMQP], "feed": "incoming",
            "source": source, "reconnect_max": 1.0, **more}  # fmt: skip


async def gateway(make_gateway: MakeGateway, *bridges: dict[str, Any], **more: Any) -> Gateway:
    return await make_gateway(feeds=FEEDS, bridges=tuple(parse(b) for b in bridges), **more)


def bridge(gw: Gateway, name: str) -> AmqpBridge:
    found = gw.app[BRIDGES].get(name)
    assert isinstance(found, AmqpBridge)
    return found


async def until(check: Any, timeout: float, what: str) -> None:
    """Wait (bounded) until ``check()`` is true."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.05)


async def up(gw: Gateway, *names: str, timeout: float = 20.0) -> None:
    for name in names:
        await until(lambda n=name: bridge(gw, n).health.state.name == "up", timeout, f"{name} up")


async def new_pipe(gw: Gateway, feed: str, address: str = "", **attrs: str) -> str:
    async with gw.http.post(gw.uri(DOMAIN), data=body(pipe=[attrs]), headers=HJ) as r:
        assert r.status == 201, await r.text()
        pipe = r.headers["Location"]
    join = body(join=[{"feed": gw.uri(f"/restms/feed/{feed}"), "address": address}])
    async with gw.http.post(pipe, data=join, headers=HJ) as r:
        assert r.status == 201, await r.text()
    return pipe


async def publish(gw: Gateway, feed: str, *messages: dict[str, Any]) -> list[int]:
    data = body(message=list(messages))
    async with gw.http.post(gw.uri(f"/restms/feed/{feed}"), data=data, headers=HJ) as r:
        assert r.status == 200, await r.text()
        reply = await r.json(content_type=None)
    return [int(m["count"]) for m in reply["restms"]["message"]]


async def held(gw: Gateway, pipe: str) -> list[dict[str, Any]]:
    """The message elements the pipe lists (href, address, message_id), oldest first."""
    async with gw.http.get(pipe, headers=AJ) as r:
        assert r.status == 200, await r.text()
        doc = await r.json(content_type=None)
    return [m for m in doc["restms"]["pipe"][0].get("message", []) if "async" not in m]


async def take(gw: Gateway, pipe: str, count: int, timeout: float = 30.0) -> list[dict[str, Any]]:
    """Read ``count`` messages in order (whole documents) and acknowledge them."""
    out: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while len(out) < count:
        listed = (await held(gw, pipe))[: count - len(out)]
        if not listed:
            if time.monotonic() > deadline:
                raise AssertionError(f"only {len(out)} of {count} messages within {timeout} s")
            await asyncio.sleep(0.05)
            continue
        for item in listed:
            async with gw.http.get(item["href"], headers=AJ) as r:
                assert r.status == 200, await r.text()
                doc = await r.json(content_type=None)
            out.append(doc["restms"]["message"][0])
        async with gw.http.delete(listed[-1]["href"]) as r:  # acknowledges the older ones too
            assert r.status == 200, await r.text()
    return out


def content_bytes(message: dict[str, Any]) -> bytes:
    content = message["content"][0]
    if content.get("encoding") == "base64":
        return base64.b64decode(content["value"])
    return str(content.get("value", "")).encode()


def headers_of(message: dict[str, Any]) -> dict[str, str]:
    return {h["name"]: h.get("value", "") for h in message.get("header", [])}


def dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True)
