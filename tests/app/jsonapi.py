"""Small JSON helpers the HTTP tests share: documents, requests and replies."""

from __future__ import annotations

import json
from typing import Any

from tests.conftest import Gateway

JSON = "application/restms+json"
HJ = {"Content-Type": JSON, "Accept": JSON}
AJ = {"Accept": JSON}


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
