"""The SSRF guard of AMQP and ZeroMQ bridges made at run time, when they are made
(gateway/admin/bridge_guard.py; docs/AMQP.md and docs/ZEROMQ.md, "Security"): 403
text/plain naming the key, the endpoint and why, nothing made, unless ``bridge_allow``
names the address; a name that does not resolve yet is made and says, retrying, why it
cannot connect. No broker or peer is connected to here (tests/integration/
test_bridge_guard.py has them); the one public address named, 8.8.8.8, is never reached:
its definition is refused for another URL first.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from feeds.config import FeedConfig
from gateway.admin.bridging import BRIDGES
from tests.conftest import Gateway, MakeGateway
from tests.integration.gw import until

pytestmark = pytest.mark.timeout(60)

FEEDS = (FeedConfig(name="orders", type="topic"),)
ADMIN = {"feeds": FEEDS, "guest_scopes": "restms:admin"}
REACH = "a bridge made at run time may reach only public addresses, or those bridge_allow names"


def amqp(*urls: str, **more: Any) -> dict[str, Any]:
    return {"name": "g", "direction": "out", "urls": list(urls), "feed": "orders",
            "address": "#", "target": "/queue/g", **more}  # fmt: skip


def zeromq(*endpoints: str, bind: bool = False, **more: Any) -> dict[str, Any]:
    return {"kind": "zeromq", "name": "g", "socket": "push", "feed": "orders",
            "endpoints": list(endpoints), "bind": bind, **more}  # fmt: skip


async def create(gw: Gateway, definition: dict[str, Any]) -> tuple[int, str]:
    async with gw.http.post("/admin/bridges", json=definition) as r:
        text = await r.text()
        if r.status == 403:
            assert r.content_type == "text/plain"
        return r.status, text


async def refused(gw: Gateway, definition: dict[str, Any], says: str) -> str:
    status, text = await create(gw, definition)
    assert status == 403, text
    assert text.startswith("bridge g: ")
    assert says in text, text
    async with gw.http.get("/admin/bridges/g") as r:
        assert r.status == 404  # nothing was made, nothing kept
    return text


LOCAL = "the peer host 'localhost' resolves to a loopback address"
EVERY = "binds on every interface: a bridge made at run time binds on loopback, or on what"


@pytest.mark.parametrize(
    ("urls", "says"),
    [
        (["amqp://127.0.0.1:5672"], "urls: amqp://127.0.0.1:5672: the peer address is loopback"),
        (["amqp://guest:secret@localhost"], f"urls: amqp://guest:***@localhost: {LOCAL}"),
        (["amqps://[::1]:5671"], "the peer address is loopback"),
        (["amqp://[::ffff:10.0.0.1]"], "the peer address is private (carried in ::ffff:a00:1)"),
        (["amqp://8.8.8.8", "amqp://169.254.169.254"], "169.254.169.254: the peer address is link"),
    ],
)
async def test_a_run_time_amqp_bridge_to_a_refused_address_is_403(
    make_gateway: MakeGateway, urls: list[str], says: str
) -> None:
    gw = await make_gateway(**ADMIN)
    text = await refused(gw, amqp(*urls), says)
    assert "secret" not in text
    assert text.rstrip().endswith(REACH)


@pytest.mark.parametrize(
    ("endpoints", "bind", "says"),
    [
        (["tcp://127.0.0.1:5555"], False, "tcp://127.0.0.1:5555: the peer address is loopback"),
        (["tcp://localhost:5555"], False, f"endpoints: tcp://localhost:5555: {LOCAL}: {REACH}"),
        (["tcp://10.1.2.3:5555"], False, "the peer address is private"),
        (["tcp://*:*"], True, f"endpoints: tcp://*:*: {EVERY} bridge_allow names (tcp://*)"),
        (["tcp://127.0.0.1:*", "tcp://0.0.0.0:*"], True, f"tcp://0.0.0.0:*: {EVERY}"),
        (["tcp://10.1.2.3:*"], True, "binds on 10.1.2.3, which is not loopback"),
        (["tcp://lo:*"], True, "binds on the interface 'lo'"),
        (["inproc://zeromq.zap.01"], False, "uses inproc:// endpoints only where bridge_allow"),
    ],
)
async def test_a_run_time_zeromq_bridge_to_a_refused_endpoint_is_403(
    make_gateway: MakeGateway, endpoints: list[str], bind: bool, says: str
) -> None:
    gw = await make_gateway(**ADMIN)
    await refused(gw, zeromq(*endpoints, bind=bind), says)


async def test_an_ipc_bind_is_refused_and_leaves_the_file_at_its_path(
    make_gateway: MakeGateway, tmp_path: Path
) -> None:
    """libzmq removes what is at the path it binds: a run-time bridge could delete any
    file the gateway may write, its own store included."""
    gw = await make_gateway(**ADMIN, data_dir=str(tmp_path / "data"))
    kept = tmp_path / "precious"
    await asyncio.to_thread(kept.write_text, "kept")
    await refused(gw, zeromq(f"ipc://{kept}", bind=True), "uses ipc:// endpoints only where")
    assert await asyncio.to_thread(kept.read_text) == "kept"


async def test_bridge_allow_lets_what_it_names(make_gateway: MakeGateway, tmp_path: Path) -> None:
    """A network lets bridges connect to its addresses, a name to that name, an
    endpoint entry use its endpoints: each bridge is made (binds on other addresses
    than loopback: tests/unit/test_bridge_allow.py, this test stays on loopback)."""
    folder = tmp_path / "sockets"
    await asyncio.to_thread(folder.mkdir)
    allow = f"127.0.0.0/8 localhost ipc://{folder}/ inproc://made.here"
    gw = await make_gateway(**ADMIN, bridge_allow=allow)
    made = [
        amqp("amqp://127.0.0.1:1", "amqp://localhost:1", name="a1"),
        zeromq("tcp://127.0.0.1:1", "tcp://localhost:1", name="z1"),
        zeromq(f"ipc://{folder}/one.sock", bind=True, socket="pull", name="z2"),
        zeromq("inproc://made.here", name="z3"),
    ]
    for definition in made:
        status, text = await create(gw, definition)
        assert status == 201, text
    for name in ("z2", "z3"):  # opened: what the guard allowed, libzmq did
        bridge = gw.app[BRIDGES].get(name)
        await until(lambda b=bridge: b.health.state.name == "up", 10, f"{name} up")


async def test_a_name_that_does_not_resolve_yet_is_made_and_says_why_it_waits(
    make_gateway: MakeGateway,
) -> None:
    """Like a broker that is down: made, retrying, the reason in its status; the
    ZeroMQ bridge does not leave the name to libzmq, which would look it up itself."""
    gw = await make_gateway(**ADMIN)
    for definition in (
        amqp("amqp://does-not-exist.invalid:5672", name="a"),
        zeromq("tcp://does-not-exist.invalid:5555", name="z"),
    ):
        status, text = await create(gw, definition)
        assert status == 201, text
    for name, says in (("a", "cannot connect to amqp://does-not-exist.invalid:5672: "),
                       ("z", "cannot open tcp://does-not-exist.invalid:5555: ")):  # fmt: skip
        bridge = gw.app[BRIDGES].get(name)
        await until(lambda b=bridge: bool(b.health.last_error), 20, f"{name} tried")
        async with gw.http.get(f"/admin/bridges/{name}") as r:
            shown = await r.json()
        assert shown["state"] == "retrying"
        assert shown["last_error"].startswith(says), shown["last_error"]
