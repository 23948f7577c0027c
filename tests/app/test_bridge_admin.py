"""The admin resource for bridges over real HTTP (gateway/admin/bridging.py, docs/ADMIN.md).

No broker is needed: every bridge points at a port nothing listens on, so its link
stays in ``connecting``/``retrying`` and an outbound bridge's messages wait in its
internal pipe -- which is exactly the state the resource must report, refuse to
delete without ``?discard=true``, and keep over a restart. That port is on loopback,
which a bridge made at run time reaches only when ``bridge_allow`` names it (ALLOW).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import stat
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

import bridges.config
from bridges.amqp import owner_of
from feeds.config import FeedConfig
from tests.app.jsonapi import publish
from tests.app.oauth import clients, token
from tests.conftest import Gateway, MakeGateway

pytestmark = pytest.mark.app

ISS = "http://gw.test"
ADMIN = "/admin/bridges"
NOWHERE = "amqp://127.0.0.1:1"  # refuses connections: bridges never get "up"
ALLOW = "127.0.0.1"  # bridge_allow: run-time bridges may reach NOWHERE
FEEDS = (FeedConfig(name="orders", type="fanout"), FeedConfig(name="other.x", type="fanout"))
SCOPES = {
    "root": "restms:admin",
    "narrow": "restms:admin:feed/other*",
    "user": "restms:read restms:publish restms:subscribe",
}
Auth = dict[str, str]
Reply = tuple[int, Any, Any]


def outbound(name: str = "out", **changes: Any) -> dict[str, Any]:
    return {
        "name": name,
        "direction": "out",
        "urls": [NOWHERE],
        "feed": "orders",
        "target": "/exchange/amq.topic/{address}",
        **changes,
    }


def inbound(name: str = "in", **changes: Any) -> dict[str, Any]:
    return {
        "name": name,
        "direction": "in",
        "urls": [NOWHERE],
        "feed": "orders",
        "source": "/queue/incoming",
        **changes,
    }


async def admin_gateway(make_gateway: MakeGateway, **overrides: Any) -> tuple[Gateway, Auth]:
    """A gateway with the FEEDS, and an Authorization header per client in SCOPES
    (``guest``: none at all, the loopback guest)."""
    configured, secrets = await clients(**SCOPES)
    overrides.setdefault("feeds", FEEDS)
    overrides.setdefault("bridge_allow", ALLOW)
    gw = await make_gateway(clients=configured, oauth_issuer=ISS, **overrides)
    auth = {"guest": ""}
    for name, secret in secrets.items():
        auth[name] = f"Bearer {await token(gw, name, secret)}"
    return gw, auth


async def call(
    gw: Gateway,
    auth: str,
    method: str,
    path: str = ADMIN,
    definition: Any = None,
    *,
    data: bytes | None = None,
    content_type: str | None = "application/json",
) -> Reply:
    """(status, parsed JSON or text, headers) of one admin request made with ``auth``."""
    headers = {"Authorization": auth} if auth else {}
    if definition is not None:
        data = json.dumps(definition).encode()
    if data is not None and content_type is not None:
        headers["Content-Type"] = content_type
    async with gw.http.request(method, path, data=data, headers=headers) as r:
        text = await r.text()
        parsed = json.loads(text) if r.content_type == "application/json" else text
        return r.status, parsed, r.headers


async def until(check: Callable[[], Awaitable[Any]], what: str, timeout: float = 10.0) -> Any:
    """Poll ``check`` until it returns something true; fail after ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        result = await check()
        if result:
            return result
        assert loop.time() < deadline, f"gave up waiting for {what}"
        await asyncio.sleep(0.05)


async def joined(gw: Gateway, name: str) -> None:
    """Wait until the outbound bridge ``name`` has its internal pipe joined to its feed."""

    async def check() -> bool:
        return any(pipe.joins for pipe in gw.engine.pipes_of(owner_of(name)))

    await until(check, f"bridge {name}'s join")


async def status_of(gw: Gateway, auth: str, name: str) -> dict[str, Any]:
    status, reply, _ = await call(gw, auth, "GET", f"{ADMIN}/{name}")
    assert status == 200, reply
    assert isinstance(reply, dict)
    return reply


def plain(reply: Reply, status: int, reason: str) -> None:
    """An error reply: this status, one line of text/plain holding ``reason``."""
    got, text, headers = reply
    assert got == status, (got, text)
    assert headers["Content-Type"].startswith("text/plain"), headers["Content-Type"]
    assert reason in text, text


