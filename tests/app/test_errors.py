"""Error rules (digest S2-S4, G5, M6, U7): every 4xx is ``text/plain`` with a reason,
bad input is a 4xx and never a 500, and oversized bodies give 413.

The last part throws damaged documents, odd headers and odd paths at every kind
of resource and only asks that the server answer with something other than 500.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import random
from collections.abc import AsyncIterator

import pytest
from yarl import URL

from tests.app.xmlapi import Reply, call, doc
from tests.conftest import Gateway, MakeGateway

XML = "application/restms+xml"
JSON = "application/restms+json"
DOMAIN = "/restms/domain/default"
DEFAULT_FEED = "/restms/feed/default"
NS = "http://www.restms.org/schema/restms"


@dataclasses.dataclass
class Targets:
    feed: str
    pipe: str
    pipe_name: str
    join: str
    staged: str


@pytest.fixture
async def targets(gw: Gateway) -> Targets:
    feed = await call(gw, "POST", DOMAIN, doc('<feed name="err" type="topic"/>'))
    pipe = await call(gw, "POST", DOMAIN, doc("<pipe/>"))
    join = await call(gw, "POST", pipe.headers["Location"], doc('<join feed="/restms/feed/err"/>'))
    staged = await call(gw, "POST", "/restms/feed/err", b"s", content_type="text/plain")
    assert (feed.status, pipe.status, join.status, staged.status) == (201, 201, 201, 201)
    name = URL(pipe.headers["Location"]).name
    return Targets(
        feed="/restms/feed/err",
        pipe=URL(pipe.headers["Location"]).path,
        pipe_name=name,
        join=URL(join.headers["Location"]).path,
        staged=URL(staged.headers["Location"]).path,
    )


# ---------------------------------------------------------------- S4 by status
BILLION_LAUGHS = (
    '<?xml version="1.0"?><!DOCTYPE restms [<!ENTITY a "aaaaaaaaaa">'
    '<!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;"><!ENTITY c "&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;">]>'
    '<restms><feed name="bl" title="&c;"/></restms>'
)
XXE = (
    '<?xml version="1.0"?><!DOCTYPE restms [<!ENTITY x SYSTEM "file:///etc/passwd">]>'
    '<restms><feed name="xxe" title="&x;"/></restms>'
)

BAD_DOMAIN_POSTS = [
    pytest.param(b"<restms><feed name='x'>", XML, id="unclosed-xml"),
    pytest.param(b"<restms><feed name=x/></restms>", XML, id="unquoted-attr"),
    pytest.param(b"not xml at all", XML, id="text-as-xml"),
    pytest.param(b'<feed name="x"/>', XML, id="wrong-root"),
    pytest.param(b'<restms><feed name="\xff\xfe"/></restms>', XML, id="bad-utf8-xml"),
    pytest.param(BILLION_LAUGHS.encode(), XML, id="billion-laughs"),
    pytest.param(XXE.encode(), XML, id="xxe"),
    pytest.param(b'{"restms": {', JSON, id="unclosed-json"),
    pytest.param(b"[1, 2]", JSON, id="json-array"),
    pytest.param(b'"restms"', JSON, id="json-string"),
    pytest.param(b'{"other": {}}', JSON, id="json-no-restms"),
    pytest.param(b'{"restms": []}', JSON, id="json-restms-array"),
    pytest.param(b'{"restms": {"feed": "x"}}', JSON, id="json-feed-string"),
    pytest.param(b'{"restms": {"feed": [1]}}', JSON, id="json-feed-number"),
    pytest.param(b'{"restms": {"feed": [{"name": "\\u0001"}]}}', JSON, id="json-control"),
    pytest.param(b'{"restms": {"feed": [{"name": "\\ud800"}]}}', JSON, id="json-lone-surrogate"),
    pytest.param(b'{"restms": {"feed": [{"name": "\xff"}]}}', JSON, id="bad-utf8-json"),
    pytest.param(b'{"restms": {"bad tag": [{}]}}', JSON, id="json-bad-tag"),
    pytest.param(doc('<feed name="a/b"/>').encode(), XML, id="name-with-slash"),
    pytest.param(doc('<feed name="a@b"/>').encode(), XML, id="name-with-at"),
    pytest.param(doc('<feed name="a b"/>').encode(), XML, id="name-with-space"),
    pytest.param(doc(f'<feed name="{"n" * 5000}"/>').encode(), XML, id="name-too-long"),
    pytest.param(doc('<feed name="x" type="queue"/>').encode(), XML, id="unknown-feed-type"),
    pytest.param(doc('<pipe type="stream-ish"/>').encode(), XML, id="unknown-pipe-type"),
    pytest.param(b"<a>" * 100 + b"</a>" * 100, XML, id="deep-nesting-no-root"),
    pytest.param(doc("<feed>" * 60 + "</feed>" * 60).encode(), XML, id="deep-nesting"),
]


@pytest.mark.parametrize(("body", "content_type"), BAD_DOMAIN_POSTS)
async def test_S2_S4_bad_document_on_domain_is_400_text_plain(
    gw: Gateway, body: bytes, content_type: str
) -> None:
    r = await call(gw, "POST", DOMAIN, body, content_type=content_type)
    r.assert_text_error(400)


async def test_G5_entities_are_never_expanded(gw: Gateway) -> None:
    await call(gw, "POST", DOMAIN, XXE)
    await call(gw, "POST", DOMAIN, BILLION_LAUGHS)
    for name in ("xxe", "bl"):
        assert (await call(gw, "GET", f"/restms/feed/{name}")).status == 404


BAD_PUBLISHES = [
    pytest.param('<message><content encoding="zip">x</content></message>', id="bad-encoding"),
    pytest.param('<message><content encoding="base64">%%%</content></message>', id="bad-b64"),
    pytest.param('<message><content encoding="base64">abcde</content></message>', id="b64-pad"),
    pytest.param(
        '<message><content encoding="base64">\u00e9t\u00e9</content></message>',
        id="b64-non-ascii",
    ),
    pytest.param('<message priority="10"/>', id="priority-10"),
    pytest.param('<message priority="high"/>', id="priority-word"),
    pytest.param('<message delivery_mode="3"/>', id="delivery-mode-3"),
    pytest.param('<message expiration="-5"/>', id="expiration-negative"),
    pytest.param('<message><header value="v"/></message>', id="header-without-name"),
    pytest.param("", id="no-message"),
]


@pytest.mark.parametrize("inner", BAD_PUBLISHES)
async def test_M6_S2_bad_publish_is_400_text_plain(
    gw: Gateway, targets: Targets, inner: str
) -> None:
    r = await call(gw, "POST", targets.feed, doc(inner))
    r.assert_text_error(400)


async def test_S4_403_is_text_plain(gw: Gateway, targets: Targets) -> None:
    (await call(gw, "PUT", targets.join, doc("<join/>"))).assert_text_error(403)


async def test_S4_404_is_text_plain(gw: Gateway) -> None:
    (await call(gw, "GET", "/restms/resource/missing")).assert_text_error(404)


async def test_S4_405_is_text_plain_with_allow(gw: Gateway, targets: Targets) -> None:
    r = await call(gw, "PATCH", targets.feed, doc('<feed title="x"/>'))
    r.assert_text_error(405)
    assert "GET" in r.headers["Allow"]


async def test_S4_router_404_and_405_are_text_plain(gw: Gateway) -> None:
    """Requests no route serves get the router's answers, as every error: text/plain."""
    for method in ("GET", "POST", "OPTIONS"):
        (await call(gw, method, "/no/such/path")).assert_text_error(404)
    assert (await call(gw, "HEAD", "/no/such/path")).status == 404
    r = await call(gw, "DELETE", "/healthz")  # served, for GET and HEAD only
    r.assert_text_error(405)
    assert r.headers["Allow"] == "GET,HEAD"
    r = await call(gw, "GET", "/admin/pipes/x/messages")  # another route's prefix
    r.assert_text_error(405)
    assert r.headers["Allow"] == "DELETE"


