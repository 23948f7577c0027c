"""Delivery over HTTP: asynclets (A1-A9), messages and contents (D1-D9), pipe types (P1-P8).

Every test talks to a real gateway on 127.0.0.1 with plain HTTP requests, mostly in
RestMS JSON (J1-J3), because its shape is easy to compare. Requests that must be
answered at once run under a short ``asyncio.timeout`` so a server that blocks
instead fails fast rather than waiting for ``max_wait``.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from tests.app.gauges import until_waiting
from tests.app.jsonapi import AJ, DOMAIN, JSON, delete, get, join, new_pipe, post, publish
from tests.conftest import Gateway, MakeGateway

XML = "application/restms+xml"
DEFAULT_FEED = "/restms/feed/default"
AT_ONCE = 1.0  # seconds: an answer that must not block gets this long


# ---------------------------------------------------------------- helpers


@pytest.fixture
async def gw(make_gateway: MakeGateway) -> Gateway:
    """The default configuration, with /metrics open to this host: a test waits on
    ``restms_waiting_requests`` to know a GET reached the server and waits there."""
    return await make_gateway(metrics_access="loopback")


async def new_feed(gw: Gateway, name: str, kind: str = "") -> str:
    status, reply, location = await post(gw, DOMAIN, feed=[{"name": name, "type": kind}])
    assert status in (200, 201), reply
    return location


async def listing(gw: Gateway, pipe: dict[str, Any]) -> list[dict[str, Any]]:
    status, reply = await get(gw, pipe["uri"])
    assert status == 200, reply
    return list(reply["restms"]["pipe"][0].get("message", []))


def held(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [m for m in items if m.get("async") != "1"]


def asynclets(items: list[dict[str, Any]]) -> list[str]:
    return [m["href"] for m in items if m.get("async") == "1"]


async def asynclet(gw: Gateway, pipe: dict[str, Any]) -> str:
    (href,) = asynclets(await listing(gw, pipe))
    return href


def beyond(href: str, step: int) -> str:
    """The URI of a later position than ``href``.

    Message URIs are opaque to clients (A3); this gateway spells them
    ``{pipe}.{position}``, which the first assertion pins down, so a test can name
    a position the server never issued.
    """
    head, _, seq = href.rpartition(".")
    assert seq.isdigit(), href
    return f"{head}.{int(seq) + step}"


def text(address: str, value: str) -> dict[str, Any]:
    return {"address": address, "content": [{"type": "text/plain", "value": value}]}


async def message(gw: Gateway, href: str) -> dict[str, Any]:
    async with asyncio.timeout(AT_ONCE):
        status, reply = await get(gw, href)
    assert status == 200, reply
    return dict(reply["restms"]["message"][0])


def value(msg: dict[str, Any]) -> str:
    return str(msg["content"][0]["value"])


# ---------------------------------------------------------------- A1-A9: asynclets
async def test_A1_new_pipe_lists_exactly_one_asynclet(gw: Gateway) -> None:
    pipe = await new_pipe(gw)
    assert len(pipe["message"]) == 1
    assert pipe["message"][0]["async"] == "1"
    assert asynclets(await listing(gw, pipe)) == [pipe["message"][0]["href"]]


async def test_A1_asynclet_is_listed_once_after_the_held_messages(gw: Gateway) -> None:
    pipe = await new_pipe(gw)
    assert await publish(gw, DEFAULT_FEED, text(pipe["name"], "a"), text(pipe["name"], "b")) == [
        1,
        1,
    ]
    items = await listing(gw, pipe)
    assert len(items) == 3
    assert [m.get("async") for m in items] == [None, None, "1"]
    assert len(set(asynclets(items))) == 1
    assert len({m["href"] for m in items}) == 3


async def test_A2_A3_get_on_asynclet_waits_and_wakes_on_publish(gw: Gateway) -> None:
    pipe = await new_pipe(gw)
    href = pipe["message"][0]["href"]
    waiter = asyncio.create_task(get(gw, href))
    await until_waiting(gw, "asynclet", 1)
    assert not waiter.done()  # nothing published yet: the GET waits
    assert await publish(gw, DEFAULT_FEED, text(pipe["name"], "wake")) == [1]
    async with asyncio.timeout(AT_ONCE):
        status, reply = await waiter
    assert status == 200
    assert value(reply["restms"]["message"][0]) == "wake"
    # A3: the message took exactly the asynclet's URI; a new asynclet follows it.
    items = await listing(gw, pipe)
    assert [m["href"] for m in held(items)] == [href]
    assert asynclets(items) != [href]


async def test_A2_filled_asynclet_answers_at_once(gw: Gateway) -> None:
    pipe = await new_pipe(gw)
    href = pipe["message"][0]["href"]
    await publish(gw, DEFAULT_FEED, text(pipe["name"], "ready"))
    assert value(await message(gw, href)) == "ready"


async def test_A4_asynclet_from_creation_reply_stays_valid(gw: Gateway) -> None:
    pipe = await new_pipe(gw)
    first = pipe["message"][0]["href"]
    await publish(gw, DEFAULT_FEED, text(pipe["name"], "one"), text(pipe["name"], "two"))
    await publish(gw, DEFAULT_FEED, text(pipe["name"], "three"))
    assert value(await message(gw, first)) == "one"
    # Reusing an older listing's asynclet once its messages are worked through.
    old = await listing(gw, pipe)
    (old_asynclet,) = asynclets(old)
    for item in held(old):
        assert await delete(gw, item["href"]) == 200
    waiter = asyncio.create_task(get(gw, old_asynclet))
    await until_waiting(gw, "asynclet", 1)
    await publish(gw, DEFAULT_FEED, text(pipe["name"], "four"))
    async with asyncio.timeout(AT_ONCE):
        status, reply = await waiter
    assert status == 200
    assert value(reply["restms"]["message"][0]) == "four"


async def test_A5_every_waiter_on_the_asynclet_gets_the_message(gw: Gateway) -> None:
    pipe = await new_pipe(gw)
    href = pipe["message"][0]["href"]
    waiters = [asyncio.create_task(get(gw, href)) for _ in range(4)]
    await until_waiting(gw, "asynclet", 4)
    assert not any(w.done() for w in waiters)
    await publish(gw, DEFAULT_FEED, text(pipe["name"], "all"))
    async with asyncio.timeout(AT_ONCE):
        replies = await asyncio.gather(*waiters)
    assert [status for status, _ in replies] == [200] * 4
    assert {value(reply["restms"]["message"][0]) for _, reply in replies} == {"all"}


@pytest.mark.parametrize("step", [1, 2, 1000])
async def test_A5_get_beyond_the_asynclet_is_404_at_once(gw: Gateway, step: int) -> None:
    pipe = await new_pipe(gw)
    await publish(gw, DEFAULT_FEED, text(pipe["name"], "x"))
    href = await asynclet(gw, pipe)
    started = time.monotonic()
    async with asyncio.timeout(AT_ONCE):
        status, _ = await get(gw, beyond(href, step))
    assert status == 404
    assert time.monotonic() - started < AT_ONCE
    # The real asynclet is unaffected and still works.
    await publish(gw, DEFAULT_FEED, text(pipe["name"], "y"))
    assert value(await message(gw, href)) == "y"


async def test_A5_position_never_issued_before_the_first_is_404(gw: Gateway) -> None:
    pipe = await new_pipe(gw)
    async with asyncio.timeout(AT_ONCE):
        status, _ = await get(gw, beyond(pipe["message"][0]["href"], -1))
    assert status == 404


async def test_A6_deleting_the_pipe_answers_waiters_404(gw: Gateway) -> None:
    pipe = await new_pipe(gw)
    href = pipe["message"][0]["href"]
    waiters = [asyncio.create_task(get(gw, href)) for _ in range(2)]
    await until_waiting(gw, "asynclet", 2)
    assert not any(w.done() for w in waiters)
    assert await delete(gw, pipe["uri"]) == 200
    async with asyncio.timeout(AT_ONCE):
        replies = await asyncio.gather(*waiters)
    assert [status for status, _ in replies] == [404, 404]


async def test_A6_client_that_disconnects_leaves_the_asynclet_working(gw: Gateway) -> None:
    pipe = await new_pipe(gw)
    href = pipe["message"][0]["href"]
    gone = asyncio.create_task(get(gw, href))
    await until_waiting(gw, "asynclet", 1)
    gone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gone
    await until_waiting(gw, "asynclet", 0)  # the server saw the client go
    await publish(gw, DEFAULT_FEED, text(pipe["name"], "still"))
    assert value(await message(gw, href)) == "still"


async def test_A7_delete_on_pending_asynclet_is_a_no_op(gw: Gateway) -> None:
    pipe = await new_pipe(gw)
    await publish(gw, DEFAULT_FEED, text(pipe["name"], "a"), text(pipe["name"], "b"))
    before = await listing(gw, pipe)
    (href,) = asynclets(before)
    assert await delete(gw, href) == 200
    after = await listing(gw, pipe)
    assert after == before  # nothing older went, the asynclet is the same
    for item in held(before):
        await message(gw, item["href"])
    await publish(gw, DEFAULT_FEED, text(pipe["name"], "c"))
    assert value(await message(gw, href)) == "c"


async def test_A8_capped_listing_leaves_the_asynclet_out(make_gateway: MakeGateway) -> None:
    gw = await make_gateway(listing_cap=3)
    pipe = await new_pipe(gw)
    name = pipe["name"]
    await publish(gw, DEFAULT_FEED, *(text(name, str(i)) for i in range(3)))
    items = await listing(gw, pipe)
    assert len(held(items)) == 3
    assert len(asynclets(items)) == 1  # exactly at the cap: all listed, asynclet too
    await publish(gw, DEFAULT_FEED, text(name, "3"))
    items = await listing(gw, pipe)
    assert len(items) == 3
    assert asynclets(items) == []
    assert [value(await message(gw, m["href"])) for m in items] == ["0", "1", "2"]
    # Working through the listing and reading the pipe again reveals the rest.
    assert await delete(gw, items[-1]["href"]) == 200
    items = await listing(gw, pipe)
    assert len(held(items)) == 1
    assert value(await message(gw, held(items)[0]["href"])) == "3"
    assert len(asynclets(items)) == 1


@pytest.mark.parametrize(("status", "overrides"), [(503, {}), (500, {"expired_wait_status": 500})])
async def test_A9_expired_asynclet_wait(
    make_gateway: MakeGateway, status: int, overrides: dict[str, Any]
) -> None:
    gw = await make_gateway(max_wait=0.3, **overrides)
    pipe = await new_pipe(gw)
    href = pipe["message"][0]["href"]
    started = time.monotonic()
    async with asyncio.timeout(3), gw.http.get(href, headers=AJ) as r:
        assert r.status == status
        assert r.content_type == "text/plain"
        assert (await r.text()).strip() == "asynclet wait expired, retry"
        if status == 503:
            assert r.headers["Retry-After"] == "0"
    assert 0.25 <= time.monotonic() - started < 2.5
    # The asynclet is still the same one: a retry after a publish gets the message.
    await publish(gw, DEFAULT_FEED, text(pipe["name"], "late"))
    assert value(await message(gw, href)) == "late"


async def test_U11_A2_head_on_pending_asynclet_is_404_at_once(gw: Gateway) -> None:
    pipe = await new_pipe(gw)
    href = pipe["message"][0]["href"]
    async with asyncio.timeout(AT_ONCE), gw.http.head(href, headers=AJ) as r:
        assert r.status == 404
    await publish(gw, DEFAULT_FEED, text(pipe["name"], "h"))
    async with asyncio.timeout(AT_ONCE), gw.http.head(href, headers=AJ) as r:
        assert r.status == 200
        assert r.content_type == JSON
        assert await r.read() == b""


# ---------------------------------------------------------------- D1-D9: messages, contents
AMQP9_PROPERTIES = {
    "message_id": "inv-2231",
    "reply_to": "reply-pipe",
    "correlation_id": "corr-7",
    "delivery_mode": "2",
    "priority": "5",
    "expiration": "600000",
    "timestamp": "Tue, 15 Nov 1994 08:12:31 GMT",
    "type": "invoice",
    "user_id": "guest",
    "app_id": "billing",
    "sender_id": "eu-node-3",
}


@pytest.mark.parametrize("fmt", ["json", "xml"])
async def test_D1_message_round_trips_every_property_and_header(gw: Gateway, fmt: str) -> None:
    pipe = await new_pipe(gw)
    headers = [
        {"name": "region", "value": "eu"},
        {"name": "Tier", "value": "gold & <silver>"},
        {"name": "empty", "value": ""},
    ]
    content = {"type": "text/plain", "encoding": "plain", "value": 'say "hi" & <bye>'}
    sent = {"address": pipe["name"], **AMQP9_PROPERTIES, "header": headers, "content": [content]}
    if fmt == "json":
        assert await publish(gw, DEFAULT_FEED, sent) == [1]
    else:
        from lxml import etree

        root = etree.Element("restms", nsmap={None: "http://www.restms.org/schema/restms"})
        el = etree.SubElement(root, "message", address=pipe["name"], **AMQP9_PROPERTIES)
        for h in headers:
            etree.SubElement(el, "header", name=h["name"], value=h["value"])
        c = etree.SubElement(el, "content", type="text/plain", encoding="plain")
        c.text = content["value"]
        async with gw.http.post(
            DEFAULT_FEED, data=etree.tostring(root), headers={"Content-Type": XML}
        ) as r:
            assert r.status == 200, await r.text()
    got = await message(gw, pipe["message"][0]["href"])
    for key, expected in {"address": pipe["name"], **AMQP9_PROPERTIES}.items():
        assert got[key] == expected, key
    assert got["header"] == headers
    assert got["content"] == [content]


async def test_D1_base64_content_round_trips(gw: Gateway) -> None:
    pipe = await new_pipe(gw)
    sent = {"type": "image/png", "encoding": "base64", "value": "AAEC/f7/"}
    await publish(gw, DEFAULT_FEED, {"address": pipe["name"], "content": [sent]})
    got = await message(gw, pipe["message"][0]["href"])
    assert got["content"] == [sent]


async def test_D1_D9_several_messages_in_one_post_are_routed_in_order(gw: Gateway) -> None:
    pipe = await new_pipe(gw)
    name = pipe["name"]
    sent = [{"address": name, "message_id": f"m{i}"} for i in range(5)]
    assert await publish(gw, DEFAULT_FEED, *sent) == [1] * 5
    items = held(await listing(gw, pipe))
    assert [m["message_id"] for m in items] == [f"m{i}" for i in range(5)]
    assert [(await message(gw, m["href"]))["message_id"] for m in items] == [
        f"m{i}" for i in range(5)
    ]


async def stage(gw: Gateway, feed: str, data: bytes, content_type: str) -> str:
    async with gw.http.post(feed, data=data, headers={"Content-Type": content_type}) as r:
        assert r.status == 201, await r.text()
        return r.headers["Location"]


async def test_D2_staged_content_is_delivered_with_exact_bytes_and_type(gw: Gateway) -> None:
    pipe = await new_pipe(gw)
    data = bytes(range(256)) * 3
    staged = await stage(gw, DEFAULT_FEED, data, "application/x-blob; v=2")
    assert await publish(gw, DEFAULT_FEED, {"address": pipe["name"], "content": [{"href": staged}]})
    got = await message(gw, pipe["message"][0]["href"])
    (content,) = got["content"]
    assert content["href"] != staged  # a per-pipe content URI (D6)
    assert content["type"] == "application/x-blob; v=2"
    async with gw.http.get(content["href"]) as r:
        assert r.status == 200
        assert r.headers["Content-Type"] == "application/x-blob; v=2"
        assert await r.read() == data


async def test_D2_untyped_staged_content_is_delivered_as_octet_stream(gw: Gateway) -> None:
    pipe = await new_pipe(gw)
    staged = await stage(gw, DEFAULT_FEED, b"\x00\x01raw", "")
    await publish(gw, DEFAULT_FEED, {"address": pipe["name"], "content": [{"href": staged}]})
    (content,) = (await message(gw, pipe["message"][0]["href"]))["content"]
    async with gw.http.get(content["href"]) as r:
        assert r.status == 200
        assert r.headers["Content-Type"] == "application/octet-stream"
        assert await r.read() == b"\x00\x01raw"


async def test_D5_D6_legacy_order_delete_content_then_message(gw: Gateway) -> None:
    pipe = await new_pipe(gw)
    staged = await stage(gw, DEFAULT_FEED, b"payload", "text/csv")
    await publish(
        gw,
        DEFAULT_FEED,
        {"address": pipe["name"], "message_id": "m1", "content": [{"href": staged}]},
    )
    href = pipe["message"][0]["href"]
    (content,) = (await message(gw, href))["content"]
    assert await delete(gw, content["href"]) == 200
    async with gw.http.get(content["href"]) as r:
        assert r.status == 404
    # D6: the deleted content is dropped from the message document.
    got = await message(gw, href)
    assert got["message_id"] == "m1"
    assert got.get("content", []) == []
    assert await delete(gw, href) == 200
    assert (await get(gw, href))[0] == 404
    # D5: deleting again is still fine.
    assert await delete(gw, href) == 200
    assert await delete(gw, content["href"]) == 200


async def test_D5_deleting_a_message_removes_its_contents(gw: Gateway) -> None:
    pipe = await new_pipe(gw)
    staged = await stage(gw, DEFAULT_FEED, b"gone soon", "text/plain")
    await publish(gw, DEFAULT_FEED, {"address": pipe["name"], "content": [{"href": staged}]})
    href = pipe["message"][0]["href"]
    (content,) = (await message(gw, href))["content"]
    assert await delete(gw, href) == 200
    async with gw.http.get(content["href"]) as r:
        assert r.status == 404


async def test_D6_fanout_copies_have_their_own_content_uris(gw: Gateway) -> None:
    feed = await new_feed(gw, "d6-fanout", "fanout")
    pipes = [await new_pipe(gw), await new_pipe(gw)]
    for pipe in pipes:
        await join(gw, pipe, feed)
    staged = await stage(gw, feed, b"shared bytes", "application/x-shared")
    assert await publish(gw, feed, {"content": [{"href": staged}]}) == [2]
    contents = []
    for pipe in pipes:
        (content,) = (await message(gw, pipe["message"][0]["href"]))["content"]
        contents.append(content["href"])
    assert contents[0] != contents[1]
    assert await delete(gw, contents[0]) == 200
    async with gw.http.get(contents[0]) as r:
        assert r.status == 404
    async with gw.http.get(contents[1]) as r:
        assert r.status == 200
        assert r.headers["Content-Type"] == "application/x-shared"
        assert await r.read() == b"shared bytes"
    # Deleting the first pipe's message does not touch the second copy either.
    assert await delete(gw, pipes[0]["message"][0]["href"]) == 200
    async with gw.http.get(contents[1]) as r:
        assert r.status == 200


async def test_D4_delete_removes_the_message_and_all_older(gw: Gateway) -> None:
    pipe = await new_pipe(gw)
    name = pipe["name"]
    await publish(gw, DEFAULT_FEED, *(text(name, str(i)) for i in range(4)))
    items = held(await listing(gw, pipe))
    assert await delete(gw, items[2]["href"]) == 200
    for item in items[:3]:
        assert (await get(gw, item["href"]))[0] == 404
    remaining = await listing(gw, pipe)
    assert [m["href"] for m in held(remaining)] == [items[3]["href"]]
    assert len(asynclets(remaining)) == 1
    assert value(await message(gw, items[3]["href"])) == "3"


async def test_D4_deleting_an_older_message_keeps_newer_ones(gw: Gateway) -> None:
    pipe = await new_pipe(gw)
    name = pipe["name"]
    await publish(gw, DEFAULT_FEED, *(text(name, str(i)) for i in range(3)))
    items = held(await listing(gw, pipe))
    assert await delete(gw, items[0]["href"]) == 200
    assert [m["href"] for m in held(await listing(gw, pipe))] == [m["href"] for m in items[1:]]


async def test_D7_embedded_content_always_carries_type_and_encoding(gw: Gateway) -> None:
    pipe = await new_pipe(gw)
    xml = f'<restms><message address="{pipe["name"]}"><content>bare</content></message></restms>'
    async with gw.http.post(DEFAULT_FEED, data=xml, headers={"Content-Type": XML}) as r:
        assert r.status == 200
    got = await message(gw, pipe["message"][0]["href"])
    assert got["content"] == [{"type": "text/plain", "encoding": "plain", "value": "bare"}]


async def test_D9_one_writer_100_messages_arrive_in_order(gw: Gateway) -> None:
    feed = await new_feed(gw, "d9-order", "direct")
    pipe = await new_pipe(gw)
    await join(gw, pipe, feed, "seq")
    for i in range(100):
        assert await publish(gw, feed, {"address": "seq", "message_id": str(i)}) == [1]
    items = held(await listing(gw, pipe))
    assert [m["message_id"] for m in items] == [str(i) for i in range(100)]
    # Receive them as a client would: asynclet, then DELETE, one at a time.
    href = pipe["message"][0]["href"]
    received = []
    for _ in range(100):
        got = await message(gw, href)
        received.append(got["message_id"])
        assert await delete(gw, href) == 200
        href = beyond(href, 1)
    assert received == [str(i) for i in range(100)]
    assert held(await listing(gw, pipe)) == []


async def test_Q30_expired_message_is_dropped_from_the_pipe(gw: Gateway) -> None:
    pipe = await new_pipe(gw)
    await publish(
        gw,
        DEFAULT_FEED,
        {"address": pipe["name"], "message_id": "short", "expiration": "1"},
        {"address": pipe["name"], "message_id": "long", "expiration": "600000"},
    )
    await asyncio.sleep(0.05)
    assert [m["message_id"] for m in held(await listing(gw, pipe))] == ["long"]


# ---------------------------------------------------------------- P1-P8: pipe types
async def test_P1_default_pipe_keeps_a_message_until_deleted(gw: Gateway) -> None:
    pipe = await new_pipe(gw)
    assert pipe["type"] == ""
    await publish(gw, DEFAULT_FEED, text(pipe["name"], "keep"))
    href = pipe["message"][0]["href"]
    for _ in range(3):
        assert value(await message(gw, href)) == "keep"
    assert [m["href"] for m in held(await listing(gw, pipe))] == [href]
    assert await delete(gw, href) == 200
    assert held(await listing(gw, pipe)) == []


async def test_P2_fifo_is_an_alias_of_the_default_pipe_type(gw: Gateway) -> None:
    pipe = await new_pipe(gw, "fifo")
    assert pipe["type"] == ""
    (default_join,) = pipe["join"]
    assert default_join["address"] == pipe["name"]
    assert default_join["feed"].endswith(DEFAULT_FEED)
    assert await publish(gw, DEFAULT_FEED, text(pipe["name"], "fifo")) == [1]
    assert value(await message(gw, pipe["message"][0]["href"])) == "fifo"


@pytest.mark.parametrize("kind", ["rotator", "service"])
async def test_P3_ondemand_takes_a_message_only_when_the_asynclet_is_got(
    gw: Gateway, kind: str
) -> None:
    feed = await new_feed(gw, f"p3-{kind}", kind)
    pipe = await new_pipe(gw, "ondemand")
    await join(gw, pipe, feed)
    assert await publish(gw, feed, text("", "J1"), text("", "J2")) == [0, 0]
    items = await listing(gw, pipe)
    assert held(items) == []  # nothing assigned before a GET
    (href,) = asynclets(items)
    assert value(await message(gw, href)) == "J1"
    items = await listing(gw, pipe)
    assert [m["href"] for m in held(items)] == [href]  # at most one message held
    (next_href,) = asynclets(items)
    # J2 stays on the feed while J1 is held and nobody asks.
    assert len(held(await listing(gw, pipe))) == 1
    assert await delete(gw, href) == 200
    assert held(await listing(gw, pipe)) == []
    assert value(await message(gw, next_href)) == "J2"


async def test_P3_ondemand_waiter_gets_the_next_publish(gw: Gateway) -> None:
    feed = await new_feed(gw, "p3-wait", "rotator")
    pipe = await new_pipe(gw, "ondemand")
    await join(gw, pipe, feed)
    waiter = asyncio.create_task(get(gw, pipe["message"][0]["href"]))
    await until_waiting(gw, "asynclet", 1)
    assert await publish(gw, feed, text("", "now")) == [1]
    async with asyncio.timeout(AT_ONCE):
        status, reply = await waiter
    assert status == 200
    assert value(reply["restms"]["message"][0]) == "now"


async def test_P3_ondemand_pipe_that_never_asks_gets_nothing(gw: Gateway) -> None:
    feed = await new_feed(gw, "p3-idle", "rotator")
    idle, busy = await new_pipe(gw, "ondemand"), await new_pipe(gw, "ondemand")
    await join(gw, idle, feed)
    await join(gw, busy, feed)
    await publish(gw, feed, *(text("", f"J{i}") for i in range(3)))
    href = busy["message"][0]["href"]
    for i in range(3):
        assert value(await message(gw, href)) == f"J{i}"
        assert await delete(gw, href) == 200
        href = beyond(href, 1)
    assert held(await listing(gw, idle)) == []


@pytest.mark.parametrize("kind", ["", "fanout", "direct", "topic", "headers", "regexp"])
async def test_P4_ondemand_join_to_non_queueing_feed_is_403(gw: Gateway, kind: str) -> None:
    feed = await new_feed(gw, f"p4-{kind or 'plain'}", kind)
    pipe = await new_pipe(gw, "ondemand")
    status, _, _ = await post(gw, pipe["uri"], join=[{"feed": feed, "address": "a"}])
    assert status == 403
    status, _, _ = await post(gw, pipe["uri"], join=[{"feed": DEFAULT_FEED, "address": "a"}])
    assert status == 403


@pytest.mark.parametrize("kind", ["rotator", "service"])
async def test_P4_ondemand_join_to_queueing_feed_is_allowed(gw: Gateway, kind: str) -> None:
    feed = await new_feed(gw, f"p4ok-{kind}", kind)
    pipe = await new_pipe(gw, "ondemand")
    status, _, location = await post(gw, pipe["uri"], join=[{"feed": feed}])
    assert status == 201
    assert location


async def test_P5_ondemand_pipe_has_no_default_join(gw: Gateway) -> None:
    pipe = await new_pipe(gw, "ondemand")
    assert pipe["type"] == "ondemand"
    assert pipe.get("join", []) == []
    assert len(asynclets(pipe["message"])) == 1
    assert await publish(gw, DEFAULT_FEED, text(pipe["name"], "x")) == [0]
    status, reply = await get(gw, pipe["uri"])
    assert status == 200
    assert reply["restms"]["pipe"][0].get("join", []) == []


async def test_P6_stream_pipe_type_is_offered_by_the_extension_profile(gw: Gateway) -> None:
    status, reply = await get(gw, DOMAIN)
    assert status == 200
    names = [p["name"] for p in reply["restms"]["domain"][0]["profile"]]
    assert "x-gateway/Extensions" in names
    pipe = await new_pipe(gw, "stream")
    assert pipe["type"] == "stream"
    assert len(asynclets(pipe["message"])) == 1


@pytest.mark.parametrize("kind", ["loopback", "STREAM", "sse", "x"])
async def test_P6_P7_unknown_pipe_types_are_400(gw: Gateway, kind: str) -> None:
    status, _, _ = await post(gw, DOMAIN, pipe=[{"type": kind}])
    assert status == 400
