"""WebSocket on a pipe: who may open one, the limits on it, and every way it ends.

Decided behaviour under test (docs/BROWSER.md):

* The upgrade is a GET of the pipe and is checked as one: another principal's pipe is
  404, a missing scope 403, bad credentials 401, all before any upgrade. A browser
  sends its bearer token as the subprotocol ``restms.bearer.<token>``, which the
  gateway accepts on upgrade requests only and never selects.
* Per principal at most ``websocket_max_per_principal`` sockets (429 before the
  upgrade); publish frames take from the principal's rate limit (an ``error`` frame with
  429 and ``retry_after``); ``websocket_max_errors`` refused frames in a row close the
  socket with 1008; a frame over ``websocket_max_frame`` bytes closes it with 1009.
* The gateway ends a socket with an ``end`` frame and then the close frame: 4404 when
  the pipe is deleted, 4401 when the token expires, 1000 at ``websocket_max_life``,
  1001 at shutdown. A client that stops answering pings is dropped.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gateway.restms.websocket import Frames
from tests.app.gauges import scrape, until_waiting, value
from tests.app.jsonapi import new_pipe
from tests.app.oauth import DOMAIN, As, clients, token
from tests.app.process import listening_port, start
from tests.app.test_websocket import (
    PROTOCOL,
    STEP,
    connect,
    deliveries,
    ended,
    expect,
    held,
    ids,
    quiet,
    send,
)
from tests.conftest import Gateway, MakeGateway

pytestmark = pytest.mark.app

ISS = "http://gw.test"
EVERYTHING = "restms:read restms:publish restms:subscribe"


async def principals(make_gateway: MakeGateway, **overrides: Any) -> tuple[Gateway, dict[str, As]]:
    """A gateway with clients alice, bob (everything) and watcher (subscribe, read);
    each signed in with a fresh token."""
    configured, secrets = await clients(
        alice=EVERYTHING, bob=EVERYTHING, watcher="restms:subscribe restms:read"
    )
    gw = await make_gateway(clients=configured, oauth_issuer=ISS, **overrides)
    signed = {name: As.bearer(gw, await token(gw, name, secrets[name])) for name in secrets}
    return gw, signed


def offered(who: As) -> tuple[str, ...]:
    """The subprotocols a browser offers: ours, and its token as a subprotocol."""
    bearer = who.auth["Authorization"].removeprefix("Bearer ")
    return (PROTOCOL, f"restms.bearer.{bearer}")


async def refused(gw: Gateway, uri: str, **kwargs: Any) -> aiohttp.WSServerHandshakeError:
    with pytest.raises(aiohttp.WSServerHandshakeError) as caught:
        await connect(gw, uri, **kwargs)
    return caught.value


# ---------------------------------------------------------------- who may open one
async def test_a_browser_sends_its_token_as_a_subprotocol(make_gateway: MakeGateway) -> None:
    gw, who = await principals(make_gateway, anonymous=False)
    pipe = await who["alice"].pipe()
    async with await connect(gw, pipe, protocols=offered(who["alice"])) as ws:
        assert ws.protocol == PROTOCOL  # the token is never echoed
        await ws.send_json({"type": "ack", "position": 1, "id": 1})
        assert (await expect(ws, "acked"))["removed"] == 0
    # A non-browser client may send Authorization as on any request.
    async with await connect(gw, pipe, headers=who["alice"].auth) as ws:
        assert ws.protocol == PROTOCOL
    async with await connect(gw, pipe, headers=who["alice"].auth, protocols=()) as ws:
        assert ws.protocol is None  # none offered: served all the same
        await ws.send_json({"type": "ack", "position": 1, "id": 2})
        assert (await expect(ws, "acked"))["id"] == 2
    # Without credentials (anonymous is off): 401 before the upgrade.
    assert (await refused(gw, pipe)).status == 401
    # A token that is not one: 401.
    assert (await refused(gw, pipe, protocols=(PROTOCOL, "restms.bearer.nonsense"))).status == 401


async def test_the_token_subprotocol_counts_on_upgrade_requests_only(
    make_gateway: MakeGateway,
) -> None:
    gw, who = await principals(make_gateway, anonymous=False)
    pipe = await who["alice"].pipe()
    protocols = ", ".join(offered(who["alice"]))
    async with gw.http.get(pipe, headers={"Sec-WebSocket-Protocol": protocols}) as r:
        assert r.status == 401


async def test_another_principals_pipe_is_404_before_the_upgrade(
    make_gateway: MakeGateway,
) -> None:
    gw, who = await principals(make_gateway)
    pipe = await who["alice"].pipe()
    answer = await refused(gw, pipe, protocols=offered(who["bob"]))
    assert answer.status == 404
    assert (await refused(gw, pipe)).status == 404  # the loopback guest's neither
    assert (await refused(gw, pipe + "x", protocols=offered(who["alice"]))).status == 404
    # The loopback guest keeps working on its own pipes.
    mine = await new_pipe(gw)
    async with await connect(gw, mine["uri"]) as ws:
        await send(gw, mine, "guest")
        assert ids(await deliveries(ws, 1)) == ["guest"]


async def test_publish_frames_need_the_publish_scope(make_gateway: MakeGateway) -> None:
    gw, who = await principals(make_gateway)
    watcher = who["watcher"]
    pipe = await watcher.pipe()
    status, reason, _ = await watcher.call(
        "POST", "/restms/feed/default", {"message": [{"address": "x"}]}
    )
    assert status == 403
    async with await connect(gw, pipe, protocols=offered(watcher)) as ws:
        await ws.send_json(
            {"type": "publish", "feed": "default", "message": {"address": "x"}, "id": 1}
        )
        error = await expect(ws, "error")
        assert error == {"type": "error", "status": 403, "reason": reason.rstrip(), "id": 1}
    # Another principal's private feed is not there for it.
    _, created = await who["alice"].ok("POST", DOMAIN, {"feed": [{"type": "fanout"}]})
    private = created["Location"]
    mine = await who["bob"].pipe()
    async with await connect(gw, mine, protocols=offered(who["bob"])) as ws:
        await ws.send_json({"type": "publish", "feed": private, "message": {}, "id": 2})
        error = await expect(ws, "error")
        assert error == {"type": "error", "status": 404, "reason": "no such resource", "id": 2}


# ---------------------------------------------------------------- limits
async def test_sockets_per_principal_are_capped(make_gateway: MakeGateway) -> None:
    gw = await make_gateway(websocket_max_per_principal=2, metrics_access="loopback")
    pipe = await new_pipe(gw)
    first = await connect(gw, pipe["uri"])
    second = await connect(gw, pipe["uri"])
    answer = await refused(gw, pipe["uri"])
    assert answer.status == 429
    assert answer.headers is not None
    assert answer.headers["Retry-After"] == "1"
    await first.close()
    await until_waiting(gw, "websocket", 1)  # the server side has let go of it
    async with await connect(gw, pipe["uri"]) as third:
        await send(gw, pipe, "m")
        assert ids(await deliveries(third, 1)) == ["m"]
    await second.close()


async def test_publish_frames_take_from_the_rate_limit(make_gateway: MakeGateway) -> None:
    gw, who = await principals(make_gateway, rate_limit=0.01, rate_burst=5)
    alice = who["alice"]
    pipe = await alice.pipe()  # one request; the upgrade is another
    frame = {"type": "publish", "feed": "default", "message": {"address": "x"}}
    async with await connect(gw, pipe, protocols=offered(alice)) as ws:
        for n in range(3):
            await ws.send_json({**frame, "id": n})
            assert (await expect(ws, "published"))["id"] == n
        await ws.send_json({**frame, "id": "over"})
        error = await expect(ws, "error")
        assert error["status"] == 429
        assert error["retry_after"] >= 1
        assert error["reason"].startswith("rate limit")
        assert error["id"] == "over"
        # Acknowledgements are not requests: they still work.
        await ws.send_json({"type": "ack", "position": 1, "id": "a"})
        assert (await expect(ws, "acked"))["id"] == "a"


async def test_repeated_refused_frames_close_the_socket_with_1008(
    make_gateway: MakeGateway,
) -> None:
    gw = await make_gateway(websocket_max_errors=3)
    pipe = await new_pipe(gw)
    async with await connect(gw, pipe["uri"]) as ws:
        # A good frame in between starts the count again.
        for text in ("x", "y", '{"type": "ack", "position": 0, "id": 1}', "z", "w"):
            await ws.send_str(text)
            await expect(ws, "acked" if text.startswith("{") else "error")
        await ws.send_bytes(b"\x00")
        assert (await expect(ws, "error"))["status"] == 415
        end, code = await ended(ws)
    assert code == 1008
    assert end["reason"] == "too many refused frames in a row"


async def test_a_frame_over_the_limit_closes_with_1009_and_nothing_breaks(
    make_gateway: MakeGateway, caplog: pytest.LogCaptureFixture
) -> None:
    gw = await make_gateway(websocket_max_frame=1024)
    pipe = await new_pipe(gw)
    async with await connect(gw, pipe["uri"]) as ws:
        filler = {"address": "x", "content": [{"value": "y" * 1000}]}
        await ws.send_json({"type": "publish", "feed": "default", "message": filler})
        found = await ws.receive(timeout=STEP)
        assert found.type is aiohttp.WSMsgType.CLOSE
        assert found.data == 1009
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [], [r.getMessage() for r in errors]
    async with await connect(gw, pipe["uri"]) as ws:  # the gateway serves on
        await ws.send_json({"type": "ack", "position": 0, "id": 1})
        await expect(ws, "acked")
    assert await held(gw, pipe) == []


async def test_a_client_that_stops_answering_pings_is_dropped(make_gateway: MakeGateway) -> None:
    gw = await make_gateway(websocket_heartbeat=0.2)
    pipe = await new_pipe(gw)
    async with await connect(gw, pipe["uri"], autoping=False) as ws:
        found = await ws.receive(timeout=STEP)
        assert found.type is aiohttp.WSMsgType.PING
        found = await ws.receive(timeout=STEP)  # no pong within half the heartbeat
        assert found.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
    # One that answers (while it waits to receive) stays, pinged while idle.
    async with await connect(gw, pipe["uri"]) as ws:
        waiting = asyncio.create_task(deliveries(ws, 1))
        await asyncio.sleep(0.8)
        assert not waiting.done()
        await send(gw, pipe, "alive")
        assert ids(await waiting) == ["alive"]


async def test_request_deadlines_do_not_cut_an_open_socket(make_gateway: MakeGateway) -> None:
    gw = await make_gateway(header_timeout=0.2, body_timeout=0.2, keepalive_timeout=0.2)
    pipe = await new_pipe(gw)
    async with await connect(gw, pipe["uri"]) as ws:
        await quiet(ws, 0.6)
        await ws.send_json({"type": "publish", "feed": "default", "message": {"address": "x"}})
        assert (await expect(ws, "published"))["message"] == [{"count": 0}]
        await send(gw, pipe, "late")
        assert ids(await deliveries(ws, 1)) == ["late"]


# ---------------------------------------------------------------- how a socket ends
async def closes(gw: Gateway, code: int) -> float:
    """The sockets the gateway closed with ``code``, as its metrics count them."""
    samples, _ = await scrape(gw)
    return value(samples, "restms_websocket_closes_total", code=str(code))


async def test_deleting_the_pipe_ends_the_socket_with_4404(make_gateway: MakeGateway) -> None:
    gw = await make_gateway(metrics_access="loopback")
    pipe = await new_pipe(gw)
    await send(gw, pipe, "only")
    before = await closes(gw, 4404)
    async with await connect(gw, pipe["uri"]) as ws:
        await deliveries(ws, 1)
        async with gw.http.delete(pipe["uri"]) as r:
            assert r.status == 200
        end, code = await ended(ws)
    assert code == 4404
    assert end == {"type": "end", "code": 4404, "reason": "the pipe was deleted"}
    assert await closes(gw, 4404) == before + 1


async def test_the_socket_ends_with_4401_when_its_token_expires(
    make_gateway: MakeGateway,
) -> None:
    gw, who = await principals(make_gateway, token_ttl=1.0)
    alice = who["alice"]
    pipe = await alice.pipe()
    started = time.monotonic()
    async with await connect(gw, pipe, protocols=offered(alice)) as ws:
        end, code = await asyncio.wait_for(ended(ws), 3 * STEP)
    assert code == 4401
    assert end["reason"].startswith("the access token expired")
    assert time.monotonic() - started < 3.0  # the token's life, not websocket_max_life


async def test_the_socket_ends_with_1000_at_its_maximum_life(make_gateway: MakeGateway) -> None:
    gw = await make_gateway(websocket_max_life=0.4)
    pipe = await new_pipe(gw)
    async with await connect(gw, pipe["uri"]) as ws:
        end, code = await ended(ws)
    assert code == 1000
    assert end["reason"] == "the socket reached its maximum life; reconnect"


async def test_a_failure_in_the_gateway_ends_the_socket_with_1011(
    make_gateway: MakeGateway, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The last resort: a bug while pushing is logged, counted and the client is told,
    never left waiting on a socket that no longer sends."""
    gw = await make_gateway(metrics_access="loopback")
    pipe = await new_pipe(gw)

    def broken(*_: object) -> bytes:
        raise RuntimeError("a fault put in by the test")

    before = await closes(gw, 1011)
    monkeypatch.setattr(Frames, "message", broken)
    async with await connect(gw, pipe["uri"]) as ws:
        await send(gw, pipe, "m")
        end, code = await ended(ws)
    assert code == 1011
    assert end["reason"] == "internal error; it has been logged"
    assert any("WebSocket push failed" in r.getMessage() for r in caplog.records)
    assert await closes(gw, 1011) == before + 1  # counted, where the HTTP metric says 101
    assert await closes(gw, 4404) == 0  # by its own code only
    monkeypatch.undo()
    async with await connect(gw, pipe["uri"]) as ws:  # nothing was lost
        assert ids(await deliveries(ws, 1)) == ["m"]


async def test_shutdown_ends_the_socket_with_1001(tmp_path: Path) -> None:
    proc = await start("--port", "0", "--data-dir", str(tmp_path))
    try:
        port = await listening_port(proc)
        async with aiohttp.ClientSession(base_url=f"http://127.0.0.1:{port}") as http:
            running = Gateway(url=f"http://127.0.0.1:{port}", app=None, http=http)  # type: ignore[arg-type]
            pipe = await new_pipe(running)
            async with await connect(running, pipe["uri"]) as ws:
                await send(running, pipe, "before")
                assert ids(await deliveries(ws, 1)) == ["before"]
                proc.send_signal(signal.SIGTERM)
                end, code = await ended(ws)
        assert code == 1001
        assert end["reason"] == "the gateway is shutting down; reconnect later"
        async with asyncio.timeout(5):
            assert await proc.wait() == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
