"""Compressed replies and request bodies (docs/OPERATIONS.md, "Compression").

**Replies.** A reply whose whole body is at least ``compression_min_bytes`` (1024) and
of a textual type (XML, JSON, text, JavaScript, CSS, SVG, YAML) is sent compressed
when the request's ``Accept-Encoding`` accepts a coding the gateway writes (RFC 9110
12.5.3: the highest weight wins, a ``q=0`` refuses, ``*`` stands for the codings not
named): ``zstd`` (level 3) first, then ``gzip`` (zlib's level 1). On the gateway's
documents, which repeat themselves (a listing names one pipe a thousand times), zstd
packs a 116 KB listing to half of gzip's size in a third of its time, and gzip at level
1 within 2-4 % of zlib's default level 6 in a third of the time (docs/BENCHMARKS.md,
"Compression and CORS"); aiohttp's own compression has neither zstd nor a level to
choose. Bodies up to :data:`INLINE_MAX` are compressed on the event loop, which spent
some thirty times longer making them (a 116 KB listing: about 3 ms to make, 0.09 ms to
gzip, 0.025 ms to zstd), so that a thread's hand-over costs more than it saves; larger
ones in a thread, so the loop never waits long. Such replies carry ``Vary:
Accept-Encoding``. Smaller replies, and the streams (SSE, stream pipes, WebSocket:
their messages must go out one by one, as they come), are sent as they are. A
compressed reply's ``ETag`` is made weak (``W/"..."``): a strong tag names one sequence
of bytes, and the coded bytes are others (RFC 9110 8.8.3), so a cache or a range
request never takes one coding's bytes for the other's. The comparisons that matter
here are weak anyway (``If-None-Match``, ``When-None-Match``; ``If-Match`` takes either
form), and a ``304`` answering a weak tag names it weak, so that a cache holding the
compressed copy freshens it.

A request without ``Accept-Encoding`` is not looked at any further: the check is one
header look-up in :mod:`gateway.server.middleware`.

**Request bodies.** The gateway decodes ``gzip``, ``deflate`` and ``zstd`` bodies
itself (:func:`read_decoded`; aiohttp's parser is told not to, ``auto_decompress``),
as they arrive, a bounded piece at a time: ``max_body`` counts the decoded bytes, so a
small body that would decode to gigabytes is refused with ``413`` once ``max_body``
bytes came out, and never fills memory. A body that is not what its coding says, or
is cut short (its last gzip member or zstd frame unfinished), is ``400``: aiohttp's
parser checked the end of ``deflate`` data only, and took a gzip or zstd body as far
as it went, so a message was published with part of its content. Several gzip
members or zstd frames one after the other are one body, as RFC 1952 says. A
``Content-Encoding`` the gateway does not decode (``br``, a list of codings) is
refused with ``415`` (RFC 9110 15.5.16), never handed on still encoded.
"""

from __future__ import annotations

import asyncio
import functools
import sys
import threading
import zlib
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from aiohttp import hdrs, web

from restms.errors import UnsupportedMediaType

if TYPE_CHECKING:
    from aiohttp import StreamReader

# zstd (re-exported: the tests and the benchmark decode and pack with the same module)
if sys.version_info >= (3, 14):
    from compression import zstd
else:  # the same module, as a package (the request bodies are decoded with it too)
    from backports import zstd

# Codings of request bodies the gateway decodes (read_decoded); names as sent.
DECODED = frozenset(("gzip", "deflate", "zstd", "identity"))
GZIP_LEVEL = 1  # zlib's fastest
ZSTD_LEVEL = 3  # zstd's default
PREFERENCE = ("gzip", "zstd")  # the codings written, the best last
# Bytes of a request body decoded between returns to the event loop: a 64 KB piece of
# a zip bomb unpacks to max_body at once otherwise (4 MiB of gzip: about 11 ms).
PIECE = 256 * 1024
INLINE_MAX = 256 * 1024  # bytes compressed on the loop at most (0.2 ms with gzip level 1)
_TEXTUAL = ("json", "xml", "javascript", "yaml", "markdown", "css", "csv", "html", "plain")


def check_request(request: web.Request) -> None:
    """415 for a request body in a content coding the gateway does not decode."""
    coding = request.headers.get(hdrs.CONTENT_ENCODING, "").strip().lower()
    if coding and coding not in DECODED:
        raise UnsupportedMediaType(
            f"Content-Encoding {coding[:100]!r} is not understood: send the body as it "
            "is, or compressed with gzip, deflate or zstd"
        )


class Undecodable(ValueError):
    """A request body that does not decode from its ``Content-Encoding``."""


def coding_of(headers: Mapping[str, str]) -> str | None:
    """The coding a request body is to be decoded from (gzip, deflate or zstd), or None
    for a body sent as it is (after :func:`check_request`)."""
    coding = headers.get(hdrs.CONTENT_ENCODING, "").strip().lower()
    return None if coding in ("", "identity") else coding


def _unpacker(coding: str, first: bytes) -> Any:
    if coding == "zstd":
        return zstd.ZstdDecompressor()
    if coding == "gzip":
        return zlib.decompressobj(16 + zlib.MAX_WBITS)
    # deflate names zlib data (RFC 9110 8.4.1.2), whose first byte says method 8; some
    # clients send raw deflate data under the name, taken too.
    return zlib.decompressobj(zlib.MAX_WBITS if first[0] & 0x0F == 8 else -zlib.MAX_WBITS)


