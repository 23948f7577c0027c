"""The SSRF guard of federation links made at run time (docs/FEDERATION.md, "Security"),
with real gateways on 127.0.0.1: such a link may reach only public addresses unless
``federation_allow`` names them, checked when it is made (403 with the reason) and at
every connection it makes (a link kept from a run under another configuration, a name
that resolves elsewhere now); a link of the configuration file reaches loopback.

Every remote that is connected to is a gateway on loopback. The one public address
named (8.8.8.8) is never connected to: its definition is refused for its ``token_url``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from bridges.config import parse
from gateway.admin.bridging import BRIDGES
from tests.app.test_admin_cli import fails, start
from tests.app.test_federation_admin import FEEDS, definition
from tests.conftest import Gateway, MakeGateway
from tests.integration.gw import content_bytes, held, new_pipe, publish, take, until

pytestmark = pytest.mark.timeout(60)

ADMIN = {"feeds": FEEDS, "guest_scopes": "restms:admin"}


def content(value: str) -> dict[str, Any]:
    return {"address": "n", "content": [{"value": value}]}


async def status(gw: Gateway, name: str) -> dict[str, Any]:
    async with gw.http.get(f"/admin/bridges/{name}") as r:
        assert r.status == 200, await r.text()
        return dict(await r.json())


@pytest.mark.parametrize(
    ("more", "reason"),
    [
        ({}, "remote: the remote address is loopback"),
        ({"remote": "http://localhost:9/restms/feed/news"}, "resolves to a loopback address"),
        ({"remote": "http://[::1]:9/restms/feed/news"}, "the remote address is loopback"),
        (
            {"remote": "http://[::ffff:127.0.0.1]:9/restms/feed/news"},
            "loopback (carried in ::ffff:7f00:1)",
        ),
        ({"remote": "http://10.1.2.3/restms/feed/news"}, "the remote address is private"),
        (
            {
                "remote": "http://8.8.8.8/restms/feed/news",
                "token_url": "http://169.254.169.254/latest/meta-data/",
                "client_id": "x",
                "client_secret": "y",
            },
            "token_url: the remote address is link-local",
        ),
    ],
)
async def test_a_run_time_link_to_a_refused_address_is_403_with_the_reason(
    make_gateway: MakeGateway, tmp_path: Path, more: dict[str, Any], reason: str
) -> None:
    a = await make_gateway(data_dir=str(tmp_path / "a"), **ADMIN)
    async with a.http.post("/admin/bridges", json={**definition(a), **more}) as r:
        assert r.status == 403
        assert r.content_type == "text/plain"
        text = await r.text()
    assert reason in text
    assert text.startswith("bridge to-b: ")
    assert text.rstrip().endswith("only public addresses, or those federation_allow names")
    async with a.http.get("/admin/bridges/to-b") as r:
        assert r.status == 404  # nothing was made, nothing kept


async def test_a_name_that_does_not_resolve_yet_is_made_and_checked_when_it_connects(
    make_gateway: MakeGateway, tmp_path: Path
) -> None:
    """Like a remote that is down: the link is made and retries, saying why."""
    a = await make_gateway(data_dir=str(tmp_path / "a"), **ADMIN)
    nowhere = {"remote": "http://does-not-exist.invalid:9/restms/feed/news"}
    async with a.http.post("/admin/bridges", json={**definition(a), **nowhere}) as r:
        assert r.status == 201, await r.text()
    link = a.app[BRIDGES].get("to-b")
    await until(lambda: bool(link.health.last_error), 20, "a connection tried")
    shown = await status(a, "to-b")
    assert shown["state"] == "retrying"
    assert "does-not-exist.invalid" in shown["last_error"]
    assert "cannot connect" in shown["last_error"]


async def test_federation_allow_lets_a_run_time_link_reach_what_it_names(
    make_gateway: MakeGateway, tmp_path: Path
) -> None:
    """A network lets an address literal through, a host name that name (as written,
    whatever it resolves to): both links reach B."""
    b = await make_gateway(feeds=FEEDS, data_dir=str(tmp_path / "b"))
    a = await make_gateway(
        data_dir=str(tmp_path / "a"), federation_allow="127.0.0.0/8, localhost", **ADMIN
    )
    named = {"remote": b.uri("/restms/feed/news").replace("127.0.0.1", "localhost")}
    for link in (definition(b), {**definition(b), "name": "named", **named}):
        async with a.http.post("/admin/bridges", json=link) as r:
            assert r.status == 201, await r.text()
    links = a.app[BRIDGES]
    await until(lambda: all(x.health.state.name == "up" for x in links), 20, "links up")
    await publish(a, "news", content("both"))
    for link in ("to-b", "named"):  # each reached B; B kept one copy (the same message id)
        counters = links.get(link).counters
        await until(lambda c=counters: c.sent + c.remote_duplicates == 1, 20, f"{link} sent")


async def test_a_link_of_the_configuration_file_reaches_loopback(
    make_gateway: MakeGateway, tmp_path: Path
) -> None:
    """No ``federation_allow``: the operator's own links are not guarded."""
    b = await make_gateway(feeds=FEEDS, data_dir=str(tmp_path / "b"))
    a = await make_gateway(
        feeds=FEEDS, data_dir=str(tmp_path / "a"), bridges=(parse(definition(b)),)
    )
    await until(lambda: a.app[BRIDGES].get("to-b").health.state.name == "up", 20, "up")
    on_b = await new_pipe(b, "news", "#")
    await publish(a, "news", content("configured"))
    (got,) = await take(b, on_b, 1)
    assert content_bytes(got) == b"configured"


