"""Documents and negotiation over HTTP (digest §2: G1-G15, J1-J8).

The codec itself has table-driven unit tests; these check what a client actually
sees: the root and namespace, hrefs on children, what the domain lists, which
media type a reply takes for a given ``Accept``/``Content-Type``, and that JSON
replies keep the J1-J3 shape for every document the server sends.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from lxml import etree

from tests.app.xmlapi import Reply, call, doc, local
from tests.conftest import Gateway, MakeGateway

XML = "application/restms+xml"
JSON = "application/restms+json"
NS = "http://www.restms.org/schema/restms"
IMATIX_NS = "http://www.imatix.com/schema/restms"
DOMAIN = "/restms/domain/default"
DEFAULT_FEED = "/restms/feed/default"
XML_TYPES = (XML, "text/xml")


def jdoc(tag: str, **attrs: Any) -> str:
    return json.dumps({"restms": {tag: [attrs]}})


def children(el: etree._Element, tag: str) -> list[etree._Element]:
    return [c for c in el if local(c) == tag]


def assert_json_shape(data: Any) -> None:
    """J1-J3: one "restms" key; child types map to arrays of objects; properties are strings."""
    assert isinstance(data, dict)
    assert list(data) == ["restms"]
    _check_object(data["restms"])


def _check_object(obj: Any) -> None:
    assert isinstance(obj, dict), obj
    for key, value in obj.items():
        if isinstance(value, list):
            for item in value:
                _check_object(item)
        else:
            assert isinstance(value, str), (key, value)


async def new_pipe(gw: Gateway) -> Reply:
    r = await call(gw, "POST", DOMAIN, doc("<pipe/>"))
    assert r.status == 201
    return r


async def deliver_one(gw: Gateway, body: str, content_type: str = XML) -> str:
    """Make a pipe, publish ``body`` (with {name} filled) to the default feed; message URI."""
    pipe = await new_pipe(gw)
    name = pipe.top().get("name")
    published = await call(
        gw, "POST", DEFAULT_FEED, body.replace("{name}", name), content_type=content_type
    )
    assert published.status == 200, published.body
    listing = await call(gw, "GET", pipe.headers["Location"])
    return children(listing.top(), "message")[0].get("href")


# ---------------------------------------------------------------- G1-G7
async def test_G1_G3_reply_root_is_restms_in_the_restms_namespace(gw: Gateway) -> None:
    r = await call(gw, "GET", DOMAIN)
    root = r.root()
    assert root.tag == f"{{{NS}}}restms"
    assert root.nsmap == {None: NS}
    assert all(c.tag.startswith(f"{{{NS}}}") for c in root.iter() if isinstance(c.tag, str))


async def test_G2_properties_are_attributes_not_child_elements(gw: Gateway) -> None:
    r = await call(gw, "POST", DOMAIN, doc('<feed name="g2" type="topic" title="T"/>'))
    feed = r.top()
    assert len(feed) == 0
    assert (feed.get("name"), feed.get("type"), feed.get("title")) == ("g2", "topic", "T")


@pytest.mark.parametrize("ns", [NS, IMATIX_NS, None, "urn:anything"])
async def test_G3_L1_any_namespace_or_none_is_accepted(gw: Gateway, ns: str | None) -> None:
    r = await call(gw, "POST", DOMAIN, doc('<feed name="g3" type="fanout"/>', ns))
    assert r.status in (200, 201), r.body
    assert r.root().tag == f"{{{NS}}}restms"
    pipe = await call(gw, "POST", DOMAIN, doc("<pipe/>", ns))
    assert pipe.status == 201
    join = await call(gw, "POST", pipe.headers["Location"], doc('<join feed="/restms/feed/g3"/>'))
    assert join.status == 201


async def test_G3_prefixed_namespace_is_matched_on_local_names(gw: Gateway) -> None:
    body = f'<r:restms xmlns:r="{NS}"><r:feed r:name="g3p" name="g3p" type="direct"/></r:restms>'
    r = await call(gw, "POST", DOMAIN, body)
    assert r.status == 201, r.body
    assert r.headers["Location"].endswith("/restms/feed/g3p")


async def test_G4_child_elements_carry_href(gw: Gateway) -> None:
    domain = (await call(gw, "GET", DOMAIN)).top()
    for child in domain:
        assert child.get("href"), etree.tostring(child)
    pipe = (await new_pipe(gw)).top()
    assert len(pipe) >= 2
    for child in pipe:
        assert child.get("href", "").startswith("http://"), etree.tostring(child)


async def test_G5_J6_special_characters_round_trip_xml_json_xml(gw: Gateway) -> None:
    title = "He said \"hi\" & <bye> 'ok'"
    escaped = title.replace("&", "&amp;").replace("<", "&lt;").replace('"', "&quot;")
    r = await call(gw, "POST", DOMAIN, doc(f'<feed name="g5" type="topic" title="{escaped}"/>'))
    assert r.status == 201
    assert r.top().get("title") == title
    as_json = await call(gw, "GET", "/restms/feed/g5", Accept=JSON)
    feed = as_json.json()["restms"]["feed"][0]
    assert feed["title"] == title
    feed["title"] = title + "!"
    put = await call(
        gw, "PUT", "/restms/feed/g5", json.dumps({"restms": {"feed": [feed]}}), content_type=JSON
    )
    assert put.status == 200, put.body
    back = await call(gw, "GET", "/restms/feed/g5", Accept=XML)
    assert back.top().get("title") == title + "!"
    assert back.top().get("type") == "topic"


async def test_G6_unknown_elements_and_attributes_are_ignored_and_not_echoed(
    gw: Gateway,
) -> None:
    body = doc('<feed name="g6" type="fanout" colour="red"><gadget size="3"/></feed><widget/>')
    r = await call(gw, "POST", DOMAIN, body)
    assert r.status == 201, r.body
    got = await call(gw, "GET", "/restms/feed/g6")
    assert b"colour" not in got.body
    assert b"gadget" not in got.body
    assert b"widget" not in got.body
    assert len(got.top()) == 0


async def test_G6_unknown_message_elements_do_not_reject_a_publish(gw: Gateway) -> None:
    href = await deliver_one(
        gw,
        doc(
            '<message address="{name}" flavour="x"><sticker/>'
            '<content type="text/plain" encoding="plain">ok</content></message>'
        ),
    )
    message = (await call(gw, "GET", href)).top()
    assert message.get("flavour") is None
    assert [local(c) for c in message] == ["content"]
    assert message[0].text == "ok"


async def test_G7_whitespace_between_elements_is_ignored(gw: Gateway) -> None:
    body = (
        '<?xml version="1.0"?>\n<restms>\n  <feed name="g7"\n        type="direct"/>\n\n</restms>\n'
    )
    r = await call(gw, "POST", DOMAIN, body)
    assert r.status == 201, r.body
    assert r.top().get("type") == "direct"


# ---------------------------------------------------------------- G8-G12 negotiation
BROWSER = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"


@pytest.mark.parametrize(
    ("accept", "expected"),
    [
        (None, XML_TYPES),
        ("", XML_TYPES),
        (XML, (XML,)),
        (JSON, (JSON,)),
        ("text/xml", XML_TYPES),
        ("*/*", XML_TYPES),
        (BROWSER, XML_TYPES),
        (f"{XML};q=0.5, {JSON}", (JSON,)),
        (f"{JSON};q=0.4, {XML};q=0.9", XML_TYPES),
        (f"{JSON}; charset=utf-8", (JSON,)),
        ("image/png, */*;q=0.1", XML_TYPES),
        (f"text/xml;q=0.2, {JSON};q=0.8", (JSON,)),
    ],
)
async def test_G9_accept_chooses_the_reply_format(
    gw: Gateway, accept: str | None, expected: tuple[str, ...]
) -> None:
    headers = {} if accept is None else {"Accept": accept}
    r = await call(gw, "GET", DOMAIN, **headers)
    assert r.status == 200
    assert r.media_type in expected
    if r.media_type == JSON:
        assert_json_shape(r.json())
    else:
        assert local(r.top()) == "domain"


@pytest.mark.parametrize("accept", ["image/png", "text/html", "application/pdf, text/csv;q=0.5"])
async def test_G9_accept_naming_only_unproducible_types_is_406(gw: Gateway, accept: str) -> None:
    (await call(gw, "GET", DOMAIN, Accept=accept)).assert_text_error(406)


async def test_G9_406_on_create_creates_nothing(gw: Gateway) -> None:
    r = await call(gw, "POST", DOMAIN, doc('<feed name="g9c"/>'), Accept="image/png")
    r.assert_text_error(406)
    assert (await call(gw, "GET", "/restms/feed/g9c")).status == 404


async def test_G9_406_on_join_post_creates_no_join(gw: Gateway) -> None:
    assert (await call(gw, "POST", DOMAIN, doc('<feed name="g9j" type="fanout"/>'))).status == 201
    pipe = await new_pipe(gw)
    r = await call(
        gw,
        "POST",
        pipe.headers["Location"],
        doc('<join feed="/restms/feed/g9j"/>'),
        Accept="image/png",
    )
    r.assert_text_error(406)
    listing = await call(gw, "GET", pipe.headers["Location"])
    assert len(children(listing.top(), "join")) == 1  # only the default join


async def test_G9_406_on_put_changes_nothing(gw: Gateway) -> None:
    assert (await call(gw, "POST", DOMAIN, doc('<feed name="g9p" title="old"/>'))).status == 201
    r = await call(gw, "PUT", "/restms/feed/g9p", doc('<feed title="new"/>'), Accept="image/png")
    r.assert_text_error(406)
    assert (await call(gw, "GET", "/restms/feed/g9p")).top().get("title") == "old"


async def test_G9_M10_406_on_publish_routes_nothing(gw: Gateway) -> None:
    pipe = await new_pipe(gw)
    name = pipe.top().get("name")
    body = doc(f'<message address="{name}"/>')
    r = await call(gw, "POST", DEFAULT_FEED, body, Accept="image/png")
    r.assert_text_error(406)
    listing = await call(gw, "GET", pipe.headers["Location"])
    held = [m for m in children(listing.top(), "message") if m.get("async") != "1"]
    assert held == []


@pytest.mark.parametrize(
    "content_type",
    [
        XML,
        f"{XML}; charset=utf-8",
        "application/xml",
        "text/xml",
        "text/xml;charset=UTF-8",
        "Application/RestMS+XML",
    ],
)
async def test_G10_xml_content_types_are_read_as_xml(gw: Gateway, content_type: str) -> None:
    r = await call(gw, "POST", DOMAIN, doc("<pipe/>"), content_type=content_type)
    assert r.status == 201, r.body


@pytest.mark.parametrize("content_type", [JSON, f"{JSON};charset=utf-8", "application/json"])
async def test_G10_json_content_types_are_read_as_json(gw: Gateway, content_type: str) -> None:
    r = await call(gw, "POST", DOMAIN, jdoc("pipe", title="j"), content_type=content_type)
    assert r.status == 201, r.body


async def test_G8_structured_post_without_content_type_is_read_as_xml(gw: Gateway) -> None:
    r = await call(gw, "POST", DOMAIN, doc('<feed name="g8" type="fanout"/>'), content_type=None)
    assert r.status == 201, r.body
    assert r.headers["Location"].endswith("/restms/feed/g8")


async def test_G8_join_post_and_put_without_content_type_are_read_as_xml(gw: Gateway) -> None:
    assert (await call(gw, "POST", DOMAIN, doc('<feed name="g8j" type="fanout"/>'))).status == 201
    pipe = await new_pipe(gw)
    join = await call(
        gw,
        "POST",
        pipe.headers["Location"],
        doc('<join feed="/restms/feed/g8j"/>'),
        content_type=None,
    )
    assert join.status == 201, join.body
    put = await call(gw, "PUT", "/restms/feed/g8j", doc('<feed title="T"/>'), content_type=None)
    assert put.status == 200, put.body
    assert put.top().get("title") == "T"


@pytest.mark.parametrize("content_type", ["text/plain", "application/pdf", "image/png"])
async def test_G11_unsupported_content_type_on_domain_post_is_415(
    gw: Gateway, content_type: str
) -> None:
    r = await call(gw, "POST", DOMAIN, doc("<pipe/>"), content_type=content_type)
    r.assert_text_error(415)


async def test_G11_unsupported_content_type_on_join_post_and_feed_put_is_415(
    gw: Gateway,
) -> None:
    pipe = await new_pipe(gw)
    join = await call(
        gw,
        "POST",
        pipe.headers["Location"],
        doc(f'<join feed="{DEFAULT_FEED}"/>'),
        content_type="text/plain",
    )
    join.assert_text_error(415)
    assert (await call(gw, "POST", DOMAIN, doc('<feed name="g11"/>'))).status == 201
    put = await call(
        gw, "PUT", "/restms/feed/g11", doc('<feed title="t"/>'), content_type="text/csv"
    )
    put.assert_text_error(415)


@pytest.mark.parametrize(
    ("content_type", "accept", "expected"),
    [
        (JSON, None, (JSON,)),
        (XML, None, (XML,)),
        ("text/xml", None, XML_TYPES),
        (JSON, XML, (XML,)),
        (XML, JSON, (JSON,)),
        ("application/json", None, (JSON,)),
    ],
)
async def test_G12_create_reply_follows_accept_else_mirrors_content_type(
    gw: Gateway, content_type: str, accept: str | None, expected: tuple[str, ...]
) -> None:
    body = jdoc("pipe") if "json" in content_type else doc("<pipe/>")
    headers = {} if accept is None else {"Accept": accept}
    r = await call(gw, "POST", DOMAIN, body, content_type=content_type, **headers)
    assert r.status == 201
    assert r.media_type in expected
    if r.media_type == JSON:
        assert "pipe" in r.json()["restms"]
    else:
        assert local(r.top()) == "pipe"


async def test_G12_put_and_publish_replies_mirror_json(gw: Gateway) -> None:
    assert (await call(gw, "POST", DOMAIN, doc('<feed name="g12"/>'))).status == 201
    put = await call(gw, "PUT", "/restms/feed/g12", jdoc("feed", title="J"), content_type=JSON)
    assert put.status == 200
    assert put.json()["restms"]["feed"][0]["title"] == "J"
    publish = await call(
        gw, "POST", "/restms/feed/g12", jdoc("message", address="a"), content_type=JSON
    )
    assert publish.status == 200
    assert publish.json() == {"restms": {"message": [{"count": "0"}]}}


# ---------------------------------------------------------------- G13 domain document
async def test_G13_F1_domain_lists_profiles_with_hrefs(gw: Gateway) -> None:
    domain = (await call(gw, "GET", DOMAIN)).top()
    profiles = {p.get("name"): p.get("href") for p in children(domain, "profile")}
    assert profiles["3/Defaults"] == "http://www.restms.org/spec:3/Defaults"
    assert profiles["4/AMQP9"] == "http://www.restms.org/spec:4/AMQP9"


async def test_G13_F14_domain_lists_public_feeds_but_no_private_feeds_or_pipes(
    gw: Gateway,
) -> None:
    for body in ('<feed name="listed" type="topic"/>', '<feed type="topic"/>', "<pipe/>"):
        assert (await call(gw, "POST", DOMAIN, doc(body))).status == 201
    domain = (await call(gw, "GET", DOMAIN)).top()
    assert {local(c) for c in domain} <= {"profile", "feed"}
    feeds = children(domain, "feed")
    assert sorted(f.get("name") for f in feeds) == [
        "dead-letter",
        "default",
        "listed",
        "restms.system",
    ]
    for feed in feeds:
        assert feed.get("href") == gw.uri(f"/restms/feed/{feed.get('name')}")
    listed = next(f for f in feeds if f.get("name") == "listed")
    assert listed.get("type") == "topic"


async def test_L4_default_feed_type_is_direct_in_legacy_mode(make_gateway: MakeGateway) -> None:
    gw = await make_gateway(legacy_default_feed_type="direct")
    feed = (await call(gw, "GET", DEFAULT_FEED)).top()
    assert feed.get("type") == "direct"
    domain = (await call(gw, "GET", DOMAIN)).top()
    default = next(f for f in children(domain, "feed") if f.get("name") == "default")
    assert default.get("type") == "direct"


# ---------------------------------------------------------------- G14 joins
async def test_G14_join_without_feed_is_400(gw: Gateway) -> None:
    pipe = await new_pipe(gw)
    r = await call(gw, "POST", pipe.headers["Location"], doc('<join address="x"/>'))
    r.assert_text_error(400)


async def test_G14_join_to_unknown_feed_is_400_naming_the_uri(gw: Gateway) -> None:
    pipe = await new_pipe(gw)
    r = await call(
        gw, "POST", pipe.headers["Location"], doc('<join feed="/restms/feed/missing-feed"/>')
    )
    r.assert_text_error(400)
    assert b"/restms/feed/missing-feed" in r.body


async def test_G14_join_address_defaults_to_empty(gw: Gateway) -> None:
    assert (await call(gw, "POST", DOMAIN, doc('<feed name="g14" type="direct"/>'))).status == 201
    pipe = await new_pipe(gw)
    r = await call(gw, "POST", pipe.headers["Location"], doc('<join feed="/restms/feed/g14"/>'))
    assert r.status == 201
    assert r.top().get("address") == ""


# ---------------------------------------------------------------- J1-J8 JSON mapping
async def test_J1_J2_J3_every_document_shape_in_json(gw: Gateway) -> None:
    assert_json_shape((await call(gw, "GET", DOMAIN, Accept=JSON)).json())
    feed = await call(gw, "POST", DOMAIN, jdoc("feed", name="j", type="topic"), content_type=JSON)
    assert_json_shape(feed.json())
    pipe = await call(gw, "POST", DOMAIN, jdoc("pipe"), content_type=JSON)
    pipe_json = pipe.json()
    assert_json_shape(pipe_json)
    body = pipe_json["restms"]["pipe"][0]
    assert isinstance(body["join"], list)
    assert len(body["join"]) == 1
    assert body["message"] == [{"href": body["message"][0]["href"], "async": "1"}]
    join = await call(
        gw,
        "POST",
        pipe.headers["Location"],
        json.dumps(
            {
                "restms": {
                    "join": [
                        {"feed": "/restms/feed/j", "address": "a.#", "header": [{"name": "h"}]}
                    ]
                }
            }
        ),
        content_type=JSON,
    )
    assert join.status == 201
    assert_json_shape(join.json())
    assert join.json()["restms"]["join"][0]["address"] == "a.#"
    for uri in (pipe.headers["Location"], join.headers["Location"], "/restms/feed/j"):
        assert_json_shape((await call(gw, "GET", uri, Accept=JSON)).json())


async def test_J3_json_numbers_become_strings(gw: Gateway) -> None:
    body = json.dumps({"restms": {"feed": [{"name": "j3", "type": "fanout", "title": 42}]}})
    r = await call(gw, "POST", DOMAIN, body, content_type=JSON)
    assert r.status == 201, r.body
    assert r.json()["restms"]["feed"][0]["title"] == "42"
    assert (await call(gw, "GET", "/restms/feed/j3")).top().get("title") == "42"


async def test_J3_an_object_where_a_property_belongs_creates_nothing(gw: Gateway) -> None:
    before = (await call(gw, "GET", DOMAIN, Accept=JSON)).body
    body = b'{"restms":{"feed":[{"type":{"v":"fanout"}}]}}'
    r = await call(gw, "POST", DOMAIN, body, content_type=JSON)
    assert r.status == 400
    assert r.media_type == "text/plain"
    assert r.body.decode() == 'property "type" of <feed> must be a string, not an object\n'
    assert (await call(gw, "GET", DOMAIN, Accept=JSON)).body == before


async def test_J3_G2_a_property_written_as_a_child_element_creates_nothing(gw: Gateway) -> None:
    before = (await call(gw, "GET", DOMAIN)).body
    r = await call(gw, "POST", DOMAIN, doc('<feed name="g2"><type v="fanout"/></feed>'))
    assert (r.status, r.media_type) == (400, "text/plain")
    assert r.body.decode() == 'property "type" of <feed> must be an attribute\n'
    assert (await call(gw, "GET", DOMAIN)).body == before


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (
            b'{"restms":{"message":[{"address":{"x":1}}]}}',
            'property "address" of <message> must be a string, not an object',
        ),
        (
            b'{"restms":{"message":[{"address":"{name}","header":[{"name":["a","b"]}]}]}}',
            'property "name" of <header> must be a string, not an array',
        ),
        (
            b'{"restms":{"message":[{"address":"{name}","address":"{name}"}]}}',
            "JSON object repeats the key 'address'",
        ),
    ],
)
async def test_J3_a_malformed_json_publish_routes_nothing(
    gw: Gateway, body: bytes, reason: str
) -> None:
    pipe = await new_pipe(gw)
    name = pipe.top().get("name")
    r = await call(
        gw, "POST", DEFAULT_FEED, body.replace(b"{name}", name.encode()), content_type=JSON
    )
    assert (r.status, r.media_type, r.body.decode()) == (400, "text/plain", reason + "\n")
    listing = await call(gw, "GET", pipe.headers["Location"])
    assert [m.get("async") for m in children(listing.top(), "message")] == ["1"]  # the asynclet


@pytest.mark.parametrize("text_key", ["value", "#text"])
async def test_J5_content_text_travels_under_value(gw: Gateway, text_key: str) -> None:
    message = {
        "address": "{name}",
        "content": [{"type": "text/plain", "encoding": "plain", text_key: 'hi & "bye" <x>'}],
    }
    href = await deliver_one(gw, json.dumps({"restms": {"message": [message]}}), JSON)
    got = await call(gw, "GET", href, Accept=JSON)
    assert_json_shape(got.json())
    content = got.json()["restms"]["message"][0]["content"]
    assert content == [{"type": "text/plain", "encoding": "plain", "value": 'hi & "bye" <x>'}]
    as_xml = (await call(gw, "GET", href, Accept=XML)).top()
    assert children(as_xml, "content")[0].text == 'hi & "bye" <x>'


async def test_J5_linked_content_has_no_value_in_json(gw: Gateway) -> None:
    pipe = await new_pipe(gw)
    name = pipe.top().get("name")
    staged = await call(gw, "POST", DEFAULT_FEED, b"\x00\x01", content_type="application/x-bin")
    assert staged.status == 201
    publish = await call(
        gw,
        "POST",
        DEFAULT_FEED,
        doc(f'<message address="{name}"><content href="{staged.headers["Location"]}"/></message>'),
    )
    assert publish.status == 200
    listing = await call(gw, "GET", pipe.headers["Location"], Accept=JSON)
    href = listing.json()["restms"]["pipe"][0]["message"][0]["href"]
    content = (await call(gw, "GET", href, Accept=JSON)).json()["restms"]["message"][0]["content"]
    assert len(content) == 1
    assert "value" not in content[0]
    assert content[0]["href"].startswith(gw.uri("/restms/resource/"))


@pytest.mark.parametrize("body", ['{"restms":{}}', '{"restms":null}'])
async def test_J8_empty_json_document_parses_but_creates_nothing(gw: Gateway, body: str) -> None:
    (await call(gw, "POST", DOMAIN, body, content_type=JSON)).assert_text_error(400)
