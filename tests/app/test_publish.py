"""Publication: staging, publishing, reuse, foreign contents, atomic requests (digest §5).

A feed ``pub`` (fanout) with one pipe joined to it is set up for each test, so
"routes nothing" can be checked by looking at the pipe. Delivery details (asynclets,
acknowledgement, contents at delivery) are covered by ``test_delivery.py``.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json

import pytest
from lxml import etree
from yarl import URL

from tests.app.xmlapi import call, doc
from tests.conftest import Gateway, MakeGateway

XML = "application/restms+xml"
JSON = "application/restms+json"
DOMAIN = "/restms/domain/default"
DEFAULT_FEED = "/restms/feed/default"
FEED = "/restms/feed/pub"


def message(address: str = "a", *hrefs: str, text: str | None = None) -> str:
    parts = "".join(f'<content href="{h}"/>' for h in hrefs)
    if text is not None:
        parts += f'<content type="text/plain" encoding="plain">{text}</content>'
    return f'<message address="{address}">{parts}</message>'


@dataclasses.dataclass
class Setup:
    pipe: str
    pipe_name: str

    async def held(self, gw: Gateway) -> list[etree._Element]:
        """The messages in the pipe (the asynclet left out)."""
        r = await call(gw, "GET", self.pipe)
        return [
            m for m in r.top() if etree.QName(m).localname == "message" and m.get("async") != "1"
        ]


@pytest.fixture
async def setup(gw: Gateway) -> Setup:
    assert (await call(gw, "POST", DOMAIN, doc('<feed name="pub" type="fanout"/>'))).status == 201
    assert (await call(gw, "POST", DOMAIN, doc('<feed name="other" type="fanout"/>'))).status == 201
    pipe = await call(gw, "POST", DOMAIN, doc("<pipe/>"))
    join = await call(gw, "POST", pipe.headers["Location"], doc(f'<join feed="{FEED}"/>'))
    assert (pipe.status, join.status) == (201, 201)
    return Setup(pipe=pipe.headers["Location"], pipe_name=pipe.top().get("name"))


async def stage(
    gw: Gateway, data: bytes = b"payload", content_type: str = "text/plain", feed: str = FEED
) -> str:
    r = await call(gw, "POST", feed, data, content_type=content_type)
    assert r.status == 201, r.body
    return r.headers["Location"]


# ---------------------------------------------------------------- M1-M4 staging
@pytest.mark.parametrize(
    ("data", "content_type"),
    [
        (b"\x89PNG\r\n\x1a\n\x00binary", "image/png"),
        (b"hello", "text/plain; charset=utf-8"),
        (b'{"not": "a restms document"}', "application/vnd.example+json"),
        (b"", "application/octet-stream"),
    ],
)
async def test_M1_M4_opaque_post_is_staged_with_201_and_served_back_exactly(
    gw: Gateway, setup: Setup, data: bytes, content_type: str
) -> None:
    r = await call(gw, "POST", FEED, data, content_type=content_type)
    assert r.status == 201
    assert r.headers["Location"].startswith(gw.uri("/restms/resource/"))
    assert "Content-Type" not in r.headers
    assert r.body == b""
    assert r.headers.get("Content-Length", "0") == "0"
    got = await call(gw, "GET", r.headers["Location"])
    assert got.status == 200
    assert got.body == data
    assert got.headers["Content-Type"] == content_type
    assert await setup.held(gw) == []


async def test_M1_staging_works_on_private_feeds(gw: Gateway) -> None:
    feed = await call(gw, "POST", DOMAIN, doc('<feed type="direct"/>'))
    staged = await stage(gw, b"private", "text/csv", feed=feed.headers["Location"])
    got = await call(gw, "GET", staged)
    assert (got.status, got.body) == (200, b"private")


async def test_M1_every_staging_post_gets_its_own_uri(gw: Gateway, setup: Setup) -> None:
    first = await stage(gw, b"same")
    second = await stage(gw, b"same")
    assert first != second


@pytest.mark.parametrize("content_type", [XML, JSON, "text/xml", f"{XML}; charset=utf-8"])
async def test_M2_structured_post_to_a_feed_publishes(
    gw: Gateway, setup: Setup, content_type: str
) -> None:
    body = (
        json.dumps({"restms": {"message": [{"address": "m2"}]}})
        if "json" in content_type
        else doc(message("m2"))
    )
    r = await call(gw, "POST", FEED, body, content_type=content_type)
    assert r.status == 200, r.body
    held = await setup.held(gw)
    assert [m.get("address") for m in held] == ["m2"]


@pytest.mark.parametrize(
    "body",
    [
        doc(message("m3")).encode(),
        b'<?xml version="1.0"?>' + doc(message("m3")).encode(),
        b"  \n\t" + doc(message("m3")).encode(),
        json.dumps({"restms": {"message": [{"address": "m3"}]}}).encode(),
    ],
)
@pytest.mark.parametrize("header", ["empty", "missing"])
async def test_M3_structured_body_without_content_type_is_sniffed_as_messages(
    gw: Gateway, setup: Setup, body: bytes, header: str
) -> None:
    ctype = "" if header == "empty" else None
    r = await call(gw, "POST", FEED, body, content_type=ctype)
    assert r.status == 200, r.body
    assert [m.get("address") for m in await setup.held(gw)] == ["m3"]


@pytest.mark.parametrize("header", ["empty", "missing"])
async def test_M3_L17_opaque_body_without_content_type_is_staged_as_octet_stream(
    gw: Gateway, setup: Setup, header: str
) -> None:
    ctype = "" if header == "empty" else None
    r = await call(gw, "POST", FEED, b"just some bytes", content_type=ctype)
    assert r.status == 201
    got = await call(gw, "GET", r.headers["Location"])
    assert got.body == b"just some bytes"
    assert got.headers["Content-Type"] == "application/octet-stream"


async def test_M4_staged_content_can_be_deleted(gw: Gateway, setup: Setup) -> None:
    staged = await stage(gw)
    assert (await call(gw, "DELETE", staged)).status == 200
    (await call(gw, "GET", staged)).assert_text_error(404)
    r = await call(gw, "POST", FEED, doc(message("a", staged)))
    r.assert_text_error(404)
    assert await setup.held(gw) == []


async def test_M4_staged_content_expires_after_its_ttl(make_gateway: MakeGateway) -> None:
    gw = await make_gateway(staged_ttl=0.1, sweep_interval=0.05)
    staged = await stage(gw, feed=DEFAULT_FEED)
    assert (await call(gw, "GET", staged)).status == 200
    await asyncio.sleep(0.4)
    (await call(gw, "GET", staged)).assert_text_error(404)


async def test_M4_staging_on_a_missing_feed_is_404(gw: Gateway) -> None:
    r = await call(gw, "POST", "/restms/feed/nowhere", b"x", content_type="text/plain")
    r.assert_text_error(404)


# ---------------------------------------------------------------- M5-M7 publishing
async def test_M5_F18_several_messages_give_one_count_each_in_order(
    gw: Gateway, setup: Setup
) -> None:
    body = doc(message(setup.pipe_name, text="one") + message("nobody") + message(setup.pipe_name))
    r = await call(gw, "POST", DEFAULT_FEED, body)
    assert r.status == 200
    assert r.counts() == ["1", "0", "1"]
    assert all(etree.QName(el).localname == "message" for el in r.elements())


async def test_M5_message_with_headers_properties_and_mixed_contents(
    gw: Gateway, setup: Setup
) -> None:
    staged = await stage(gw, b"linked-bytes", "application/x-thing")
    body = doc(
        '<message address="mix" message_id="id-1" reply_to="back" priority="5">'
        '<header name="h1" value="v1"/><header name="h2" value="v2"/>'
        f'<content href="{staged}"/>'
        '<content type="text/html" encoding="plain">&lt;b&gt;hi&lt;/b&gt;</content>'
        "</message>"
    )
    r = await call(gw, "POST", FEED, body)
    assert r.status == 200, r.body
    (held,) = await setup.held(gw)
    got = (await call(gw, "GET", held.get("href"))).top()
    assert (got.get("address"), got.get("message_id"), got.get("reply_to")) == (
        "mix",
        "id-1",
        "back",
    )
    assert got.get("priority") == "5"
    headers = [(h.get("name"), h.get("value")) for h in got if h.get("name")]
    assert headers == [("h1", "v1"), ("h2", "v2")]
    contents = [c for c in got if etree.QName(c).localname == "content"]
    assert len(contents) == 2
    linked = await call(gw, "GET", contents[0].get("href"))
    assert (linked.body, linked.headers["Content-Type"]) == (b"linked-bytes", "application/x-thing")
    assert (contents[1].get("type"), contents[1].text) == ("text/html", "<b>hi</b>")


@pytest.mark.parametrize("encoding", ["gzip", "base32", "PLAIN", "quoted-printable"])
async def test_M6_unknown_encoding_is_400(gw: Gateway, setup: Setup, encoding: str) -> None:
    body = doc(f'<message address="a"><content encoding="{encoding}">x</content></message>')
    (await call(gw, "POST", FEED, body)).assert_text_error(400)
    assert await setup.held(gw) == []


@pytest.mark.parametrize("value", ["!!!not base64!!!", "abc", "ab=c", "====", "a\u00e9bc"])
async def test_M6_invalid_base64_is_400(gw: Gateway, setup: Setup, value: str) -> None:
    body = doc(f'<message address="a"><content encoding="base64">{value}</content></message>')
    (await call(gw, "POST", FEED, body)).assert_text_error(400)
    assert await setup.held(gw) == []


async def test_M6_L19_base64_with_line_breaks_and_indentation_is_accepted(
    gw: Gateway, setup: Setup
) -> None:
    raw = bytes(range(256)) * 2
    encoded = base64.encodebytes(raw).decode()  # 76-column lines
    indented = "\n".join("        " + line for line in encoded.splitlines())
    body = doc(
        '<message address="b64"><content type="application/octet-stream" encoding="base64">'
        f"\n{indented}\n    </content></message>"
    )
    r = await call(gw, "POST", FEED, body)
    assert r.status == 200, r.body
    (held,) = await setup.held(gw)
    got = (await call(gw, "GET", held.get("href"))).top()
    content = next(c for c in got if etree.QName(c).localname == "content")
    if content.get("href"):
        data = (await call(gw, "GET", content.get("href"))).body
    else:
        assert content.get("encoding") == "base64"
        data = base64.b64decode("".join((content.text or "").split()))
    assert data == raw


async def test_M6_embedded_content_defaults_to_plain_text(gw: Gateway, setup: Setup) -> None:
    body = doc('<message address="d"><content>just text</content></message>')
    assert (await call(gw, "POST", FEED, body)).status == 200
    (held,) = await setup.held(gw)
    got = (await call(gw, "GET", held.get("href"))).top()
    content = next(c for c in got if etree.QName(c).localname == "content")
    assert content.get("type") == "text/plain"
    assert content.get("encoding") == "plain"
    assert content.text == "just text"


@pytest.mark.parametrize("form", ["absolute", "path"])
async def test_M7_published_staged_content_is_used_up_and_delivered(
    gw: Gateway, setup: Setup, form: str
) -> None:
    staged = await stage(gw, b"\x00\x01\x02", "application/x-raw")
    href = staged if form == "absolute" else URL(staged).raw_path
    r = await call(gw, "POST", FEED, doc(message("m7", href)))
    assert r.status == 200, r.body
    (await call(gw, "GET", staged)).assert_text_error(404)
    (held,) = await setup.held(gw)
    got = (await call(gw, "GET", held.get("href"))).top()
    (content,) = [c for c in got if etree.QName(c).localname == "content"]
    delivered = await call(gw, "GET", content.get("href"))
    assert delivered.body == b"\x00\x01\x02"
    assert delivered.headers["Content-Type"] == "application/x-raw"


# ---------------------------------------------------------------- M8-M10 references
async def test_M8_reusing_a_published_staged_content_is_404_and_routes_nothing(
    gw: Gateway, setup: Setup
) -> None:
    staged = await stage(gw)
    assert (await call(gw, "POST", FEED, doc(message("first", staged)))).status == 200
    r = await call(gw, "POST", FEED, doc(message("second", staged)))
    r.assert_text_error(404)
    assert [m.get("address") for m in await setup.held(gw)] == ["first"]


async def test_M8_same_staged_content_twice_in_one_request_is_404_and_not_used_up(
    gw: Gateway, setup: Setup
) -> None:
    staged = await stage(gw)
    r = await call(gw, "POST", FEED, doc(message("a", staged) + message("b", staged)))
    r.assert_text_error(404)
    r = await call(gw, "POST", FEED, doc(message("c", staged, staged)))
    r.assert_text_error(404)
    assert await setup.held(gw) == []
    assert (await call(gw, "GET", staged)).status == 200


@pytest.mark.parametrize(
    "href",
    [
        "/restms/resource/never-staged",
        "/restms/feed/pub",
        "/restms/domain/default",
        "http://127.0.0.1:1/restms/resource/nothing",
    ],
)
async def test_M8_reference_to_something_that_is_no_staged_content_is_404(
    gw: Gateway, setup: Setup, href: str
) -> None:
    (await call(gw, "POST", FEED, doc(message("a", href)))).assert_text_error(404)
    assert await setup.held(gw) == []


async def test_M8_reference_to_a_pipe_or_message_is_404(gw: Gateway, setup: Setup) -> None:
    assert (await call(gw, "POST", FEED, doc(message("x")))).status == 200
    (held,) = await setup.held(gw)
    for href in (setup.pipe, held.get("href")):
        (await call(gw, "POST", FEED, doc(message("a", href)))).assert_text_error(404)
    assert len(await setup.held(gw)) == 1


async def test_M9_staged_content_of_another_feed_is_403_and_routes_nothing(
    gw: Gateway, setup: Setup
) -> None:
    foreign = await stage(gw, feed="/restms/feed/other")
    r = await call(gw, "POST", FEED, doc(message("a", foreign)))
    r.assert_text_error(403)
    assert await setup.held(gw) == []
    assert (await call(gw, "GET", foreign)).status == 200


async def test_M9_private_feed_staged_content_is_foreign_to_public_feed(
    gw: Gateway, setup: Setup
) -> None:
    private = await call(gw, "POST", DOMAIN, doc('<feed type="fanout"/>'))
    foreign = await stage(gw, feed=private.headers["Location"])
    (await call(gw, "POST", FEED, doc(message("a", foreign)))).assert_text_error(403)
    ok = await call(gw, "POST", private.headers["Location"], doc(message("a", foreign)))
    assert ok.status == 200


async def test_M10_good_and_foreign_reference_is_403_and_good_one_is_not_used(
    gw: Gateway, setup: Setup
) -> None:
    good = await stage(gw, b"good")
    foreign = await stage(gw, feed="/restms/feed/other")
    r = await call(gw, "POST", FEED, doc(message("a", good) + message("b", foreign)))
    r.assert_text_error(403)
    kept = await call(gw, "GET", good)
    assert (kept.status, kept.body) == (200, b"good")
    assert await setup.held(gw) == []
    # The same good content still publishes afterwards.
    assert (await call(gw, "POST", FEED, doc(message("a", good)))).status == 200


async def test_M10_good_and_foreign_in_one_message_is_403(gw: Gateway, setup: Setup) -> None:
    good = await stage(gw)
    foreign = await stage(gw, feed="/restms/feed/other")
    r = await call(gw, "POST", FEED, doc(message("a", good, foreign)))
    r.assert_text_error(403)
    assert (await call(gw, "GET", good)).status == 200


async def test_M10_earlier_messages_are_not_routed_when_a_later_one_fails(
    gw: Gateway, setup: Setup
) -> None:
    body = doc(message("ok", text="fine") + message("bad", "/restms/resource/missing"))
    (await call(gw, "POST", FEED, body)).assert_text_error(404)
    assert await setup.held(gw) == []


@pytest.mark.parametrize(
    ("order", "expected"), [(("foreign", "missing"), 403), (("missing", "foreign"), 404)]
)
async def test_M10_first_failing_message_in_document_order_decides(
    gw: Gateway, setup: Setup, order: tuple[str, str], expected: int
) -> None:
    refs = {
        "foreign": await stage(gw, feed="/restms/feed/other"),
        "missing": gw.uri("/restms/resource/gone-or-never-there"),
    }
    body = doc("".join(message("x", refs[kind]) for kind in order))
    (await call(gw, "POST", FEED, body)).assert_text_error(expected)
    assert (await call(gw, "GET", refs["foreign"])).status == 200


async def test_M10_bad_embedded_content_in_a_later_message_routes_nothing(
    gw: Gateway, setup: Setup
) -> None:
    good = await stage(gw)
    body = doc(
        message("ok", good)
        + '<message address="bad"><content encoding="base64">@@@</content></message>'
    )
    (await call(gw, "POST", FEED, body)).assert_text_error(400)
    assert await setup.held(gw) == []
    assert (await call(gw, "GET", good)).status == 200


# ---------------------------------------------------------------- M11, M12, F18-F20
async def test_M11_publish_is_200_without_location(gw: Gateway, setup: Setup) -> None:
    r = await call(gw, "POST", FEED, doc(message("a")))
    assert r.status == 200
    assert "Location" not in r.headers
    assert r.headers["Content-Type"].split(";")[0] in (XML, "text/xml")


@pytest.mark.parametrize("feed", ["/restms/feed/missing", "/restms/resource/missing"])
async def test_M12_publish_to_missing_feed_is_404(gw: Gateway, feed: str) -> None:
    (await call(gw, "POST", feed, doc(message("a")))).assert_text_error(404)


async def test_M12_publish_to_deleted_feed_is_404(gw: Gateway, setup: Setup) -> None:
    assert (await call(gw, "DELETE", FEED)).status == 200
    (await call(gw, "POST", FEED, doc(message("a")))).assert_text_error(404)
    r = await call(gw, "POST", FEED, b"x", content_type="text/plain")
    r.assert_text_error(404)


@pytest.mark.parametrize(
    "body",
    [
        doc(""),
        doc('<feed name="x"/>'),
        doc('<content type="text/plain">x</content>'),
        '{"restms":{}}',
    ],
)
async def test_M12_publish_without_message_element_is_400(
    gw: Gateway, setup: Setup, body: str
) -> None:
    ctype = JSON if body.startswith("{") else XML
    (await call(gw, "POST", FEED, body, content_type=ctype)).assert_text_error(400)
    assert await setup.held(gw) == []


async def test_F18_F19_default_feed_reports_count_of_matching_joins(
    gw: Gateway, setup: Setup
) -> None:
    hit = await call(gw, "POST", DEFAULT_FEED, doc(message(setup.pipe_name)))
    assert hit.status == 200
    assert hit.counts() == ["1"]
    miss = await call(gw, "POST", DEFAULT_FEED, doc(message("nobody")))
    assert miss.status == 200
    assert miss.counts() == ["0"]
    as_json = await call(
        gw,
        "POST",
        DEFAULT_FEED,
        json.dumps({"restms": {"message": [{"address": setup.pipe_name}]}}),
        content_type=JSON,
    )
    assert json.loads(as_json.body) == {"restms": {"message": [{"count": "1"}]}}


async def test_F20_amqp9_feed_replies_with_count_or_empty_document(
    gw: Gateway, setup: Setup
) -> None:
    second = await call(gw, "POST", DOMAIN, doc("<pipe/>"))
    join = await call(gw, "POST", second.headers["Location"], doc(f'<join feed="{FEED}"/>'))
    assert join.status == 201
    r = await call(gw, "POST", FEED, doc(message("any")))
    assert r.status == 200
    assert r.counts() in ([], ["2"])


async def test_M5_content_count_cap_is_413_or_400(make_gateway: MakeGateway) -> None:
    gw = await make_gateway(max_contents_per_message=1)
    body = doc('<message address="a"><content>one</content><content>two</content></message>')
    r = await call(gw, "POST", DEFAULT_FEED, body)
    assert r.status in (400, 413)
    assert r.headers["Content-Type"].startswith("text/plain")


async def test_M5_message_count_cap_is_413_or_400(make_gateway: MakeGateway) -> None:
    gw = await make_gateway(max_messages_per_request=2)
    r = await call(gw, "POST", DEFAULT_FEED, doc(message("a") * 3))
    assert r.status in (400, 413)
    assert r.headers["Content-Type"].startswith("text/plain")
    ok = await call(gw, "POST", DEFAULT_FEED, doc(message("a") * 2))
    assert ok.counts() == ["0", "0"]
