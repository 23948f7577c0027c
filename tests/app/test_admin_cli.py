"""The online admin verbs (admincli/commands.py) against a real gateway on 127.0.0.1.

Each verb runs as a user runs it, ``python main.py ...`` in its own process; what it
prints and its exit code are checked, and the gateway's state is checked over HTTP.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import trustme
import yaml

from feeds.config import FeedConfig
from gateway.server.keys import CONFIG
from tests.app.oauth import JSON, As, clients, token
from tests.app.process import ROOT, main_py
from tests.conftest import Gateway, MakeGateway

pytestmark = pytest.mark.app

ISS = "http://gw.test"
SCOPES = {
    "root": "restms:admin",
    "user": "restms:read restms:publish restms:subscribe",
    "other": "restms:read restms:publish restms:subscribe",
}
FEEDS = (FeedConfig(name="orders", type="topic"),)


async def cli(*args: str, **env: str) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of ``python main.py ARGS`` with these variables."""
    return await main_py(*args, env=env)


async def ok(*args: str, **env: str) -> str:
    code, out, err = await cli(*args, **env)
    assert code == 0, err
    assert err == ""
    return out


async def fails(code: int, says: str, *args: str, **env: str) -> str:
    """Run a verb that must exit with ``code``, print nothing on stdout, and say why on
    stderr as ``main.py: ...`` with ``says`` in it; returns that reason."""
    got, out, err = await cli(*args, **env)
    assert (got, out) == (code, ""), err
    assert err.startswith("main.py: ")
    assert says in err
    return err


async def ok_json(*args: str, **env: str) -> Any:
    return json.loads(await ok(*args, "--json", **env))


@dataclass
class Live:
    """A gateway, the CLI's environment for its admin client, and every client's secret."""

    gw: Gateway
    env: dict[str, str]
    secrets: dict[str, str]

    async def client(self, name: str) -> As:
        return As.bearer(self.gw, await token(self.gw, name, self.secrets[name]))


async def start(make_gateway: MakeGateway, **overrides: Any) -> Live:
    """A gateway with an admin client ``root`` and users; the CLI acts as ``root`` (a
    client of the built-in issuer, which the CLI gets a token from)."""
    configured, secrets = await clients(**SCOPES)
    gw = await make_gateway(clients=configured, oauth_issuer=ISS, feeds=FEEDS, **overrides)
    env = {
        "RESTMS_URL": gw.url,
        "RESTMS_CLIENT_ID": "root",
        "RESTMS_CLIENT_SECRET": secrets["root"],
    }
    return Live(gw, env, secrets)


async def make_pipe(who: As, title: str = "work") -> str:
    status, reply, _headers = await who.call(
        "POST", "/restms/domain/default", {"pipe": [{"title": title}]}
    )
    assert status == 201, reply
    return str(reply["restms"]["pipe"][0]["name"])


async def admin(who: As, method: str, path: str) -> tuple[int, Any, Any]:
    """An admin request: (status, parsed JSON or the text/plain reason, headers)."""
    status, reply, headers = await who.call(method, path, Accept="application/json")
    if headers.get("Content-Type", "").startswith("application/json"):
        reply = json.loads(reply)
    return status, reply, headers


def conforms(reply: Any, schema: str) -> None:
    """The reply matches ``schema`` of openapi/openapi.yaml (OpenAPI 3.1: JSON Schema)."""
    spec = yaml.safe_load((ROOT / "openapi" / "openapi.yaml").read_text(encoding="utf-8"))
    document = {"$ref": f"#/components/schemas/{schema}", "components": spec["components"]}
    jsonschema.Draft202012Validator(document).validate(reply)


async def publish(who: As, feed: str, address: str, count: int, persistent: bool) -> None:
    message = {"address": address, "content": [{"type": "text/plain", "value": "x"}]}
    if persistent:
        message["delivery_mode"] = "2"
    status, reply, _ = await who.call(
        "POST", f"/restms/feed/{feed}", {"message": [message] * count}
    )
    assert status == 200, reply