async def test_S4_406_is_text_plain(gw: Gateway) -> None:
    (await call(gw, "GET", DOMAIN, Accept="image/gif")).assert_text_error(406)


async def test_S4_412_is_text_plain(gw: Gateway, targets: Targets) -> None:
    r = await call(gw, "DELETE", targets.feed, If_Match='"nope"')
    r.assert_text_error(412)


async def test_S4_415_is_text_plain(gw: Gateway) -> None:
    (await call(gw, "POST", DOMAIN, "<pipe/>", content_type="text/plain")).assert_text_error(415)


# ---------------------------------------------------------------- S3 413 body limit
@pytest.fixture
async def small(make_gateway: MakeGateway) -> Gateway:
    return await make_gateway(max_body=1000)


@pytest.mark.parametrize(
    ("method", "path", "content_type"),
    [
        ("POST", DEFAULT_FEED, "application/octet-stream"),
        ("POST", DEFAULT_FEED, XML),
        ("POST", DOMAIN, XML),
        ("POST", DOMAIN, JSON),
    ],
)
async def test_S3_body_over_max_body_is_413(
    small: Gateway, method: str, path: str, content_type: str
) -> None:
    body = doc(f'<message address="a"><content>{"x" * 2000}</content></message>').encode()
    (await call(small, method, path, body, content_type=content_type)).assert_text_error(413)


