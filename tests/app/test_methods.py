"""Resources, URIs, the method matrix and create/retrieve/update/delete (digest §1).

Every cell of the §1.2 method matrix is exercised against a real gateway: one
"world" per test holds a resource of every kind (domain, public and private feed,
pipe, default and ordinary join, staged content, message, delivered content), and
the tests walk GET, HEAD, PUT, DELETE, POST and the undefined methods over it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re

import pytest
from lxml import etree

from feeds import FeedConfig
from tests.app.xmlapi import call, doc, local
from tests.conftest import Gateway, MakeGateway

pytestmark = pytest.mark.nodes

XML = "application/restms+xml"
JSON = "application/restms+json"
DOMAIN = "/restms/domain/default"
DEFAULT_FEED = "/restms/feed/default"
XML_TYPES = (XML, "text/xml")


# ---------------------------------------------------------------- helpers


@dataclasses.dataclass
class World:
    """One resource of every kind, by absolute URI."""

    domain: str
    default_feed: str
    feed: str
    private_feed: str
    pipe: str
    pipe_name: str
    join: str
    default_join: str
    staged: str
    message: str
    content: str
    asynclet: str

    def uri(self, kind: str) -> str:
        return getattr(self, kind)


async def build_world(gw: Gateway) -> World:
    feed = await call(gw, "POST", DOMAIN, doc('<feed name="matrix" type="fanout"/>'))
    assert feed.status == 201
    private = await call(gw, "POST", DOMAIN, doc('<feed type="fanout"/>'))
    assert private.status == 201
    pipe = await call(gw, "POST", DOMAIN, doc("<pipe/>"))
    assert pipe.status == 201
    pipe_uri = pipe.headers["Location"]
    default_join = pipe.children("join")[0].get("href")
    join = await call(gw, "POST", pipe_uri, doc(f'<join feed="{feed.headers["Location"]}"/>'))
    assert join.status == 201
    staged_for_message = await call(
        gw, "POST", feed.headers["Location"], b"payload", content_type="text/plain"
    )
    assert staged_for_message.status == 201
    published = await call(
        gw,
        "POST",
        feed.headers["Location"],
        doc(
            f'<message address="a"><content href="{staged_for_message.headers["Location"]}"/>'
            "</message>"
        ),
    )
    assert published.status == 200
    listing = await call(gw, "GET", pipe_uri)
    messages = listing.children("message")
    assert len(messages) == 2
    message_uri = messages[0].get("href")
    delivered = await call(gw, "GET", message_uri)
    content_uri = delivered.children("content")[0].get("href")
    staged = await call(gw, "POST", feed.headers["Location"], b"spare", content_type="text/plain")
    assert staged.status == 201
    return World(
        domain=gw.uri(DOMAIN),
        default_feed=gw.uri(DEFAULT_FEED),
        feed=feed.headers["Location"],
        private_feed=private.headers["Location"],
        pipe=pipe_uri,
        pipe_name=pipe.top().get("name"),
        join=join.headers["Location"],
        default_join=default_join,
        staged=staged.headers["Location"],
        message=message_uri,
        content=content_uri,
        asynclet=messages[1].get("href"),
    )


@pytest.fixture
async def world(gw: Gateway) -> World:
    return await build_world(gw)


# ---------------------------------------------------------------- §1.1 URI forms
async def test_U1_U3_default_domain_is_at_restms_domain_default(gw: Gateway) -> None:
    r = await call(gw, "GET", DOMAIN)
    assert r.status == 200
    assert r.headers["Content-Type"].split(";")[0] in XML_TYPES
    assert local(r.top()) == "domain"
    assert r.top().get("name") == "default"


async def test_U1_public_feed_lives_at_restms_feed_name(gw: Gateway) -> None:
    r = await call(gw, "POST", DOMAIN, doc('<feed name="u1-news" type="topic"/>'))
    assert r.status == 201
    assert r.headers["Location"] == gw.uri("/restms/feed/u1-news")
    assert (await call(gw, "GET", "/restms/feed/u1-news")).status == 200


async def test_U2_private_resources_live_under_restms_resource(world: World, gw: Gateway) -> None:
    for kind in ("private_feed", "pipe", "join", "staged", "message", "content", "asynclet"):
        assert world.uri(kind).startswith(gw.uri("/restms/resource/")), kind


async def test_U4_emitted_uris_are_absolute_and_use_the_host_header(
    make_gateway: MakeGateway,
) -> None:
    host = "mq.example.test:8123"
    gw = await make_gateway(allowed_hosts=host)  # a host the gateway is told it serves
    base = f"http://{host}/restms/"
    feed = await call(gw, "POST", DOMAIN, doc('<feed name="u4" type="direct"/>'), Host=host)
    assert feed.headers["Location"] == base + "feed/u4"
    pipe = await call(gw, "POST", DOMAIN, doc("<pipe/>"), Host=host)
    assert pipe.headers["Location"].startswith(base + "resource/")
    staged = await call(gw, "POST", "/restms/feed/u4", b"x", content_type="text/plain", Host=host)
    assert staged.headers["Location"].startswith(base + "resource/")
    for child in pipe.top():
        assert child.get("href").startswith(base + "resource/"), etree.tostring(child)
    default_join = pipe.children("join")[0]
    assert default_join.get("feed") == base + "feed/default"
    join = await call(
        gw, "POST", pipe.headers["Location"], doc('<join feed="/restms/feed/u4"/>'), Host=host
    )
    assert join.headers["Location"].startswith(base + "resource/")
    assert join.top().get("feed") == base + "feed/u4"
    domain = await call(gw, "GET", DOMAIN, Host=host)
    feeds = {f.get("name"): f.get("href") for f in domain.children("feed")}
    assert feeds["u4"] == base + "feed/u4"
    assert feeds["default"] == base + "feed/default"


async def test_U4_another_host_header_gives_other_uris_for_the_same_resource(
    make_gateway: MakeGateway,
) -> None:
    gw = await make_gateway(allowed_hosts="one.test, two.test:99")
    pipe = await call(gw, "POST", DOMAIN, doc("<pipe/>"), Host="one.test")
    path = pipe.headers["Location"].removeprefix("http://one.test")
    again = await call(gw, "GET", path, Host="two.test:99")
    assert again.status == 200
    assert again.children("message")[0].get("href").startswith("http://two.test:99/restms/")


@pytest.mark.parametrize(
    "feed_ref",
    [
        "/restms/feed/u5",
        "http://localhost:1/restms/feed/u5",
        "https://elsewhere.test/restms/feed/u5",
    ],
)
async def test_U5_join_feed_uri_may_be_path_only_or_any_host(gw: Gateway, feed_ref: str) -> None:
    assert (await call(gw, "POST", DOMAIN, doc('<feed name="u5" type="fanout"/>'))).status == 201
    pipe = await call(gw, "POST", DOMAIN, doc("<pipe/>"))
    join = await call(gw, "POST", pipe.headers["Location"], doc(f'<join feed="{feed_ref}"/>'))
    assert join.status == 201, join.body
    assert join.top().get("feed") == gw.uri("/restms/feed/u5")


async def test_U6_pipe_uri_hash_equals_pipe_name(world: World) -> None:
    assert world.pipe.rsplit("/", 1)[1] == world.pipe_name


async def test_U7_private_hashes_are_url_safe_unguessable_and_fresh(gw: Gateway) -> None:
    hashes = set()
    for _ in range(5):
        r = await call(gw, "POST", DOMAIN, doc("<pipe/>"))
        hashes.add(r.headers["Location"].rsplit("/", 1)[1])
        r = await call(gw, "POST", DOMAIN, doc("<feed/>"))
        hashes.add(r.headers["Location"].rsplit("/", 1)[1])
    assert len(hashes) == 10
    for h in hashes:
        assert re.fullmatch(r"[A-Za-z0-9_-]{16,}", h), h  # >= 96 bits of base64url


# ---------------------------------------------------------------- §1.2 method matrix
ALL_KINDS = [
    "domain",
    "default_feed",
    "feed",
    "private_feed",
    "pipe",
    "join",
    "staged",
    "message",
    "content",
]
STRUCTURED = {"domain", "default_feed", "feed", "private_feed", "pipe", "join", "message"}


@pytest.mark.parametrize("kind", ALL_KINDS)
async def test_U10_get_on_every_resource_is_200(world: World, gw: Gateway, kind: str) -> None:
    r = await call(gw, "GET", world.uri(kind))
    assert r.status == 200, r.body
    if kind in STRUCTURED:
        assert r.headers["Content-Type"].split(";")[0] in XML_TYPES
        expected = {"default_feed": "feed", "private_feed": "feed"}.get(kind, kind)
        assert local(r.top()) == expected
    else:
        assert r.headers["Content-Type"] == "text/plain"
        assert r.body == (b"spare" if kind == "staged" else b"payload")


FORBIDDEN = [
    ("domain", "PUT", doc('<domain title="x"/>')),
    ("domain", "DELETE", None),
    ("default_feed", "PUT", doc('<feed title="x"/>')),
    ("default_feed", "DELETE", None),
    ("join", "PUT", doc('<join address="x" feed="/restms/feed/matrix"/>')),
    ("join", "POST", doc('<join feed="/restms/feed/matrix"/>')),
    ("default_join", "DELETE", None),
    ("staged", "PUT", doc('<content type="text/plain"/>')),
    ("staged", "POST", doc('<message address="x"/>')),
    ("message", "PUT", doc('<message address="changed"/>')),
    ("message", "POST", doc('<content type="text/plain" encoding="plain">x</content>')),
    ("content", "PUT", doc('<content type="text/plain"/>')),
    ("content", "POST", doc('<message address="x"/>')),
]


@pytest.mark.parametrize(
    ("kind", "method", "body"),
    [pytest.param(k, m, b, id=f"{k}-{m}") for k, m, b in FORBIDDEN],
)
async def test_U10_disallowed_methods_are_403_and_change_nothing(
    world: World, gw: Gateway, kind: str, method: str, body: str | None
) -> None:
    before = await call(gw, "GET", world.uri(kind))
    assert before.status == 200
    r = await call(gw, method, world.uri(kind), body)
    r.assert_text_error(403)
    after = await call(gw, "GET", world.uri(kind))
    assert after.status == 200
    assert after.body == before.body


async def test_U10_put_on_domain_is_403(gw: Gateway) -> None:
    r = await call(gw, "PUT", DOMAIN, doc('<domain name="default" title="renamed"/>'))
    r.assert_text_error(403)


async def test_U10_delete_on_domain_is_403(gw: Gateway) -> None:
    (await call(gw, "DELETE", DOMAIN)).assert_text_error(403)
    assert (await call(gw, "GET", DOMAIN)).status == 200


async def test_F17_put_and_delete_on_default_feed_are_403(gw: Gateway) -> None:
    put = await call(gw, "PUT", DEFAULT_FEED, doc('<feed name="default" title="mine"/>'))
    put.assert_text_error(403)
    (await call(gw, "DELETE", DEFAULT_FEED)).assert_text_error(403)
    r = await call(gw, "GET", DEFAULT_FEED)
    assert r.status == 200
    assert r.top().get("title") != "mine"


async def test_F17_put_and_delete_on_configured_feed_are_403(make_gateway: MakeGateway) -> None:
    gw = await make_gateway(feeds=(FeedConfig(name="orders", type="topic"),))
    feed = "/restms/feed/orders"
    (await call(gw, "PUT", feed, doc('<feed title="t"/>'))).assert_text_error(403)
    (await call(gw, "DELETE", feed)).assert_text_error(403)
    assert (await call(gw, "GET", feed)).status == 200


async def test_F16_delete_on_default_join_is_403(world: World, gw: Gateway) -> None:
    (await call(gw, "DELETE", world.default_join)).assert_text_error(403)
    pipe = await call(gw, "GET", world.pipe)
    assert world.default_join in [j.get("href") for j in pipe.children("join")]


async def test_F16_other_join_onto_default_feed_is_403(world: World, gw: Gateway) -> None:
    r = await call(gw, "POST", world.pipe, doc(f'<join address="other" feed="{DEFAULT_FEED}"/>'))
    r.assert_text_error(403)
    other = await call(gw, "POST", DOMAIN, doc("<pipe/>"))
    name = other.top().get("name")
    # Even another pipe's name as address is not this pipe's default join.
    r = await call(gw, "POST", world.pipe, doc(f'<join address="{name}" feed="{DEFAULT_FEED}"/>'))
    r.assert_text_error(403)
    pipe = await call(gw, "GET", world.pipe)
    assert len(pipe.children("join")) == 2


async def test_F16_exact_copy_of_default_join_is_200_with_its_location(
    world: World, gw: Gateway
) -> None:
    r = await call(
        gw,
        "POST",
        world.pipe,
        doc(f'<join address="{world.pipe_name}" feed="{DEFAULT_FEED}"/>'),
    )
    assert r.status == 200, r.body
    assert r.headers["Location"] == world.default_join


async def test_U13_post_on_message_is_403(world: World, gw: Gateway) -> None:
    r = await call(gw, "POST", world.message, b"bytes", content_type="text/plain")
    r.assert_text_error(403)


UNDEFINED = ["PATCH", "OPTIONS", "TRACE", "PROPFIND"]


@pytest.mark.parametrize("method", UNDEFINED)
@pytest.mark.parametrize("kind", ALL_KINDS)
async def test_U11_undefined_methods_are_405_with_allow(
    world: World, gw: Gateway, kind: str, method: str
) -> None:
    r = await call(gw, method, world.uri(kind), doc("<feed/>"))
    r.assert_text_error(405)
    allow = {m.strip() for m in r.headers["Allow"].split(",")}
    assert {"GET", "HEAD"} <= allow
    assert method not in allow


@pytest.mark.parametrize("kind", [*ALL_KINDS, "default_join"])
async def test_U11_head_is_get_without_body(world: World, gw: Gateway, kind: str) -> None:
    get = await call(gw, "GET", world.uri(kind))
    head = await call(gw, "HEAD", world.uri(kind))
    assert head.status == 200
    assert head.body == b""
    assert head.headers["Content-Type"] == get.headers["Content-Type"]
    assert head.headers.get("ETag") == get.headers.get("ETag")
    assert head.headers.get("Last-Modified") == get.headers.get("Last-Modified")


async def test_U11_head_on_unfilled_asynclet_is_404_at_once(world: World, gw: Gateway) -> None:
    r = await asyncio.wait_for(call(gw, "HEAD", world.asynclet), timeout=2)
    assert r.status == 404
    assert r.body == b""


async def test_U11_head_on_unknown_resource_is_404(gw: Gateway) -> None:
    assert (await call(gw, "HEAD", "/restms/resource/nothing-here")).status == 404


# ---------------------------------------------------------------- U12 unknown paths
UNKNOWN_PATHS = [
    "/restms/",
    "/restms/domain/nosuch",
    "/restms/feed/nosuch",
    "/restms/resource/nosuch",
    "/restms/resource/AAAAAAAAAAAAAAAAAAAAAAAA",
    "/restms/pipe/abc",
    "/restms/feed/a/b",
    "/restms/resource/",
    "/restms/somethingelse/x",
]


@pytest.mark.parametrize("method", ["GET", "PUT", "POST"])
@pytest.mark.parametrize("path", UNKNOWN_PATHS)
async def test_U12_unknown_path_is_404(gw: Gateway, method: str, path: str) -> None:
    body = None if method == "GET" else doc('<feed name="x"/>')
    (await call(gw, method, path, body)).assert_text_error(404)


@pytest.mark.parametrize("kind", ["feed", "private_feed", "pipe", "join", "staged"])
async def test_U12_L10_deleted_resource_is_404_for_get_put_post(
    world: World, gw: Gateway, kind: str
) -> None:
    assert (await call(gw, "DELETE", world.uri(kind))).status == 200
    (await call(gw, "GET", world.uri(kind))).assert_text_error(404)
    (await call(gw, "PUT", world.uri(kind), doc('<feed title="t"/>'))).assert_text_error(404)
    post = await call(gw, "POST", world.uri(kind), doc('<message address="a"/>'))
    post.assert_text_error(404)


async def test_U12_message_positions_never_issued_are_404(world: World, gw: Gateway) -> None:
    for suffix in (".999", ".0", ".1.7", ".x"):
        r = await asyncio.wait_for(call(gw, "GET", world.pipe + suffix), timeout=2)
        r.assert_text_error(404)


@pytest.mark.parametrize("method", ["PUT", "POST"])
async def test_U12_put_post_on_message_positions_never_issued_are_404(
    world: World, gw: Gateway, method: str
) -> None:
    statuses = {}
    for suffix in (".999", ".0", ".999.0"):
        r = await call(gw, method, world.pipe + suffix, doc('<message address="x"/>'))
        statuses[suffix] = r.status
    assert statuses == {".999": 404, ".0": 404, ".999.0": 404}


@pytest.mark.parametrize("method", ["PUT", "POST"])
async def test_U12_put_post_on_deleted_message_and_content_are_404(
    world: World, gw: Gateway, method: str
) -> None:
    assert (await call(gw, "DELETE", world.message)).status == 200
    statuses = {}
    for kind in ("message", "content"):
        r = await call(gw, method, world.uri(kind), doc('<message address="x"/>'))
        statuses[kind] = r.status
    assert statuses == {"message": 404, "content": 404}


# ---------------------------------------------------------------- §1.3 creating resources
async def test_C1_C2_new_public_feed_is_201_with_location_and_document(gw: Gateway) -> None:
    r = await call(
        gw,
        "POST",
        DOMAIN,
        doc('<feed name="c2" type="topic" title="Two" license="MPL"/>'),
    )
    assert r.status == 201
    assert r.headers["Location"] == gw.uri("/restms/feed/c2")
    assert r.headers["Content-Type"].split(";")[0] in XML_TYPES
    assert r.headers["ETag"]
    assert r.headers["Last-Modified"].endswith("GMT")
    feed = r.top()
    assert local(feed) == "feed"
    assert (feed.get("name"), feed.get("type"), feed.get("title"), feed.get("license")) == (
        "c2",
        "topic",
        "Two",
        "MPL",
    )


async def test_C2_new_pipe_shows_its_default_join_and_asynclet(gw: Gateway) -> None:
    r = await call(gw, "POST", DOMAIN, doc('<pipe title="worker"/>'))
    assert r.status == 201
    assert r.headers["ETag"]
    assert r.headers["Last-Modified"]
    pipe = r.top()
    assert local(pipe) == "pipe"
    assert pipe.get("title") == "worker"
    assert pipe.get("type") == ""
    name = pipe.get("name")
    assert r.headers["Location"] == gw.uri(f"/restms/resource/{name}")
    joins = r.children("join")
    assert len(joins) == 1
    assert joins[0].get("feed") == gw.uri(DEFAULT_FEED)
    assert joins[0].get("address") == name
    messages = r.children("message")
    assert len(messages) == 1
    assert messages[0].get("async") == "1"
    assert messages[0].get("href").startswith(gw.uri("/restms/resource/"))


async def test_C2_new_join_is_201_with_location_and_document(world: World, gw: Gateway) -> None:
    r = await call(
        gw,
        "POST",
        world.pipe,
        doc(f'<join address="rec.#" feed="{world.private_feed}"/>'),
    )
    assert r.status == 201
    assert r.headers["Location"].startswith(gw.uri("/restms/resource/"))
    assert r.headers["ETag"]
    join = r.top()
    assert local(join) == "join"
    assert join.get("address") == "rec.#"
    assert join.get("feed") == world.private_feed
    got = await call(gw, "GET", r.headers["Location"])
    assert got.status == 200
    assert got.top().get("address") == "rec.#"


async def test_C3_public_feed_recreate_is_200_with_same_location(gw: Gateway) -> None:
    first = await call(gw, "POST", DOMAIN, doc('<feed name="c3" type="service" title="A"/>'))
    assert first.status == 201
    again = await call(gw, "POST", DOMAIN, doc('<feed name="c3" type="service" title="A"/>'))
    assert again.status == 200
    assert again.headers["Location"] == first.headers["Location"]
    assert again.top().get("name") == "c3"
    assert again.top().get("type") == "service"
    domain = await call(gw, "GET", DOMAIN)
    assert [f.get("name") for f in domain.children("feed")].count("c3") == 1


async def test_C3_default_feed_recreate_is_200(gw: Gateway) -> None:
    r = await call(gw, "POST", DOMAIN, doc('<feed name="default" type="topic"/>'))
    assert r.status == 200
    assert r.headers["Location"] == gw.uri(DEFAULT_FEED)
    assert r.top().get("type") == ""


async def test_C4_recreate_with_other_type_title_license_returns_existing_unchanged(
    gw: Gateway,
) -> None:
    first = await call(
        gw, "POST", DOMAIN, doc('<feed name="c4" type="fanout" title="Old" license="L1"/>')
    )
    assert first.status == 201
    again = await call(
        gw, "POST", DOMAIN, doc('<feed name="c4" type="topic" title="New" license="L2"/>')
    )
    assert again.status == 200
    assert again.headers["Location"] == first.headers["Location"]
    feed = again.top()
    assert (feed.get("type"), feed.get("title"), feed.get("license")) == ("fanout", "Old", "L1")
    stored = (await call(gw, "GET", "/restms/feed/c4")).top()
    assert (stored.get("type"), stored.get("title")) == ("fanout", "Old")


async def test_C5_private_feed_creation_is_always_new(gw: Gateway) -> None:
    a = await call(gw, "POST", DOMAIN, doc('<feed type="topic" title="same"/>'))
    b = await call(gw, "POST", DOMAIN, doc('<feed type="topic" title="same"/>'))
    assert (a.status, b.status) == (201, 201)
    assert a.headers["Location"] != b.headers["Location"]


async def test_C5_pipe_creation_is_always_new(gw: Gateway) -> None:
    a = await call(gw, "POST", DOMAIN, doc("<pipe/>"))
    b = await call(gw, "POST", DOMAIN, doc("<pipe/>"))
    assert (a.status, b.status) == (201, 201)
    assert a.headers["Location"] != b.headers["Location"]
    assert a.top().get("name") != b.top().get("name")


@pytest.mark.parametrize(
    ("target", "body"),
    [
        ("domain", '<feed name="c6" type="nosuchtype"/>'),
        ("domain", '<feed type="cartesian"/>'),
        ("domain", '<pipe type="loopback"/>'),
        ("domain", '<pipe type="bogus"/>'),
        ("pipe", '<join type="bogus" feed="/restms/feed/matrix"/>'),
    ],
)
async def test_C6_unknown_type_is_400(world: World, gw: Gateway, target: str, body: str) -> None:
    (await call(gw, "POST", world.uri(target), doc(body))).assert_text_error(400)


@pytest.mark.parametrize(
    ("target", "body"),
    [
        ("domain", b""),
        ("domain", doc("").encode()),
        ("domain", doc('<join feed="/restms/feed/matrix"/>').encode()),
        ("domain", doc('<message address="x"/>').encode()),
        ("domain", doc('<feed name="c7a"/><feed name="c7b"/>').encode()),
        ("domain", doc('<feed name="c7c"/><pipe/>').encode()),
        ("domain", b"<restms><feed name='c7d'>"),
        ("pipe", doc('<feed name="c7e"/>').encode()),
        ("pipe", doc("<pipe/>").encode()),
        ("pipe", doc("").encode()),
        ("pipe", doc('<join feed="/restms/feed/matrix"/><join feed="/restms/feed/x"/>').encode()),
    ],
)
async def test_C7_bad_creation_document_is_400(
    world: World, gw: Gateway, target: str, body: bytes
) -> None:
    (await call(gw, "POST", world.uri(target), body)).assert_text_error(400)
    domain = await call(gw, "GET", DOMAIN)
    assert not any(f.get("name", "").startswith("c7") for f in domain.children("feed"))


async def test_C8_empty_name_creates_a_private_feed(gw: Gateway) -> None:
    r = await call(gw, "POST", DOMAIN, doc('<feed name="" type="topic" title="" license=""/>'))
    assert r.status == 201
    assert r.headers["Location"].startswith(gw.uri("/restms/resource/"))
    assert not r.top().get("name")
    assert r.top().get("type") == "topic"
    again = await call(gw, "POST", DOMAIN, doc('<feed name="" type="topic"/>'))
    assert again.status == 201
    assert again.headers["Location"] != r.headers["Location"]
    domain = await call(gw, "GET", DOMAIN)
    hrefs = [f.get("href") for f in domain.children("feed")]
    assert r.headers["Location"] not in hrefs


async def test_C8_empty_title_counts_as_absent(gw: Gateway) -> None:
    r = await call(gw, "POST", DOMAIN, doc('<pipe type="" name="" title=""/>'))
    assert r.status == 201
    assert r.top().get("title", "") == ""
    assert r.top().get("type") == ""


async def test_C9_pipe_name_in_spec_is_ignored(gw: Gateway) -> None:
    r = await call(gw, "POST", DOMAIN, doc('<pipe name="stale-cached-name" type="fifo"/>'))
    assert r.status == 201
    name = r.top().get("name")
    assert name != "stale-cached-name"
    assert r.headers["Location"].endswith(f"/restms/resource/{name}")
    assert (await call(gw, "GET", "/restms/resource/stale-cached-name")).status == 404
    again = await call(gw, "POST", DOMAIN, doc(f'<pipe name="{name}"/>'))
    assert again.status == 201
    assert again.top().get("name") != name


async def test_C10_slug_names_a_feed_without_a_name(gw: Gateway) -> None:
    r = await call(gw, "POST", DOMAIN, doc('<feed type="fanout"/>'), Slug="slugged")
    assert r.status == 201
    assert r.headers["Location"] == gw.uri("/restms/feed/slugged")
    assert r.top().get("name") == "slugged"
    assert (await call(gw, "GET", "/restms/feed/slugged")).status == 200


async def test_C10_name_in_document_wins_over_slug(gw: Gateway) -> None:
    r = await call(gw, "POST", DOMAIN, doc('<feed name="named" type="fanout"/>'), Slug="slug")
    assert r.status == 201
    assert r.headers["Location"] == gw.uri("/restms/feed/named")
    assert (await call(gw, "GET", "/restms/feed/slug")).status == 404


# ---------------------------------------------------------------- §1.4 retrieve/update/delete
@pytest.mark.parametrize("kind", ["domain", "feed", "private_feed", "pipe", "join", "message"])
async def test_R1_get_has_validators_and_changes_nothing(
    world: World, gw: Gateway, kind: str
) -> None:
    first = await call(gw, "GET", world.uri(kind))
    second = await call(gw, "GET", world.uri(kind))
    assert first.status == second.status == 200
    assert first.headers["ETag"]
    assert first.headers["Last-Modified"]
    assert first.headers["ETag"] == second.headers["ETag"]
    assert first.body == second.body


@pytest.mark.parametrize("kind", ["feed", "private_feed"])
async def test_R2_put_on_feed_updates_title_and_license(
    world: World, gw: Gateway, kind: str
) -> None:
    before = await call(gw, "GET", world.uri(kind))
    r = await call(gw, "PUT", world.uri(kind), doc('<feed title="New title" license="GPL"/>'))
    assert r.status == 200, r.body
    assert r.top().get("title") == "New title"
    assert r.top().get("license") == "GPL"
    assert r.headers["ETag"] != before.headers["ETag"]
    after = await call(gw, "GET", world.uri(kind))
    assert after.top().get("title") == "New title"
    assert after.top().get("license") == "GPL"
    assert after.top().get("type") == "fanout"
    assert after.headers["ETag"] == r.headers["ETag"]


@pytest.mark.parametrize("kind", ["feed", "private_feed", "pipe"])
async def test_R2_empty_put_is_204_and_changes_nothing(
    world: World, gw: Gateway, kind: str
) -> None:
    before = await call(gw, "GET", world.uri(kind))
    r = await call(gw, "PUT", world.uri(kind), b"")
    assert r.status == 204
    assert r.body == b""
    after = await call(gw, "GET", world.uri(kind))
    assert after.headers["ETag"] == before.headers["ETag"]
    assert after.body == before.body


@pytest.mark.parametrize(
    "body",
    [
        b"<restms><feed title='x'>",
        doc('<pipe title="x"/>').encode(),
        doc('<feed title="a"/><feed title="b"/>').encode(),
        doc("").encode(),
    ],
)
async def test_R2_put_with_bad_document_is_400(world: World, gw: Gateway, body: bytes) -> None:
    before = await call(gw, "GET", world.feed)
    (await call(gw, "PUT", world.feed, body)).assert_text_error(400)
    assert (await call(gw, "GET", world.feed)).body == before.body


async def test_R3_put_changing_feed_name_is_403(world: World, gw: Gateway) -> None:
    r = await call(gw, "PUT", world.feed, doc('<feed name="renamed" title="t"/>'))
    r.assert_text_error(403)
    assert (await call(gw, "GET", "/restms/feed/renamed")).status == 404
    assert (await call(gw, "GET", world.feed)).top().get("title") != "t"


async def test_R3_put_changing_feed_type_is_403(world: World, gw: Gateway) -> None:
    r = await call(gw, "PUT", world.feed, doc('<feed type="topic" title="t"/>'))
    r.assert_text_error(403)
    assert (await call(gw, "GET", world.feed)).top().get("type") == "fanout"


async def test_R3_put_naming_a_private_feed_is_403(world: World, gw: Gateway) -> None:
    r = await call(gw, "PUT", world.private_feed, doc('<feed name="now-public"/>'))
    r.assert_text_error(403)


async def test_R3_put_repeating_name_and_type_is_200(world: World, gw: Gateway) -> None:
    r = await call(gw, "PUT", world.feed, doc('<feed name="matrix" type="fanout" title="same"/>'))
    assert r.status == 200
    assert r.top().get("title") == "same"
    r = await call(gw, "PUT", world.private_feed, doc('<feed name="" type="" title="p"/>'))
    assert r.status == 200
    assert r.top().get("title") == "p"
    assert r.top().get("type") == "fanout"


async def test_L8_put_on_pipe_changes_its_title_only(world: World, gw: Gateway) -> None:
    body = doc(f'<pipe type="fifo" name="{world.pipe_name}" title="title"/>')
    r = await call(gw, "PUT", world.pipe, body)
    assert r.status == 200, r.body
    assert r.top().get("title") == "title"
    got = await call(gw, "GET", world.pipe)
    assert got.top().get("title") == "title"
    assert got.top().get("name") == world.pipe_name
    assert got.top().get("type") == ""
    assert len(got.children("join")) == 2


async def test_L8_put_on_deleted_pipe_is_404(world: World, gw: Gateway) -> None:
    assert (await call(gw, "DELETE", world.pipe)).status == 200
    (await call(gw, "PUT", world.pipe, doc('<pipe title="x"/>'))).assert_text_error(404)


@pytest.mark.parametrize(
    "kind", ["feed", "private_feed", "pipe", "join", "staged", "message", "content"]
)
async def test_R4_L10_delete_twice_is_200_both_times(world: World, gw: Gateway, kind: str) -> None:
    first = await call(gw, "DELETE", world.uri(kind))
    assert first.status == 200, first.body
    second = await call(gw, "DELETE", world.uri(kind))
    assert second.status == 200, second.body
    (await call(gw, "GET", world.uri(kind))).assert_text_error(404)


@pytest.mark.parametrize(
    "path", ["/restms/resource/never-issued", "/restms/feed/never-made", "/restms/domain/nope"]
)
async def test_R4_delete_on_unknown_resource_is_200(gw: Gateway, path: str) -> None:
    assert (await call(gw, "DELETE", path)).status == 200


async def test_R4_deleted_public_feed_leaves_the_domain(world: World, gw: Gateway) -> None:
    assert (await call(gw, "DELETE", world.feed)).status == 200
    domain = await call(gw, "GET", DOMAIN)
    assert "matrix" not in [f.get("name") for f in domain.children("feed")]
    again = await call(gw, "POST", DOMAIN, doc('<feed name="matrix" type="topic"/>'))
    assert again.status == 201
    assert again.top().get("type") == "topic"


async def test_R5_deleting_a_pipe_deletes_joins_and_messages(world: World, gw: Gateway) -> None:
    assert (await call(gw, "DELETE", world.pipe)).status == 200
    for kind in ("pipe", "join", "default_join", "message", "content", "asynclet"):
        r = await asyncio.wait_for(call(gw, "GET", world.uri(kind)), timeout=2)
        assert r.status == 404, kind


async def test_R5_deleting_a_feed_deletes_its_joins_and_staged_contents(
    world: World, gw: Gateway
) -> None:
    assert (await call(gw, "DELETE", world.feed)).status == 200
    assert (await call(gw, "GET", world.staged)).status == 404
    pipe = await call(gw, "GET", world.pipe)
    assert world.join not in [j.get("href") for j in pipe.children("join")]
    # Messages already delivered stay (R5 [REC], Q29).
    assert (await call(gw, "GET", world.message)).status == 200


async def test_R6_join_goes_with_its_feed(world: World, gw: Gateway) -> None:
    assert (await call(gw, "DELETE", world.feed)).status == 200
    (await call(gw, "GET", world.join)).assert_text_error(404)
    assert (await call(gw, "DELETE", world.join)).status == 200


async def test_R6_deleted_join_leaves_the_pipe(world: World, gw: Gateway) -> None:
    assert (await call(gw, "DELETE", world.join)).status == 200
    pipe = await call(gw, "GET", world.pipe)
    assert [j.get("href") for j in pipe.children("join")] == [world.default_join]


@pytest.mark.parametrize("kind", ["feed", "pipe", "join", "staged"])
async def test_R7_delete_ignores_accept_and_content_type(
    world: World, gw: Gateway, kind: str
) -> None:
    r = await call(
        gw,
        "DELETE",
        world.uri(kind),
        b"ignored",
        content_type="image/png",
        Accept="image/png",
    )
    assert r.status == 200, r.body
    assert (await call(gw, "GET", world.uri(kind))).status == 404


# ---------------------------------------------------------------- §1.5 status catalogue
async def test_S1_publish_is_200_and_staging_201(world: World, gw: Gateway) -> None:
    staged = await call(gw, "POST", world.feed, b"x", content_type="application/pdf")
    assert staged.status == 201
    published = await call(gw, "POST", world.feed, doc('<message address="a"/>'))
    assert published.status == 200
    assert "Location" not in published.headers
