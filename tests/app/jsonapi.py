"""Small JSON helpers the HTTP tests share: documents, requests and replies."""

from __future__ import annotations

import json
from typing import Any

from tests.conftest import Gateway

JSON = "application/restms+json"
HJ = {"Content-Type": JSON, "Accept": JSON}
AJ = {"Accept": JSON}
DOMAIN = "/restms/domain/default"


def body(**children: list[dict[str, Any]]) -> bytes:
    return json.dumps({"restms": children}).encode()


async def post(gw: Gateway, uri: str, **children: list[dict[str, Any]]) -> tuple[int, Any, str]:
    """POST a JSON document; (status, parsed reply or text, Location)."""
    async with gw.http.post(uri, data=body(**children), headers=HJ) as r:
        text = await r.text()
        parsed = json.loads(text) if r.content_type == JSON else text
        return r.status, parsed, r.headers.get("Location", "")


async def get(gw: Gateway, uri: str) -> tuple[int, Any]:
    async with gw.http.get(uri, headers=AJ) as r:
        text = await r.text()
        return r.status, (json.loads(text) if r.content_type == JSON else text)


async def delete(gw: Gateway, uri: str) -> int:
    async with gw.http.delete(uri) as r:
        return r.status


async def new_pipe(gw: Gateway, kind: str | None = None, **options: str) -> dict[str, Any]:
    """Create a pipe (with these attributes); its element, plus ``uri`` (the Location)."""
    spec = options if kind is None else {"type": kind, **options}
    status, reply, location = await post(gw, DOMAIN, pipe=[spec])
    assert status == 201, reply
    pipe: dict[str, Any] = reply["restms"]["pipe"][0]
    pipe["uri"] = location
    return pipe


async def join(
    gw: Gateway,
    pipe: dict[str, Any],
    feed: str,
    address: str = "",
    headers: dict[str, str] | None = None,
) -> str:
    """Join the pipe to a feed (201); the join's URI."""
    spec: dict[str, Any] = {"feed": feed, "address": address}
    if headers:
        spec["header"] = [{"name": k, "value": v} for k, v in headers.items()]
    status, reply, location = await post(gw, pipe["uri"], join=[spec])
    assert status == 201, reply
    return location


async def publish(gw: Gateway, feed: str, *messages: dict[str, Any]) -> list[int]:
    """Publish (200, no Location: M11); the count for each message."""
    status, reply, location = await post(gw, feed, message=list(messages))
    assert status == 200, reply
    assert location == ""  # M11
    return [int(m["count"]) for m in reply["restms"].get("message", [])]
