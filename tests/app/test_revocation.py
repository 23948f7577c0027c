"""Revoking a client ends what its tokens hold open, against a real gateway on 127.0.0.1.

Decided behaviour under test (docs/AUTH.md, section 10; gateway/auth/authn.py ``Waiting``):

* Revoking a client, through ``DELETE /admin/clients/{id}`` or with the offline
  ``main.py client revoke`` writing the revocation list while the gateway runs, ends
  within about a second every WebSocket (an ``end`` frame, close code 1008), SSE
  response (an ``event: revoked``), stream pipe reply (its closing delimiter), waiting
  asynclet and evented GET (401 ``invalid_token``) held with a token the revocation
  refuses.
* A frame sent on the socket once the gateway knows of the revocation is not served:
  a publish in it never reaches the feed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest

from gateway.auth.authn import AUTH
from gateway.server.keys import CONFIG
from tests.app.oauth import DOMAIN, As, clients, open_sse, open_stream, token
from tests.app.process import main_py
from tests.conftest import Gateway, MakeGateway

pytestmark = pytest.mark.app

ISS = "http://gw.test"
EVERYTHING = "restms:read restms:publish restms:subscribe"
PROTOCOL = "restms.v1"
BOUND = 3.0  # seconds for everything to end after a revocation (about one; a loaded host)
FEED = "/restms/feed/default"


@dataclass
class Held:
    """What the client ``worker`` holds open on the gateway."""

    ws: aiohttp.ClientWebSocketResponse
    sse: aiohttp.ClientResponse
    stream: aiohttp.ClientResponse  # a stream pipe's multipart reply
    asynclet: asyncio.Task[tuple[int, Any, Any]]
    evented: asyncio.Task[tuple[int, Any, Any]]
    audit: str  # root's pipe, where worker's socket published

    async def close(self) -> None:
        self.asynclet.cancel()
        self.evented.cancel()
        await asyncio.wait([self.asynclet, self.evented])
        self.sse.close()
        self.stream.close()
        await self.ws.close()


async def setting(make_gateway: MakeGateway) -> tuple[Gateway, As, As]:
    """A gateway with an admin ``root`` and a client ``worker`` added over the admin
    API (so that it can be revoked); both as bearer principals."""
    configured, secrets = await clients(root="restms:admin " + EVERYTHING)
    gw = await make_gateway(clients=configured, oauth_issuer=ISS, max_wait=60.0, stream_max=60.0)
    root = As.bearer(gw, await token(gw, "root", secrets["root"]))
    added = {"client_id": "worker", "scopes": EVERYTHING.split()}
    async with gw.http.post("/admin/clients", json=added, headers=root.auth) as r:
        assert r.status == 201
        secret = (await r.json())["client_secret"]
    return gw, root, As.bearer(gw, await token(gw, "worker", secret))


async def messages_in(who: As, pipe: str) -> int:
    listed, _ = await who.ok("GET", pipe)
    return len(listed["restms"]["pipe"][0].get("message", [])) - 1  # less the asynclet


async def open_everything(gw: Gateway, worker: As, audit: str) -> Held:
    pipe = await worker.pipe()
    address = audit.rsplit("/", 1)[1]
    ws = await gw.http.ws_connect(pipe, protocols=(PROTOCOL,), headers=worker.auth)
    publish = {"type": "publish", "id": 1, "feed": FEED, "message": {"address": address}}
    await ws.send_str(json.dumps(publish))
    answer = json.loads((await ws.receive(timeout=BOUND)).data)
    assert answer == {"type": "published", "message": [{"count": 1}], "id": 1}
    sse = await open_sse(gw, worker, pipe)
    stream = await open_stream(gw, worker)
    listed, _ = await worker.ok("GET", pipe)
    asynclet = asyncio.create_task(
        worker.call("GET", listed["restms"]["pipe"][0]["message"][-1]["href"])
    )
    _, headers = await worker.ok("GET", DOMAIN)
    evented = asyncio.create_task(
        worker.call("GET", DOMAIN, **{"When-None-Match": headers["ETag"]})
    )
    held = gw.app[AUTH].held
    for _ in range(100):  # until the gateway holds all five open
        if len(held.get("worker", ())) == 5:
            break
        await asyncio.sleep(0.05)
    assert len(held.get("worker", ())) == 5
    return Held(ws, sse, stream, asynclet, evented, audit)


async def all_end(gw: Gateway, held: Held, root: As) -> None:
    """Each of them ends, within BOUND seconds, saying why."""
    async with asyncio.timeout(BOUND):
        end = json.loads((await held.ws.receive()).data)
        assert end["type"] == "end", end
        assert end["code"] == 1008
        assert "revoked" in end["reason"]
        closing = await held.ws.receive()
        assert closing.type is aiohttp.WSMsgType.CLOSE
        assert closing.data == 1008
        rest = await held.sse.content.read()
        assert b"event: revoked\n" in rest
        assert await held.stream.content.read() == b"--\r\n"  # the closing delimiter
        for wait in (held.asynclet, held.evented):
            status, text, headers = await wait
            assert status == 401, text
            assert "revoked" in text
            assert 'error="invalid_token"' in headers["WWW-Authenticate"]
    held.sse.close()
    assert "worker" not in gw.app[AUTH].held
    assert await messages_in(root, held.audit) == 1  # a publish sent after was not served


async def publish_after(held: Held) -> None:
    """A publish frame sent once the revocation is made (it may find the socket
    closing already)."""
    address = held.audit.rsplit("/", 1)[1]
    publish = {"type": "publish", "id": 2, "feed": FEED, "message": {"address": address}}
    with contextlib.suppress(ConnectionError):  # closed before it could be sent
        await held.ws.send_str(json.dumps(publish))


@contextlib.asynccontextmanager
async def everything_open(make_gateway: MakeGateway) -> AsyncIterator[tuple[Gateway, As, As, Held]]:
    """(gateway, root, worker, what worker holds open); worker has published one message
    to the audit pipe of root over its socket (``held.audit``)."""
    gw, root, worker = await setting(make_gateway)
    audit = await root.pipe()
    held = await open_everything(gw, worker, audit)
    assert await messages_in(root, audit) == 1
    try:
        yield gw, root, worker, held
    finally:
        await held.close()


async def test_revoking_through_the_admin_api_ends_open_connections(
    make_gateway: MakeGateway,
) -> None:
    async with everything_open(make_gateway) as (gw, root, _, held):
        started = time.monotonic()
        async with gw.http.delete("/admin/clients/worker", headers=root.auth) as r:
            assert r.status == 200
        await publish_after(held)
        await all_end(gw, held, root)
        assert time.monotonic() - started < BOUND


async def test_revoking_with_the_offline_command_ends_open_connections(
    make_gateway: MakeGateway,
) -> None:
    async with everything_open(make_gateway) as (gw, root, worker, held):
        code, out, err = await main_py(
            "client", "revoke", "worker", "--data-dir", gw.app[CONFIG].data_dir
        )
        assert (code, err) == (0, "")
        assert out == "revoked client worker: removed, and its tokens are refused\n"
        started = time.monotonic()  # the list is on disk from here; the gateway reads
        await all_end(gw, held, root)  # it within REVOCATIONS_POLL seconds
        assert time.monotonic() - started < BOUND
    status, text, _ = await worker.call("GET", DOMAIN)
    assert status == 401
    assert "revoked" in text
