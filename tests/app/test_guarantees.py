"""Delivery guarantees over HTTP, against a real server on 127.0.0.1: pipe options,
overflow replies, duplicate replies, Idempotency-Key, and lease redelivery as a reader
sees it (``delivery_count``), in XML and in JSON."""

from __future__ import annotations

import asyncio
import hashlib
import json

import pytest

from tests.app.xmlapi import JSON, XML, call, doc
from tests.conftest import Gateway, MakeGateway

DOMAIN = "/restms/domain/default"


async def pipe_with(gw: Gateway, attrs: str = "", fmt: str = XML) -> tuple[str, str]:
    """Create a pipe with these attributes; (its URI, its name)."""
    if fmt == JSON:
        body = json.dumps({"restms": {"pipe": [json.loads("{" + attrs + "}")]}})
    else:
        body = doc(f"<pipe {attrs}/>")
    r = await call(gw, "POST", DOMAIN, body, content_type=fmt)
    assert r.status == 201, r.body
    uri = r.headers["Location"]
    return uri, uri.rsplit("/", 1)[1]


async def feed(gw: Gateway, name: str, kind: str = "fanout") -> str:
    r = await call(gw, "POST", DOMAIN, doc(f'<feed name="{name}" type="{kind}"/>'))
    assert r.status in (200, 201), r.body
    return f"/restms/feed/{name}"


async def join(gw: Gateway, pipe: str, feed_uri: str) -> None:
    r = await call(gw, "POST", pipe, doc(f'<join feed="{gw.uri(feed_uri)}"/>'))
    assert r.status == 201, r.body


def messages(*ids: str, body: str = "x") -> str:
    return doc(
        "".join(
            f'<message message_id="{i}"><content encoding="plain">{body}</content></message>'
            for i in ids
        )
    )


async def held(gw: Gateway, pipe: str) -> list[tuple[str | None, str | None]]:
    """(message_id, delivery_count) of each message the pipe lists, oldest first."""
    listed = (await call(gw, "GET", pipe)).children("message")
    out = []
    for el in listed:
        if el.get("async") == "1":
            continue
        m = (await call(gw, "GET", el.get("href"), Accept=XML)).top()  # a fetch: a lease
        out.append((m.get("message_id"), m.get("delivery_count")))
    return out


# ---------------------------------------------------------------- pipe options
async def test_pipe_options_are_kept_and_shown_with_defaults_filled_in(gw: Gateway) -> None:
    await feed(gw, "dl", "rotator")
    uri, _ = await pipe_with(
        gw, 'max_messages="5" overflow="reject" lease="2.5" dead_letter="/restms/feed/dl"'
    )
    pipe = (await call(gw, "GET", uri)).top()
    assert pipe.get("max_messages") == "5"
    assert pipe.get("overflow") == "reject"
    assert pipe.get("lease") == "2.5"
    assert pipe.get("dead_letter") == gw.uri("/restms/feed/dl")
    assert pipe.get("max_deliveries") == "5"  # the configured default
    assert pipe.get("durable") == "0"
    plain, _ = await pipe_with(gw)
    shown = (await call(gw, "GET", plain)).top()
    assert shown.get("dead_letter") == gw.uri("/restms/feed/dead-letter")
    assert shown.get("overflow") == "skip"


async def test_pipe_options_in_json(gw: Gateway) -> None:
    uri, _ = await pipe_with(gw, '"durable": "1", "max_bytes": "1024"', fmt=JSON)
    r = await call(gw, "GET", uri, Accept=JSON)
    [pipe] = r.json()["restms"]["pipe"]
    assert (pipe["durable"], pipe["max_bytes"]) == ("1", "1024")


@pytest.mark.parametrize(
    ("attrs", "says"),
    [
        ('overflow="explode"', "overflow"),
        ('max_messages="0"', "max_messages"),
        ('max_messages="ten"', "max_messages"),
        ('max_messages="99999999"', "at most"),
        ('lease="-1"', "lease"),
        ('lease="nan"', "lease"),
        ('durable="maybe"', "durable"),
        ('dead_letter="/restms/feed/none-such"', "feed"),
    ],
)
async def test_bad_pipe_options_are_400_and_make_no_pipe(
    gw: Gateway, attrs: str, says: str
) -> None:
    before = (await call(gw, "GET", DOMAIN)).body
    r = await call(gw, "POST", DOMAIN, doc(f"<pipe {attrs}/>"))
    r.assert_text_error(400)
    assert says in r.body.decode()
    assert (await call(gw, "GET", DOMAIN)).body == before