async def test_S3_a_body_that_unpacks_past_max_body_is_413(small: Gateway) -> None:
    """Counted as it is read, not as it came: 100 bytes of gzip unpack to 5,000."""
    body = doc(f'<message address="a"><content>{"x" * 5000}</content></message>').encode()
    packed = gzip.compress(body)
    assert len(packed) < 1000 < len(body)
    reply = await call(small, "POST", DEFAULT_FEED, packed, Content_Encoding="gzip")
    reply.assert_text_error(413)


async def test_S3_a_body_under_max_body_unpacked_is_published(small: Gateway) -> None:
    body = doc('<message address="a"><content>packed</content></message>').encode()
    reply = await call(small, "POST", DEFAULT_FEED, gzip.compress(body), Content_Encoding="gzip")
    assert reply.status == 200, reply.body


async def test_S3_put_over_max_body_is_413(small: Gateway) -> None:
    assert (await call(small, "POST", DOMAIN, doc('<feed name="big"/>'))).status == 201
    body = doc(f'<feed title="{"t" * 2000}"/>')
    (await call(small, "PUT", "/restms/feed/big", body)).assert_text_error(413)
    assert (await call(small, "GET", "/restms/feed/big")).status == 200


async def test_S3_chunked_body_over_max_body_is_413(small: Gateway) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(20):
            yield b"y" * 200

    async with small.http.post(
        DEFAULT_FEED, data=chunks(), headers={"Content-Type": "application/octet-stream"}
    ) as r:
        reply = Reply(r.status, r.headers, await r.read())
    reply.assert_text_error(413)


async def test_S3_body_at_max_body_is_accepted(small: Gateway) -> None:
    r = await call(small, "POST", DEFAULT_FEED, b"z" * 1000, content_type="text/plain")
    assert r.status == 201
    assert (await call(small, "GET", r.headers["Location"])).body == b"z" * 1000


async def test_S3_too_many_elements_is_rejected(make_gateway: MakeGateway) -> None:
    gw = await make_gateway(max_elements=10)
    body = doc('<message address="a"/>' * 20)
    r = await call(gw, "POST", DEFAULT_FEED, body)
    assert r.status in (400, 413)
    r.assert_sane()