def insufficient_scope(reply: Reply) -> None:
    plain(reply, 403, "restms:admin")
    challenge = ", ".join(reply[2].getall("WWW-Authenticate", []))
    assert 'error="insufficient_scope"' in challenge, challenge
    assert 'scope="restms:admin"' in challenge, challenge


def threads_of(*names: str) -> list[str]:
    wanted = {f"amqp-bridge-{name}" for name in names}
    return [t.name for t in threading.enumerate() if t.name in wanted]


# ---------------------------------------------------------------- create, get, list
async def test_a_new_bridges_location_names_public_url(make_gateway: MakeGateway) -> None:
    gw, auth = await admin_gateway(make_gateway, public_url="https://gw.example.com")
    status, reply, headers = await call(gw, auth["root"], "POST", definition=outbound())
    assert status == 201, reply
    assert headers["Location"] == f"https://gw.example.com{ADMIN}/out"


async def test_create_get_and_list_show_status_without_secrets(
    make_gateway: MakeGateway,
) -> None:
    gw, auth = await admin_gateway(make_gateway)
    root = auth["root"]
    definition = outbound(
        urls=["amqp://u:secret@127.0.0.1:1", "amqps://127.0.0.1:2"],
        user="u",
        password="hunter2",
        address="eu.*",
        window=10,
    )
    status, reply, headers = await call(gw, root, "POST", definition=definition)
    assert status == 201, reply
    assert headers["Location"] == f"{gw.url}{ADMIN}/out"
    assert headers["Content-Type"].startswith("application/json")
    assert headers["Cache-Control"] == "no-store"
    assert reply["name"] == "out"
    assert reply["kind"] == "amqp"
    assert reply["direction"] == "out"
    assert reply["configured"] is False
    assert reply["state"] in ("connecting", "retrying")
    assert reply["backlog"] == 0
    assert reply["counters"]["accepted"] == 0
    assert reply["counters"]["published"] == 0
    shown = reply["definition"]
    assert shown["urls"] == ["amqp://u:***@127.0.0.1:1", "amqps://127.0.0.1:2"]
    assert shown["password"] == "***"
    assert shown["user"] == "u"
    assert shown["address"] == "eu.*"
    assert shown["window"] == 10
    assert shown["target"] == "/exchange/amq.topic/{address}"
    assert shown["durable"] is True  # defaults are shown too
    assert set(shown) == {f.name for f in dataclasses.fields(bridges.config.AmqpBridgeConfig)}

    # The same definition again: 200 and the same bridge; a different one: 409.
    status, again, headers = await call(gw, root, "POST", definition=definition)
    assert status == 200, again
    assert headers["Location"] == f"{gw.url}{ADMIN}/out"
    assert again["definition"] == shown
    changed = {**definition, "window": 11}
    plain(await call(gw, root, "POST", definition=changed), 409, "a different bridge named 'out'")
    # Racing creates of one new definition: one makes it, the others find it.
    racing = await asyncio.gather(
        *(call(gw, root, "POST", definition=outbound("race")) for _ in range(5))
    )
    assert sorted(status for status, _, _ in racing) == [200, 200, 200, 200, 201]
    assert len(gw.engine.pipes_of(owner_of("race"))) <= 1
    status, reply, _ = await call(gw, root, "DELETE", f"{ADMIN}/race")
    assert (status, reply) == (200, {"deleted": "race", "discarded": 0})

    status, reply, _ = await call(gw, root, "POST", definition=inbound(address_from="header:rk"))
    assert status == 201, reply
    assert reply["direction"] == "in"
    assert reply["definition"]["source"] == "/queue/incoming"
    assert reply["definition"]["password"] == ""  # none given: nothing to hide

    # Nothing listens there: the status says the link is not up, and why.
    async def failing() -> dict[str, Any] | None:
        found = await status_of(gw, root, "out")
        return found if found["last_error"] else None

    found = await until(failing, "a last_error")
    assert found["state"] in ("connecting", "retrying")
    assert found["last_error_at"] is not None
    assert found["counters"]["connects"] == 0
    assert "secret" not in found["last_error"]

    status, listed, headers = await call(gw, root, "GET")
    assert status == 200, listed
    assert headers["Cache-Control"] == "no-store"
    assert [b["name"] for b in listed["bridges"]] == ["out", "in"]
    assert all(b["state"] in ("connecting", "retrying") for b in listed["bridges"])

    # No reply ever holds a password, in a URL or not.
    for path in (ADMIN, f"{ADMIN}/out"):
        async with gw.http.get(path, headers={"Authorization": root}) as r:
            text = await r.text()
        assert "secret" not in text
        assert "hunter2" not in text

    plain(await call(gw, root, "GET", f"{ADMIN}/nothing"), 404, "no bridge named 'nothing'")


