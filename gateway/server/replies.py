"""Reading the body of a reply the gateway asked for: an issuer's keys or metadata, a
token introspection, a webhook receiver's answer, a remote gateway's document.

Each is bounded in bytes, and read to its end: one ``read`` of aiohttp's stream returns
what has arrived so far, which for a body sent in pieces is only its first ones.
"""

from __future__ import annotations

import aiohttp


async def read_at_most(reply: aiohttp.ClientResponse, limit: int) -> tuple[bytes, bool]:
    """The body's first ``limit`` bytes, and whether more followed them. Past the limit
    the connection is dropped rather than read to its end."""
    chunks: list[bytes] = []
    left = limit + 1
    while left > 0:
        chunk = await reply.content.read(left)
        if not chunk:
            return b"".join(chunks), False
        chunks.append(chunk)
        left -= len(chunk)
    reply.close()
    return b"".join(chunks)[:limit], True