async def test_feeds_add_list_delete(make_gateway: MakeGateway) -> None:
    live = await start(make_gateway)
    gw, env = live.gw, live.env
    out = await ok("feeds", "add", "weather", "--type", "topic", "--title", "Weather", **env)
    assert out == "created feed weather (type topic)\n"
    again = await ok_json("feeds", "add", "weather", "--type", "topic", **env)
    assert again == {"name": "weather", "type": "topic", "created": False}
    async with gw.http.get("/restms/feed/weather", headers={"Accept": JSON}) as r:
        assert r.status == 200
        assert (await r.json())["restms"]["feed"][0]["type"] == "topic"

    table = (await ok("feeds", "list", **env)).splitlines()
    assert table[0].split() == ["NAME", "TYPE", "TITLE"]
    assert ["weather", "topic", "Weather"] in [line.split() for line in table]
    listed = await ok_json("feeds", "list", **env)
    assert {"name": "weather", "type": "topic", "title": "Weather"}.items() <= next(
        f for f in listed if f["name"] == "weather"
    ).items()

    assert await ok("feeds", "delete", "weather", **env) == "deleted feed weather\n"
    async with gw.http.get("/restms/feed/weather") as r:
        assert r.status == 404
    err = await fails(1, "404", "feeds", "delete", "weather", **env)
    assert "weather" in err
    await fails(1, " 400 ", "feeds", "add", "bad name", **env)


async def test_joins_of_own_pipe(make_gateway: MakeGateway) -> None:
    live = await start(make_gateway)
    gw, env = live.gw, live.env
    root = await live.client("root")
    pipe = await make_pipe(root)
    made = await ok_json("joins", "add", pipe, "orders", "--address", "eu.#", **env)
    assert made["feed"] == "orders"
    assert made["address"] == "eu.#"
    assert made["created"] is True
    again = await ok_json("joins", "add", pipe, "orders", "--address", "eu.#", **env)
    assert again == {**made, "created": False}
    status, reply, _ = await root.call("GET", made["uri"])
    assert status == 200
    assert reply["restms"]["join"][0]["address"] == "eu.#"

    table = await ok("joins", "list", f"{gw.url}/restms/resource/{pipe}", **env)
    rows = [line.split() for line in table.splitlines()]
    assert rows[0] == ["JOIN", "FEED", "TYPE", "ADDRESS"]
    assert [made["uri"], "orders", "-", "eu.#"] in rows
    await publish(root, "orders", "eu.paris", 1, persistent=False)
    await publish(root, "orders", "us.nyc", 1, persistent=False)
    status, reply, _ = await root.call("GET", f"/restms/resource/{pipe}")
    assert [m.get("address") for m in reply["restms"]["pipe"][0]["message"]] == ["eu.paris", None]

    assert await ok("joins", "delete", made["uri"], **env) == f"deleted join {made['uri']}\n"
    status, _, _ = await root.call("GET", made["uri"])
    assert status == 404
    joins = await ok_json("joins", "list", pipe, **env)
    assert [j["feed"] for j in joins] == ["default"]  # the pipe's default join stays
    await fails(1, " 400 ", "joins", "add", pipe, "nosuch", **env)