# ---------------------------------------------------------------- no input gives 500
ODD_REQUESTS = [
    ("GET", "/restms/feed/%ZZ", None, {}),
    ("GET", "/restms/feed/%2F", None, {}),
    ("GET", "/restms/resource/%00", None, {}),
    ("GET", "/restms/resource/..%2F..%2Fetc", None, {}),
    ("GET", "/restms/resource/" + "h" * 5000, None, {}),
    ("GET", "/restms/resource/a.b.c.d", None, {}),
    ("GET", "/restms/resource/a.-1", None, {}),
    ("GET", "/restms/resource/a.99999999999999999999999", None, {}),
    ("GET", "/restms/domain/default?x=%ZZ&&&", None, {}),
    ("GET", DOMAIN, None, {"If-Modified-Since": "yesterday"}),
    ("GET", DOMAIN, None, {"If-Modified-Since": "Mon, 99 Foo 99999 99:99:99 GMT"}),
    ("GET", DOMAIN, None, {"If-None-Match": ",,,"}),
    ("GET", DOMAIN, None, {"If-None-Match": 'W/"'}),
    ("GET", DOMAIN, None, {"When-Modified-After": "not a date"}),
    ("GET", DOMAIN, None, {"When-None-Match": ","}),
    ("GET", DOMAIN, None, {"Accept": ";;;q=abc"}),
    ("GET", DOMAIN, None, {"Accept": f"{JSON};q=nan"}),
    ("GET", DOMAIN, None, {"Accept": f"{JSON};q=1e999, {XML};q=-1"}),
    ("GET", DOMAIN, None, {"Accept": ","}),
    ("PUT", "/restms/feed/err", b"", {"If-Unmodified-Since": "garbage"}),
    ("DELETE", "/restms/feed/err", None, {"If-Match": ""}),
    ("POST", DOMAIN, doc('<feed type="fanout"/>'), {"Slug": "a/b"}),
    ("POST", DOMAIN, doc('<feed type="fanout"/>'), {"Slug": "   "}),
    ("POST", DOMAIN, doc("<pipe/>"), {"Content-Type": ";;;"}),
    ("POST", DOMAIN, doc("<pipe/>"), {"Content-Type": "application/restms+xml; charset=nope"}),
    ("POST", "/restms/feed/err", b"\x00\x01", {"Content-Type": "\t"}),
    ("POST", "/restms/feed/err", b"<restms", {"Content-Type": ""}),
    ("POST", "/restms/feed/err", b'{"restms": [', {"Content-Type": ""}),
    ("POST", "/restms/feed/err", b'{"restms": 5}', {"Content-Type": JSON}),
    ("POST", "/restms/feed/err", b'{"restms": {"message": [{"content": [5]}]}}', {}),
    ("POST", "/restms/feed/err", b'{"restms": {"message": [{"content": [{"value": []}]}]}}', {}),
    ("POST", "/restms/feed/err", b'{"restms": {"message": [{"header": [{"name": 1}]}]}}', {}),
    ("POST", "/restms/feed/err", doc('<message><content href="http://[::1"/></message>'), {}),
    ("POST", "/restms/feed/err", doc('<message><content href="%%%"/></message>'), {}),
    ("POST", "/restms/feed/err", doc('<message><content href=""/></message>'), {}),
]


@pytest.mark.parametrize(
    ("method", "path", "body", "headers"),
    [pytest.param(*case, id=f"{i}-{case[0]}") for i, case in enumerate(ODD_REQUESTS)],
)
async def test_S4_odd_requests_never_give_500(
    gw: Gateway,
    targets: Targets,
    method: str,
    path: str,
    body: str | bytes | None,
    headers: dict[str, str],
) -> None:
    hdrs = dict(headers)
    content_type = hdrs.pop("Content-Type", XML if body is not None else None)
    if body is not None and "Content-Type" not in headers and path.startswith("/restms/feed"):
        content_type = JSON if isinstance(body, bytes) and body.startswith(b"{") else XML
    r = await call(gw, method, path, body, content_type=content_type, **hdrs)
    r.assert_sane()


