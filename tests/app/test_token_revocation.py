"""A token revoked at ``POST /oauth/revoke`` ends what it holds open, within a second,
on one gateway and on three nodes behind a round-robin proxy (tests/nodes.py).

Decided behaviour under test (docs/AUTH.md, sections 2 and 10):

* Within one second of the revocation's 200, an open WebSocket gets an ``end`` frame
  and close code 1008 ("the access token was revoked"), an open SSE response an
  ``event: revoked`` (``data: the token was revoked``), a stream pipe reply its
  closing delimiter and a waiting asynclet a 401; and every node refuses the token.
  On three nodes, the revocation is made through one node while the connections are
  held by others: each learns of it from the shared list (read every half second).
* Only that token: an SSE response held with another token of the same client stays
  open and goes on delivering.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aiohttp
import pytest

from tests.app.oauth import DOMAIN, As, clients, open_sse, open_stream, token
from tests.conftest import MakeGateway

pytestmark = [pytest.mark.app, pytest.mark.nodes]

ISS = "http://gw.test"
EVERYTHING = "restms:read restms:publish restms:subscribe"
PROTOCOL = "restms.v1"
BOUND = 1.0  # seconds: everything ends, and every node refuses, within this
SLACK = 5.0  # seconds a step that is not measured may take on a loaded host


async def asynclet(who: As, pipe: str) -> asyncio.Task[tuple[int, Any, Any]]:
    listed, _ = await who.ok("GET", pipe)
    return asyncio.create_task(who.call("GET", listed["restms"]["pipe"][0]["message"][-1]["href"]))


async def every_node_refuses(who: As, nodes: int) -> float:
    """Seconds until ``nodes`` requests in a row (one to each node, round robin) are
    refused as revoked."""
    started = time.monotonic()
    in_a_row = 0
    while in_a_row < nodes:
        status, text, _ = await who.call("GET", DOMAIN)
        if status == 401:
            assert "the token was revoked" in text
            in_a_row += 1
        else:
            assert status == 200, text
            in_a_row = 0
            await asyncio.sleep(0.02)
        assert time.monotonic() - started < SLACK
    return time.monotonic() - started


async def test_a_revoked_token_ends_its_streams_and_sockets_within_a_second(
    make_gateway: MakeGateway, topology: str
) -> None:
    configured, secrets = await clients(app=EVERYTHING)
    gw = await make_gateway(clients=configured, oauth_issuer=ISS, max_wait=60.0, stream_max=60.0)
    tok = await token(gw, "app", secrets["app"])
    doomed, kept = As.bearer(gw, tok), As.bearer(gw, await token(gw, "app", secrets["app"]))
    pipe, other = await doomed.pipe(), await kept.pipe()

    ws = await gw.http.ws_connect(pipe, protocols=(PROTOCOL,), headers=doomed.auth)
    ping = {"type": "publish", "id": 1, "feed": "/restms/feed/default", "message": {}}
    await ws.send_str(json.dumps(ping))  # served: the socket is open on its node
    assert json.loads((await ws.receive(timeout=SLACK)).data)["type"] == "published"
    events = await open_sse(gw, doomed, pipe)
    multipart = await open_stream(gw, doomed)
    waiting = await asynclet(doomed, pipe)
    survivor = await open_sse(gw, kept, other)
    await asyncio.sleep(0.2)  # the asynclet's request reaches its node and waits

    form = {"token": tok, "client_id": "app", "client_secret": secrets["app"]}
    async with gw.http.post("/oauth/revoke", data=form) as r:
        assert r.status == 200
    revoked = time.monotonic()

    async def socket_ends() -> float:
        end = json.loads((await ws.receive()).data)
        assert end == {"type": "end", "code": 1008, "reason": "the access token was revoked"}
        closing = await ws.receive()
        assert (closing.type, closing.data) == (aiohttp.WSMsgType.CLOSE, 1008)
        return time.monotonic() - revoked

    async def sse_ends() -> float:
        rest = await events.content.read()
        assert rest.endswith(b"event: revoked\ndata: the token was revoked\n\n"), rest
        return time.monotonic() - revoked

    async def stream_ends() -> float:
        assert await multipart.content.read() == b"--\r\n"
        return time.monotonic() - revoked

    async def wait_ends() -> float:
        status, text, headers = await waiting
        assert status == 401, text
        assert text.strip() == "the token was revoked; get a new token"
        assert 'error_description="the token was revoked"' in headers["WWW-Authenticate"]
        return time.monotonic() - revoked

    nodes = 3 if topology == "three-nodes" else 1
    async with asyncio.timeout(SLACK):
        took = await asyncio.gather(
            socket_ends(), sse_ends(), stream_ends(), wait_ends(), every_node_refuses(doomed, nodes)
        )
    assert max(took) < BOUND, dict(
        zip(("ws", "sse", "stream", "asynclet", "refused"), took, strict=True)
    )

    # the client's other token holds its stream still, and it delivers
    address = other.rsplit("/", 1)[1]
    published = {"message": [{"address": address}]}
    await kept.ok("POST", "/restms/feed/default", published)
    async with asyncio.timeout(SLACK):
        while b"event: message" not in await survivor.content.readline():
            pass
    for held in (events, multipart, survivor):
        held.close()
    await ws.close()