# ---------------------------------------------------------------- overflow
async def test_a_full_reject_pipe_fails_the_publish_with_503_naming_it(gw: Gateway) -> None:
    news = await feed(gw, "news")
    uri, name = await pipe_with(gw, 'title="audit" max_messages="2" overflow="reject"')
    await join(gw, uri, news)
    assert (await call(gw, "POST", news, messages("1", "2"))).counts() == ["1", "1"]
    r = await call(gw, "POST", news, messages("3"))
    r.assert_text_error(503)
    assert int(r.headers["Retry-After"]) > 0
    reason = r.body.decode()
    digest = hashlib.sha256(name.encode()).hexdigest()[:12]
    assert "'audit'" in reason
    assert digest in reason
    assert name not in reason
    await call(gw, "DELETE", f"{uri}.1")
    assert (await call(gw, "POST", news, messages("3"))).counts() == ["1"]


async def test_drop_oldest_keeps_the_newest(gw: Gateway) -> None:
    news = await feed(gw, "news")
    uri, _ = await pipe_with(gw, 'max_messages="2" overflow="drop-oldest"')
    await join(gw, uri, news)
    await call(gw, "POST", news, messages("1", "2", "3"))
    assert [m for m, _ in await held(gw, uri)] == ["2", "3"]


# ---------------------------------------------------------------- deduplication
async def test_a_repeated_message_id_is_answered_as_a_duplicate_xml_and_json(
    gw: Gateway,
) -> None:
    news = await feed(gw, "news")
    uri, _ = await pipe_with(gw)
    await join(gw, uri, news)
    first = await call(gw, "POST", news, messages("a"))
    assert [el.get("duplicate") for el in first.elements()] == [None]
    again = await call(gw, "POST", news, messages("a", "b"))
    assert [(el.get("count"), el.get("duplicate")) for el in again.elements()] == [
        ("1", "1"),
        ("1", None),
    ]
    body = json.dumps({"restms": {"message": [{"message_id": "b"}]}})
    r = await call(gw, "POST", news, body, content_type=JSON, Accept=JSON)
    assert r.json()["restms"]["message"] == [{"count": "1", "duplicate": "1"}]
    assert [m for m, _ in await held(gw, uri)] == ["a", "b"]


# ---------------------------------------------------------------- Idempotency-Key
async def test_idempotency_key_replays_the_first_reply_without_a_second_effect(
    gw: Gateway,
) -> None:
    news = await feed(gw, "news")
    uri, _ = await pipe_with(gw)
    await join(gw, uri, news)
    body = doc("<message><content>no id</content></message>")  # no message_id to go by
    first = await call(gw, "POST", news, body, Idempotency_Key="k-1")
    again = await call(gw, "POST", news, body, Idempotency_Key="k-1")
    assert first.status == again.status == 200
    assert again.body == first.body
    assert again.headers["Idempotent-Replayed"] == "true"
    assert "Idempotent-Replayed" not in first.headers
    other = await call(gw, "POST", news, body, Idempotency_Key="k-2")
    assert other.status == 200
    assert len(await held(gw, uri)) == 2  # k-1 once, k-2 once


async def test_idempotency_key_on_pipe_creation_makes_one_pipe(gw: Gateway) -> None:
    body = doc('<pipe title="once"/>')
    first = await call(gw, "POST", DOMAIN, body, Idempotency_Key="make-pipe")
    again = await call(gw, "POST", DOMAIN, body, Idempotency_Key="make-pipe")
    assert first.status == again.status == 201
    assert first.headers["Location"] == again.headers["Location"]


