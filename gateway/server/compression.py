"""Compressed replies and request bodies (docs/OPERATIONS.md, "Compression").

**Replies.** A reply whose whole body is at least ``compression_min_bytes`` (1024) and
of a textual type (XML, JSON, text, JavaScript, CSS, SVG, YAML) is sent gzip-compressed
when the request's ``Accept-Encoding`` accepts ``gzip`` (RFC 9110 12.5.3: a ``q=0``
refuses it, ``*`` accepts it), at zlib's level 1: on the gateway's documents, which
repeat themselves (a listing names one pipe a thousand times), it packs as small as
the default level 6 in a third of the time (docs/BENCHMARKS.md, "Compression and
CORS"), and aiohttp's own compression has no level to choose. Bodies over
:data:`INLINE_MAX` are compressed in a thread, so the event loop never waits long for
zlib. Such replies carry ``Vary: Accept-Encoding``. Smaller replies, and the streams
(SSE, stream pipes, WebSocket: their messages must go out one by one, as they come),
are sent as they are.
The ``ETag`` stays the resource's: it names its version, in whichever coding.

A request without ``Accept-Encoding`` is not looked at any further: the check is one
header look-up in :mod:`gateway.server.middleware`.

**Request bodies.** aiohttp's parser decodes ``gzip`` and ``deflate`` bodies as they
arrive, a bounded piece at a time, and pauses while the handler has not read what it
decoded; ``max_body`` counts the decoded bytes. So a small body that would decode to
gigabytes is refused with ``413`` once ``max_body`` bytes came out, and never fills
memory. A ``Content-Encoding`` it does not decode (a list of codings among them) is
refused with ``415`` (RFC 9110 15.5.16), never handed on still encoded.
"""

from __future__ import annotations

import asyncio
import functools
import zlib

from aiohttp import hdrs, web

from restms.errors import UnsupportedMediaType

# Codings aiohttp's parser decodes (with the packages installed here); names as sent.
DECODED = frozenset(("gzip", "deflate", "identity"))
LEVEL = 1  # zlib's fastest
INLINE_MAX = 32 * 1024  # bytes compressed on the loop at most (about 0.1 ms at level 1)
_TEXTUAL = ("json", "xml", "javascript", "yaml", "markdown", "css", "csv", "html", "plain")


def check_request(request: web.Request) -> None:
    """415 for a request body in a content coding the gateway does not decode."""
    coding = request.headers.get(hdrs.CONTENT_ENCODING, "").strip().lower()
    if coding and coding not in DECODED:
        raise UnsupportedMediaType(
            f"Content-Encoding {coding[:100]!r} is not understood: send the body as it "
            "is, or gzip- or deflate-compressed"
        )


@functools.lru_cache(maxsize=256)  # a few clients send a few distinct values
def accepts_gzip(accept_encoding: str) -> bool:
    """Whether an ``Accept-Encoding`` value accepts gzip (q > 0, named or by ``*``)."""
    named, wildcard = None, None
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
        if coding in ("gzip", "x-gzip"):
            named = quality > 0
        elif coding == "*":
            wildcard = quality > 0
    return named if named is not None else bool(wildcard)


def _textual(content_type: str) -> bool:
    kind, _, subtype = content_type.partition("/")
    return kind == "text" or any(word in subtype for word in _TEXTUAL)


def gzip(body: bytes) -> bytes:
    """``body`` as a gzip member, at :data:`LEVEL`."""
    packer = zlib.compressobj(LEVEL, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    return packer.compress(body) + packer.flush()


async def offer(request: web.Request, response: web.StreamResponse, min_bytes: int) -> None:
    """Compress ``response`` (not yet prepared) with gzip where it is worth it and the
    request (which has ``Accept-Encoding``) accepts it."""
    if not isinstance(response, web.Response) or response.prepared:
        return  # a stream, or a socket: sent as it goes
    body = response.body
    if not isinstance(body, bytes) or len(body) < min_bytes:
        return
    headers = response.headers
    if hdrs.CONTENT_ENCODING in headers or not _textual(response.content_type):
        return
    headers.add(hdrs.VARY, "Accept-Encoding")
    if accepts_gzip(request.headers.get(hdrs.ACCEPT_ENCODING, "")):
        packed = gzip(body) if len(body) <= INLINE_MAX else await asyncio.to_thread(gzip, body)
        response.body = packed
        headers[hdrs.CONTENT_ENCODING] = "gzip"