# ---------------------------------------------------------------- validation
BAD: list[tuple[Any, str]] = [
    ({**outbound(), "colour": "red"}, "unknown amqp bridge keys: colour"),
    ({"name": "x"}, "an amqp bridge needs direction, urls, feed"),
    (outbound(urls=["http://127.0.0.1:1"]), "is not an amqp:// or amqps:// URL"),
    (outbound(urls=["amqp://u:pw@:5672"]), "amqp://u:***@:5672 is not an amqp:// or amqps://"),
    (outbound(urls=["amqp://127.0.0.1:99999"]), "amqp://127.0.0.1:99999 has a bad port"),
    (outbound(urls=["amqp://u:pw@127.0.0.1:99999"]), "amqp://u:***@127.0.0.1:99999 has a bad port"),
    (outbound(urls=[]), "urls must name at least one broker"),
    (outbound(urls=5), "urls must be a list of strings"),
    (outbound(direction="sideways"), "direction must be out or in, not 'sideways'"),
    (outbound(kind="zmq"), "unknown bridge kind 'zmq'"),
    (outbound(target=""), "an outbound bridge needs a target"),
    ({k: v for k, v in outbound().items() if k != "target"}, "an outbound bridge needs a target"),
    ({k: v for k, v in inbound().items() if k != "source"}, "an inbound bridge needs a source"),
    (inbound(address_from="body"), "address_from must be subject, to or header:NAME"),
    (inbound(address_from="header:"), "address_from must be subject, to or header:NAME"),
    (outbound(target="/exchange/x/{subject}"), "may hold {address} and no other braces"),
    (outbound(target="/exchange/x/{address"), "may hold {address} and no other braces"),
    (outbound(window=0), "window must be 1 to 100000"),
    (outbound(window="8"), "window must be an integer"),
    (outbound(window=1.5), "window must be an integer"),
    (outbound(durable="yes"), "durable must be true or false"),
    (outbound(retry_min=0), "retry_min must be above 0 and at most 3600 s"),
    (outbound(heartbeat=1e23), "heartbeat must be at most 3600 s"),
    (outbound(retry_min=5, retry_max=1), "a *_min delay is larger than its *_max"),
    (outbound(headers={"a": 1}), "headers must be a table of strings"),
    (outbound(sasl="GSSAPI"), "sasl must be PLAIN or ANONYMOUS"),
    (outbound(name="has space"), "must be 1-64 of A-Z a-z 0-9 . _ -"),
    (outbound(name="x" * 65), "must be 1-64 of A-Z a-z 0-9 . _ -"),
    ({**outbound(), "name": 7}, "name must be a string"),
    (outbound(feed="nope"), "no feed named 'nope'"),
    (inbound(feed="nope"), "no feed named 'nope'"),
    ([outbound()], "must be a table / JSON object"),
    ("out", "must be a table / JSON object"),
]

WRONG_TYPES: tuple[Any, ...] = (None, [1], {"a": []})  # wrong for every key


async def test_bad_definitions_are_refused_with_a_reason(make_gateway: MakeGateway) -> None:
    gw, auth = await admin_gateway(make_gateway, max_body=4096)
    root = auth["root"]
    for definition, reason in BAD:
        reply = await call(gw, root, "POST", definition=definition)
        plain(reply, 400, reason)
        assert "pw@" not in reply[1]  # a refused URL is shown without its password

    # Every key with a value of the wrong type: 400 naming the key, never a 500.
    for key in (f.name for f in dataclasses.fields(bridges.config.AmqpBridgeConfig)):
        for wrong in WRONG_TYPES:
            reply = await call(gw, root, "POST", definition={**outbound("typed"), key: wrong})
            plain(reply, 400, key)
    plain(await call(gw, root, "POST", data=b"null"), 400, "must be a table / JSON object")
    plain(await call(gw, root, "POST", data=b"{"), 400, "not valid JSON")
    plain(await call(gw, root, "POST", data=b""), 400, "not valid JSON")
    plain(await call(gw, root, "POST", data=b'{"window": 1e999999}'), 400, "not valid JSON")
    body = json.dumps(outbound()).encode()
    for content_type in ("text/plain", "application/xml", "application/restms+json", None):
        reply = await call(gw, root, "POST", data=body, content_type=content_type)
        plain(reply, 415, "application/json")
    status, reply, _ = await call(
        gw, root, "POST", data=body, content_type="Application/JSON; charset=utf-8"
    )
    assert status == 201, reply  # parameters and case do not matter
    huge = json.dumps(outbound(name="big", title="x" * 5000)).encode()
    plain(await call(gw, root, "POST", data=huge), 413, "4096-byte limit")

    status, listed, _ = await call(gw, root, "GET")
    assert status == 200
    assert [b["name"] for b in listed["bridges"]] == ["out"]  # no refused one was kept
    assert gw.engine.pipes_of(owner_of("big")) == []


