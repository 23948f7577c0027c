"""Reading a body the gateway takes whole, bounded in bytes: a reply it asked for (an
issuer's keys or metadata, a token introspection, a webhook receiver's answer, a
remote gateway's document) or a small request body of its own endpoints (a token
request's form).

Read to its end: one ``read`` of aiohttp's stream returns what has arrived so far,
which for a body sent in pieces is only its first ones.
"""

from __future__ import annotations

import aiohttp


async def read_at_most(stream: aiohttp.StreamReader, limit: int) -> tuple[bytes, bool]:
    """The body's first ``limit`` bytes, and whether more followed them. The rest is not
    read: a client reply left unfinished is not reused when its context ends."""
    chunks: list[bytes] = []
    left = limit + 1
    while left > 0:
        chunk = await stream.read(left)
        if not chunk:
            return b"".join(chunks), False
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)[:limit], True
