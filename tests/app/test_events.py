"""Management events on the system feed (docs/EVENTS.md), over HTTP on 127.0.0.1.

Each test makes a pipe joined to ``restms.system``, causes one kind of event and reads
the message: its address, its headers and its JSON content. Bridge events use a real
AMQP bridge to a port nothing listens on and real ZeroMQ sockets; no broker needed.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import socket
from pathlib import Path
from typing import Any

import pytest

from feeds.config import FeedConfig
from tests.app.jsonapi import AJ, DOMAIN, HJ, body, delete, get, join, new_pipe, post, publish
from tests.conftest import Gateway, MakeGateway

pytestmark = pytest.mark.app

SYSTEM = "/restms/feed/restms.system"
WAIT = 5.0  # seconds an expected event may take at most
FAST = {"events_interval": 0.4, "sweep_interval": 0.05}


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:12]


async def pipe_with(gw: Gateway, **options: str) -> dict[str, Any]:
    """A pipe with these options (201); its element, plus ``uri``."""
    status, reply, location = await post(gw, DOMAIN, pipe=[options])
    assert status == 201, reply
    pipe: dict[str, Any] = reply["restms"]["pipe"][0]
    pipe["uri"] = location
    return pipe


def closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


class Watcher:
    """A pipe joined to the system feed; reads events oldest first, acknowledging each."""

    def __init__(self, gw: Gateway, pipe: dict[str, Any]) -> None:
        self.gw, self.pipe = gw, pipe

    @classmethod
    async def start(cls, gw: Gateway, *patterns: str, **options: str) -> Watcher:
        pipe = await pipe_with(gw, **options)
        for pattern in patterns:
            await join(gw, pipe, SYSTEM, pattern)
        return cls(gw, pipe)

    async def held(self) -> list[str]:
        status, reply = await get(self.gw, self.pipe["uri"])
        assert status == 200, reply
        items = reply["restms"]["pipe"][0].get("message", [])
        return [m["href"] for m in items if m.get("async") != "1"]

    async def next(self, timeout: float = WAIT) -> dict[str, Any]:
        """The next event (waiting for it as the asynclet), acknowledged."""
        status, reply = await get(self.gw, self.pipe["uri"])
        href = reply["restms"]["pipe"][0]["message"][0]["href"]
        async with asyncio.timeout(timeout):
            status, reply = await get(self.gw, href)
        assert status == 200, reply
        message: dict[str, Any] = reply["restms"]["message"][0]
        assert await delete(self.gw, href) == 200
        return message

    async def event(self, address: str, timeout: float = WAIT) -> Event:
        """The next event with this address (others before it are skipped)."""
        async with asyncio.timeout(timeout):
            while True:
                found = Event(await self.next())
                if found.address == address:
                    return found

    async def none(self, seconds: float = 0.5) -> None:
        """No event arrives within ``seconds``."""
        await asyncio.sleep(seconds)
        assert await self.held() == []


class Event:
    """One event message: address, headers and the parsed JSON content."""

    def __init__(self, message: dict[str, Any]) -> None:
        self.raw = json.dumps(message)
        self.address = message["address"]
        self.headers = {h["name"]: h["value"] for h in message.get("header", [])}
        [content] = message["content"]
        assert content["type"] == "application/json"
        self.body: dict[str, Any] = json.loads(content["value"])
        self.details: dict[str, Any] = self.body["details"]
        assert message["delivery_mode"] == "1"  # news, not records
        assert self.body["event"] == self.headers["event"] == self.address
        assert self.body["object"] == self.headers["object"]
        assert self.body["time"].endswith("Z")


# ---------------------------------------------------------------- the feed itself
async def test_the_system_feed_is_a_topic_feed_made_at_start_up(gw: Gateway) -> None:
    status, reply = await get(gw, SYSTEM)
    assert status == 200, reply
    feed = reply["restms"]["feed"][0]
    assert (feed["name"], feed["type"]) == ("restms.system", "topic")


@pytest.mark.parametrize(
    ("method", "data", "headers"),
    [
        ("POST", body(message=[{"address": "pipe.created"}]), HJ),
        ("POST", b"opaque bytes", {"Content-Type": "application/octet-stream"}),
        ("PUT", body(feed=[{"title": "mine now"}]), HJ),
        ("DELETE", None, {}),
    ],
)
async def test_nobody_publishes_to_changes_or_deletes_the_system_feed(
    make_gateway: MakeGateway, method: str, data: bytes | None, headers: dict[str, str]
) -> None:
    gw = await make_gateway(guest_scopes="restms:admin")  # not even an admin
    async with gw.http.request(method, SYSTEM, data=data, headers=headers) as r:
        assert r.status == 403
        assert "system feed" in await r.text()
    assert (await get(gw, SYSTEM))[0] == 200


async def test_nor_over_a_websocket(gw: Gateway) -> None:
    pipe = await new_pipe(gw)
    async with gw.http.ws_connect(pipe["uri"], protocols=("restms.v1",)) as ws:
        frame = {"type": "publish", "feed": "restms.system", "message": {"address": "x"}}
        await ws.send_json(frame)
        while True:  # frames about the pipe itself may come first
            reply = await ws.receive_json(timeout=WAIT)
            if reply["type"] == "error":
                break
    assert reply["status"] == 403
    assert "system feed" in reply["reason"]


async def test_no_bridge_publishes_into_the_system_feed(make_gateway: MakeGateway) -> None:
    gw = await make_gateway(guest_scopes="restms:admin", bridge_allow="127.0.0.1")
    inbound = {"name": "in", "direction": "in", "urls": ["amqp://127.0.0.1:1"],
               "feed": "restms.system", "source": "/queue/x"}  # fmt: skip
    async with gw.http.post("/admin/bridges", json=inbound) as r:
        assert r.status == 403
        assert "system feed" in await r.text()
    outbound = {**inbound, "direction": "out", "target": "/queue/x", "address": "#"}
    del outbound["source"]
    async with gw.http.post("/admin/bridges", json=outbound) as r:
        assert r.status == 201, await r.text()  # events may leave by a bridge


async def test_joining_the_system_feed_needs_read_on_it(make_gateway: MakeGateway) -> None:
    gw = await make_gateway(guest_scopes="restms:subscribe restms:read:feed/other")
    pipe = await new_pipe(gw)
    status, reply, _ = await post(gw, pipe["uri"], join=[{"feed": SYSTEM, "address": "#"}])
    assert status == 403, reply
    assert "restms:read" in reply
    scopes = "restms:subscribe restms:read:feed/restms.system"
    gw2 = await make_gateway(guest_scopes=scopes, store="memory")
    await Watcher.start(gw2, "#")  # read on that feed alone is enough


async def test_the_system_feed_can_be_renamed_or_switched_off(make_gateway: MakeGateway) -> None:
    renamed = await make_gateway(system_feed="ops.events", store="memory")
    assert (await get(renamed, "/restms/feed/ops.events"))[0] == 200
    assert (await get(renamed, SYSTEM))[0] == 404
    off = await make_gateway(system_feed="", store="memory")
    assert off.engine.events is None
    assert (await get(off, SYSTEM))[0] == 404
    await new_pipe(off)  # and everything works without it


async def test_a_headers_system_feed_selects_on_the_events_headers(
    make_gateway: MakeGateway,
) -> None:
    gw = await make_gateway(system_feed_type="headers")
    watcher = await Watcher.start(gw)
    wanted = {"event": "pipe.deleted", "principal": "guest"}
    await join(gw, watcher.pipe, SYSTEM, headers=wanted)
    pipe = await new_pipe(gw)  # pipe.created: not selected
    assert await delete(gw, pipe["uri"]) == 200
    gone = Event(await watcher.next())
    assert gone.address == "pipe.deleted"
    assert gone.headers["object"] == sha(pipe["name"])
    await watcher.none()  # nothing else: not the join's own event, not pipe.created


async def test_a_watcher_stays_joined_across_a_restart(
    make_gateway: MakeGateway, tmp_path: Path
) -> None:
    data = str(tmp_path / "kept")
    first = await make_gateway(data_dir=data)
    watcher = await Watcher.start(first, "pipe.created")
    await first.stop()
    second = await make_gateway(data_dir=data)
    watcher.gw = second
    watcher.pipe["uri"] = watcher.pipe["uri"].replace(first.url, second.url)  # a new port
    pipe = await new_pipe(second)
    made = await watcher.event("pipe.created")
    assert made.headers["object"] == sha(pipe["name"])


# ---------------------------------------------------------------- feeds, pipes, joins
async def test_feed_created_and_deleted(gw: Gateway) -> None:
    watcher = await Watcher.start(gw, "feed.*")
    status, reply, location = await post(gw, DOMAIN, feed=[{"name": "orders", "type": "topic"}])
    assert status == 201, reply
    made = await watcher.event("feed.created")
    assert made.headers == {
        "event": "feed.created",
        "kind": "feed",
        "object": "orders",
        "principal": "guest",
        "domain": "default",
        "type": "topic",
    }
    assert made.body["principal"] == "guest"
    assert made.details == {"type": "topic", "private": False}
    assert await delete(gw, location) == 200
    gone = await watcher.event("feed.deleted")
    assert gone.details == {"type": "topic", "private": False, "reason": "deleted"}
    assert (gone.headers["object"], gone.headers["reason"]) == ("orders", "deleted")


async def test_a_private_feed_is_named_by_its_digest(gw: Gateway) -> None:
    watcher = await Watcher.start(gw, "feed.created")
    status, reply, location = await post(gw, DOMAIN, feed=[{"type": "fanout"}])
    assert status == 201, reply
    key = location.rsplit("/", 1)[1]
    made = await watcher.event("feed.created")
    assert made.headers["object"] == sha(key)
    assert made.details["private"] is True
    assert key not in made.raw


async def test_pipe_created_and_deleted_never_show_the_pipe_name(gw: Gateway) -> None:
    watcher = await Watcher.start(gw, "pipe.*")
    pipe = await new_pipe(gw)
    made = await watcher.event("pipe.created")
    assert made.headers["object"] == sha(pipe["name"])
    assert (made.headers["principal"], made.headers["type"]) == ("guest", "")
    assert made.details == {"type": "", "webhook": False}
    assert pipe["name"] not in made.raw  # a private pipe's name is its capability
    assert await delete(gw, pipe["uri"]) == 200
    gone = await watcher.event("pipe.deleted")
    assert gone.headers["object"] == sha(pipe["name"])
    assert gone.details["reason"] == "deleted"
    assert pipe["name"] not in gone.raw


async def test_an_idle_pipe_collected_says_so(make_gateway: MakeGateway) -> None:
    gw = await make_gateway(pipe_idle_timeout=0.5, sweep_interval=0.05)
    watcher = await Watcher.start(gw, "pipe.deleted")
    pipe = await new_pipe(gw)
    async with asyncio.timeout(WAIT):
        while True:  # the watcher's own pipe is touched by reading: only the other goes
            gone = await watcher.event("pipe.deleted")
            if gone.headers["object"] == sha(pipe["name"]):
                break
    assert gone.details["reason"] == "idle"


async def test_join_created_and_deleted(gw: Gateway) -> None:
    watcher = await Watcher.start(gw, "join.#")
    own = await watcher.event("join.created")  # the watcher's own join comes first
    assert own.details["feed"] == "restms.system"
    status, reply, _ = await post(gw, DOMAIN, feed=[{"name": "news", "type": "topic"}])
    assert status == 201, reply
    pipe = await new_pipe(gw)
    location = await join(gw, pipe, "/restms/feed/news", "sport.*")
    key = location.rsplit("/", 1)[1]
    made = await watcher.event("join.created")
    assert made.headers["object"] == sha(key)
    assert made.headers["feed"] == "news"
    assert made.details == {"feed": "news", "pipe": sha(pipe["name"]), "address": "sport.*"}
    assert key not in made.raw
    assert pipe["name"] not in made.raw
    assert await delete(gw, location) == 200
    gone = await watcher.event("join.deleted")
    assert (gone.headers["object"], gone.details["reason"]) == (sha(key), "deleted")


async def test_the_watchers_own_join_is_an_event_and_nothing_loops(gw: Gateway) -> None:
    watcher = await Watcher.start(gw, "#", max_messages="1")
    made = await watcher.event("join.created")  # its own join, routed to itself once
    assert made.details["feed"] == "restms.system"
    for _ in range(5):
        await new_pipe(gw)  # five pipe.created events; the watcher holds one at a time
    await asyncio.sleep(0.2)
    assert len(await watcher.held()) == 1  # full: the rest skipped, and no pipe.full event
    event = Event(await watcher.next())
    assert event.address == "pipe.created"
    await watcher.none()  # the skipped ones made no events of their own


# ---------------------------------------------------------------- over limits, dead letters
async def test_pipe_full_is_coalesced_per_pipe(make_gateway: MakeGateway) -> None:
    gw = await make_gateway(**FAST)
    watcher = await Watcher.start(gw, "pipe.full")
    status, reply, _ = await post(gw, DOMAIN, feed=[{"name": "jobs", "type": "fanout"}])
    assert status == 201, reply
    small = await pipe_with(gw, max_messages="1")
    await join(gw, small, "/restms/feed/jobs")
    messages = [{"address": "a"} for _ in range(4)]
    assert await publish(gw, "/restms/feed/jobs", *messages) == [1, 0, 0, 0]
    first = await watcher.event("pipe.full")
    assert first.headers["object"] == sha(small["name"])
    assert first.headers["policy"] == "skip"
    assert first.details["count"] == 1
    assert (first.details["messages"], first.details["max_messages"]) == (1, 1)
    later = await watcher.event("pipe.full")  # the other two, once the interval is over
    assert later.details["count"] == 2
    await watcher.none(0.6)


async def test_message_dead_lettered(make_gateway: MakeGateway) -> None:
    gw = await make_gateway(lease=0.2, max_deliveries=1, **FAST)
    watcher = await Watcher.start(gw, "message.*")
    status, reply, _ = await post(gw, DOMAIN, feed=[{"name": "work", "type": "fanout"}])
    assert status == 201, reply
    reader = await new_pipe(gw)
    await join(gw, reader, "/restms/feed/work")
    await publish(gw, "/restms/feed/work", {"address": "job.1", "message_id": "m-1"})
    status, _ = await get(gw, reader["message"][0]["href"])  # fetched, never acknowledged
    assert status == 200
    dead = await watcher.event("message.dead-lettered")
    assert dead.headers["object"] == sha(reader["name"])
    assert dead.headers["reason"] == "max-deliveries"
    assert dead.details == {
        "reason": "max-deliveries",
        "feed": "work",
        "address": "job.1",
        "message_id": "m-1",
        "outcome": "dead-lettered",
        "dead_letter_feed": "dead-letter",
        "count": 1,
    }


# ---------------------------------------------------------------- webhooks
async def test_webhook_failing(make_gateway: MakeGateway) -> None:
    gw = await make_gateway(webhook_allow="127.0.0.1", **FAST)
    watcher = await Watcher.start(gw, "webhook.*")
    secret = "s" * 32
    callback = f"http://127.0.0.1:{closed_port()}/hook?token=do-not-show"
    status, reply, _ = await post(
        gw, DOMAIN, pipe=[{"type": "webhook", "callback": callback, "secret": secret}]
    )
    assert status == 201, reply
    name = reply["restms"]["pipe"][0]["name"]
    failing = await watcher.event("webhook.failing")
    assert failing.headers["object"] == sha(name)
    assert failing.headers["status"] in ("connect", "refused")
    assert failing.details["error"].startswith("verification failed")
    for hidden in (secret, "do-not-show", name):
        assert hidden not in failing.raw


# ---------------------------------------------------------------- bridges
async def test_bridge_amqp_down_to_a_port_nothing_listens_on(make_gateway: MakeGateway) -> None:
    gw = await make_gateway(
        guest_scopes="restms:admin",
        feeds=(FeedConfig(name="orders"),),
        bridge_allow="127.0.0.1",  # loopback, for a bridge made at run time
        **FAST,
    )
    watcher = await Watcher.start(gw, "bridge.#")
    url = f"amqp://user:hunter2@127.0.0.1:{closed_port()}"
    definition = {"name": "out", "direction": "out", "urls": [url], "feed": "orders",
                  "address": "#", "target": "/queue/x"}  # fmt: skip
    async with gw.http.post("/admin/bridges", json=definition) as r:
        assert r.status == 201, await r.text()
    error = await watcher.event("bridge.amqp.error")  # the failure, then the move
    down = Event(await watcher.next())
    assert down.address == "bridge.amqp.down"
    assert (down.headers["object"], down.headers["bridge"]) == ("out", "out")
    assert down.details["state"] == "retrying"
    assert down.details["error"] == error.details["error"]
    assert "127.0.0.1" in down.details["url"]
    for event in (error, down):
        assert "hunter2" not in event.raw  # URLs are shown redacted
    # retries while down make no more "down" events; errors are coalesced
    await asyncio.sleep(1.5)
    addresses = [Event(await watcher.next()).address for _ in await watcher.held()]
    assert "bridge.amqp.down" not in addresses


async def test_bridge_zeromq_up_then_down(make_gateway: MakeGateway) -> None:
    gw = await make_gateway(guest_scopes="restms:admin", feeds=(FeedConfig(name="ticks"),))
    watcher = await Watcher.start(gw, "bridge.zeromq.*")
    first = {"kind": "zeromq", "name": "pub1", "socket": "pub", "feed": "ticks",
             "endpoints": ["tcp://127.0.0.1:*"]}  # fmt: skip
    async with gw.http.post("/admin/bridges", json=first) as r:
        assert r.status == 201, await r.text()
    up = await watcher.event("bridge.zeromq.up")
    # the socket is opened after the reply: the event names the port it was bound to
    async with gw.http.get("/admin/bridges/pub1") as r:
        assert r.status == 200, await r.text()
        endpoints = (await r.json())["endpoints"]
    assert (up.headers["object"], [up.details["url"]]) == ("pub1", endpoints)
    assert endpoints[0].startswith("tcp://127.0.0.1:")
    assert "*" not in endpoints[0]
    # a second bridge binding a port someone else holds cannot open its socket: down
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    held = f"tcp://127.0.0.1:{busy.getsockname()[1]}"
    try:
        second = {**first, "name": "pub2", "endpoints": [held]}
        async with gw.http.post("/admin/bridges", json=second) as r:
            assert r.status == 201, await r.text()
        down = await watcher.event("bridge.zeromq.down")
        assert (down.headers["object"], down.details["was"]) == ("pub2", "connecting")
        assert "cannot open" in down.details["error"]
    finally:
        busy.close()
    # the port is free again: a retry binds it and the link comes up
    again = await watcher.event("bridge.zeromq.up", timeout=15)
    assert (again.headers["object"], again.details["url"]) == ("pub2", held)


# ---------------------------------------------------------------- authentication
async def test_auth_failures_are_rate_limited(make_gateway: MakeGateway) -> None:
    gw = await make_gateway(events_interval=2.0, sweep_interval=0.05)  # ten requests fit in it
    watcher = await Watcher.start(gw, "auth.failed")
    token = "not-a-token-but-secret-anyway"
    for _ in range(10):
        async with gw.http.get(DOMAIN, headers={**AJ, "Authorization": f"Bearer {token}"}) as r:
            assert r.status == 401
    first = await watcher.event("auth.failed")
    assert (first.headers["object"], first.headers["scheme"]) == ("bearer", "bearer")
    assert first.details["count"] == 1
    assert first.details["peer"] == "127.0.0.1"
    assert first.details["reason"].startswith("bearer token refused")
    rest = await watcher.event("auth.failed")  # the nine others: one event
    assert rest.details["count"] == 9
    for event in (first, rest):
        assert token not in event.raw
    await watcher.none(0.6)


async def test_refused_token_requests_are_auth_failures_too(make_gateway: MakeGateway) -> None:
    gw = await make_gateway(events_interval=2.0, sweep_interval=0.05)
    watcher = await Watcher.start(gw, "auth.failed")
    secret = "a-guessed-secret"
    basic = base64.b64encode(f"nobody:{secret}".encode()).decode()
    for _ in range(3):
        async with gw.http.post(
            "/oauth/token",
            data={"grant_type": "client_credentials"},
            headers={"Authorization": f"Basic {basic}"},
        ) as r:
            assert r.status == 401
    first = await watcher.event("auth.failed")
    assert (first.headers["object"], first.headers["scheme"]) == ("client", "client")
    assert (first.details["count"], first.details["peer"]) == (1, "127.0.0.1")
    assert first.details["reason"] == "unknown client or wrong secret"
    rest = await watcher.event("auth.failed")
    assert rest.details["count"] == 2
    for event in (first, rest):
        assert secret not in event.raw
        assert "nobody" not in event.raw  # a client id may be a secret pasted in its place