async def test_pipes_list_inspect_purge_survives_restart(make_gateway: MakeGateway) -> None:
    live = await start(make_gateway)
    gw, env = live.gw, live.env
    user = await live.client("user")
    pipe = await make_pipe(user, "orders-eu")
    status, _, _ = await user.call(
        "POST",
        f"/restms/resource/{pipe}",
        {"join": [{"feed": "/restms/feed/orders", "address": "eu.#"}]},
    )
    assert status == 201
    await publish(user, "orders", "eu.x", 3, persistent=True)
    await publish(user, "orders", "eu.y", 2, persistent=False)

    rows = [line.split() for line in (await ok("pipes", "list", **env)).splitlines()]
    assert rows[0] == ["NAME", "TYPE", "DOMAIN", "OWNER", "MESSAGES", "JOINS", "WAITING", "TITLE"]
    assert [pipe, "-", "default", "user", "5", "2", "0", "orders-eu"] in rows
    shown = await ok_json("pipes", "inspect", pipe, **env)
    assert shown["name"] == pipe
    assert shown["owner"] == "user"
    assert shown["messages"] == 5
    assert shown["next"] == 6
    assert shown["oldest"] == 1
    assert {(j["feed"], j["address"]) for j in shown["joined"]} == {
        ("default", pipe),
        ("orders", "eu.#"),
    }

    out = await ok("pipes", "purge", pipe, **env)
    assert out == f"purged 5 messages from pipe {pipe}\n"
    assert (await ok_json("pipes", "inspect", pipe, **env))["messages"] == 0
    await gw.stop()

    live = await start(make_gateway)  # the same data directory
    gw, env = live.gw, live.env
    user = await live.client("user")
    status, reply, _ = await user.call("GET", f"/restms/resource/{pipe}")
    assert status == 200
    messages = reply["restms"]["pipe"][0]["message"]
    assert messages == [{"href": f"{gw.url}/restms/resource/{pipe}.6", "async": "1"}]
    await fails(1, "404 no pipe by that name", "pipes", "purge", "nosuch", **env)


async def test_an_admin_deletes_anyones_pipe_for_good(make_gateway: MakeGateway) -> None:
    """DELETE /admin/pipes/{name} takes another principal's pipe with its joins and
    messages, on disk before the reply; absent pipes are 404 and non-admins 403."""
    live = await start(make_gateway)
    root, user = await live.client("root"), await live.client("user")
    pipe, kept = await make_pipe(user, "doomed"), await make_pipe(user, "kept")
    status, reply, headers = await user.call(
        "POST",
        f"/restms/resource/{pipe}",
        {"join": [{"feed": "/restms/feed/orders", "address": "#"}]},
    )
    assert status == 201, reply
    join = headers["Location"].removeprefix(live.gw.url)  # the port changes on restart
    await publish(user, "orders", "a", 3, persistent=True)

    status, reply, _ = await admin(user, "DELETE", f"/admin/pipes/{pipe}")
    assert status == 403
    assert "restms:admin" in reply
    await user.ok("GET", f"/restms/resource/{pipe}")  # refused: nothing done

    status, reply, headers = await admin(root, "DELETE", f"/admin/pipes/{pipe}")
    assert status == 200, reply
    assert headers["Cache-Control"] == "no-store"
    assert reply == {
        "deleted": pipe,
        "digest": reply["digest"],
        "owner": "user",
        "messages": 3,
        "joins": 2,
    }
    await asyncio.to_thread(conforms, reply, "PipeDeleted")
    for uri in (f"/restms/resource/{pipe}", join, f"/restms/resource/{pipe}.1"):
        status, _, _ = await user.call("GET", uri)
        assert status == 404, uri
    status, reply, headers = await admin(root, "DELETE", f"/admin/pipes/{pipe}")
    assert (status, reply.strip()) == (404, "no pipe by that name")
    assert headers["Content-Type"].startswith("text/plain")
    stats = await ok_json("stats", **live.env)
    assert (stats["pipes"], stats["joins"]) == (1, 1)  # the kept pipe and its default join
    await live.gw.stop()

    live = await start(make_gateway)  # the same data directory
    user = await live.client("user")
    for uri in (f"/restms/resource/{pipe}", join):
        status, _, _ = await user.call("GET", uri)
        assert status == 404, uri
    await user.ok("GET", f"/restms/resource/{kept}")
    stats = await ok_json("stats", **live.env)
    assert (stats["pipes"], stats["joins"], stats["messages"]["on_disk"]) == (1, 1, 0)


