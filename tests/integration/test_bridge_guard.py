"""The SSRF guard of AMQP and ZeroMQ bridges made at run time, with the real RabbitMQ on
127.0.0.1:5672 and real ZeroMQ peers on 127.0.0.1 (docs/AMQP.md and docs/ZEROMQ.md,
"Security"): loopback is reached only when ``bridge_allow`` names it, and then a
message crosses, by address and by name (the bridge connects to the address the guard
checked, and TLS still checks the name); bridges of the configuration file reach
loopback without it; run-time bridges kept from a run whose ``bridge_allow`` was wider
are checked again when the gateway starts under a narrower one: they do not connect,
say why, and send what waited once the setting allows them again; and a ZeroMQ
bridge whose peer's name comes to stand for a refused address stops using it.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from bridges import zeromq
from bridges.common import owner_of
from bridges.config import parse
from gateway.admin import bridging
from gateway.admin.bridge_guard import BridgeGuard
from gateway.admin.bridging import BRIDGES
from gateway.server.keys import SERVICE
from tests.conftest import Gateway, MakeGateway
from tests.integration.broker import Broker
from tests.integration.gw import (
    AMQP,
    FEEDS,
    content_bytes,
    inbound,
    new_pipe,
    outbound,
    publish,
    take,
    until,
)
from tests.integration.test_amqps import certificates, tls_front  # noqa: F401 (a fixture)
from tests.integration.zmqpeers import Peer, Peers

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

ADMIN = {"feeds": FEEDS, "guest_scopes": "restms:admin"}


@pytest.fixture
async def peers() -> AsyncIterator[Peers]:
    async with Peers() as group:
        yield group


def push(name: str, endpoint: str) -> dict[str, Any]:
    return {"kind": "zeromq", "name": name, "socket": "push", "bind": False,
            "feed": "orders", "address": "#", "endpoints": [endpoint]}  # fmt: skip


def message(body: str, address: str = "eu.order") -> dict[str, Any]:
    return {"address": address, "content": [{"value": body}]}


async def create(gw: Gateway, definition: dict[str, Any]) -> tuple[int, str]:
    async with gw.http.post("/admin/bridges", json=definition) as r:
        return r.status, await r.text()


async def status(gw: Gateway, name: str) -> dict[str, Any]:
    async with gw.http.get(f"/admin/bridges/{name}") as r:
        assert r.status == 200, await r.text()
        return dict(await r.json())


async def all_up(gw: Gateway) -> None:
    bridges = gw.app[BRIDGES]
    await until(lambda: all(b.health.state.name == "up" for b in bridges), 20, "bridges up")


async def body_from(broker: Broker, queue: str) -> bytes:
    got = await asyncio.to_thread(broker.get, queue, 20.0)
    assert got is not None, f"nothing on {queue}"
    return bytes(got[2])


async def body_from_peer(peer: Peer) -> bytes:
    (frames,) = await peer.received(1, timeout=20)
    return frames[-1]


async def test_a_run_time_bridge_to_loopback_needs_bridge_allow_and_then_works(
    make_gateway: MakeGateway, broker: Broker, queue_name: str, peers: Peers
) -> None:
    """Refused without the setting; with it an AMQP bridge by address and one by name
    (``localhost``: ::1 is not in the network allowed, 127.0.0.1 is), and a ZeroMQ
    bridge by name, each carry a message to the broker or the peer."""
    other = broker.track(queue_name + "-named")
    for queue in (queue_name, other):
        await asyncio.to_thread(broker.declare_queue, queue)
    worker = await peers.start("pull", "--bind", "--endpoint", "tcp://127.0.0.1:*")
    named = worker.endpoint.replace("127.0.0.1", "localhost")
    made = [
        outbound("lit", f"/queue/{queue_name}", address="lit.#"),
        outbound(
            "name",
            f"/queue/{other}",
            address="name.#",
            urls=[AMQP.replace("127.0.0.1", "localhost")],
        ),
        {**push("zmq", named), "address": "zmq.#"},
    ]
    plain = await make_gateway(**ADMIN, store="memory")
    for definition in made:
        got, text = await create(plain, definition)
        assert got == 403, text
        assert "bridge_allow" in text
    gw = await make_gateway(**ADMIN, bridge_allow="127.0.0.0/8")
    for definition in made:
        got, text = await create(gw, definition)
        assert got == 201, text
    await all_up(gw)
    await publish(gw, "orders", message("by address", "lit.x"), message("by name", "name.x"))
    await publish(gw, "orders", message("to the peer", "zmq.x"))
    assert await body_from(broker, queue_name) == b"by address"
    assert await body_from(broker, other) == b"by name"
    assert await body_from_peer(worker) == b"to the peer"
    shown = await status(gw, "name")
    assert shown["url"] == "amqp://guest:***@localhost:5672"  # the name, as defined
    assert (await status(gw, "zmq"))["endpoints"] == [named]


async def test_bridges_of_the_configuration_file_are_not_guarded(
    make_gateway: MakeGateway, broker: Broker, queue_name: str, peers: Peers
) -> None:
    await asyncio.to_thread(broker.declare_queue, queue_name)
    worker = await peers.start("pull", "--bind", "--endpoint", "tcp://127.0.0.1:*")
    configured = (
        parse(outbound("amqp", f"/queue/{queue_name}", address="a.#")),
        parse({**push("zmq", worker.endpoint), "address": "z.#"}),
    )
    gw = await make_gateway(feeds=FEEDS, bridges=configured)  # no bridge_allow
    await all_up(gw)
    await publish(gw, "orders", message("to the broker", "a.x"), message("to the peer", "z.x"))
    assert await body_from(broker, queue_name) == b"to the broker"
    assert await body_from_peer(worker) == b"to the peer"


async def test_kept_run_time_bridges_are_checked_again_when_the_gateway_starts(
    make_gateway: MakeGateway, broker: Broker, queue_name: str, peers: Peers, tmp_path: Path
) -> None:
    """Made under ``bridge_allow`` and kept (bridges.json), they meet a gateway started
    without it: they do not connect, each says why (its status; /readyz lists it
    retrying), and what is published waits in their pipes; started with the setting
    again, they send it."""
    await asyncio.to_thread(broker.declare_queue, queue_name)
    worker = await peers.start("pull", "--bind", "--endpoint", "tcp://127.0.0.1:*")
    data = str(tmp_path / "data")
    allow = "127.0.0.1 localhost"
    gw = await make_gateway(**ADMIN, data_dir=data, bridge_allow=allow)
    made = [
        outbound("amqp", f"/queue/{queue_name}", address="a.#"),
        {
            **push("zmq", worker.endpoint.replace("127.0.0.1", "localhost")),
            "address": "z.#",
            "durable": True,  # its pipe keeps what waits over a restart
        },
    ]
    for definition in made:
        got, text = await create(gw, definition)
        assert got == 201, text
    await all_up(gw)
    await gw.stop()

    gw = await make_gateway(**ADMIN, data_dir=data, ready_needs_bridges=True)
    bridges = gw.app[BRIDGES]
    await until(lambda: all(b.health.last_error for b in bridges), 20, "both refused")
    amqp, zmq = await status(gw, "amqp"), await status(gw, "zmq")
    assert amqp["state"] == zmq["state"] == "retrying"
    assert amqp["counters"]["connects"] == zmq["counters"]["connects"] == 0
    assert amqp["last_error"] == (
        "cannot connect to amqp://guest:***@127.0.0.1:5672: the peer address is loopback: "
        "a bridge made at run time may reach only public addresses, or those bridge_allow names"
    )
    assert zmq["last_error"].startswith(
        f"cannot open {made[1]['endpoints'][0]}: "
        "the peer host resolves only to refused addresses (loopback): "
    )
    async with gw.http.get("/readyz") as r:
        assert r.status == 503
        lines = (await r.text()).splitlines()
    assert {"bridge amqp: retrying", "bridge zmq: retrying"} <= set(lines)
    await publish(gw, "orders", message("held a", "a.x"), message("held z", "z.x"))
    await asyncio.sleep(1.0)
    for name in ("amqp", "zmq"):  # in the bridge's pipe (the ZeroMQ one opens it once up)
        assert sum(pipe.held for pipe in await gw.app[SERVICE].pipes(owner_of(name))) == 1
    assert await asyncio.to_thread(broker.depth, queue_name) == 0
    await gw.stop()

    gw = await make_gateway(**ADMIN, data_dir=data, bridge_allow=allow)
    await all_up(gw)
    assert await body_from(broker, queue_name) == b"held a"
    assert await body_from_peer(worker) == b"held z"


async def test_a_guarded_amqps_bridge_verifies_the_name_it_was_given(
    make_gateway: MakeGateway,
    broker: Broker,
    queue_name: str,
    certificates: tuple[ssl.SSLContext, str],  # noqa: F811 (the fixture imported above)
) -> None:
    """The bridge connects to the address the guard checked for ``localhost``, and TLS
    still checks the certificate against ``localhost``: the one issued for that name
    is accepted, and the same front reached by its address is refused (no name)."""
    context, ca = certificates
    await asyncio.to_thread(broker.declare_queue, queue_name)
    gw = await make_gateway(**ADMIN, bridge_allow="127.0.0.0/8")
    async with tls_front(context) as port:
        for name, host in (("named", "localhost"), ("bare", "127.0.0.1")):
            definition = inbound(name, f"/queue/{queue_name}", tls_ca=ca)
            definition["urls"] = [f"amqps://guest:guest@{host}:{port}"]
            got, text = await create(gw, definition)
            assert got == 201, text
        bridges = gw.app[BRIDGES]
        named, bare = bridges.get("named"), bridges.get("bare")
        await until(lambda: named.health.state.name == "up", 20, "amqps up by name")
        await until(lambda: bare.health.last_error != "", 20, "the TLS failure by address")
        assert bare.health.counters.connects == 0
        assert "SSL" in bare.health.last_error
        pipe = await new_pipe(gw, "incoming")
        await asyncio.to_thread(broker.publish, "", queue_name, b"over tls", None)
        [got_message] = await take(gw, pipe, 1)
        assert content_bytes(got_message) == b"over tls"
        await gw.stop()


class Moving(BridgeGuard):
    """The gateway's guard, with one name of the test's whose address the test sets (no
    DNS): what ``peer.test`` stands for goes through the guard like a resolver's answer."""

    points_to = "127.0.0.1"

    def addresses(self, host: str, port: int, family: int) -> list[str]:
        if host == "peer.test":
            return super().addresses(Moving.points_to, port, family)
        return super().addresses(host, port, family)