# ---------------------------------------------------------------- authorization
async def test_a_bridges_own_pipe_is_deleted_with_the_bridge(make_gateway: MakeGateway) -> None:
    """DELETE /admin/pipes/{name}, and an admin's RestMS DELETE of the pipe, refuse a
    bridge's internal pipe, naming the bridge: the bridge would make another pipe at
    once, and what waited to be sent would go."""
    gw, auth = await admin_gateway(make_gateway)
    status, reply, _ = await call(gw, auth["root"], "POST", definition=outbound())
    assert status == 201, reply
    await joined(gw, "out")
    [pipe] = gw.engine.pipes_of(owner_of("out"))
    for path in (f"/admin/pipes/{pipe.key}", f"/restms/resource/{pipe.key}"):
        reply = await call(gw, auth["root"], "DELETE", path)
        plain(reply, 409, "bridge 'out'")
        assert f"{ADMIN}/out" in reply[1]
    assert gw.engine.pipes_of(owner_of("out")) == [pipe]
    assert not pipe.deleted


async def test_only_admins_of_the_bridge_feed_reach_it(make_gateway: MakeGateway) -> None:
    gw, auth = await admin_gateway(make_gateway)
    root, narrow, user = auth["root"], auth["narrow"], auth["user"]
    for definition in (outbound("o-orders"), inbound("i-other", feed="other.x")):
        status, reply, _ = await call(gw, root, "POST", definition=definition)
        assert status == 201, reply

    # No admin scope at all (a token without it, or the loopback guest): 403 everywhere.
    for who in (user, auth["guest"]):
        insufficient_scope(await call(gw, who, "GET"))
        insufficient_scope(await call(gw, who, "POST", definition=outbound("mine")))
        insufficient_scope(await call(gw, who, "POST", definition=outbound("mine", feed="x")))
        insufficient_scope(await call(gw, who, "GET", f"{ADMIN}/o-orders"))
        insufficient_scope(await call(gw, who, "DELETE", f"{ADMIN}/o-orders"))
        insufficient_scope(await call(gw, who, "DELETE", f"{ADMIN}/o-orders?discard=true"))
        # ... even for names that do not exist: a non-admin cannot probe for bridges.
        insufficient_scope(await call(gw, who, "GET", f"{ADMIN}/nothing"))
        insufficient_scope(await call(gw, who, "DELETE", f"{ADMIN}/nothing"))

    # An admin of other* feeds sees only their bridges; the others look absent.
    status, listed, _ = await call(gw, narrow, "GET")
    assert status == 200, listed
    assert [b["name"] for b in listed["bridges"]] == ["i-other"]
    assert (await status_of(gw, narrow, "i-other"))["direction"] == "in"
    for method, query in (("GET", ""), ("DELETE", ""), ("DELETE", "?discard=true")):
        hidden = await call(gw, narrow, method, f"{ADMIN}/o-orders{query}")
        absent = await call(gw, narrow, method, f"{ADMIN}/o-nothing{query}")
        plain(hidden, 404, "no bridge named 'o-orders'")
        assert absent[1] == hidden[1].replace("o-orders", "o-nothing")  # indistinguishable
    # Non-admins are refused before the body is read: no probing the validation either.
    for who in (user, auth["guest"]):
        insufficient_scope(await call(gw, who, "POST", data=b"{"))
        insufficient_scope(await call(gw, who, "POST", data=b"{}", content_type="text/plain"))
    insufficient_scope(await call(gw, narrow, "POST", definition=outbound("n-orders")))
    status, reply, _ = await call(gw, narrow, "POST", definition=outbound("n", feed="other.x"))
    assert status == 201, reply

    # Nothing the refused callers did changed anything.
    status, listed, _ = await call(gw, root, "GET")
    assert [b["name"] for b in listed["bridges"]] == ["o-orders", "i-other", "n"]
    assert gw.engine.pipes_of(owner_of("mine")) == []

    status, reply, _ = await call(gw, narrow, "DELETE", f"{ADMIN}/n")
    assert (status, reply) == (200, {"deleted": "n", "discarded": 0})


