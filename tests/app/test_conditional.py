"""Caching, conditional and evented requests (digest §3: H1-H11, Q34).

Evented GETs are woken by a change made from another task while the GET is held;
expiry runs against a gateway with a small ``max_wait``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import time
from email.utils import formatdate

import pytest
from lxml import etree

from tests.app.xmlapi import Reply, call, doc
from tests.conftest import Gateway, MakeGateway

XML = "application/restms+xml"
JSON = "application/restms+json"
DOMAIN = "/restms/domain/default"
DEFAULT_FEED = "/restms/feed/default"
RFC1123 = re.compile(r"[A-Z][a-z]{2}, \d{2} [A-Z][a-z]{2} \d{4} \d{2}:\d{2}:\d{2} GMT")
HELD = 0.15  # how long a GET must stay unanswered to count as waiting


def http_date(ts: float) -> str:
    return formatdate(int(ts), usegmt=True)


@dataclasses.dataclass
class Things:
    feed: str
    pipe: str
    pipe_name: str
    join: str
    message: str

    def uri(self, kind: str) -> str:
        return DOMAIN if kind == "domain" else getattr(self, kind)


@pytest.fixture
async def things(gw: Gateway) -> Things:
    feed = await call(gw, "POST", DOMAIN, doc('<feed name="cond" type="fanout"/>'))
    pipe = await call(gw, "POST", DOMAIN, doc("<pipe/>"))
    join = await call(gw, "POST", pipe.headers["Location"], doc('<join feed="/restms/feed/cond"/>'))
    assert (feed.status, pipe.status, join.status) == (201, 201, 201)
    published = await call(gw, "POST", "/restms/feed/cond", doc('<message address="m"/>'))
    assert published.status == 200
    listing = await call(gw, "GET", pipe.headers["Location"])
    message = next(m for m in listing.top() if m.get("address") == "m")
    return Things(
        feed=feed.headers["Location"],
        pipe=pipe.headers["Location"],
        pipe_name=pipe.top().get("name"),
        join=join.headers["Location"],
        message=message.get("href"),
    )


async def publish_to(gw: Gateway, pipe_name: str, text: str = "x") -> None:
    body = doc(
        f'<message address="{pipe_name}">'
        f'<content type="text/plain" encoding="plain">{text}</content></message>'
    )
    r = await call(gw, "POST", DEFAULT_FEED, body)
    assert r.status == 200
    assert b'count="1"' in r.body


async def held(task: asyncio.Task[Reply]) -> None:
    """Assert the request is still waiting after a short while."""
    await asyncio.sleep(HELD)
    assert not task.done(), task.result() if task.done() else None


KINDS = ["domain", "feed", "pipe", "join", "message"]


# ---------------------------------------------------------------- H1, H2 validators
@pytest.mark.parametrize("kind", KINDS)
async def test_H1_H2_get_carries_etag_and_rfc1123_last_modified(
    gw: Gateway, things: Things, kind: str
) -> None:
    r = await call(gw, "GET", things.uri(kind))
    assert r.status == 200
    assert re.fullmatch(r'(W/)?"[^"]+"', r.etag), r.etag
    assert RFC1123.fullmatch(r.headers["Last-Modified"]), r.headers["Last-Modified"]
    assert abs(r.modified - time.time()) < 60


async def test_H1_create_and_put_replies_carry_validators(gw: Gateway) -> None:
    for body in ('<feed name="h1" type="topic"/>', "<pipe/>", '<feed type="topic"/>'):
        r = await call(gw, "POST", DOMAIN, doc(body))
        assert r.status == 201
        assert r.headers["ETag"]
        assert RFC1123.fullmatch(r.headers["Last-Modified"])
    put = await call(gw, "PUT", "/restms/feed/h1", doc('<feed title="t"/>'))
    assert put.status == 200
    assert put.headers["ETag"]
    assert RFC1123.fullmatch(put.headers["Last-Modified"])


# ---------------------------------------------------------------- H3 conditional GET
@pytest.mark.parametrize("kind", KINDS)
async def test_H3_if_none_match_current_is_304_without_body(
    gw: Gateway, things: Things, kind: str
) -> None:
    first = await call(gw, "GET", things.uri(kind))
    r = await call(gw, "GET", things.uri(kind), If_None_Match=first.etag)
    assert r.status == 304
    assert r.body == b""
    assert r.etag == first.etag


@pytest.mark.parametrize("kind", KINDS)
async def test_H3_if_none_match_stale_is_200_with_document(
    gw: Gateway, things: Things, kind: str
) -> None:
    first = await call(gw, "GET", things.uri(kind))
    r = await call(gw, "GET", things.uri(kind), If_None_Match='"not-the-current-tag"')
    assert r.status == 200
    assert r.body == first.body


async def test_H3_if_none_match_list_containing_current_is_304(gw: Gateway, things: Things) -> None:
    first = await call(gw, "GET", things.feed)
    r = await call(gw, "GET", things.feed, If_None_Match=f'"old-one", {first.etag}, "other"')
    assert r.status == 304


async def test_H3_if_none_match_after_a_change_is_200(gw: Gateway, things: Things) -> None:
    first = await call(gw, "GET", things.feed)
    assert (await call(gw, "PUT", things.feed, doc('<feed title="changed"/>'))).status == 200
    r = await call(gw, "GET", things.feed, If_None_Match=first.etag)
    assert r.status == 200
    assert r.top().get("title") == "changed"
    assert r.etag != first.etag


@pytest.mark.parametrize("kind", KINDS)
async def test_H3_if_modified_since_current_is_304(gw: Gateway, things: Things, kind: str) -> None:
    first = await call(gw, "GET", things.uri(kind))
    r = await call(gw, "GET", things.uri(kind), If_Modified_Since=first.headers["Last-Modified"])
    assert r.status == 304
    assert r.body == b""


async def test_H3_if_modified_since_older_is_200(gw: Gateway, things: Things) -> None:
    first = await call(gw, "GET", things.pipe)
    r = await call(gw, "GET", things.pipe, If_Modified_Since=http_date(first.modified - 10))
    assert r.status == 200
    assert r.body


async def test_H2_if_modified_since_accepts_utc_suffix(gw: Gateway, things: Things) -> None:
    first = await call(gw, "GET", things.feed)
    utc = first.headers["Last-Modified"].replace("GMT", "UTC")
    assert (await call(gw, "GET", things.feed, If_Modified_Since=utc)).status == 304


@pytest.mark.parametrize(
    ("etag_current", "date_current", "expected"),
    [(True, True, 304), (True, False, 200), (False, True, 200), (False, False, 200)],
)
async def test_H3_with_both_headers_304_only_when_both_say_unchanged(
    gw: Gateway, things: Things, etag_current: bool, date_current: bool, expected: int
) -> None:
    first = await call(gw, "GET", things.feed)
    inm = first.etag if etag_current else '"stale"'
    ims = first.headers["Last-Modified"] if date_current else http_date(first.modified - 3600)
    r = await call(gw, "GET", things.feed, If_None_Match=inm, If_Modified_Since=ims)
    assert r.status == expected


@pytest.mark.parametrize("kind", ["feed", "pipe", "join"])
async def test_H4_conditional_get_on_deleted_resource_is_404(
    gw: Gateway, things: Things, kind: str
) -> None:
    first = await call(gw, "GET", things.uri(kind))
    assert (await call(gw, "DELETE", things.uri(kind))).status == 200
    r = await call(
        gw,
        "GET",
        things.uri(kind),
        If_None_Match=first.etag,
        If_Modified_Since=first.headers["Last-Modified"],
    )
    r.assert_text_error(404)


# ---------------------------------------------------------------- H5 preconditions
async def test_H5_put_with_stale_if_match_is_412_and_changes_nothing(
    gw: Gateway, things: Things
) -> None:
    first = await call(gw, "GET", things.feed)
    assert (await call(gw, "PUT", things.feed, doc('<feed title="one"/>'))).status == 200
    r = await call(gw, "PUT", things.feed, doc('<feed title="two"/>'), If_Match=first.etag)
    r.assert_text_error(412)
    assert (await call(gw, "GET", things.feed)).top().get("title") == "one"


async def test_H5_put_with_current_if_match_is_200(gw: Gateway, things: Things) -> None:
    first = await call(gw, "GET", things.feed)
    r = await call(gw, "PUT", things.feed, doc('<feed title="ok"/>'), If_Match=first.etag)
    assert r.status == 200
    assert r.top().get("title") == "ok"


async def test_H5_put_on_pipe_with_stale_if_match_is_412(gw: Gateway, things: Things) -> None:
    first = await call(gw, "GET", things.pipe)
    await publish_to(gw, things.pipe_name)
    r = await call(gw, "PUT", things.pipe, doc('<pipe title="t"/>'), If_Match=first.etag)
    r.assert_text_error(412)
    assert (await call(gw, "GET", things.pipe)).top().get("title", "") == ""


@pytest.mark.parametrize("kind", ["feed", "pipe", "join"])
async def test_H5_delete_with_stale_if_match_is_412_and_keeps_resource(
    gw: Gateway, things: Things, kind: str
) -> None:
    r = await call(gw, "DELETE", things.uri(kind), If_Match='"not-current"')
    r.assert_text_error(412)
    assert (await call(gw, "GET", things.uri(kind))).status == 200


@pytest.mark.parametrize("kind", ["feed", "pipe", "join"])
async def test_H5_delete_with_current_if_match_is_200(
    gw: Gateway, things: Things, kind: str
) -> None:
    first = await call(gw, "GET", things.uri(kind))
    assert (await call(gw, "DELETE", things.uri(kind), If_Match=first.etag)).status == 200
    assert (await call(gw, "GET", things.uri(kind))).status == 404


@pytest.mark.parametrize("method", ["PUT", "DELETE"])
async def test_H5_if_unmodified_since_older_is_412(
    gw: Gateway, things: Things, method: str
) -> None:
    first = await call(gw, "GET", things.feed)
    body = doc('<feed title="late"/>') if method == "PUT" else None
    r = await call(
        gw, method, things.feed, body, If_Unmodified_Since=http_date(first.modified - 3600)
    )
    r.assert_text_error(412)
    after = await call(gw, "GET", things.feed)
    assert after.status == 200
    assert after.top().get("title") != "late"


@pytest.mark.parametrize("method", ["PUT", "DELETE"])
async def test_H5_if_unmodified_since_current_is_200(
    gw: Gateway, things: Things, method: str
) -> None:
    first = await call(gw, "GET", things.feed)
    body = doc('<feed title="fine"/>') if method == "PUT" else None
    r = await call(
        gw, method, things.feed, body, If_Unmodified_Since=first.headers["Last-Modified"]
    )
    assert r.status == 200


async def test_H5_either_failing_check_is_enough_for_412(gw: Gateway, things: Things) -> None:
    first = await call(gw, "GET", things.feed)
    stale_date = http_date(first.modified - 3600)
    r = await call(gw, "DELETE", things.feed, If_Match=first.etag, If_Unmodified_Since=stale_date)
    r.assert_text_error(412)
    r = await call(
        gw,
        "DELETE",
        things.feed,
        If_Match='"stale"',
        If_Unmodified_Since=first.headers["Last-Modified"],
    )
    r.assert_text_error(412)
    assert (await call(gw, "GET", things.feed)).status == 200


async def test_H5_delete_message_with_stale_if_match_is_412(gw: Gateway, things: Things) -> None:
    staged = await call(gw, "POST", "/restms/feed/cond", b"c", content_type="text/plain")
    body = doc(f'<message address="h5"><content href="{staged.headers["Location"]}"/></message>')
    assert (await call(gw, "POST", "/restms/feed/cond", body)).status == 200
    listing = await call(gw, "GET", things.pipe)
    href = next(m.get("href") for m in listing.top() if m.get("address") == "h5")
    first = await call(gw, "GET", href)
    content = next(c.get("href") for c in first.top() if c.get("href"))
    assert (await call(gw, "DELETE", content)).status == 200
    changed = await call(gw, "GET", href)
    assert changed.etag != first.etag
    r = await call(gw, "DELETE", href, If_Match=first.etag)
    r.assert_text_error(412)
    assert (await call(gw, "GET", href)).status == 200
    assert (await call(gw, "DELETE", href, If_Match=changed.etag)).status == 200


async def test_H5_delete_message_with_older_if_unmodified_since_is_412(
    gw: Gateway, things: Things
) -> None:
    first = await call(gw, "GET", things.message)
    old = http_date(first.modified - 3600)
    (await call(gw, "DELETE", things.message, If_Unmodified_Since=old)).assert_text_error(412)
    assert (await call(gw, "GET", things.message)).status == 200


async def test_H4_conditional_put_on_deleted_feed_is_404(gw: Gateway, things: Things) -> None:
    first = await call(gw, "GET", things.feed)
    assert (await call(gw, "DELETE", things.feed)).status == 200
    r = await call(gw, "PUT", things.feed, doc('<feed title="x"/>'), If_Match=first.etag)
    r.assert_text_error(404)


# ---------------------------------------------------------------- H6 ETag per media type
@pytest.mark.parametrize("kind", KINDS)
async def test_H6_G15_xml_json_and_text_xml_have_different_etags(
    gw: Gateway, things: Things, kind: str
) -> None:
    tags = {}
    for accept in (XML, JSON, "text/xml"):
        r = await call(gw, "GET", things.uri(kind), Accept=accept)
        assert r.status == 200
        tags[accept] = r.etag
    assert len(set(tags.values())) == 3, tags


async def test_H6_xml_etag_does_not_validate_the_json_form(gw: Gateway, things: Things) -> None:
    xml = await call(gw, "GET", things.pipe, Accept=XML)
    r = await call(gw, "GET", things.pipe, Accept=JSON, If_None_Match=xml.etag)
    assert r.status == 200
    assert "pipe" in json.loads(r.body)["restms"]
    as_json = await call(gw, "GET", things.pipe, Accept=JSON)
    r = await call(gw, "GET", things.pipe, Accept=JSON, If_None_Match=as_json.etag)
    assert r.status == 304


# ---------------------------------------------------------------- H7, H8
async def test_H7_pipe_etag_changes_when_a_message_arrives(gw: Gateway, things: Things) -> None:
    before = await call(gw, "GET", things.pipe)
    await publish_to(gw, things.pipe_name)
    after = await call(gw, "GET", things.pipe)
    assert after.etag != before.etag
    assert after.modified >= before.modified
    assert (await call(gw, "GET", things.pipe, If_None_Match=before.etag)).status == 200


async def test_H7_pipe_etag_changes_when_a_message_is_deleted(gw: Gateway, things: Things) -> None:
    before = await call(gw, "GET", things.pipe)
    assert (await call(gw, "DELETE", things.message)).status == 200
    after = await call(gw, "GET", things.pipe)
    assert after.etag != before.etag


async def test_H7_pipe_etag_changes_when_joins_come_and_go(gw: Gateway, things: Things) -> None:
    first = await call(gw, "GET", things.pipe)
    assert (await call(gw, "POST", DOMAIN, doc('<feed name="h7" type="topic"/>'))).status == 201
    join = await call(gw, "POST", things.pipe, doc('<join address="#" feed="/restms/feed/h7"/>'))
    assert join.status == 201
    second = await call(gw, "GET", things.pipe)
    assert second.etag != first.etag
    assert (await call(gw, "DELETE", join.headers["Location"])).status == 200
    third = await call(gw, "GET", things.pipe)
    assert third.etag not in (first.etag, second.etag)


@pytest.mark.parametrize("kind", ["pipe", "message"])
async def test_H8_pipes_and_messages_are_no_cache(gw: Gateway, things: Things, kind: str) -> None:
    r = await call(gw, "GET", things.uri(kind))
    assert "no-cache" in r.headers.get("Cache-Control", "")


# ---------------------------------------------------------------- H9-H11 evented GETs
async def test_H9_when_none_match_waits_for_a_pipe_change(gw: Gateway, things: Things) -> None:
    current = await call(gw, "GET", things.pipe)
    task = asyncio.create_task(call(gw, "GET", things.pipe, When_None_Match=current.etag))
    await held(task)
    await publish_to(gw, things.pipe_name, "wake")
    r = await asyncio.wait_for(task, 2)
    assert r.status == 200
    assert r.etag != current.etag
    messages = [m for m in r.top() if etree.QName(m).localname == "message"]
    assert len(messages) == 3  # the fixture's message, the new one, the asynclet


async def test_H9_when_none_match_on_domain_wakes_when_a_public_feed_appears(
    gw: Gateway,
) -> None:
    current = await call(gw, "GET", DOMAIN)
    task = asyncio.create_task(call(gw, "GET", DOMAIN, When_None_Match=current.etag))
    await held(task)
    assert (await call(gw, "POST", DOMAIN, doc('<feed name="h9" type="topic"/>'))).status == 201
    r = await asyncio.wait_for(task, 2)
    assert r.status == 200
    assert "h9" in [f.get("name") for f in r.top()]


async def test_H9_when_none_match_on_feed_wakes_on_put(gw: Gateway, things: Things) -> None:
    current = await call(gw, "GET", things.feed, Accept=JSON)
    task = asyncio.create_task(
        call(gw, "GET", things.feed, Accept=JSON, When_None_Match=current.etag)
    )
    await held(task)
    assert (await call(gw, "PUT", things.feed, doc('<feed title="new"/>'))).status == 200
    r = await asyncio.wait_for(task, 2)
    assert r.status == 200
    assert json.loads(r.body)["restms"]["feed"][0]["title"] == "new"


async def test_H11_when_none_match_already_different_answers_at_once(
    gw: Gateway, things: Things
) -> None:
    r = await asyncio.wait_for(call(gw, "GET", things.pipe, When_None_Match='"old-tag"'), 2)
    assert r.status == 200


async def test_H11_when_modified_after_in_the_past_answers_at_once(
    gw: Gateway, things: Things
) -> None:
    current = await call(gw, "GET", things.pipe)
    past = http_date(current.modified - 60)
    r = await asyncio.wait_for(call(gw, "GET", things.pipe, When_Modified_After=past), 2)
    assert r.status == 200
    assert r.etag == current.etag


async def test_H10_when_modified_after_waits_for_a_later_change(
    gw: Gateway, things: Things
) -> None:
    current = await call(gw, "GET", things.pipe)
    task = asyncio.create_task(
        call(gw, "GET", things.pipe, When_Modified_After=current.headers["Last-Modified"])
    )
    await held(task)
    # Dates have one-second resolution (H2): a change in the same second is not "later".
    await asyncio.sleep(max(0.0, current.modified + 1.02 - time.time()))
    assert not task.done()
    await publish_to(gw, things.pipe_name, "later")
    r = await asyncio.wait_for(task, 2)
    assert r.status == 200
    assert r.modified > current.modified


async def test_H10_with_both_headers_a_held_date_alone_does_not_release(
    gw: Gateway, things: Things
) -> None:
    current = await call(gw, "GET", things.pipe)
    task = asyncio.create_task(
        call(
            gw,
            "GET",
            things.pipe,
            When_None_Match=current.etag,
            When_Modified_After=http_date(current.modified - 60),
        )
    )
    await held(task)
    await publish_to(gw, things.pipe_name)
    r = await asyncio.wait_for(task, 2)
    assert r.status == 200
    assert r.etag != current.etag


async def test_H10_with_both_headers_a_changed_etag_alone_does_not_release(
    make_gateway: MakeGateway,
) -> None:
    gw = await make_gateway(max_wait=0.3)
    pipe = await call(gw, "POST", DOMAIN, doc("<pipe/>"))
    future = http_date(time.time() + 3600)
    task = asyncio.create_task(
        call(
            gw,
            "GET",
            pipe.headers["Location"],
            When_None_Match='"some-old-tag"',
            When_Modified_After=future,
        )
    )
    await asyncio.sleep(0.05)
    await publish_to(gw, pipe.top().get("name"))
    r = await asyncio.wait_for(task, 2)
    r.assert_text_error(503)


async def test_H11_resource_deleted_during_wait_gives_404(gw: Gateway, things: Things) -> None:
    current = await call(gw, "GET", things.pipe)
    task = asyncio.create_task(call(gw, "GET", things.pipe, When_None_Match=current.etag))
    await held(task)
    assert (await call(gw, "DELETE", things.pipe)).status == 200
    r = await asyncio.wait_for(task, 2)
    r.assert_text_error(404)


async def test_H11_feed_deleted_during_wait_gives_404(gw: Gateway, things: Things) -> None:
    current = await call(gw, "GET", things.feed)
    task = asyncio.create_task(call(gw, "GET", things.feed, When_None_Match=current.etag))
    await held(task)
    assert (await call(gw, "DELETE", things.feed)).status == 200
    r = await asyncio.wait_for(task, 2)
    r.assert_text_error(404)


@pytest.mark.parametrize("header", ["When-None-Match", "When-Modified-After"])
async def test_H11_A9_expired_wait_is_503_with_retry_after_0(
    make_gateway: MakeGateway, header: str
) -> None:
    gw = await make_gateway(max_wait=0.3)
    current = await call(gw, "GET", DOMAIN)
    value = current.etag if header == "When-None-Match" else current.headers["Last-Modified"]
    started = time.monotonic()
    r = await asyncio.wait_for(call(gw, "GET", DOMAIN, **{header.replace("-", "_"): value}), 3)
    assert time.monotonic() - started >= 0.25
    r.assert_text_error(503)
    assert r.headers["Retry-After"] == "0"


async def test_H11_A9_expired_wait_is_500_in_compatibility_mode(
    make_gateway: MakeGateway,
) -> None:
    gw = await make_gateway(max_wait=0.3, expired_wait_status=500)
    pipe = await call(gw, "POST", DOMAIN, doc("<pipe/>"))
    r = await asyncio.wait_for(
        call(gw, "GET", pipe.headers["Location"], When_None_Match=pipe.etag), 3
    )
    r.assert_text_error(500)


async def test_Q34_if_none_match_is_evaluated_before_when_none_match(
    gw: Gateway, things: Things
) -> None:
    current = await call(gw, "GET", things.pipe)
    r = await asyncio.wait_for(
        call(gw, "GET", things.pipe, If_None_Match=current.etag, When_None_Match=current.etag),
        2,
    )
    assert r.status == 304
    assert r.body == b""


async def test_H1_H3_contents_carry_validators_and_answer_304(gw: Gateway) -> None:
    """Staged and delivered contents have an ETag and Last-Modified, and honour If-None-Match."""
    async with gw.http.post(
        "/restms/domain/default", data=b"<restms><pipe/></restms>", headers={"Content-Type": XML}
    ) as r:
        pipe_name = r.headers["Location"].rsplit("/", 1)[1]
    async with gw.http.post(
        "/restms/feed/default", data=b"\x00\x01bytes", headers={"Content-Type": "application/x-b"}
    ) as r:
        staged = r.headers["Location"]
    async with gw.http.get(staged) as r:
        assert r.status == 200
        tag, modified = r.headers["ETag"], r.headers["Last-Modified"]
    async with gw.http.get(staged, headers={"If-None-Match": tag}) as r:
        assert r.status == 304
        assert await r.read() == b""
    async with gw.http.get(staged, headers={"If-Modified-Since": modified}) as r:
        assert r.status == 304
    body = f'<restms><message address="{pipe_name}"><content href="{staged}"/></message></restms>'
    async with gw.http.post("/restms/feed/default", data=body, headers={"Content-Type": XML}) as r:
        assert r.status == 200
    async with gw.http.get(f"/restms/resource/{pipe_name}.1.0") as r:
        assert r.status == 200
        assert await r.read() == b"\x00\x01bytes"
        delivered_tag = r.headers["ETag"]
        assert delivered_tag != tag  # each delivered copy is its own resource (D6)
    async with gw.http.get(
        f"/restms/resource/{pipe_name}.1.0", headers={"If-None-Match": delivered_tag}
    ) as r:
        assert r.status == 304