def _holds_more(unpacker: Any) -> bool:
    """Whether a zstd decompressor has output left from input it was given."""
    return isinstance(unpacker, zstd.ZstdDecompressor) and not (
        unpacker.needs_input or unpacker.eof
    )


async def read_decoded(content: StreamReader, coding: str, limit: int) -> bytes:
    """The body of ``content`` decoded from ``coding``, as it arrives. Decoding stops
    once more than ``limit`` bytes came out: a longer result means "over the limit".
    :class:`Undecodable` for data that is not ``coding``'s or ends unfinished."""
    out = bytearray()
    unpacker: Any = None  # the gzip member or zstd frame being decoded
    try:
        async for received in content.iter_any():
            data = received
            while (data or _holds_more(unpacker)) and len(out) <= limit:
                if unpacker is None or unpacker.eof:  # a body's first or next member
                    unpacker = _unpacker(coding, data)
                out += unpacker.decompress(data, min(PIECE, limit + 1 - len(out)))
                if unpacker.eof:
                    data = unpacker.unused_data
                else:  # zlib hands back what it did not decode; zstd keeps it
                    data = b"" if coding == "zstd" else unpacker.unconsumed_tail
                await asyncio.sleep(0)  # a piece at a time: other requests go on
            if len(out) > limit:
                return bytes(out)
    except (zlib.error, zstd.ZstdError, EOFError) as exc:
        raise Undecodable(f"the body is not {coding} data") from exc
    if unpacker is not None and not unpacker.eof:
        raise Undecodable(f"the {coding} body is cut short")
    return bytes(out)


@functools.lru_cache(maxsize=256)  # a few clients send a few distinct values
def choose(accept_encoding: str) -> str | None:
    """The coding to write for an ``Accept-Encoding`` value: ``zstd`` or ``gzip``, the
    one of higher weight (zstd on a tie), or None when neither is acceptable."""
    weights: dict[str, float] = {}
    for item in accept_encoding.split(","):
        coding, _, params = item.partition(";")
        coding = coding.strip().lower()
        quality = 1.0
        for param in params.split(";"):
            key, _, value = param.partition("=")
            if key.strip().lower() == "q":
                try:
                    quality = float(value.strip())
                except ValueError:
                    quality = 0.0  # unreadable: as if refused
        weights[coding] = quality
    wildcard = weights.get("*", 0.0)
    # (weight, preference, coding): the higher weight, then zstd before gzip
    weight, _, coding = max((weights.get(c, wildcard), i, c) for i, c in enumerate(PREFERENCE))
    return coding if weight > 0 else None


def _textual(content_type: str) -> bool:
    kind, _, subtype = content_type.partition("/")
    return kind == "text" or any(word in subtype for word in _TEXTUAL)


def gzip(body: bytes) -> bytes:
    """``body`` as a gzip member, at :data:`GZIP_LEVEL`."""
    packer = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    return packer.compress(body) + packer.flush()


_THREAD = threading.local()  # a compressor is not to be shared between threads


def zstandard(body: bytes) -> bytes:
    """``body`` as a zstd frame, at :data:`ZSTD_LEVEL`, with this thread's compressor:
    making a context costs about 8 us, compressing a 2 KB reply with one about 1.5."""
    packer: zstd.ZstdCompressor | None = getattr(_THREAD, "zstd", None)
    if packer is None:
        packer = _THREAD.zstd = zstd.ZstdCompressor(level=ZSTD_LEVEL)
    return packer.compress(body, mode=zstd.ZstdCompressor.FLUSH_FRAME)


CODERS: dict[str, Callable[[bytes], bytes]] = {"gzip": gzip, "zstd": zstandard}


async def offer(request: web.Request, response: web.StreamResponse, min_bytes: int) -> None:
    """Compress ``response`` (not yet prepared) where it is worth it, with the coding the
    request (which has ``Accept-Encoding``) accepts best."""
    if not isinstance(response, web.Response) or response.prepared:
        return  # a stream, or a socket: sent as it goes
    if response.status == 304:  # its 200 may have been compressed: the same Vary
        response.headers.add(hdrs.VARY, "Accept-Encoding")  # (RFC 9110 15.4.5)
        tag = response.headers.get(hdrs.ETAG)
        asked = request.headers.get(hdrs.IF_NONE_MATCH, "")
        if tag and any(part.strip() == "W/" + tag for part in asked.split(",")):
            response.headers[hdrs.ETAG] = "W/" + tag  # the compressed copy's, freshened
        return
    body = response.body
    if not isinstance(body, bytes) or len(body) < min_bytes:
        return
    headers = response.headers
    if hdrs.CONTENT_ENCODING in headers or not _textual(response.content_type):
        return
    headers.add(hdrs.VARY, "Accept-Encoding")
    coding = choose(request.headers.get(hdrs.ACCEPT_ENCODING, ""))
    if coding is not None:
        pack = CODERS[coding]
        response.body = (
            pack(body) if len(body) <= INLINE_MAX else await asyncio.to_thread(pack, body)
        )
        headers[hdrs.CONTENT_ENCODING] = coding
        tag = headers.get(hdrs.ETAG)
        if tag and not tag.startswith("W/"):
            headers[hdrs.ETAG] = "W/" + tag


__all__ = [
    "CODERS",
    "DECODED",
    "Undecodable",
    "check_request",
    "choose",
    "coding_of",
    "gzip",
    "offer",
    "read_decoded",
    "zstandard",
    "zstd",
]
