"""Compressed replies and request bodies (``gateway/server/compression.py``,
docs/OPERATIONS.md "Compression"), against a real gateway on 127.0.0.1.

Decided behaviour under test:

* A textual reply of at least ``compression_min_bytes`` is compressed for a client
  whose ``Accept-Encoding`` accepts it: ``zstd`` or ``gzip``, the one weighed higher
  (zstd on a tie; ``q=0`` refuses, ``*`` stands for the others), with ``Vary:
  Accept-Encoding``, and decodes to the very bytes sent uncompressed: the OpenAPI
  document, a pipe listing, a batched publish's reply; its ETag is the weak form of the
  plain reply's (other bytes), which revalidates (304, naming the tag sent) and serves
  If-Match as the strong one does. Smaller
  replies, streams, and gateways with ``compression = false`` are sent as they are.
* A request body with ``Content-Encoding: gzip``, ``deflate`` or ``zstd`` is decoded;
  ``max_body`` counts the decoded bytes, so a zip bomb is ``413`` with a ``text/plain``
  reason and the gateway's memory stays bounded; a broken gzip stream is ``400``, and
  so is ``br`` (the parser has no decoder for it); any other coding is ``415``.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import zlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from multidict import CIMultiDict

from gateway.server import compression
from gateway.server.compression import choose, zstd
from tests.app.jsonapi import AJ, DOMAIN, HJ, body, new_pipe
from tests.conftest import Gateway, MakeGateway

pytestmark = pytest.mark.app

FEED = "/restms/feed/default"
GZIP = {"Accept-Encoding": "gzip"}
IDENTITY = {"Accept-Encoding": "identity"}
ZSTD = {"Accept-Encoding": "zstd"}
DECODE = {"gzip": gzip.decompress, "zstd": zstd.decompress, None: lambda body: body}


async def raw(
    gw: Gateway, method: str, path: str, **kwargs: Any
) -> tuple[int, CIMultiDict[str], bytes]:
    """The reply as sent: its status, headers and undecoded body."""
    async with gw.http.request(method, path, auto_decompress=False, **kwargs) as r:
        return r.status, r.headers.copy(), await r.read()


def messages(count: int, size: int = 200) -> bytes:
    text = "x" * size
    return body(
        message=[
            {"address": f"a{i}", "content": [{"type": "text/plain", "value": text}]}
            for i in range(count)
        ]
    )


async def filled_pipe(gw: Gateway, count: int) -> str:
    """A new pipe holding ``count`` messages; its URI."""
    pipe = await new_pipe(gw)
    # the pipe's default join takes messages addressed to its name on the default feed
    payload = json.loads(messages(count))
    for message in payload["restms"]["message"]:
        message["address"] = pipe["name"]
    async with gw.http.post(FEED, data=json.dumps(payload), headers=HJ) as r:
        assert r.status == 200, await r.text()
    return str(pipe["uri"])


# ---------------------------------------------------------------- replies
async def test_the_openapi_document_is_compressed_for_gzip_clients(gw: Gateway) -> None:
    status, plain_headers, plain = await raw(gw, "GET", "/openapi.json", headers=IDENTITY)
    assert status == 200
    assert "Content-Encoding" not in plain_headers
    status, headers, packed = await raw(gw, "GET", "/openapi.json", headers=GZIP)
    assert status == 200
    assert headers["Content-Encoding"] == "gzip"
    assert "Accept-Encoding" in headers["Vary"]
    assert int(headers["Content-Length"]) == len(packed) < len(plain) / 3
    assert gzip.decompress(packed) == plain


async def test_a_compressed_reply_has_the_weak_form_of_the_etag(gw: Gateway) -> None:
    _, plain_headers, plain = await raw(gw, "GET", "/static/app.js", headers=IDENTITY)
    _, headers, packed = await raw(gw, "GET", "/static/app.js", headers=GZIP)
    assert headers["Content-Encoding"] == "gzip"
    assert gzip.decompress(packed) == plain
    strong = plain_headers["ETag"]
    assert not strong.startswith("W/")
    # other bytes, so not the plain reply's strong tag (RFC 9110 8.8.3)
    assert headers["ETag"] == "W/" + strong
    for sent in (headers["ETag"], strong):  # the compressed copy's tag, or the plain one's
        conditional = {**GZIP, "If-None-Match": sent}
        status, revalidated, empty = await raw(gw, "GET", "/static/app.js", headers=conditional)
        assert (status, empty) == (304, b"")
        assert revalidated["ETag"] == sent  # freshens the copy it names
        # RFC 9110 15.4.5: a 304 has the Vary its 200 would have had
        assert "Accept-Encoding" in revalidated.getall("Vary", [])


async def test_a_pipe_read_compressed_is_revalidated_and_deleted_with_its_weak_etag(
    gw: Gateway,
) -> None:
    uri = await filled_pipe(gw, 50)
    _, headers, _ = await raw(gw, "GET", uri, headers={**AJ, **GZIP})
    assert headers["Content-Encoding"] == "gzip"
    weak = headers["ETag"]
    assert weak.startswith("W/")
    status, _, _ = await raw(gw, "GET", uri, headers={**AJ, **GZIP, "If-None-Match": weak})
    assert status == 304
    stale = weak[:3] + ("0" if weak[3] != "0" else "1") + weak[4:]  # another version's
    status, headers, reason = await raw(gw, "DELETE", uri, headers={"If-Match": stale})
    assert (status, headers["Content-Type"]) == (412, "text/plain; charset=utf-8"), reason
    status, _, reason = await raw(gw, "DELETE", uri, headers={"If-Match": weak})
    assert status == 200, reason


async def test_a_pipe_listing_is_smallest_in_zstd(gw: Gateway) -> None:
    uri = await filled_pipe(gw, 200)
    _, _, plain = await raw(gw, "GET", uri, headers={**AJ, **IDENTITY})
    _, headers, packed = await raw(gw, "GET", uri, headers={**AJ, **ZSTD})
    assert headers["Content-Encoding"] == "zstd"
    assert zstd.decompress(packed) == plain
    _, _, gzipped = await raw(gw, "GET", uri, headers={**AJ, **GZIP})
    assert len(packed) < len(gzipped) < len(plain) / 10


async def test_a_pipe_listing_and_a_batched_publish_reply_are_compressed(gw: Gateway) -> None:
    uri = await filled_pipe(gw, 50)
    status, _plain_headers, plain = await raw(gw, "GET", uri, headers={**AJ, **IDENTITY})
    assert status == 200
    status, headers, packed = await raw(gw, "GET", uri, headers={**AJ, **GZIP})
    assert headers["Content-Encoding"] == "gzip"
    assert gzip.decompress(packed) == plain
    status, headers, packed = await raw(
        gw, "POST", FEED, data=messages(100, 10), headers={**HJ, **GZIP}
    )
    assert status == 200
    assert headers["Content-Encoding"] == "gzip"
    reply = json.loads(gzip.decompress(packed))
    assert len(reply["restms"]["message"]) == 100


@pytest.mark.parametrize(
    ("accept", "coding"),
    [
        ("gzip", "gzip"),
        ("deflate, gzip;q=0.5, br", "gzip"),
        ("GZIP", "gzip"),
        ("zstd", "zstd"),
        ("gzip, deflate, br, zstd", "zstd"),  # as browsers send it over HTTPS
        ("zstd;q=0.5, gzip", "gzip"),
        ("*", "zstd"),
        ("gzip;q=0, *", "zstd"),  # named: the wildcard does not count for gzip
        ("gzip;q=0", None),
        ("*;q=0", None),
        ("identity", None),
        ("br", None),
        ("gzip;q=nonsense", None),
    ],
)
async def test_accept_encoding_is_read_with_its_weights(
    gw: Gateway, accept: str, coding: str | None
) -> None:
    status, headers, packed = await raw(
        gw, "GET", "/openapi.json", headers={"Accept-Encoding": accept}
    )
    assert status == 200
    assert headers.get("Content-Encoding") == coding
    assert choose(accept) == coding
    _, _, plain = await raw(gw, "GET", "/openapi.json", headers=IDENTITY)
    assert DECODE[coding](packed) == plain


async def test_small_replies_and_streams_are_sent_as_they_are(gw: Gateway) -> None:
    status, headers, _ = await raw(gw, "GET", "/healthz", headers=GZIP)
    assert status == 200
    assert "Content-Encoding" not in headers
    status, headers, _ = await raw(gw, "GET", DOMAIN + "-nosuch", headers=GZIP)
    assert "Content-Encoding" not in headers
    pipe = await new_pipe(gw)
    async with gw.http.get(
        pipe["uri"], headers={"Accept": "text/event-stream", **GZIP}, auto_decompress=False
    ) as r:
        assert r.content_type == "text/event-stream"
        assert "Content-Encoding" not in r.headers


async def test_compression_can_be_turned_off_or_its_threshold_moved(
    make_gateway: MakeGateway,
) -> None:
    off = await make_gateway(compression=False)
    _, headers, _ = await raw(off, "GET", "/openapi.json", headers=GZIP)
    assert "Content-Encoding" not in headers
    low = await make_gateway(compression_min_bytes=0)
    _status, headers, packed = await raw(low, "GET", "/healthz", headers=GZIP)
    assert headers["Content-Encoding"] == "gzip"
    assert gzip.decompress(packed) == b"ok\n"


# ---------------------------------------------------------------- request bodies
async def test_a_gzip_request_body_is_decoded(gw: Gateway) -> None:
    plain = messages(20)
    packings = (
        ("gzip", gzip.compress(plain)),
        ("deflate", zlib.compress(plain)),
        ("zstd", zstd.compress(plain)),
    )
    for coding, packed in packings:
        headers = {**HJ, "Content-Encoding": coding}
        async with gw.http.post(FEED, data=packed, headers=headers) as r:
            assert r.status == 200, await r.text()
            assert len((await r.json(content_type=None))["restms"]["message"]) == 20


@pytest.mark.parametrize("coding", ["gzip", "zstd"])
async def test_a_zip_bomb_is_413_and_memory_stays_bounded(
    make_gateway: MakeGateway, coding: str
) -> None:
    gw = await make_gateway(max_body=1 << 20)
    zeros = b"\0" * (512 << 20)
    bomb = gzip.compress(zeros, 9) if coding == "gzip" else zstd.compress(zeros, 19)
    del zeros
    assert len(bomb) < 1 << 20  # 512 MiB in at most 500 KB
    before = await asyncio.to_thread(_rss)
    async with gw.http.post(FEED, data=bomb, headers={**HJ, "Content-Encoding": coding}) as r:
        assert r.status == 413
        assert r.content_type == "text/plain"
        assert "limit" in await r.text()
    assert await asyncio.to_thread(_rss) - before < 64 << 20  # not the 512 MiB it unpacks to


async def test_a_broken_gzip_body_is_400(gw: Gateway) -> None:
    broken = gzip.compress(messages(5))[:-20] + b"garbage-garbage-garbage"
    async with gw.http.post(FEED, data=broken, headers={**HJ, "Content-Encoding": "gzip"}) as r:
        assert r.status == 400
        assert r.content_type == "text/plain"
        assert "Content-Encoding" in await r.text()


@pytest.mark.parametrize("coding", ["gzip", "zstd", "deflate"])
@pytest.mark.parametrize("cut", [8, 900])
async def test_a_body_cut_short_is_400_and_nothing_is_published(
    gw: Gateway, coding: str, cut: int
) -> None:
    """A compressed body whose end is missing (its last bytes, or most of it) is refused:
    before, gzip and zstd bodies were taken as far as they went, and a message was
    published with part of its content, or none."""
    content = os.urandom(1500).hex().encode()  # 3,000 bytes that do not pack well
    pack = {"gzip": gzip.compress, "zstd": zstd.compress, "deflate": zlib.compress}[coding]
    packed = pack(content)
    headers = {"Content-Type": "text/plain", "Content-Encoding": coding}
    async with gw.http.post(FEED, data=packed[:-cut], headers=headers) as r:
        assert r.status == 400, await r.text()
        assert r.content_type == "text/plain"
        assert "Content-Encoding" in await r.text()
        assert "X-Request-ID" in r.headers
    async with gw.http.post(FEED, data=packed, headers=headers) as r:  # whole: published
        assert r.status == 201, await r.text()
        async with gw.http.get(r.headers["Location"]) as stored:
            assert await stored.read() == content


async def test_concatenated_members_and_raw_deflate_are_decoded(gw: Gateway) -> None:
    plain = messages(10)
    halves = gzip.compress(plain[:500]) + gzip.compress(plain[500:])
    raw = zlib.compressobj(6, zlib.DEFLATED, -zlib.MAX_WBITS)
    for coding, packed in (("gzip", halves), ("deflate", raw.compress(plain) + raw.flush())):
        async with gw.http.post(FEED, data=packed, headers={**HJ, "Content-Encoding": coding}) as r:
            assert r.status == 200, await r.text()


async def test_a_body_arriving_in_small_pieces_decodes_alike(gw: Gateway) -> None:
    """Chunks of 7 bytes, two gzip members, a zstd frame: split anywhere, one body."""
    plain = messages(5)
    packings = {
        "gzip": gzip.compress(plain[:300]) + gzip.compress(plain[300:]),
        "zstd": zstd.compress(plain),
    }
    for coding, packed in packings.items():

        async def pieces(packed: bytes = packed) -> AsyncIterator[bytes]:
            for at in range(0, len(packed), 7):
                yield packed[at : at + 7]
                await asyncio.sleep(0)

        headers = {**HJ, "Content-Encoding": coding}
        async with gw.http.post(FEED, data=pieces(), headers=headers) as r:
            assert r.status == 200, await r.text()
            assert len((await r.json(content_type=None))["restms"]["message"]) == 5


async def test_a_brotli_body_is_415_as_the_gateway_does_not_decode_it(gw: Gateway) -> None:
    async with gw.http.post(FEED, data=messages(1), headers={**HJ, "Content-Encoding": "br"}) as r:
        assert r.status == 415
        assert r.content_type == "text/plain"
        assert "X-Request-ID" in r.headers


@pytest.mark.parametrize("coding", ["compress", "gzip, gzip", "x-unknown", "br, gzip"])
async def test_an_unknown_content_encoding_is_415(gw: Gateway, coding: str) -> None:
    async with gw.http.post(
        FEED, data=messages(1), headers={**HJ, "Content-Encoding": coding}
    ) as r:
        assert r.status == 415
        assert r.content_type == "text/plain"
        assert "Content-Encoding" in await r.text()


def _rss() -> int:
    """This process's resident memory (the gateway runs in it), in bytes."""
    with open(f"/proc/{os.getpid()}/statm", encoding="ascii") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.parametrize("coding", ["gzip", "zstd"])
async def test_bodies_over_the_inline_size_are_packed_in_a_thread_alike(
    gw: Gateway, monkeypatch: pytest.MonkeyPatch, coding: str
) -> None:
    _, _, plain = await raw(gw, "GET", "/openapi.json", headers=IDENTITY)
    monkeypatch.setattr(compression, "INLINE_MAX", 1024)  # the OpenAPI JSON is far larger
    status, headers, packed = await raw(
        gw, "GET", "/openapi.json", headers={"Accept-Encoding": coding}
    )
    assert status == 200
    assert headers["Content-Encoding"] == coding
    assert DECODE[coding](packed) == plain