async def test_the_loopback_guest_is_admin_only_when_configured(
    make_gateway: MakeGateway,
) -> None:
    gw = await make_gateway(feeds=FEEDS, guest_scopes="restms:admin", bridge_allow=ALLOW)
    status, reply, _ = await call(gw, "", "POST", definition=outbound())
    assert status == 201, reply
    status, reply, _ = await call(gw, "", "DELETE", f"{ADMIN}/out")
    assert status == 200, reply


# ---------------------------------------------------------------- delete
async def test_delete_forgets_a_run_time_bridge(make_gateway: MakeGateway) -> None:
    gw, auth = await admin_gateway(make_gateway)
    root = auth["root"]
    for definition in (outbound(), inbound()):
        status, reply, _ = await call(gw, root, "POST", definition=definition)
        assert status == 201, reply
    await joined(gw, "out")

    for name in ("out", "in"):
        status, reply, headers = await call(gw, root, "DELETE", f"{ADMIN}/{name}")
        assert (status, reply) == (200, {"deleted": name, "discarded": 0})
        assert headers["Cache-Control"] == "no-store"
        plain(await call(gw, root, "GET", f"{ADMIN}/{name}"), 404, f"no bridge named {name!r}")
        plain(await call(gw, root, "DELETE", f"{ADMIN}/{name}"), 404, "no bridge named")
    assert gw.engine.pipes_of(owner_of("out")) == []
    status, listed, _ = await call(gw, root, "GET")
    assert listed == {"bridges": []}

    # Its name is free again, and the new bridge starts afresh.
    status, reply, _ = await call(gw, root, "POST", definition=outbound(window=3))
    assert status == 201, reply

    async def in_ended() -> bool:
        return not threads_of("in")

    await until(in_ended, "the proton thread of 'in' to end")
    assert threads_of("out") == ["amqp-bridge-out"]


async def test_a_configured_bridge_cannot_be_deleted(make_gateway: MakeGateway) -> None:
    configured = bridges.config.parse(outbound("conf", password="hunter2"))
    gw, auth = await admin_gateway(make_gateway, bridges=(configured,))
    root = auth["root"]
    found = await status_of(gw, root, "conf")
    assert found["configured"] is True
    assert found["definition"]["password"] == "***"
    for query in ("", "?discard=true"):
        reply = await call(gw, root, "DELETE", f"{ADMIN}/conf{query}")
        plain(reply, 403, "in the configuration file")
        assert "WWW-Authenticate" not in reply[2]  # not a scope problem
    # A run-time definition cannot take its name, nor replace it.
    plain(await call(gw, root, "POST", definition=outbound("conf")), 409, "a different bridge")
    _, listed, _ = await call(gw, root, "GET")
    assert [b["name"] for b in listed["bridges"]] == ["conf"]


async def test_waiting_messages_keep_a_bridge_until_discarded(
    make_gateway: MakeGateway,
) -> None:
    gw, auth = await admin_gateway(make_gateway)
    root = auth["root"]
    status, reply, _ = await call(gw, root, "POST", definition=outbound())
    assert status == 201, reply
    await joined(gw, "out")
    counts = await publish(gw, "/restms/feed/orders", *({"address": f"a{i}"} for i in range(3)))
    assert counts == [1, 1, 1]  # each went to the bridge's pipe (the only join)
    assert (await status_of(gw, root, "out"))["backlog"] == 3

    plain(await call(gw, root, "DELETE", f"{ADMIN}/out"), 409, "has 3 messages waiting")
    plain(await call(gw, root, "DELETE", f"{ADMIN}/out?discard=no"), 409, "?discard=true")
    found = await status_of(gw, root, "out")
    assert found["backlog"] == 3
    assert found["state"] in ("connecting", "retrying")

    status, reply, _ = await call(gw, root, "DELETE", f"{ADMIN}/out?discard=true")
    assert (status, reply) == (200, {"deleted": "out", "discarded": 3})
    assert gw.engine.pipes_of(owner_of("out")) == []
    plain(await call(gw, root, "GET", f"{ADMIN}/out"), 404, "no bridge named")
    assert await publish(gw, "/restms/feed/orders", {"address": "late"}) == [0]