async def test_a_pipe_provisioned_for_its_owner(make_gateway: MakeGateway) -> None:
    """POST /admin/pipes?owner=P makes P's pipe from a RestMS pipe document: P reads
    and joins it as its own, after a restart too; another principal does not see it."""
    live = await start(make_gateway)
    root, user, other = [await live.client(n) for n in ("root", "user", "other")]
    document = {"pipe": [{"type": "fifo", "title": "provisioned", "max_messages": "5"}]}
    status, reply, headers = await root.call("POST", "/admin/pipes?owner=user", document)
    assert status == 201, reply
    (made,) = reply["restms"]["pipe"]
    location = headers["Location"]
    name = made["name"]
    assert location == f"{live.gw.url}/restms/resource/{name}"
    assert headers["Cache-Control"] == "no-store"
    assert (made["title"], made["max_messages"]) == ("provisioned", "5")
    shown = await ok_json("pipes", "inspect", name, **live.env)
    assert (shown["owner"], shown["max_messages"]) == ("user", 5)

    status, _, _ = await other.call("GET", location)
    assert status == 404
    await user.ok("POST", location, {"join": [{"feed": "/restms/feed/orders", "address": "#"}]})
    await publish(user, "orders", "eu", 1, persistent=True)
    await live.gw.stop()

    live = await start(make_gateway)  # the same data directory
    user = await live.client("user")
    reply, _ = await user.ok("GET", f"/restms/resource/{name}.1")
    assert reply["restms"]["message"][0]["address"] == "eu"

    root, other = await live.client("root"), await live.client("other")
    refused = [
        ("/admin/pipes?owner=user", {"pipe": [{"type": "nosuch"}]}, 400, "unknown pipe type"),
        ("/admin/pipes", {"pipe": [{}]}, 400, "?owner="),
        ("/admin/pipes?owner=a%20b", {"pipe": [{}]}, 400, "no principal name"),
        ("/admin/pipes?owner=%23bridge/x", {"pipe": [{}]}, 400, "no principal name"),
        ("/admin/pipes?owner=user", {"feed": [{"name": "f"}]}, 400, "makes pipes"),
        ("/admin/pipes?owner=user&domain=nosuch", {"pipe": [{}]}, 404, "'nosuch'"),
    ]
    for path, body, code, says in refused:
        status, reply, headers = await root.call("POST", path, body)
        assert (status, headers["Content-Type"].split(";")[0]) == (code, "text/plain"), path
        assert says in reply, reply
    status, reply, _ = await other.call("POST", "/admin/pipes?owner=other", {"pipe": [{}]})
    assert status == 403
    assert "restms:admin" in reply
    pipes = await ok_json("pipes", "list", **live.env)
    assert [p["owner"] for p in pipes["pipes"]] == ["user"]  # nothing made by a refusal


async def test_a_provisioned_pipe_counts_in_its_owners_quota(make_gateway: MakeGateway) -> None:
    live = await start(make_gateway, max_pipes_per_principal=2)
    root, user = await live.client("root"), await live.client("user")
    await make_pipe(user)
    status, reply, _ = await root.call("POST", "/admin/pipes?owner=user", {"pipe": [{}]})
    assert status == 201, reply
    status, reply, _ = await root.call("POST", "/admin/pipes?owner=user", {"pipe": [{}]})
    assert status == 403
    assert reply.strip() == "pipe quota reached: 'user' owns 2 pipes, the most allowed"
    status, reply, _ = await user.call("POST", "/restms/domain/default", {"pipe": [{}]})
    assert status == 403  # the owner's own create counts the provisioned pipe too
    await root.ok("POST", "/restms/domain/default", {"pipe": [{}]})  # root's quota is its own