@pytest.mark.parametrize(
    ("inner", "join_feed"),
    [
        ('<join feed="http://[::1"/>', True),
        ('<join feed="/restms/resource/STAGED"/>', True),
        ('<join feed="/restms/resource/PIPE"/>', True),
        ('<join feed="/restms/domain/default"/>', True),
        ('<join feed="/restms/feed/err" address="{long}"/>', True),
        ('<join feed="/restms/feed/err" type="x"/>', True),
        ('<join feed="/restms/feed/err"><header/></join>', True),
    ],
)
async def test_G14_bad_join_is_4xx_not_500(
    gw: Gateway, targets: Targets, inner: str, join_feed: bool
) -> None:
    inner = (
        inner.replace("STAGED", URL(targets.staged).name)
        .replace("PIPE", targets.pipe_name)
        .replace("{long}", "a" * 5000)
    )
    r = await call(gw, "POST", targets.pipe, doc(inner))
    assert 400 <= r.status < 500, (r.status, r.body)
    r.assert_sane()


SEEDS = {
    "domain-feed": (DOMAIN, doc('<feed name="fz" type="topic" title="t" license="l"/>')),
    "domain-pipe": (DOMAIN, doc('<pipe type="" title="t"/>')),
    "publish": (
        "/restms/feed/err",
        doc(
            '<message address="a.b" message_id="m" priority="3"><header name="h" value="v"/>'
            '<content type="text/plain" encoding="base64">aGVsbG8=</content></message>'
        ),
    ),
    "join": ("PIPE", doc('<join address="a.#" feed="/restms/feed/err"/>')),
}


def mutations(seed: str, rng: random.Random, count: int) -> list[bytes]:
    """Truncations and byte-level damage of a valid document."""
    raw = seed.encode()
    out = [raw[:cut] for cut in range(0, len(raw), max(1, len(raw) // 12))]
    specials = b"<>&\"'/=\x00\xff{}[]:,"
    for _ in range(count):
        data = bytearray(raw)
        for _ in range(rng.randint(1, 4)):
            pos = rng.randrange(len(data))
            action = rng.random()
            if action < 0.4:
                data[pos] = rng.choice(specials)
            elif action < 0.7:
                del data[pos]
            else:
                data.insert(pos, rng.choice(specials))
        out.append(bytes(data))
    return out


def as_json(seed: str) -> str:
    """The JSON twin of a seed document, built by hand for the fuzz corpus."""
    return {
        "domain-feed": json.dumps(
            {"restms": {"feed": [{"name": "fz", "type": "topic", "title": "t"}]}}
        ),
        "domain-pipe": json.dumps({"restms": {"pipe": [{"title": "t"}]}}),
        "publish": json.dumps(
            {
                "restms": {
                    "message": [
                        {
                            "address": "a.b",
                            "header": [{"name": "h", "value": "v"}],
                            "content": [{"encoding": "base64", "value": "aGVsbG8="}],
                        }
                    ]
                }
            }
        ),
        "join": json.dumps({"restms": {"join": [{"feed": "/restms/feed/err", "address": "#"}]}}),
    }[seed]


@pytest.mark.parametrize("fmt", ["xml", "json"])
@pytest.mark.parametrize("seed", list(SEEDS))
async def test_S2_damaged_documents_never_give_500(
    gw: Gateway, targets: Targets, seed: str, fmt: str
) -> None:
    path, body = SEEDS[seed]
    path = targets.pipe if path == "PIPE" else path
    if fmt == "json":
        body = as_json(seed)
    rng = random.Random(f"{seed}-{fmt}")
    content_type = JSON if fmt == "json" else XML
    statuses = set()
    for damaged in mutations(body, rng, 40):
        r = await call(gw, "POST", path, damaged, content_type=content_type)
        r.assert_sane()
        statuses.add(r.status)
    assert 400 in statuses


@pytest.mark.parametrize("fmt", ["xml", "json"])
async def test_S2_damaged_put_documents_never_give_500(
    gw: Gateway, targets: Targets, fmt: str
) -> None:
    body = (
        json.dumps({"restms": {"feed": [{"title": "t", "license": "l"}]}})
        if fmt == "json"
        else doc('<feed name="err" type="topic" title="t" license="l"/>')
    )
    rng = random.Random(f"put-{fmt}")
    for damaged in mutations(body, rng, 40):
        for path in (targets.feed, targets.pipe):
            r = await call(gw, "PUT", path, damaged, content_type=JSON if fmt == "json" else XML)
            r.assert_sane()