# ---------------------------------------------------------------- persistence
def _file(path: Path) -> tuple[int, dict[str, Any]]:
    return stat.S_IMODE(path.stat().st_mode), json.loads(path.read_text(encoding="utf-8"))


async def test_run_time_bridges_and_their_messages_survive_a_restart(
    make_gateway: MakeGateway, tmp_path: Path
) -> None:
    data = tmp_path / "kept"
    gw, auth = await admin_gateway(make_gateway, data_dir=str(data))
    root = auth["root"]
    definitions = (outbound(password="hunter2", user="u"), inbound())
    for definition in definitions:
        status, reply, _ = await call(gw, root, "POST", definition=definition)
        assert status == 201, reply
    shown = [(await status_of(gw, root, d["name"]))["definition"] for d in definitions]
    await joined(gw, "out")
    assert await publish(gw, "/restms/feed/orders", {"address": "a"}, {"address": "b"}) == [1, 1]

    mode, kept = await asyncio.to_thread(_file, data / "bridges.json")
    assert mode == 0o600  # it holds broker passwords
    assert [b["name"] for b in kept["bridges"]] == ["out", "in"]
    await gw.stop()
    assert threads_of("out", "in") == []

    gw, auth = await admin_gateway(make_gateway, data_dir=str(data))
    root = auth["root"]
    status, listed, _ = await call(gw, root, "GET")
    assert status == 200, listed
    assert [b["definition"] for b in listed["bridges"]] == shown
    assert all(b["configured"] is False for b in listed["bridges"])

    async def backlog() -> bool:
        return bool((await status_of(gw, root, "out"))["backlog"] == 2)

    await until(backlog, "the two waiting messages")
    plain(await call(gw, root, "DELETE", f"{ADMIN}/out"), 409, "has 2 messages waiting")
    status, reply, _ = await call(gw, root, "DELETE", f"{ADMIN}/out?discard=true")
    assert (status, reply) == (200, {"deleted": "out", "discarded": 2})
    status, reply, _ = await call(gw, root, "DELETE", f"{ADMIN}/in")
    assert (status, reply) == (200, {"deleted": "in", "discarded": 0})
    mode, kept = await asyncio.to_thread(_file, data / "bridges.json")
    assert (mode, kept) == (0o600, {"bridges": []})
    await gw.stop()

    gw, auth = await admin_gateway(make_gateway, data_dir=str(data))
    status, listed, _ = await call(gw, auth["root"], "GET")
    assert listed == {"bridges": []}
    assert gw.engine.pipes_of(owner_of("out")) == []


async def test_a_memory_gateway_keeps_no_bridges(make_gateway: MakeGateway, tmp_path: Path) -> None:
    data = tmp_path / "memory"
    gw, auth = await admin_gateway(make_gateway, data_dir=str(data), store="memory")
    status, reply, _ = await call(gw, auth["root"], "POST", definition=outbound())
    assert status == 201, reply
    await gw.stop()
    assert not await asyncio.to_thread((data / "bridges.json").exists)

    gw, auth = await admin_gateway(make_gateway, data_dir=str(data), store="memory")
    status, listed, _ = await call(gw, auth["root"], "GET")
    assert listed == {"bridges": []}


# ---------------------------------------------------------------- shutdown
async def test_a_gateway_with_bridges_stops_promptly(make_gateway: MakeGateway) -> None:
    configured = bridges.config.parse(inbound("stop-conf"))
    gw, auth = await admin_gateway(make_gateway, bridges=(configured,))
    for definition in (outbound("stop-out"), inbound("stop-in")):
        status, reply, _ = await call(gw, auth["root"], "POST", definition=definition)
        assert status == 201, reply
    await joined(gw, "stop-out")
    await publish(gw, "/restms/feed/orders", {"address": "a"})
    names = ("stop-conf", "stop-out", "stop-in")
    assert sorted(threads_of(*names)) == sorted(f"amqp-bridge-{n}" for n in names)

    async with asyncio.timeout(5):
        await gw.stop()

    async def gone() -> bool:
        return not threads_of(*names)

    await until(gone, "the proton threads to end", timeout=5)