async def test_pipes_create_and_delete_verbs(make_gateway: MakeGateway) -> None:
    live = await start(make_gateway)
    env = live.env
    out = await ok("pipes", "create", "--owner", "user", "--title", "work", **env)
    words = out.split()
    assert words[:2] + words[3:] == ["created", "pipe", "for", "user", "(type", "fifo)"]
    name = words[2]
    user = await live.client("user")
    reply, _ = await user.ok("GET", f"/restms/resource/{name}")
    assert reply["restms"]["pipe"][0]["title"] == "work"
    made = await ok_json("pipes", "create", "--owner", "other", "--type", "ondemand", **env)
    assert (made["owner"], made["type"]) == ("other", "ondemand")
    assert made["uri"] == f"{live.gw.url}/restms/resource/{made['name']}"

    out = await ok("pipes", "delete", name, **env)
    assert out == f"deleted pipe {name} of user: 0 messages, 1 joins\n"
    status, _, _ = await user.call("GET", f"/restms/resource/{name}")
    assert status == 404
    gone = await ok_json("pipes", "delete", made["uri"], **env)
    assert (gone["deleted"], gone["owner"], gone["joins"]) == (made["name"], "other", 0)

    await fails(1, "404 no pipe by that name", "pipes", "delete", name, **env)
    await fails(1, " 400 ", "pipes", "create", "--owner", "a b", **env)
    await fails(
        1,
        "unknown pipe type 'nosuch'",
        "pipes",
        "create",
        "--owner",
        "u",
        "--type",
        "nosuch",
        **env,
    )
    code, out, err = await cli("pipes", "create", **env)
    assert (code, out) == (2, "")
    assert "the following arguments are required: --owner" in err
    user_token = await token(live.gw, "user", live.secrets["user"])
    await fails(1, " 403 ", "pipes", "delete", name, "--token", user_token, RESTMS_URL=live.gw.url)


async def test_pipe_names_only_to_gateway_admins(make_gateway: MakeGateway) -> None:
    configured, secrets = await clients(
        root="restms:admin",
        tenant="restms:admin:domain/default",
        feeds="restms:admin:feed/orders",
    )
    gw = await make_gateway(clients=configured, oauth_issuer=ISS, feeds=FEEDS)
    who = {name: As.bearer(gw, await token(gw, name, secret)) for name, secret in secrets.items()}
    pipe = await make_pipe(who["root"])
    status, reply, _ = await admin(who["tenant"], "GET", "/admin/pipes")
    assert status == 200
    (entry,) = reply["pipes"]
    assert "name" not in entry
    assert len(entry["digest"]) == 12
    assert entry["title"] == "work"
    status, reply, _ = await admin(who["tenant"], "GET", f"/admin/pipes/{pipe}")
    assert status == 200
    assert reply["name"] == pipe
    status, reply, _ = await admin(who["feeds"], "GET", "/admin/pipes")
    assert (status, reply) == (200, {"pipes": []})
    for path in (f"/admin/pipes/{pipe}/messages", f"/admin/pipes/{pipe}"):
        status, reply, _ = await admin(who["feeds"], "DELETE", path)
        assert status == 404
    status, reply, _ = await who["feeds"].call("POST", "/admin/pipes?owner=x", {"pipe": [{}]})
    assert status == 404  # the default domain is not the feed admin's
    status, reply, _ = await who["tenant"].call("POST", "/admin/pipes?owner=x", {"pipe": [{}]})
    assert status == 201
    for path in ("/admin/stats", "/admin/clients"):
        status, reply, headers = await who["tenant"].call("GET", path)
        assert status == 403
        assert "unqualified restms:admin" in reply
        assert 'scope="restms:admin"' in headers["WWW-Authenticate"]


