"""No input produces a 500 (S4): a bounded, seeded fuzz of bodies, headers and paths.

Valid documents are mutated (byte flips, truncation, splices, type swaps) and sent
with assorted media types and hostile headers to every resource kind. Every reply
must be below 500, and every 4xx must be text/plain with a reason.
"""

from __future__ import annotations

import random

from tests.conftest import Gateway

XML = "application/restms+xml"
JSON = "application/restms+json"

SEEDS = [
    b'<restms><feed name="f1" type="topic" title="t"/></restms>',
    b'<restms><pipe type="ondemand" title="x"/></restms>',
    b'<restms><join address="a.*" feed="/restms/feed/f1">'
    b'<header name="h" value="v"/></join></restms>',
    b'<restms><message address="a.b" priority="3" delivery_mode="2" expiration="100">'
    b'<header name="h" value="v"/><content type="text/plain" encoding="base64">aGk=</content>'
    b'<content href="/restms/resource/nope"/></message></restms>',
    b'{"restms":{"feed":[{"name":"f2","type":"fanout"}]}}',
    b'{"restms":{"message":[{"address":"x","content":[{"value":"hi","encoding":"plain"}]}]}}',
    b'{"restms":{"join":[{"feed":"http://[bad/restms/feed/f1","address":"#"}]}}',
    b'<?xml version="1.0" encoding="UTF-16"?><restms/>',
    b'<!DOCTYPE restms [<!ENTITY e SYSTEM "file:///etc/passwd">]>'
    b'<restms><feed name="&e;"/></restms>',
]
TYPES = [
    XML,
    JSON,
    "text/xml",
    "application/xml",
    "application/json",
    "",
    "image/png",
    "text/plain; charset=utf-8",
    "application/restms+xml; charset=latin-1",
    "multipart/x",
]
HOSTILE_HEADERS = [
    {"Accept": "application/restms+json;q=abc, */*;q=-1"},
    {"Accept": "text/event-stream;q=0.1, application/restms+json"},
    {"Accept": "image/png"},
    {"If-None-Match": 'W/"x", *'},
    {"If-Modified-Since": "not a date"},
    {"If-Match": '"nope"'},
    {"If-Unmodified-Since": "Sun, 06 Nov 1994 08:49:37 UTC"},
    {"When-Modified-After": "garbage"},
    {"Last-Event-ID": "99999999999999999999999"},
    {"Slug": "a b@c/d"},
    {"Slug": ".."},
]


def _mutate(rng: random.Random, body: bytes) -> bytes:
    data = bytearray(body)
    for _ in range(rng.randint(1, 4)):
        choice = rng.randrange(5)
        if choice == 0 and data:
            data[rng.randrange(len(data))] = rng.randrange(256)
        elif choice == 1 and data:
            del data[rng.randrange(len(data)) :]
        elif choice == 2:
            other = rng.choice(SEEDS)
            cut = rng.randrange(len(other) + 1)
            data[rng.randrange(len(data) + 1) :] = other[cut:]
        elif choice == 3 and data:
            pos = rng.randrange(len(data))
            data[pos:pos] = rng.choice(
                [b"&", b"<", b'"', b"\x00", b"\xff\xfe", b"{", b"]]>", b"\\u0000"]
            )
    return bytes(data)


async def test_S4_no_input_produces_a_500(make_gateway) -> None:  # type: ignore[no-untyped-def]
    gw: Gateway = await make_gateway(max_wait=0.05)
    rng = random.Random(20261121)
    async with gw.http.post(
        "/restms/domain/default", data=b"<restms><pipe/></restms>", headers={"Content-Type": XML}
    ) as r:
        pipe = r.headers["Location"].split("/restms/", 1)[1]
    async with gw.http.post(
        "/restms/domain/default", data=SEEDS[0], headers={"Content-Type": XML}
    ) as r:
        assert r.status in (200, 201)
    paths = [
        "/restms/domain/default",
        "/restms/feed/f1",
        "/restms/feed/default",
        f"/restms/{pipe}",
        f"/restms/{pipe}.1",
        f"/restms/{pipe}.0.0",
        "/restms/resource/x.y.z",
        "/restms/domain/nope",
        "/restms/feed/%2e%2e",
        "/restms/resource/" + "A" * 5000,
    ]
    methods = ["GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"]
    seen = set()
    for _ in range(600):
        method = rng.choice(methods)
        path = rng.choice(paths)
        body = _mutate(rng, rng.choice(SEEDS)) if rng.random() < 0.9 else rng.choice(SEEDS)
        headers = dict(rng.choice(HOSTILE_HEADERS)) if rng.random() < 0.4 else {}
        content_type = rng.choice(TYPES)
        if content_type:
            headers["Content-Type"] = content_type
        async with gw.http.request(method, path, data=body, headers=headers) as r:
            text = await r.read()
            assert r.status < 500 or r.status == 503, (method, path, headers, body, r.status, text)
            if r.status >= 400:
                assert r.headers["Content-Type"].startswith("text/plain"), (r.status, text)
                assert method == "HEAD" or text.strip(), "an error reply must say why"
            seen.add(r.status)
    # the fuzz reached the interesting statuses, so it exercised real paths
    assert {200, 400, 403, 404, 405}.issubset(seen), seen
