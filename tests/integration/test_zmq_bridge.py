"""The ZeroMQ bridge against real pyzmq peers in other processes (docs/ZEROMQ.md).

The gateway binds its bridge sockets on ``tcp://127.0.0.1:*`` and the peers
(``tests.integration.zmq_peer``) connect to the port it reports, or the other way
round. Messages enter and leave the gateway over plain HTTP, as clients see it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import orjson
import pytest
import zmq

from bridges.zeromq import ZmqBridge
from feeds.config import FeedConfig
from feeds.store import FILE_NAME
from gateway.admin.bridging import BRIDGES
from tests.app.jsonapi import DOMAIN, HJ, body
from tests.app.oauth import clients, token
from tests.app.test_readyz import Lock
from tests.conftest import Gateway, MakeGateway
from tests.integration.gw import (
    content_bytes,
    headers_of,
    held,
    new_pipe,
    publish,
    take,
    until,
)
from tests.integration.zmqpeers import Peers, b64, unb64

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

ANY_PORT = "tcp://127.0.0.1:*"
FEEDS = (
    FeedConfig(name="orders", type="topic"),
    FeedConfig(name="incoming", type="fanout"),
    FeedConfig(name="work", type="rotator"),
    FeedConfig(name="results", type="fanout"),
    FeedConfig(name="requests", type="fanout"),
    FeedConfig(name="jobs", type="fanout"),
)


@pytest.fixture
async def peers() -> AsyncIterator[Peers]:
    async with Peers() as group:
        yield group


def zmq_bridge(name: str, socket: str, feed: str, **more: Any) -> dict[str, Any]:
    return {"kind": "zeromq", "name": name, "socket": socket, "feed": feed,
            "endpoints": [ANY_PORT], **more}  # fmt: skip


async def gateway(make_gateway: MakeGateway, *bridges: dict[str, Any], **more: Any) -> Gateway:
    from bridges.config import parse

    gw = await make_gateway(feeds=FEEDS, bridges=tuple(parse(b) for b in bridges), **more)
    for b in bridges:
        if b.get("bind", True):
            await until(lambda n=b["name"]: zb(gw, n).health.state.name == "up", 10, "up")
    return gw


def zb(gw: Gateway, name: str) -> ZmqBridge:
    return cast(ZmqBridge, gw.app[BRIDGES].get(name))


def endpoint(gw: Gateway, name: str) -> str:
    return zb(gw, name).bound[0]


def text(value: str) -> dict[str, str]:
    return {"type": "text/plain", "value": value}


def envelope(frames: list[bytes]) -> dict[str, Any]:
    value = orjson.loads(frames[1])
    assert isinstance(value, dict)
    return value


def writable(bridge: ZmqBridge) -> bool:
    """Whether the bridge's socket would take a message now. ZeroMQ takes a dead peer's
    queue down on the socket's side only when the socket next looks at its commands
    (which reading its events does, as a send would); until then a send may still go
    into that queue and be lost."""
    return bridge.can_send()


async def peers_of(gw: Gateway, name: str, count: int) -> None:
    await until(lambda: zb(gw, name).peers >= count, 10, f"{count} peers on {name}")


# ---------------------------------------------------------------- pub/sub
async def test_pub_sends_gateway_messages_that_sub_peers_filter_by_prefix(
    make_gateway: MakeGateway, peers: Peers
) -> None:
    gw = await gateway(make_gateway, zmq_bridge("fanout", "pub", "orders", address="#"))
    url = endpoint(gw, "fanout")
    europe = await peers.start("sub", "--endpoint", url, "--subscribe", "eu.")
    everyone = await peers.start("sub", "--endpoint", url)
    await until(lambda: len(zb(gw, "fanout").subscriptions) == 2, 10, "two subscriptions")
    sent: list[dict[str, Any]] = [
        {"address": "eu.order", "message_id": "m1", "content": [text("one")],
         "header": [{"name": "region", "value": "eu"}]},
        {"address": "us.order", "message_id": "m2", "content": [text("two")]},
        {"address": "eu.refund", "message_id": "m3"},
    ]  # fmt: skip
    assert await publish(gw, "orders", *sent) == [1, 1, 1]
    got = await europe.received(2)
    assert [f[0] for f in got] == [b"eu.order", b"eu.refund"]
    first = envelope(got[0])
    assert first["v"] == 1
    assert first["p"] == {"message_id": "m1"}
    assert first["h"] == [["region", "eu"]]
    assert first["t"] == "text/plain"
    assert got[0][2] == b"one"
    assert "t" not in envelope(got[1])  # no content
    assert got[1][2] == b""
    assert [f[0] for f in await everyone.received(3)] == [b"eu.order", b"us.order", b"eu.refund"]
    await asyncio.sleep(0.2)
    assert (await europe.stats())["received"] == 2  # us.order was filtered at the peer side
    status = zb(gw, "fanout").status()
    assert status["counters"]["sent"] == 3
    assert status["backlog"] == 0


async def test_sub_takes_only_its_prefixes_from_a_pub_peer(
    make_gateway: MakeGateway, peers: Peers
) -> None:
    publisher = await peers.start("pub", "--bind", "--endpoint", ANY_PORT)
    gw = await gateway(
        make_gateway,
        zmq_bridge("listen", "sub", "incoming", endpoints=[publisher.endpoint], bind=False,
                   subscribe=["eu.", "probe"]),
    )  # fmt: skip
    pipe = await new_pipe(gw, "incoming")
    await peers_of(gw, "listen", 1)
    # The subscription reaches the peer a moment after the connection: probe until it has.
    probe = [b"probe", b'{"v":1}', b""]
    for _ in range(200):
        await publisher.send({"op": "send", "frames": b64(probe)})
        await publisher.event("sent")
        if zb(gw, "listen").counters.published:
            break
        await asyncio.sleep(0.05)
    else:
        raise AssertionError("the sub bridge never received the probe")
    messages = [
        [b"eu.price", b'{"v":1,"p":{"message_id":"e1"},"t":"application/json"}', b'{"eur":1}'],
        [b"us.price", b'{"v":1,"p":{"message_id":"u1"}}', b"ignored"],
        [b"eu.stock", b"plain two-frame body"],
    ]
    await publisher.send({"op": "send_many", "messages": [b64(m) for m in messages]})
    got: list[dict[str, Any]] = []
    while len(got) < 2:  # probes still on their way may come first
        got += [m for m in await take(gw, pipe, 1) if m["address"] != "probe"]
    assert [m["address"] for m in got] == ["eu.price", "eu.stock"]
    assert got[0]["message_id"] == "e1"
    assert got[0]["content"][0]["type"] == "application/json"
    assert content_bytes(got[0]) == b'{"eur":1}'
    assert content_bytes(got[1]) == b"plain two-frame body"
    assert got[1]["content"][0]["type"] == "application/octet-stream"
    await asyncio.sleep(0.2)
    assert await held(gw, pipe) == []  # us.price never came
    probes = (await publisher.stats())["sent"] - 3
    assert zb(gw, "listen").counters.received == probes + 2  # us.price filtered at the pub


# ---------------------------------------------------------------- pipelines
async def test_push_spreads_rotator_work_over_three_pull_workers_and_collects_results(
    make_gateway: MakeGateway, peers: Peers
) -> None:
    gw = await gateway(
        make_gateway,
        zmq_bridge("fan", "push", "work"),
        zmq_bridge("collect", "pull", "results"),
    )
    workers = [await peers.start("pull", "--endpoint", endpoint(gw, "fan")) for _ in range(3)]
    await peers_of(gw, "fan", 3)
    jobs = [{"address": f"job{i}", "message_id": f"j{i}",
             "content": [text(f"task {i}")]} for i in range(300)]  # fmt: skip
    for start in range(0, 300, 100):
        await publish(gw, "work", *jobs[start : start + 100])
    counts = [(await w.stats())["received"] for w in workers]
    await until(lambda: zb(gw, "fan").counters.sent == 300, 10, "300 sent")
    for _ in range(100):  # sent means taken by the socket: the last may still be on the way
        shares = [(await w.stats())["received"] for w in workers]
        if sum(shares) >= 300:
            break
        await asyncio.sleep(0.1)
    got: list[list[bytes]] = []
    for worker, count in zip(workers, shares, strict=True):
        got.extend(await worker.received(count))
    assert sum(shares) == 300, (counts, shares)
    ids = sorted(envelope(f)["p"]["message_id"] for f in got)
    assert ids == sorted(f"j{i}" for i in range(300))  # none lost, none twice
    assert all(share > 0 for share in shares)  # each worker had a part
    assert zb(gw, "fan").backlog() == 0

    # results: three PUSH peers into one pull bridge, all of it in the feed
    pipe = await new_pipe(gw, "results")
    senders = [await peers.start("push", "--endpoint", endpoint(gw, "collect")) for _ in range(3)]
    for n, sender in enumerate(senders):
        results = [[b"result", b'{"v":1,"p":{"message_id":"r%d-%d"}}' % (n, i), b"ok"]
                   for i in range(50)]  # fmt: skip
        await sender.send({"op": "send_many", "messages": [b64(m) for m in results]})
    arrived = await take(gw, pipe, 150)
    assert sorted(m["message_id"] for m in arrived) == sorted(
        f"r{n}-{i}" for n in range(3) for i in range(50)
    )
    assert zb(gw, "collect").counters.published == 150


async def test_push_holds_messages_while_no_worker_is_there_and_a_restarted_one_gets_them(
    make_gateway: MakeGateway, peers: Peers
) -> None:
    gw = await gateway(make_gateway, zmq_bridge("fan", "push", "work"))
    worker = await peers.start("pull", "--endpoint", endpoint(gw, "fan"))
    await peers_of(gw, "fan", 1)
    await publish(gw, "work", *({"address": "a", "message_id": f"x{i}"} for i in range(10)))
    assert len(await worker.received(10)) == 10
    assert writable(zb(gw, "fan"))  # the worker's queue has room
    await worker.kill()
    await until(lambda: zb(gw, "fan").peers == 0, 10, "the worker gone")
    await until(lambda: not writable(zb(gw, "fan")), 10, "the dead worker's queue gone")
    await publish(gw, "work", *({"address": "a", "message_id": f"y{i}"} for i in range(20)))
    # at_hwm = block: nowhere to send, so they wait in the bridge's pipe
    await until(lambda: zb(gw, "fan").backlog() == 20, 10, "20 held")
    await until(lambda: zb(gw, "fan").counters.blocked > 0, 10, "a send that waited")
    assert (zb(gw, "fan").counters.sent, zb(gw, "fan").counters.dropped) == (10, 0)
    again = await peers.start("pull", "--endpoint", endpoint(gw, "fan"))
    got = await again.received(20)
    assert [envelope(f)["p"]["message_id"] for f in got] == [f"y{i}" for i in range(20)]
    await until(lambda: zb(gw, "fan").backlog() == 0, 10, "the pipe emptied")


async def test_a_restart_keeps_persistent_messages_and_a_durable_bridge_keeps_all(
    make_gateway: MakeGateway, peers: Peers
) -> None:
    bridges = (
        zmq_bridge("light", "push", "incoming"),  # durable = false: persistent ones only
        zmq_bridge("keep", "push", "incoming", durable=True),
    )
    gw = await gateway(make_gateway, *bridges)
    sent = [{"address": "a", "message_id": f"m{i}", **({"delivery_mode": "2"} if i % 2 else {})}
            for i in range(5)]  # fmt: skip
    await publish(gw, "incoming", *sent)
    for name in ("light", "keep"):  # no worker yet: held in the bridges' pipes
        await until(lambda n=name: zb(gw, n).backlog() == 5, 10, f"5 held by {name}")
    await gw.stop()
    gw = await gateway(make_gateway, *bridges)
    assert (zb(gw, "light").backlog(), zb(gw, "keep").backlog()) == (2, 5)
    for name, expected in (("light", ["m1", "m3"]), ("keep", [f"m{i}" for i in range(5)])):
        worker = await peers.start("pull", "--endpoint", endpoint(gw, name))
        got = await worker.received(len(expected))
        assert [envelope(f)["p"]["message_id"] for f in got] == expected


async def test_at_hwm_drop_counts_what_no_peer_could_take(make_gateway: MakeGateway) -> None:
    gw = await gateway(make_gateway, zmq_bridge("lossy", "push", "work", at_hwm="drop"))
    await publish(gw, "work", *({"address": "a", "message_id": f"d{i}"} for i in range(25)))
    await until(lambda: zb(gw, "lossy").counters.dropped == 25, 10, "25 dropped")
    await until(lambda: zb(gw, "lossy").backlog() == 0, 10, "the pipe emptied")
    assert zb(gw, "lossy").counters.sent == 0


async def test_a_full_gateway_pipe_stops_the_pull_bridge_and_the_pusher_blocks(
    make_gateway: MakeGateway, peers: Peers
) -> None:
    gw = await gateway(make_gateway, zmq_bridge("in", "pull", "incoming", rcvhwm=10, window=10))
    async with gw.http.post(
        gw.uri(DOMAIN), data=body(pipe=[{"max_messages": "20"}]), headers=HJ
    ) as r:
        assert r.status == 201, await r.text()
        pipe = r.headers["Location"]
    join = body(join=[{"feed": gw.uri("/restms/feed/incoming"), "address": ""}])
    async with gw.http.post(pipe, data=join, headers=HJ) as r:
        assert r.status == 201
    pusher = await peers.start("push", "--endpoint", endpoint(gw, "in"), "--sndhwm", "10")
    # 64 KiB each, 30 MiB in all: more than the socket buffers between them can hold
    await pusher.send({"op": "send", "frames": b64([b"n", b"x" * 65536]), "count": 480})
    await until(lambda: zb(gw, "in").counters.throttled > 0, 10, "throttled")
    await asyncio.sleep(0.3)
    assert len(await held(gw, pipe)) == 20  # full, nothing skipped past it
    assert (await pusher.stats())["sent"] < 480  # the pusher is held back
    taken = 0
    while taken < 480:
        taken += len(await take(gw, pipe, min(20, 480 - taken)))
    assert (await pusher.event("sent"))["count"] == 480
    assert zb(gw, "in").counters.published == 480
    assert zb(gw, "in").counters.unroutable == 0


async def test_what_the_pull_bridge_published_shows_only_once_committed_and_is_not_lost(
    make_gateway: MakeGateway, peers: Peers, tmp_path: Path
) -> None:
    # Each commit gives up on the held lock after 0.3 s rather than the default 5 s.
    gw = await gateway(make_gateway, zmq_bridge("in", "pull", "incoming"), store_busy_timeout=0.3)
    pipe = await new_pipe(gw, "incoming", durable="1")  # every copy stored, so committed
    pusher = await peers.start("push", "--endpoint", endpoint(gw, "in"))
    async with Lock(tmp_path / "var" / FILE_NAME):  # every commit fails meanwhile
        await pusher.send({"op": "send", "frames": b64([b"n", b"stored"]), "count": 3})
        failed = "cannot commit to the store"
        await until(lambda: failed in zb(gw, "in").health.last_error, 15, "a failed commit")
        assert await held(gw, pipe) == []  # withdrawn: no reader was shown any of it
    await until(lambda: zb(gw, "in").counters.published == 3, 30, "published once committed")
    assert [content_bytes(m) for m in await take(gw, pipe, 3)] == [b"stored"] * 3
    assert await held(gw, pipe) == []  # each once: none published twice


# ---------------------------------------------------------------- request/reply
async def http_service(gw: Gateway, pipe: str, count: int, prefix: str = "ok:") -> None:
    """Answer ``count`` requests from ``pipe`` as a RestMS service does (Housecat)."""
    answered = 0
    while answered < count:
        for request in await take(gw, pipe, 1):
            reply = {"address": request["reply_to"], "correlation_id": request["message_id"],
                     "content": [{"type": "text/plain",
                                  "value": prefix + content_bytes(request).decode()}]}  # fmt: skip
            await publish(gw, "default", reply)
            answered += 1


async def test_router_serves_100_concurrent_zeromq_requests_from_an_http_service(
    make_gateway: MakeGateway, peers: Peers
) -> None:
    gw = await gateway(make_gateway, zmq_bridge("rpc", "router", "requests"))
    service = await new_pipe(gw, "requests")
    client = await peers.start("dealer-client", "--endpoint", endpoint(gw, "rpc"))
    asks = [[b"calc", b'{"v":1,"p":{"message_id":"c%d"}}' % i, b"q%d" % i] for i in range(100)]
    serving = asyncio.create_task(http_service(gw, service, 100))
    await client.send({"op": "requests", "messages": [b64(a) for a in asks], "timeout": 30})
    replies = await client.event("replies", 40)
    await serving
    assert replies["missing"] == 0
    got = {}
    for encoded in replies["replies"]:
        frames = unb64(encoded)
        got[envelope(frames)["p"]["correlation_id"]] = frames[2]
    assert got == {f"c{i}": b"ok:q%d" % i for i in range(100)}  # each to its own request
    counters = zb(gw, "rpc").counters
    assert (counters.requests, counters.replies, counters.timeouts) == (100, 100, 0)


async def test_router_answers_a_req_peer_with_an_error_when_no_reply_comes(
    make_gateway: MakeGateway, peers: Peers
) -> None:
    gw = await gateway(make_gateway, zmq_bridge("rpc", "router", "requests", timeout=0.5))
    silent = await new_pipe(gw, "requests")  # takes requests, never answers
    req = await peers.start("req", "--endpoint", endpoint(gw, "rpc"))
    ask = [b"calc", b'{"v":1,"p":{"message_id":"lonely"}}', b"?"]
    await req.send({"op": "request", "frames": b64(ask), "timeout": 10})
    reply = await req.event("reply", 15)
    frames = unb64(reply["frames"])
    assert envelope(frames) == {"v": 1, "p": {"correlation_id": "lonely"},
                                "e": "no reply within 0.5 s"}  # fmt: skip
    assert zb(gw, "rpc").counters.timeouts == 1
    # the service answers late: counted, dropped, and the socket still works
    [request] = await take(gw, silent, 1)
    await publish(gw, "default", {"address": request["reply_to"],
                                  "correlation_id": request["message_id"]})  # fmt: skip
    await until(lambda: zb(gw, "rpc").counters.late == 1, 10, "a late reply")
    # nobody joined to the feed: an error at once, not a timeout
    async with gw.http.delete(silent) as r:
        assert r.status == 200
    await req.send({"op": "request", "frames": b64(ask), "timeout": 10})
    frames = unb64((await req.event("reply"))["frames"])
    assert "no service took the request" in envelope(frames)["e"]


async def test_dealer_serves_100_concurrent_http_requests_from_three_rep_workers(
    make_gateway: MakeGateway, peers: Peers
) -> None:
    gw = await gateway(make_gateway, zmq_bridge("workers", "dealer", "jobs", timeout=20))
    for n in range(3):
        await peers.start("rep", "--endpoint", endpoint(gw, "workers"), "--id", f"w{n}")
    await peers_of(gw, "workers", 3)
    inbox = await new_pipe(gw, "results")  # any pipe: replies come by its name
    name = inbox.rsplit("/", 1)[-1]
    asks = [{"address": "calc", "message_id": f"h{i}", "reply_to": name,
             "content": [text(f"q{i}")]} for i in range(100)]  # fmt: skip
    await publish(gw, "jobs", *asks)
    replies = await take(gw, inbox, 100)
    by_request = {m["correlation_id"]: content_bytes(m) for m in replies}
    assert set(by_request) == {f"h{i}" for i in range(100)}
    workers = set()
    for i in range(100):
        worker, _, answer = by_request[f"h{i}"].partition(b":")
        assert answer == b"q%d" % i  # each reply answers its own request
        workers.add(worker)
    assert workers == {b"w0", b"w1", b"w2"}
    assert zb(gw, "workers").counters.replies == 100
    await until(lambda: zb(gw, "workers").backlog() == 0, 10, "requests acknowledged")


async def test_dealer_gives_the_requester_an_error_when_a_worker_dies_or_none_is_there(
    make_gateway: MakeGateway, peers: Peers
) -> None:
    gw = await gateway(make_gateway, zmq_bridge("workers", "dealer", "jobs", timeout=1.0))
    inbox = await new_pipe(gw, "results")
    name = inbox.rsplit("/", 1)[-1]
    # no worker at all
    await publish(gw, "jobs", {"address": "calc", "message_id": "alone", "reply_to": name})
    [error] = await take(gw, inbox, 1, timeout=10)
    assert error["correlation_id"] == "alone"
    assert headers_of(error)["x-bridge"] == "workers"
    assert headers_of(error)["x-bridge-error"] == "no ZeroMQ worker took the request within 1 s"
    # a worker that dies with the request: the requester hears so, the next worker serves
    dying = await peers.start("rep", "--endpoint", endpoint(gw, "workers"), "--die-after", "1")
    await peers_of(gw, "workers", 1)
    await publish(gw, "jobs", {"address": "calc", "message_id": "doomed", "reply_to": name,
                               "content": [{"type": "text/plain", "value": "x"}]})  # fmt: skip
    assert await dying.exited() == 0
    [error] = await take(gw, inbox, 1, timeout=10)
    assert headers_of(error)["x-bridge-error"] == "no ZeroMQ worker replied within 1 s"
    await peers.start("rep", "--endpoint", endpoint(gw, "workers"), "--id", "fresh")
    await peers_of(gw, "workers", 1)
    await publish(gw, "jobs", {"address": "calc", "message_id": "fine", "reply_to": name,
                               "content": [{"type": "text/plain", "value": "y"}]})  # fmt: skip
    [reply] = await take(gw, inbox, 1, timeout=10)
    assert (reply["correlation_id"], content_bytes(reply)) == ("fine", b"fresh:y")
    assert zb(gw, "workers").counters.timeouts == 2


# ---------------------------------------------------------------- bad input, CURVE
async def test_malformed_multipart_messages_are_counted_logged_and_dropped(
    make_gateway: MakeGateway, peers: Peers, caplog: pytest.LogCaptureFixture
) -> None:
    gw = await gateway(make_gateway, zmq_bridge("in", "pull", "incoming"))
    pipe = await new_pipe(gw, "incoming")
    pusher = await peers.start("push", "--endpoint", endpoint(gw, "in"))
    bad = [
        [b"a", b"b", b"c", b"d"],  # four frames
        [b"a", b"not json", b"x"],
        [b"a", b'{"v":2}', b"x"],  # a version this gateway does not know
        [b"\xff\xfe", b"x"],  # address not UTF-8
        [b"a", b'{"v":1,"p":{"priority":"high"}}', b"x"],
    ]
    good = [b"fine", b'{"v":1,"p":{"message_id":"ok"}}', b"body"]
    with caplog.at_level(logging.WARNING, logger="bridges.zeromq"):
        await pusher.send({"op": "send_many", "messages": [b64(m) for m in [*bad, good]]})
        [message] = await take(gw, pipe, 1)
    assert message["message_id"] == "ok"
    counters = zb(gw, "in").counters
    assert (counters.received, counters.malformed, counters.published) == (6, 5, 1)
    assert any("malformed" in r.getMessage() for r in caplog.records)
    assert zb(gw, "in").health.state.name == "up"
    assert "priority" in zb(gw, "in").health.last_error


async def test_curve_lets_in_listed_clients_only(make_gateway: MakeGateway, peers: Peers) -> None:
    server_public, server_secret = zmq.curve_keypair()
    client_public, client_secret = zmq.curve_keypair()
    stranger_public, stranger_secret = zmq.curve_keypair()
    gw = await gateway(
        make_gateway,
        zmq_bridge("secure", "pull", "incoming", curve_secret_key=server_secret.decode(),
                   curve_clients=[client_public.decode()]),
    )  # fmt: skip
    pipe = await new_pipe(gw, "incoming")
    assert zb(gw, "secure").status()["definition"]["curve_secret_key"] == "***"
    url = endpoint(gw, "secure")
    stranger = await peers.start(
        "push", "--endpoint", url, "--noblock", f"--curve-secret={stranger_secret.decode()}",
        f"--curve-public={stranger_public.decode()}", f"--curve-serverkey={server_public.decode()}",
    )  # fmt: skip
    await until(lambda: zb(gw, "secure").counters.handshake_failures > 0, 10, "refused")
    await stranger.send({"op": "send", "frames": b64([b"sneak", b"in"]), "count": 5})
    friend = await peers.start(
        "push", "--endpoint", url, f"--curve-secret={client_secret.decode()}",
        f"--curve-public={client_public.decode()}", f"--curve-serverkey={server_public.decode()}",
    )  # fmt: skip
    await friend.send({"op": "send", "frames": b64([b"hello", b"friend"]), "count": 3})
    got = await take(gw, pipe, 3)
    assert {m["address"] for m in got} == {"hello"}
    await asyncio.sleep(0.3)
    assert await held(gw, pipe) == []
    assert zb(gw, "secure").counters.published == 3


# ---------------------------------------------------------------- admin
async def test_admin_resource_creates_shows_and_deletes_a_zeromq_bridge(
    make_gateway: MakeGateway, peers: Peers
) -> None:
    configured, secrets = await clients(root="restms:admin")
    gw = await gateway(make_gateway, clients=configured, oauth_issuer="http://gw.test")
    admin = {"Authorization": f"Bearer {await token(gw, 'root', secrets['root'])}"}
    definition = zmq_bridge("made", "push", "work")
    async with gw.http.post(gw.uri("/admin/bridges"), json=definition) as r:
        assert r.status == 403  # the loopback guest is no admin
    async with gw.http.post(gw.uri("/admin/bridges"), json=definition, headers=admin) as r:
        assert r.status == 201, await r.text()
        location = r.headers["Location"]
    async with gw.http.post(gw.uri("/admin/bridges"), json=definition, headers=admin) as r:
        assert r.status == 200  # the same again: nothing new
    await until(lambda: zb(gw, "made").health.state.name == "up", 10, "up")
    worker = await peers.start("pull", "--endpoint", endpoint(gw, "made"))
    await peers_of(gw, "made", 1)
    await publish(gw, "work", {"address": "a", "message_id": "via-admin"})
    assert envelope((await worker.received(1))[0])["p"] == {"message_id": "via-admin"}
    async with gw.http.get(location, headers=admin) as r:
        status = await r.json()
    assert status["socket"] == "push"
    assert status["state"] == "up"
    assert status["peers"] == 1
    assert status["counters"]["sent"] == 1
    assert status["endpoints"][0].startswith("tcp://127.0.0.1:")
    bad = {**definition, "name": "bad", "socket": "pair"}
    async with gw.http.post(gw.uri("/admin/bridges"), json=bad, headers=admin) as r:
        assert r.status == 400
        assert "socket must be one of" in await r.text()
    taken = {**definition, "name": "clash", "endpoints": [status["endpoints"][0]]}
    async with gw.http.post(gw.uri("/admin/bridges"), json=taken, headers=admin) as r:
        assert r.status == 201  # created; its bind fails and it says so, retrying
    await until(lambda: "cannot open" in zb(gw, "clash").health.last_error, 10, "bind error")
    assert zb(gw, "clash").health.state.name in ("retrying", "connecting")
    for name in ("made", "clash"):
        async with gw.http.delete(gw.uri(f"/admin/bridges/{name}"), headers=admin) as r:
            assert r.status == 200, await r.text()
    async with gw.http.get(location, headers=admin) as r:
        assert r.status == 404


# ---------------------------------------------------------------- endpoints, linger, peer loss
async def test_ipc_and_inproc_endpoints_carry_messages(
    make_gateway: MakeGateway, peers: Peers, tmp_path: Any
) -> None:
    ipc = f"ipc://{tmp_path}/in.sock"
    gw = await gateway(
        make_gateway,
        zmq_bridge("ipc-in", "pull", "incoming", endpoints=[ipc]),
        zmq_bridge("loop-out", "push", "orders", address="#", endpoints=["inproc://loop"]),
        zmq_bridge("loop-in", "pull", "results", endpoints=["inproc://loop"], bind=False),
    )
    incoming, results = await new_pipe(gw, "incoming"), await new_pipe(gw, "results")
    pusher = await peers.start("push", "--endpoint", ipc)
    await pusher.send({"op": "send", "frames": b64([b"over.ipc", b"hello"])})
    [message] = await take(gw, incoming, 1)
    assert (message["address"], content_bytes(message)) == ("over.ipc", b"hello")
    # one feed to another through two bridges of the same gateway (one ZeroMQ context)
    await publish(gw, "orders", {"address": "round.trip", "message_id": "rt",
                                 "content": [text("inside")]})  # fmt: skip
    [message] = await take(gw, results, 1)
    assert (message["message_id"], content_bytes(message)) == ("rt", b"inside")


async def test_a_stopped_push_bridge_lingers_until_its_queue_is_delivered(
    make_gateway: MakeGateway, peers: Peers
) -> None:
    gw = await gateway(make_gateway, zmq_bridge("fan", "push", "work", linger=20.0))
    worker = await peers.start(
        "pull", "--endpoint", endpoint(gw, "fan"), "--rcvhwm", "5", "--slow", "0.01"
    )
    await peers_of(gw, "fan", 1)
    big = "x" * 60_000  # 200 of these are more than the socket buffers hold
    for start in range(0, 200, 10):  # 600 kB a request
        batch = range(start, start + 10)
        await publish(gw, "work", *({"address": "a", "message_id": f"l{i}",
                                     "content": [text(big)]} for i in batch))  # fmt: skip
    await until(lambda: zb(gw, "fan").counters.sent == 200, 20, "200 taken by the socket")
    assert (await worker.stats())["received"] < 200  # still queued in ZeroMQ
    await zb(gw, "fan").stop()  # as at shutdown: the socket closes, its linger starts
    got = await worker.received(200, timeout=30)
    assert [envelope(f)["p"]["message_id"] for f in got] == [f"l{i}" for i in range(200)]


async def test_a_reply_to_a_requester_that_has_gone_is_counted_not_fatal(
    make_gateway: MakeGateway, peers: Peers
) -> None:
    gw = await gateway(make_gateway, zmq_bridge("rpc", "router", "requests"))
    service = await new_pipe(gw, "requests")
    leaving = await peers.start("req", "--endpoint", endpoint(gw, "rpc"))
    ask = [b"calc", b'{"v":1,"p":{"message_id":"bye"}}', b"?"]
    await leaving.send({"op": "request", "frames": b64(ask), "timeout": 10})
    [request] = await take(gw, service, 1)
    await leaving.kill()
    await until(lambda: zb(gw, "rpc").peers == 0, 10, "the requester gone")
    # The monitor reports the disconnect before the router has retired the peer's pipe;
    # a reply sent in between goes into that pipe and ZeroMQ drops it unseen. ZeroMQ hands
    # the socket its commands in order, so once a requester that connected later has been
    # answered, the router knows the first one has gone.
    staying = await peers.start("req", "--endpoint", endpoint(gw, "rpc"))

    async def round_trip() -> None:
        serving = asyncio.create_task(http_service(gw, service, 1))
        await staying.send({"op": "request", "frames": b64(ask), "timeout": 10})
        frames = unb64((await staying.event("reply", 15))["frames"])
        await serving
        assert (envelope(frames)["p"], frames[2]) == ({"correlation_id": "bye"}, b"ok:?")

    await round_trip()
    await publish(gw, "default", {"address": request["reply_to"],
                                  "correlation_id": request["message_id"]})  # fmt: skip
    await until(lambda: zb(gw, "rpc").counters.lost_peers == 1, 10, "a lost peer")
    assert "went away" in zb(gw, "rpc").health.last_error
    await round_trip()  # the bridge goes on serving