async def test_clients_add_list_revoke(make_gateway: MakeGateway) -> None:
    live = await start(make_gateway)
    gw, env = live.gw, live.env
    out = await ok("clients", "add", "worker", "--scopes", "restms:read restms:subscribe", **env)
    lines = out.splitlines()
    assert lines[0] == "client_id: worker"
    secret = lines[1].removeprefix("client_secret: ")
    worker = As.bearer(gw, await token(gw, "worker", secret))
    status, _, _ = await worker.call("GET", "/restms/domain/default")
    assert status == 200

    listed = await ok_json("clients", "list", **env)
    assert {"client_id": "worker", "scopes": ["restms:read", "restms:subscribe"]}.items() <= next(
        c for c in listed["clients"] if c["client_id"] == "worker"
    ).items()
    assert secret not in json.dumps(listed)
    assert "scrypt" not in json.dumps(listed)
    rows = [line.split() for line in (await ok("clients", "list", **env)).splitlines()]
    assert ["root", "yes", "restms:admin"] in rows
    assert ["worker", "no", "restms:read", "restms:subscribe"] in rows

    out = await ok("clients", "revoke", "worker", **env)
    assert out == "revoked client worker: removed, and its tokens are refused\n"
    status, reply, headers = await worker.call("GET", "/restms/domain/default")
    assert status == 401
    assert "revoked" in reply
    assert 'error="invalid_token"' in headers["WWW-Authenticate"]
    await fails(1, "404 no client 'worker'", "clients", "revoke", "worker", **env)
    err = await fails(1, " 403 ", "clients", "revoke", "root", **env)
    assert "configuration file" in err
    await fails(1, " 409 ", "clients", "add", "root", "--scopes", "restms:read", **env)
    await gw.stop()

    live = await start(make_gateway)  # the list is on disk: the token stays refused
    status, _, _ = await As(live.gw, worker.auth).call("GET", "/restms/domain/default")
    assert status == 401


async def test_bridges_from_a_toml_file(make_gateway: MakeGateway, tmp_path: Path) -> None:
    live = await start(make_gateway, bridge_allow="127.0.0.1")  # a run-time bridge's broker
    env = live.env
    definition = tmp_path / "out.toml"
    await asyncio.to_thread(
        definition.write_text,
        '[[bridges]]\nname = "orders-out"\ndirection = "out"\nfeed = "orders"\naddress = "#"\n'
        'urls = ["amqp://127.0.0.1:1"]\ntarget = "/exchange/amq.topic/{address}"\n',
    )
    out = await ok("bridges", "add", str(definition), **env)
    assert out.startswith("bridge orders-out: ")
    root = await live.client("root")
    status, reply, _ = await admin(root, "GET", "/admin/bridges/orders-out")
    assert status == 200
    assert reply["definition"]["address"] == "#"
    rows = [line.split() for line in (await ok("bridges", "list", **env)).splitlines()]
    assert rows[0][:5] == ["NAME", "KIND", "DIRECTION", "FEED", "STATE"]
    assert rows[1][:4] == ["orders-out", "amqp", "out", "orders"]
    status = await ok_json("bridges", "status", "orders-out", **env)
    assert status["definition"]["target"] == "/exchange/amq.topic/{address}"
    assert "counters.connects" in await ok("bridges", "status", "orders-out", **env)

    await publish(root, "orders", "eu.x", 1, persistent=True)
    err = await fails(1, " 409 ", "bridges", "delete", "orders-out", **env)
    assert "?discard=true" in err
    out = await ok("bridges", "delete", "orders-out", "--discard", **env)
    assert out == "deleted bridge orders-out; 1 waiting messages discarded\n"
    assert (await ok_json("bridges", "list", **env)) == {"bridges": []}

    bad = tmp_path / "bad.json"
    text = '{"name": "x", "direction": "out", "feed": "orders", "urls": ["amqp://h"]}'
    await asyncio.to_thread(bad.write_text, text)
    await fails(1, "needs a target", "bridges", "add", str(bad), **env)
    meta = tmp_path / "meta.json"  # bridge_allow names loopback, not the metadata address
    text = text.replace("amqp://h", "amqp://169.254.169.254").replace("}", ', "target": "/q"}')
    await asyncio.to_thread(meta.write_text, text)
    err = await fails(1, " 403 ", "bridges", "add", str(meta), **env)
    assert "urls: amqp://169.254.169.254: the peer address is link-local" in err
    await fails(2, "cannot read", "bridges", "add", str(tmp_path / "absent.toml"), **env)