async def test_idempotency_key_reused_for_another_request_is_422(gw: Gateway) -> None:
    news = await feed(gw, "news")
    await call(gw, "POST", news, messages("a"), Idempotency_Key="k")
    r = await call(gw, "POST", news, messages("b"), Idempotency_Key="k")
    r.assert_text_error(422)


async def test_a_failed_request_is_not_kept_for_its_key(gw: Gateway) -> None:
    news = await feed(gw, "news")
    bad = await call(gw, "POST", news, "<restms", Idempotency_Key="k")
    bad.assert_text_error(400)
    assert (await call(gw, "POST", news, "<restms", Idempotency_Key="k")).status == 400
    good = await call(gw, "POST", news, messages("a"), Idempotency_Key="k2")
    assert good.status == 200


@pytest.mark.parametrize("key", ["", "x" * 256, "caf\u00e9"])
async def test_a_malformed_idempotency_key_is_400(gw: Gateway, key: str) -> None:
    news = await feed(gw, "news")
    async with gw.http.post(
        news,
        data=messages("a").encode(),
        headers={"Content-Type": XML, "Idempotency-Key": key.encode().decode("latin-1")},
    ) as r:
        assert r.status == 400
        assert r.content_type == "text/plain"


# ---------------------------------------------------------------- leases
async def test_an_unacknowledged_message_comes_back_with_a_delivery_count(
    make_gateway: MakeGateway,
) -> None:
    gw = await make_gateway(lease=0.3, sweep_interval=0.05, max_deliveries=2)
    news = await feed(gw, "news")
    uri, _ = await pipe_with(gw)
    await join(gw, uri, news)
    await call(gw, "POST", news, messages("job"))
    first = (await call(gw, "GET", f"{uri}.1")).top()
    assert first.get("delivery_count") is None
    async with asyncio.timeout(5):
        again = (await call(gw, "GET", f"{uri}.2")).top()  # waits as the asynclet
    assert (again.get("message_id"), again.get("delivery_count")) == ("job", "1")
    assert (await call(gw, "GET", f"{uri}.1")).status == 404  # it left its old position
    dead, _ = await pipe_with(gw)
    await join(gw, dead, "/restms/feed/dead-letter")
    async with asyncio.timeout(5):
        letter = await call(gw, "GET", f"{dead}.1")  # after the second lease ran out
    headers = {h.get("name"): h.get("value") for h in letter.children("header")}
    assert headers["x-death-reason"] == "max-deliveries"
    assert headers["x-delivery-count"] == "2"
    listed = (await call(gw, "GET", uri)).children("message")
    assert [el.get("async") for el in listed] == ["1"]  # gone from the reader's pipe


async def test_an_acknowledged_message_is_not_redelivered(make_gateway: MakeGateway) -> None:
    gw = await make_gateway(lease=0.2, sweep_interval=0.05, max_wait=1.0)
    news = await feed(gw, "news")
    uri, _ = await pipe_with(gw)
    await join(gw, uri, news)
    await call(gw, "POST", news, messages("job"))
    assert (await call(gw, "GET", f"{uri}.1")).status == 200
    assert (await call(gw, "DELETE", f"{uri}.1")).status == 200
    r = await call(gw, "GET", f"{uri}.2", Accept=XML)  # the asynclet: waits max_wait
    r.assert_text_error(503)  # nothing came back within five leases


async def test_an_sse_reader_is_leased_too_and_sees_the_message_again(
    make_gateway: MakeGateway,
) -> None:
    gw = await make_gateway(lease=0.3, sweep_interval=0.05)
    news = await feed(gw, "news")
    uri, _ = await pipe_with(gw)
    await join(gw, uri, news)
    await call(gw, "POST", news, messages("job"))
    events: list[dict[str, object]] = []
    async with asyncio.timeout(5), gw.http.get(uri, headers={"Accept": "text/event-stream"}) as r:
        async for line in r.content:
            if line.startswith(b"data: "):
                events.append(json.loads(line[6:])["restms"]["message"][0])
                if len(events) == 2:
                    break
    assert [e["message_id"] for e in events] == ["job", "job"]
    assert (events[0].get("delivery_count"), events[1].get("delivery_count")) == (None, "1")
