"""Routing per feed type over HTTP (digest §6.2: F5-F13, F18-F20, Q2, C6).

Each test builds feeds, pipes and joins through the domain and pipe URIs, publishes
with plain POSTs and reads what each pipe holds from its listing, so it checks the
whole path a client sees: join validation, the selection rule of the feed type, the
``count`` in the publish reply and what lands in which pipe.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from lxml import etree

from tests.app.jsonapi import DOMAIN, HJ, JSON, body, delete, get, join, new_pipe, post, publish
from tests.conftest import Gateway, MakeGateway

XML = "application/restms+xml"
DEFAULT_FEED = "/restms/feed/default"
NS = "http://www.restms.org/schema/restms"
AMQP9_TYPES = ("fanout", "direct", "topic", "headers", "rotator", "service")


# ---------------------------------------------------------------- helpers


async def new_feed(gw: Gateway, name: str, kind: str = "") -> str:
    status, reply, location = await post(gw, DOMAIN, feed=[{"name": name, "type": kind}])
    assert status == 201, reply
    return location


async def held(gw: Gateway, pipe: dict[str, Any]) -> list[dict[str, Any]]:
    status, reply = await get(gw, pipe["uri"])
    assert status == 200, reply
    return [m for m in reply["restms"]["pipe"][0].get("message", []) if m.get("async") != "1"]


async def addresses(gw: Gateway, pipe: dict[str, Any]) -> list[str]:
    return [m["address"] for m in await held(gw, pipe)]


async def ids(gw: Gateway, pipe: dict[str, Any]) -> list[str]:
    return [m.get("message_id", "") for m in await held(gw, pipe)]


def job(i: int) -> dict[str, str]:
    return {"message_id": f"J{i}"}


# ---------------------------------------------------------------- default and direct (F7, F9)
@pytest.mark.parametrize("kind", ["", "direct"])
async def test_F7_exact_address_match_and_star_is_literal(gw: Gateway, kind: str) -> None:
    feed = await new_feed(gw, f"exact-{kind or 'default'}", kind)
    star, bob, other = await new_pipe(gw), await new_pipe(gw), await new_pipe(gw)
    await join(gw, star, feed, "*")
    await join(gw, bob, feed, "bob")
    await join(gw, other, feed, "Bob")
    assert await publish(gw, feed, {"address": "bob"}) == [1]
    assert await publish(gw, feed, {"address": "anything"}) == [0]
    assert await publish(gw, feed, {"address": "*"}) == [1]
    assert await publish(gw, feed, {"address": ""}) == [0]
    assert await addresses(gw, star) == ["*"]
    assert await addresses(gw, bob) == ["bob"]
    assert await addresses(gw, other) == []


async def test_F9_feed_without_type_routes_like_the_default_type(gw: Gateway) -> None:
    status, reply, feed = await post(gw, DOMAIN, feed=[{"name": "untyped"}])
    assert status == 201
    assert reply["restms"]["feed"][0]["type"] == ""
    pipe = await new_pipe(gw)
    await join(gw, pipe, feed, "a.b")
    assert await publish(gw, feed, {"address": "a.b"}, {"address": "a.*"}) == [1, 0]


async def test_F15_default_feed_routes_by_pipe_name(gw: Gateway) -> None:
    a, b = await new_pipe(gw), await new_pipe(gw)
    assert await publish(gw, DEFAULT_FEED, {"address": a["name"]}, {"address": "nobody"}) == [1, 0]
    assert await addresses(gw, a) == [a["name"]]
    assert await addresses(gw, b) == []


# ---------------------------------------------------------------- fanout
async def test_F21_fanout_delivers_every_message_to_every_join(gw: Gateway) -> None:
    feed = await new_feed(gw, "fan", "fanout")
    pipes = [await new_pipe(gw) for _ in range(3)]
    for pipe, address in zip(pipes, ["x", "", "#"], strict=True):
        await join(gw, pipe, feed, address)
    assert await publish(gw, feed, {"address": "a"}, {"address": ""}, {"address": "x"}) == [3] * 3
    for pipe in pipes:
        assert await addresses(gw, pipe) == ["a", "", "x"]


async def test_F19_F21_fanout_without_joins_drops_the_message(gw: Gateway) -> None:
    feed = await new_feed(gw, "fan-empty", "fanout")
    assert await publish(gw, feed, {"address": "lost"}) == [0]
    pipe = await new_pipe(gw)
    await join(gw, pipe, feed)
    assert await publish(gw, feed, {"address": "kept"}) == [1]
    assert await addresses(gw, pipe) == ["kept"]


# ---------------------------------------------------------------- topic (F5)
F5_VECTORS = [
    ("rec.pets.*", "rec.pets.cats", True),
    ("rec.pets.*", "rec.pets", False),
    ("rec.pets.*", "rec.pets.cats.tabby", False),
    ("rec.#", "rec", True),
    ("rec.#", "rec.cars", True),
    ("rec.#", "rec.pets.dogs", True),
    ("#", "", True),
    ("#", "any.thing.at.all", True),
    ("*.cars", "rec.cars", True),
    ("rec.*.dogs", "rec.pets.dogs", True),
    ("*", "", False),
    ("rec.#", "recreation", False),
    ("Rec.#", "rec.cars", False),
    ("#.dogs", "rec.pets.dogs", True),
    ("#.dogs", "rec.dogs.cats", False),
]


@pytest.mark.parametrize(("pattern", "address", "expected"), F5_VECTORS)
async def test_F5_topic_vectors(gw: Gateway, pattern: str, address: str, expected: bool) -> None:
    feed = await new_feed(gw, "news", "topic")
    pipe = await new_pipe(gw)
    await join(gw, pipe, feed, pattern)
    assert await publish(gw, feed, {"address": address}) == [int(expected)]
    assert await addresses(gw, pipe) == ([address] if expected else [])


async def test_F5_F18_pipe_matched_by_two_joins_gets_one_copy_counted_twice(gw: Gateway) -> None:
    feed = await new_feed(gw, "news2", "topic")
    pipe, other = await new_pipe(gw), await new_pipe(gw)
    await join(gw, pipe, feed, "rec.*")
    await join(gw, pipe, feed, "#")
    await join(gw, other, feed, "rec.cars")
    assert await publish(gw, feed, {"address": "rec.cars"}) == [3]
    assert await publish(gw, feed, {"address": "misc"}) == [1]
    assert await addresses(gw, pipe) == ["rec.cars", "misc"]
    assert await addresses(gw, other) == ["rec.cars"]


async def test_F5_topic_routing_follows_join_changes(gw: Gateway) -> None:
    feed = await new_feed(gw, "news3", "topic")
    pipe = await new_pipe(gw)
    assert await publish(gw, feed, {"address": "a.b"}) == [0]
    location = await join(gw, pipe, feed, "a.*")
    assert await publish(gw, feed, {"address": "a.b"}) == [1]
    assert await delete(gw, location) == 200
    assert await publish(gw, feed, {"address": "a.b"}) == [0]
    assert await addresses(gw, pipe) == ["a.b"]


# ---------------------------------------------------------------- headers (F6)
async def test_F6_headers_feed_matches_every_join_header_exactly(gw: Gateway) -> None:
    feed = await new_feed(gw, "hdr", "headers")
    eu, eu_gold, everything = await new_pipe(gw), await new_pipe(gw), await new_pipe(gw)
    await join(gw, eu, feed, "ignored", {"region": "eu"})
    await join(gw, eu_gold, feed, "", {"region": "eu", "tier": "gold"})
    await join(gw, everything, feed)

    def msg(mid: str, **headers: str) -> dict[str, Any]:
        return {
            "message_id": mid,
            "header": [{"name": k, "value": v} for k, v in headers.items()],
        }

    counts = await publish(
        gw,
        feed,
        msg("m1", region="eu"),
        msg("m2", region="eu", tier="gold", extra="x"),
        msg("m3", region="EU"),
        msg("m4", Region="eu"),
        msg("m5"),
        msg("m6", tier="gold"),
    )
    assert counts == [2, 3, 1, 1, 1, 1]
    assert await ids(gw, eu) == ["m1", "m2"]
    assert await ids(gw, eu_gold) == ["m2"]
    assert await ids(gw, everything) == ["m1", "m2", "m3", "m4", "m5", "m6"]


async def test_F6_headers_feed_ignores_the_address(gw: Gateway) -> None:
    feed = await new_feed(gw, "hdr2", "headers")
    pipe = await new_pipe(gw)
    await join(gw, pipe, feed, "only.this", {"k": "v"})
    message = {"address": "something.else", "header": [{"name": "k", "value": "v"}]}
    assert await publish(gw, feed, message) == [1]


# ---------------------------------------------------------------- regexp (F12 extension)
async def test_F12_regexp_feed_full_matches_the_address(gw: Gateway) -> None:
    feed = await new_feed(gw, "rx", "regexp")
    pets, cars = await new_pipe(gw), await new_pipe(gw)
    await join(gw, pets, feed, r"rec\.pets\.(cats|dogs)")
    await join(gw, cars, feed, "cars")
    counts = await publish(
        gw,
        feed,
        {"address": "rec.pets.cats"},
        {"address": "rec.pets.dogs"},
        {"address": "xrec.pets.cats"},
        {"address": "rec.pets.cats.tabby"},
        {"address": "rec.cars"},
        {"address": "cars"},
    )
    assert counts == [1, 1, 0, 0, 0, 1]
    assert await addresses(gw, pets) == ["rec.pets.cats", "rec.pets.dogs"]
    assert await addresses(gw, cars) == ["cars"]


@pytest.mark.parametrize("pattern", ["(", "a[", "*x", "(?P<n>a", "a{2,1}"])
async def test_F12_regexp_invalid_pattern_is_400(gw: Gateway, pattern: str) -> None:
    feed = await new_feed(gw, "rx-bad", "regexp")
    pipe = await new_pipe(gw)
    async with gw.http.post(
        pipe["uri"], data=body(join=[{"feed": feed, "address": pattern}]), headers=HJ
    ) as r:
        assert r.status == 400
        assert r.content_type == "text/plain"
    status, reply = await get(gw, pipe["uri"])
    assert status == 200
    assert len(reply["restms"]["pipe"][0]["join"]) == 1  # only the default join


# ---------------------------------------------------------------- rotator and service (F8)
@pytest.mark.parametrize("kind", ["rotator", "service"])
async def test_F8_round_robin_gives_each_message_to_one_join(gw: Gateway, kind: str) -> None:
    feed = await new_feed(gw, f"rr-{kind}", kind)
    workers = [await new_pipe(gw) for _ in range(3)]
    for worker in workers:
        await join(gw, worker, feed, "ignored")
    assert await publish(gw, feed, *(job(i) for i in range(6))) == [1] * 6
    assert await publish(gw, feed, job(6)) == [1]
    assert [await ids(gw, w) for w in workers] == [["J0", "J3", "J6"], ["J1", "J4"], ["J2", "J5"]]


@pytest.mark.parametrize("kind", ["rotator", "service"])
async def test_F8_messages_queue_without_joins_and_drain_on_join(gw: Gateway, kind: str) -> None:
    feed = await new_feed(gw, f"q-{kind}", kind)
    assert await publish(gw, feed, job(1), job(2)) == [0, 0]
    assert await publish(gw, feed, job(3)) == [0]
    worker = await new_pipe(gw)
    await join(gw, worker, feed)
    assert await ids(gw, worker) == ["J1", "J2", "J3"]
    assert await publish(gw, feed, job(4)) == [1]
    assert await ids(gw, worker) == ["J1", "J2", "J3", "J4"]


async def test_F8_Q22_publish_to_full_queue_is_503(make_gateway: MakeGateway) -> None:
    gw = await make_gateway(max_feed_queue=2)
    feed = await new_feed(gw, "bounded", "rotator")
    assert await publish(gw, feed, job(1)) == [0]
    # A request that would overflow the queue is refused as a whole.
    async with gw.http.post(feed, data=body(message=[job(2), job(3)]), headers=HJ) as r:
        assert r.status == 503
    assert await publish(gw, feed, job(2)) == [0]
    async with gw.http.post(feed, data=body(message=[job(3)]), headers=HJ) as r:
        assert r.status == 503
        assert r.content_type == "text/plain"
        assert int(r.headers["Retry-After"]) >= 0
    worker = await new_pipe(gw)
    await join(gw, worker, feed)
    assert await ids(gw, worker) == ["J1", "J2"]
    assert await publish(gw, feed, job(4)) == [1]
    assert await ids(gw, worker) == ["J1", "J2", "J4"]


async def test_F8_Q22_queue_bound_holds_when_the_only_pipe_fills_mid_request(
    make_gateway: MakeGateway,
) -> None:
    gw = await make_gateway(max_feed_queue=1, max_pipe_messages=1)
    feed = await new_feed(gw, "bounded2", "rotator")
    worker = await new_pipe(gw)
    await join(gw, worker, feed)
    async with gw.http.post(feed, data=body(message=[job(1), job(2), job(3)]), headers=HJ) as r:
        if r.status == 503:
            assert await ids(gw, worker) == []  # refused as a whole
            return
        assert r.status == 200
        counts = [int(m["count"]) for m in (await r.json(content_type=JSON))["restms"]["message"]]
    assert counts.count(0) <= 1, f"{counts}: more messages queued than max_feed_queue=1"


async def test_F8_round_robin_order_is_kept_when_the_queue_is_nearly_full(
    make_gateway: MakeGateway,
) -> None:
    gw = await make_gateway(max_feed_queue=1)
    feed = await new_feed(gw, "rr-bound", "rotator")
    workers = [await new_pipe(gw) for _ in range(3)]
    for worker in workers:
        await join(gw, worker, feed)
    assert await publish(gw, feed, job(0), job(1)) == [1, 1]
    assert [await ids(gw, w) for w in workers] == [["J0"], ["J1"], []]


async def test_M10_F8_publish_refused_by_a_full_queue_keeps_its_staged_content(
    make_gateway: MakeGateway,
) -> None:
    gw = await make_gateway(max_feed_queue=1)
    feed = await new_feed(gw, "bounded3", "rotator")
    assert await publish(gw, feed, job(1)) == [0]
    async with gw.http.post(feed, data=b"work", headers={"Content-Type": "text/plain"}) as r:
        assert r.status == 201
        staged = r.headers["Location"]
    message = {"message_id": "J2", "content": [{"href": staged}]}
    async with gw.http.post(feed, data=body(message=[message]), headers=HJ) as r:
        assert r.status == 503
    async with gw.http.get(staged) as r:
        assert r.status == 200
        assert await r.read() == b"work"


async def test_F8_Q2_full_rotator_pipe_queues_then_drains_on_delete(
    make_gateway: MakeGateway,
) -> None:
    gw = await make_gateway(max_pipe_messages=2)
    feed = await new_feed(gw, "rr-full", "rotator")
    worker = await new_pipe(gw)
    await join(gw, worker, feed)
    assert await publish(gw, feed, job(1), job(2), job(3)) == [1, 1, 0]
    items = await held(gw, worker)
    assert [m["message_id"] for m in items] == ["J1", "J2"]
    assert await delete(gw, items[0]["href"]) == 200
    assert await ids(gw, worker) == ["J2", "J3"]


async def test_F8_service_feed_deletes_itself_after_its_last_join(gw: Gateway) -> None:
    feed = await new_feed(gw, "svc", "service")
    # Created with no joins, it stays (Wolf Call says up) and queues.
    assert (await get(gw, feed))[0] == 200
    assert await publish(gw, feed, job(0)) == [0]
    w1, w2 = await new_pipe(gw), await new_pipe(gw)
    j1 = await join(gw, w1, feed)
    await join(gw, w2, feed)
    assert await ids(gw, w1) == ["J0"]
    assert await delete(gw, j1) == 200
    assert (await get(gw, feed))[0] == 200  # one join left: still up
    assert await delete(gw, w2["uri"]) == 200  # the last join goes with its pipe
    assert (await get(gw, feed))[0] == 404  # Wolf Call: gone
    status, _, _ = await post(gw, feed, message=[job(1)])
    assert status == 404
    status, reply = await get(gw, DOMAIN)
    assert all(f["name"] != "svc" for f in reply["restms"]["domain"][0]["feed"])
    # Q33: the service can come back.
    status, _, again = await post(gw, DOMAIN, feed=[{"name": "svc", "type": "service"}])
    assert status == 201
    assert again == feed


async def test_F8_rotator_feed_survives_its_last_join(gw: Gateway) -> None:
    feed = await new_feed(gw, "rot", "rotator")
    worker = await new_pipe(gw)
    location = await join(gw, worker, feed)
    assert await delete(gw, location) == 200
    assert (await get(gw, feed))[0] == 200
    assert await publish(gw, feed, job(1)) == [0]


# ---------------------------------------------------------------- joins (F10, F11)
async def test_F10_identical_join_returns_200_with_the_same_location(gw: Gateway) -> None:
    feed = await new_feed(gw, "f10", "headers")
    pipe = await new_pipe(gw)
    spec = {"feed": feed, "address": "a", "header": [{"name": "x", "value": "1"}]}
    status, _, first = await post(gw, pipe["uri"], join=[spec])
    assert status == 201
    async with gw.http.post(pipe["uri"], data=body(join=[spec]), headers=HJ) as r:
        assert r.status == 200
        assert r.headers["Location"] == first
        reply = await r.json(content_type=JSON)
    assert reply["restms"]["join"][0]["address"] == "a"
    # Path-only feed URI (U5) and headers in another order are still the same join.
    spec2 = {
        "feed": "/restms/feed/f10",
        "address": "a",
        "header": [{"name": "x", "value": "1"}],
    }
    status, _, again = await post(gw, pipe["uri"], join=[spec2])
    assert (status, again) == (200, first)
    status, _, other = await post(gw, pipe["uri"], join=[{"feed": feed, "address": "b"}])
    assert status == 201
    assert other != first
    assert await publish(gw, feed, {"header": [{"name": "x", "value": "1"}]}) == [2]
    assert len(await held(gw, pipe)) == 1


async def test_F10_identical_join_header_order_does_not_matter(gw: Gateway) -> None:
    feed = await new_feed(gw, "f10b", "headers")
    pipe = await new_pipe(gw)
    first = await join(gw, pipe, feed, "", {"a": "1", "b": "2"})
    spec = {
        "feed": feed,
        "address": "",
        "header": [{"name": "b", "value": "2"}, {"name": "a", "value": "1"}],
    }
    assert (await post(gw, pipe["uri"], join=[spec]))[::2] == (200, first)


async def test_F10_F16_copy_of_default_join_is_200(gw: Gateway) -> None:
    pipe = await new_pipe(gw)
    (default_join,) = pipe["join"]
    status, _, location = await post(
        gw, pipe["uri"], join=[{"feed": DEFAULT_FEED, "address": pipe["name"]}]
    )
    assert (status, location) == (200, default_join["href"])


async def test_F11_message_published_before_the_join_is_not_delivered(gw: Gateway) -> None:
    feed = await new_feed(gw, "f11", "topic")
    pipe = await new_pipe(gw)
    assert await publish(gw, feed, {"address": "a", "message_id": "before"}) == [0]
    await join(gw, pipe, feed, "#")
    assert await publish(gw, feed, {"address": "a", "message_id": "after"}) == [1]
    assert await ids(gw, pipe) == ["after"]


# ---------------------------------------------------------------- full pipes (Q2)
async def test_Q2_full_pipe_is_skipped_and_not_counted(make_gateway: MakeGateway) -> None:
    gw = await make_gateway(max_pipe_messages=2)
    feed = await new_feed(gw, "q2", "fanout")
    full, free = await new_pipe(gw), await new_pipe(gw)
    await join(gw, full, feed)
    await join(gw, free, feed)
    assert await publish(gw, DEFAULT_FEED, {"address": full["name"]}, {"address": full["name"]})
    assert await publish(gw, feed, {"message_id": "f"}) == [1]
    assert len(await held(gw, full)) == 2
    assert await ids(gw, free) == ["f"]
    # The default feed skips it too (count 0), and nothing fails.
    assert await publish(gw, DEFAULT_FEED, {"address": full["name"]}) == [0]


async def test_Q2_full_pipe_is_skipped_by_a_rotator(make_gateway: MakeGateway) -> None:
    gw = await make_gateway(max_pipe_messages=2)
    feed = await new_feed(gw, "q2r", "rotator")
    full, free = await new_pipe(gw), await new_pipe(gw)
    await join(gw, full, feed)
    await join(gw, free, feed)
    await publish(gw, DEFAULT_FEED, {"address": full["name"]}, {"address": full["name"]})
    assert await publish(gw, feed, job(1), job(2)) == [1, 1]
    assert await ids(gw, free) == ["J1", "J2"]


async def test_Q2_F18_pipe_taking_its_last_slot_counts_every_matching_join(
    make_gateway: MakeGateway,
) -> None:
    """Decided: count = joins matched whose pipe took the message, one copy per pipe."""
    gw = await make_gateway(max_pipe_messages=2)
    feed = await new_feed(gw, "q2t", "topic")
    pipe = await new_pipe(gw)
    await join(gw, pipe, feed, "a.*")
    await join(gw, pipe, feed, "#")
    assert await publish(gw, feed, {"address": "a.b", "message_id": "one"}) == [2]
    assert await publish(gw, feed, {"address": "a.b", "message_id": "two"}) == [2]
    assert await ids(gw, pipe) == ["one", "two"]
    assert await publish(gw, feed, {"address": "a.b", "message_id": "three"}) == [0]


# ---------------------------------------------------------------- publish replies (F18, F20)
def counts_in(xml: bytes) -> list[dict[str, str]]:
    root = etree.fromstring(xml)
    assert etree.QName(root).localname == "restms"
    assert root.nsmap.get(None) == NS
    elements = list(root)
    assert all(etree.QName(el).localname == "message" and len(el) == 0 for el in elements)
    return [dict(el.attrib) for el in elements]


async def test_F18_default_feed_replies_one_count_per_message(gw: Gateway) -> None:
    pipe = await new_pipe(gw)
    xml = (
        f'<restms xmlns="{NS}"><message address="{pipe["name"]}"/>'
        '<message address="nobody"/>'
        f'<message address="{pipe["name"]}"/></restms>'
    )
    async with gw.http.post(DEFAULT_FEED, data=xml, headers={"Content-Type": XML}) as r:
        assert r.status == 200
        assert "Location" not in r.headers
        assert r.content_type == XML
        assert counts_in(await r.read()) == [{"count": "1"}, {"count": "0"}, {"count": "1"}]


@pytest.mark.parametrize("kind", AMQP9_TYPES)
async def test_F20_amqp9_feed_reply_is_counts_or_empty(gw: Gateway, kind: str) -> None:
    feed = await new_feed(gw, f"f20-{kind}", kind)
    pipe = await new_pipe(gw)
    await join(gw, pipe, feed, "k")
    xml = f'<restms xmlns="{NS}"><message address="k"/><message address="k"/></restms>'
    async with gw.http.post(feed, data=xml, headers={"Content-Type": XML}) as r:
        assert r.status == 200
        assert "Location" not in r.headers
        found = counts_in(await r.read())
    assert found in ([], [{"count": "1"}, {"count": "1"}])
    assert len(await held(gw, pipe)) == 2


# ---------------------------------------------------------------- types (C6, F9, F13)
@pytest.mark.parametrize("kind", ["queue", "Topic", "regex", "xmlpath", "system", "fifo", " "])
async def test_C6_unknown_feed_type_is_400(gw: Gateway, kind: str) -> None:
    async with gw.http.post(
        DOMAIN, data=body(feed=[{"name": "c6", "type": kind}]), headers=HJ
    ) as r:
        assert r.status == 400
        assert r.content_type == "text/plain"
    assert (await get(gw, "/restms/feed/c6"))[0] == 404


@pytest.mark.parametrize("kind", ["x", "fanout", "topic"])
async def test_F9_unknown_join_type_is_400(gw: Gateway, kind: str) -> None:
    feed = await new_feed(gw, "f9", "topic")
    pipe = await new_pipe(gw)
    status, _, _ = await post(gw, pipe["uri"], join=[{"feed": feed, "type": kind}])
    assert status == 400


@pytest.mark.parametrize("kind", AMQP9_TYPES)
async def test_F13_every_amqp9_feed_type_is_accepted(gw: Gateway, kind: str) -> None:
    status, reply, location = await post(gw, DOMAIN, feed=[{"name": f"t-{kind}", "type": kind}])
    assert status == 201
    assert location.endswith(f"/restms/feed/t-{kind}")
    assert reply["restms"]["feed"][0]["type"] == kind
    status, reply = await get(gw, location)
    assert status == 200
    assert reply["restms"]["feed"][0]["type"] == kind
    # Private feeds of the same type too (L27).
    status, reply, private = await post(gw, DOMAIN, feed=[{"type": kind}])
    assert status == 201
    assert "/restms/resource/" in private
    assert reply["restms"]["feed"][0]["type"] == kind


async def test_F13_routing_is_synchronous_with_the_publish_reply(gw: Gateway) -> None:
    """L27: the message is in the pipe before the 200 goes out."""
    feed = await new_feed(gw, "sync", "topic")
    pipe = await new_pipe(gw)
    await join(gw, pipe, feed, "#")
    href = pipe["message"][0]["href"]
    assert await publish(gw, feed, {"address": "now"}) == [1]
    async with asyncio.timeout(0.5), gw.http.head(href) as r:
        assert r.status == 200