async def test_a_federation_link_from_a_toml_file(
    make_gateway: MakeGateway, tmp_path: Path
) -> None:
    """docs/FEDERATION.md: a link is added, shown and deleted like any bridge; here one
    that pushes the gateway's orders to a gateway nobody runs (it waits, retrying), on
    loopback, which a link made at run time reaches only with federation_allow."""
    live = await start(make_gateway, federation_allow="127.0.0.0/8")
    definition = tmp_path / "link.toml"
    await asyncio.to_thread(
        definition.write_text,
        '[[bridges]]\nkind = "federation"\nname = "to-far"\ndirection = "out"\n'
        'feed = "orders"\naddress = "#"\nremote = "http://127.0.0.1:9/restms/feed/orders"\n'
        'bearer = "kept-secret"\n',
    )
    out = await ok("bridges", "add", str(definition), **live.env)
    assert out.startswith("bridge to-far: ")
    rows = [line.split() for line in (await ok("bridges", "list", **live.env)).splitlines()]
    assert rows[1][:4] == ["to-far", "federation", "out", "orders"]
    status = await ok_json("bridges", "status", "to-far", **live.env)
    assert status["definition"]["bearer"] == "***"
    assert "kept-secret" not in await ok("bridges", "status", "to-far", **live.env)
    out = await ok("bridges", "delete", "to-far", **live.env)
    assert out == "deleted bridge to-far; 0 waiting messages discarded\n"


async def test_stats_and_failures(make_gateway: MakeGateway) -> None:
    live = await start(make_gateway)
    gw, env = live.gw, live.env
    user = await live.client("user")
    pipe = await make_pipe(user)
    await user.call(
        "POST",
        f"/restms/resource/{pipe}",
        {"join": [{"feed": "/restms/feed/orders", "address": "#"}]},
    )
    await publish(user, "orders", "a", 4, persistent=False)
    stats = await ok_json("stats", **env)
    assert stats["pipes"] == 1
    assert stats["joins"] == 2
    assert stats["messages"] == {"in_memory": 4, "on_disk": 0, "queued": 0}
    assert stats["counters"]["published"] == 4
    assert stats["store"] == "sqlite"
    assert stats["bridges"]["total"] == 0
    text = await ok("stats", **env)
    assert "messages.in_memory" in text
    assert "counters.published" in text

    user_token = await token(gw, "user", live.secrets["user"])
    err = await fails(1, " 403 ", "stats", "--token", user_token, RESTMS_URL=gw.url)
    assert user_token not in err
    err = await fails(
        1, "invalid_client", "stats", **{**env, "RESTMS_CLIENT_SECRET": "s3cr3t-guess"}
    )
    assert "s3cr3t-guess" not in err
    await fails(3, "127.0.0.1:1", "stats", "--url", "http://127.0.0.1:1", "--token", "t")
    await fails(2, "http://", "stats", "--url", "ftp://x", "--token", "t")