async def test_a_zeromq_bridge_follows_its_peers_name_only_where_the_guard_allows(
    make_gateway: MakeGateway, peers: Peers, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its peer's name comes to stand for a refused address: at its next look the
    bridge closes its socket and says why, what is published waits in its pipe; the
    name stands for the peer again: it connects, and the message crosses."""
    monkeypatch.setattr(bridging, "BridgeGuard", Moving)
    monkeypatch.setattr(zeromq, "RECHECK", 0.2)
    worker = await peers.start("pull", "--bind", "--endpoint", "tcp://127.0.0.1:*")
    named = worker.endpoint.replace("127.0.0.1", "peer.test")
    gw = await make_gateway(**ADMIN, bridge_allow="127.0.0.1")
    got, text = await create(gw, push("zmq", named))  # peer.test: no DNS answer, let in
    assert got == 201, text
    await all_up(gw)
    await publish(gw, "orders", message("first"))
    assert await body_from_peer(worker) == b"first"

    the = gw.app[BRIDGES].get("zmq")
    monkeypatch.setattr(Moving, "points_to", "10.9.9.9")
    await until(lambda: the.health.state.name == "retrying", 10, "the socket closed")
    assert the.health.last_error.startswith(
        f"cannot open {named}: the peer address is private: a bridge made at run time"
    )
    await publish(gw, "orders", message("second"))
    monkeypatch.setattr(Moving, "points_to", "127.0.0.1")
    await all_up(gw)
    assert await body_from_peer(worker) == b"second"
