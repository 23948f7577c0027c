"""Federation links between two gateways served in this process (tests/conftest.py):
each test runs twice, on single gateways and on gateways of three cluster-engine nodes
behind a round-robin proxy (tests/nodes.py), so a link there runs on one node of its
gateway and talks to a remote whose every request goes to the next node.

Only what any node shows is asserted: messages in pipes, the dead-letter feed, the
gateway id every node says.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest

from bridges.config import parse
from feeds.config import FeedConfig
from tests.conftest import Gateway, MakeGateway
from tests.integration.gw import content_bytes, headers_of, new_pipe, publish, take

pytestmark = pytest.mark.nodes

FEEDS = (FeedConfig(name="news", type="topic"), FeedConfig(name="wire", type="topic"))
IDENTITY = "/.well-known/restms-gateway"


def link(name: str, direction: str, to: Gateway, **more: Any) -> Any:
    return parse(
        {
            "kind": "federation",
            "name": name,
            "direction": direction,
            "feed": "news",
            "address": "#",
            "remote": to.uri("/restms/feed/news"),
            "retry_min": 0.1,
            "retry_max": 1.0,
            "wait": 1.0,
            **more,
        }
    )


async def said_id(gw: Gateway) -> str:
    async with gw.http.get(IDENTITY) as r:
        assert r.status == 200, await r.text()
        return str((await r.json())["gateway_id"])


async def test_every_node_says_one_gateway_id_made_once(
    make_gateway: MakeGateway, tmp_path: Path
) -> None:
    gw = await make_gateway(data_dir=str(tmp_path / "g"))
    ids = {await said_id(gw) for _ in range(6)}  # each request to the next node
    assert len(ids) == 1
    (made,) = ids
    assert 8 <= len(made) <= 64
    named = await make_gateway(data_dir=str(tmp_path / "n"), gateway_id="site-n")
    assert await said_id(named) == "site-n"


async def test_push_and_pull_carry_every_message_once_with_its_trail(
    make_gateway: MakeGateway, tmp_path: Path
) -> None:
    b = await make_gateway(feeds=FEEDS, data_dir=str(tmp_path / "b"), gateway_id="site-b")
    # A pushes its news to B's news, and pulls B's wire into its own wire
    pull = link("from-b", "in", b, feed="wire", remote=b.uri("/restms/feed/wire"))
    a = await make_gateway(
        feeds=FEEDS,
        data_dir=str(tmp_path / "a"),
        gateway_id="site-a",
        bridges=(link("to-b", "out", b), pull),
    )
    on_b = await new_pipe(b, "news", "#")
    on_a = await new_pipe(a, "wire", "#")
    binary = base64.b64encode(bytes(range(256))).decode()
    sent = [
        {"address": "n.1", "message_id": "n-1", "content": [{"value": "one"}]},
        {"address": "n.2", "header": [{"name": "lang", "value": "fr"}],
         "content": [{"type": "application/octet-stream", "encoding": "base64", "value": binary}]},
    ]  # fmt: skip
    assert await publish(a, "news", *sent) == [1, 1]  # the link's pipe took each
    got = await take(b, on_b, 2)
    assert [m["address"] for m in got] == ["n.1", "n.2"]
    assert got[0]["message_id"] == "n-1"
    assert got[1]["message_id"].startswith("site-a/news/")  # named at its origin
    assert content_bytes(got[1]) == bytes(range(256))
    assert headers_of(got[1])["lang"] == "fr"
    assert headers_of(got[0])["x-restms-trail"] == "site-a/news"
    await publish(b, "wire", {"address": "w.1", "content": [{"value": "wired"}]})
    pulled = await take(a, on_a, 1)
    assert content_bytes(pulled[0]) == b"wired"
    assert headers_of(pulled[0])["x-restms-trail"] == "site-b/wire"
    assert pulled[0]["message_id"].startswith("site-b/wire/")


async def test_a_message_the_remote_refuses_goes_to_the_dead_letter_feed(
    make_gateway: MakeGateway, tmp_path: Path
) -> None:
    b = await make_gateway(feeds=FEEDS, data_dir=str(tmp_path / "b"), max_body=4096)
    a = await make_gateway(
        feeds=FEEDS, data_dir=str(tmp_path / "a"), bridges=(link("to-b", "out", b),)
    )
    on_b = await new_pipe(b, "news", "#")
    dead = await new_pipe(a, "dead-letter", "")
    messages = [
        {"address": "small.1", "content": [{"value": "fits"}]},
        {"address": "big", "message_id": "too-big", "content": [{"value": "x" * 6000}]},
        {"address": "small.2", "content": [{"value": "fits too"}]},
    ]
    await publish(a, "news", *messages)
    got = await take(b, on_b, 2)
    assert [m["address"] for m in got] == ["small.1", "small.2"]
    letters = await take(a, dead, 1)
    assert letters[0]["message_id"] == "too-big"
    why = headers_of(letters[0])
    assert why["x-bridge"] == "to-b"
    assert "413" in why["x-bridge-error"], why