async def test_the_guard_holds_at_every_connection(
    make_gateway: MakeGateway, tmp_path: Path
) -> None:
    """Links made under ``federation_allow`` and kept (bridges.json) meet a gateway
    restarted without it: the literal is refused as each request starts, the name by
    the resolver when it connects (it resolves to loopback now). Each link retries
    with the reason, nothing reaches B, and allowing loopback again restores both."""
    b = await make_gateway(feeds=FEEDS, data_dir=str(tmp_path / "b"))
    data = str(tmp_path / "a")
    allow = "127.0.0.1 localhost"
    a = await make_gateway(data_dir=data, federation_allow=allow, **ADMIN)
    named = {
        "name": "named",
        "direction": "in",
        "remote": b.uri("/restms/feed/news").replace("127.0.0.1", "localhost"),
    }
    for link in (definition(b), {**definition(b), **named}):
        async with a.http.post("/admin/bridges", json=link) as r:
            assert r.status == 201, await r.text()
    await until(lambda: all(x.health.state.name == "up" for x in a.app[BRIDGES]), 20, "up")
    await a.stop()

    a = await make_gateway(data_dir=data, **ADMIN)
    links = a.app[BRIDGES]
    await until(lambda: all(x.health.last_error for x in links), 20, "both refused")
    literal, name = await status(a, "to-b"), await status(a, "named")
    assert literal["state"] == name["state"] == "retrying"
    assert "cannot connect (the remote address is loopback)" in literal["last_error"]
    assert "resolves only to refused addresses (loopback)" in name["last_error"]
    on_b = await new_pipe(b, "news", "#")
    await publish(a, "news", content("held"))
    await asyncio.sleep(0.5)
    assert links.get("to-b").backlog() == 1  # waits in A's link pipe, not sent
    assert await held(b, on_b) == []
    await a.stop()

    a = await make_gateway(data_dir=data, federation_allow=allow, **ADMIN)
    await until(lambda: all(x.health.state.name == "up" for x in a.app[BRIDGES]), 20, "up")
    (got,) = await take(b, on_b, 1)  # sent once the guard allows it again
    assert content_bytes(got) == b"held"


async def test_the_admin_cli_says_why_a_link_is_refused(
    make_gateway: MakeGateway, tmp_path: Path
) -> None:
    live = await start(make_gateway)
    link = tmp_path / "link.toml"
    await asyncio.to_thread(
        link.write_text,
        '[[bridges]]\nkind = "federation"\nname = "to-meta"\ndirection = "out"\n'
        'feed = "orders"\nremote = "http://169.254.169.254/restms/feed/orders"\n',
    )
    err = await fails(1, " 403 ", "bridges", "add", str(link), **live.env)
    assert "remote: the remote address is link-local" in err