async def test_admin_replies_match_the_openapi_schemas(make_gateway: MakeGateway) -> None:
    live = await start(make_gateway)
    root, user = await live.client("root"), await live.client("user")
    pipe = await make_pipe(user)
    await publish(user, "orders", "a", 2, persistent=True)
    replies = {
        "PipeList": await admin(root, "GET", "/admin/pipes"),
        "PipeDetail": await admin(root, "GET", f"/admin/pipes/{pipe}"),
        "GatewayStats": await admin(root, "GET", "/admin/stats"),
        "ClientList": await admin(root, "GET", "/admin/clients"),
        "PipePurged": await admin(root, "DELETE", f"/admin/pipes/{pipe}/messages"),
    }
    for schema, (status, reply, headers) in replies.items():
        assert status == 200, (schema, reply)
        assert headers["Cache-Control"] == "no-store"
        await asyncio.to_thread(conforms, reply, schema)
    added = {"client_id": "w", "scopes": ["restms:read"]}
    async with live.gw.http.post("/admin/clients", json=added, headers=root.auth) as r:
        assert r.status == 201
        assert r.headers["Location"] == f"{live.gw.url}/admin/clients/w"
        await asyncio.to_thread(conforms, await r.json(), "ClientCreated")
    async with live.gw.http.delete("/admin/clients/w", headers=root.auth) as r:
        assert r.status == 200
        await asyncio.to_thread(conforms, await r.json(), "ClientRevoked")
    for body in ({"client_id": "w"}, {**added, "x": 1}, {**added, "scopes": ["a b"]}, []):
        async with live.gw.http.post("/admin/clients", json=body, headers=root.auth) as r:
            assert r.status == 400
            assert r.content_type == "text/plain"


async def test_a_revocation_that_cannot_be_recorded_changes_nothing(
    make_gateway: MakeGateway,
) -> None:
    live = await start(make_gateway)
    root = await live.client("root")
    added = {"client_id": "w", "scopes": ["restms:read"]}
    async with live.gw.http.post("/admin/clients", json=added, headers=root.auth) as r:
        assert r.status == 201
        secret = (await r.json())["client_secret"]
    worker = As.bearer(live.gw, await token(live.gw, "w", secret))
    blocker = Path(live.gw.app[CONFIG].data_dir, "oauth", "revoked.json")
    await asyncio.to_thread(blocker.mkdir)  # the list cannot be written over a directory
    async with live.gw.http.delete("/admin/clients/w", headers=root.auth) as r:
        assert r.status == 503
        assert r.headers["Retry-After"] == "5"
        assert "cannot be written" in await r.text()
    status, reply, _ = await admin(root, "GET", "/admin/clients")
    assert "w" in [c["client_id"] for c in reply["clients"]]
    status, _, _ = await worker.call("GET", "/restms/domain/default")
    assert status == 200
    await asyncio.to_thread(blocker.rmdir)
    assert await ok("clients", "revoke", "w", **live.env)
    status, _, _ = await worker.call("GET", "/restms/domain/default")
    assert status == 401


async def test_https_with_a_private_ca(make_gateway: MakeGateway, tmp_path: Path) -> None:
    """``--cacert`` verifies an https:// gateway against the operator's CA; without it
    the system's CAs do not know the certificate and nothing is sent (exit 3)."""
    ca = trustme.CA()
    leaf = ca.issue_cert("127.0.0.1")
    cert, key, bundle = tmp_path / "server.pem", tmp_path / "server.key", tmp_path / "ca.pem"

    def write() -> ssl.SSLContext:
        for blob in leaf.cert_chain_pems:
            blob.write_to_path(cert, append=True)
        leaf.private_key_pem.write_to_path(key)
        ca.cert_pem.write_to_path(bundle)
        trusting = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ca.configure_trust(trusting)
        return trusting

    trusting = await asyncio.to_thread(write)
    configured, secrets = await clients(root="restms:admin")
    gw = await make_gateway(
        clients=configured,
        oauth_issuer=ISS,
        tls_cert=str(cert),
        tls_key=str(key),
        client_ssl=trusting,
    )
    env = {"RESTMS_URL": gw.url, "RESTMS_CLIENT_ID": "root"}
    env["RESTMS_CLIENT_SECRET"] = secrets["root"]
    assert gw.url.startswith("https://")
    stats = await ok_json("stats", "--cacert", str(bundle), **env)
    assert stats["store"] == "sqlite"
    await fails(3, "CERTIFICATE_VERIFY_FAILED", "stats", **env)
