"""``Idempotency-Key`` on POST: a retried request gets the first reply, not a second effect.

A client that lost the reply to a POST (a publish, a pipe or feed creation, a staged
content) may send it again with the same ``Idempotency-Key`` header. The first
successful (2xx) reply is kept, per principal, path and key, for ``dedup_window``
seconds (at most ``idempotency_max`` replies and ``idempotency_bytes`` of bodies),
and a repeat gets it again with ``Idempotent-Replayed: true`` and no new effect.

* The same key with a different request (method, path, Content-Type or body): 422.
* The same key while the first request is still being served: 409, retry later.
* A failed request (4xx, 5xx) is not kept: retrying it runs it again.

Kept replies live in memory only: after a restart, the per-feed ``message_id``
window (:mod:`feeds.dedup`, refilled from the store) is what stops duplicates.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from aiohttp import web
from multidict import CIMultiDict, istr

from restms.errors import BadRequest, Conflict, UnprocessableContent

HEADER = istr("Idempotency-Key")  # istr: looked up on every POST (see authn.authenticate)
MAX_KEY = 255
_KEPT_HEADERS = ("Content-Type", "Location")

Scope = tuple[str, str, str]  # principal, path, key


class BodyReader(Protocol):
    """How the body is read: :func:`gateway.restms.http.read_body`."""

    async def __call__(self, request: web.Request, *, again: bool = ...) -> bytes: ...


@dataclass(frozen=True, slots=True)
class Kept:
    fingerprint: bytes
    at: float  # monotonic
    status: int
    body: bytes
    headers: tuple[tuple[str, str], ...]


class Replies:
    """Kept replies in arrival order, trimmed by age, count and bytes; and the keys
    whose first request is still running."""

    def __init__(self, window: float, limit: int, budget: int) -> None:
        self.window = window
        self.limit = limit
        self.budget = budget
        self.bytes = 0
        self._kept: dict[Scope, Kept] = {}
        self.running: set[Scope] = set()  # first requests still being served

    def __len__(self) -> int:
        return len(self._kept)

    def get(self, scope: Scope, now: float) -> Kept | None:
        kept = self._kept.get(scope)
        return kept if kept is not None and kept.at + self.window > now else None

    def keep(self, scope: Scope, kept: Kept) -> None:
        if len(kept.body) > self.budget:
            return
        old = self._kept.pop(scope, None)
        if old is not None:
            self.bytes -= len(old.body)
        self._kept[scope] = kept
        self.bytes += len(kept.body)
        cutoff = kept.at - self.window
        while self._kept:
            oldest = next(iter(self._kept))
            first = self._kept[oldest]
            if len(self._kept) <= self.limit and self.bytes <= self.budget and first.at > cutoff:
                break
            del self._kept[oldest]
            self.bytes -= len(first.body)


async def once(
    request: web.Request,
    replies: Replies,
    principal: str,
    read_body: BodyReader,
    run: Callable[[], Awaitable[web.StreamResponse]],
) -> web.StreamResponse:
    """Serve a POST at most once per ``Idempotency-Key`` (without the header: just run).

    ``read_body`` reads the request body with the gateway's limits, here so that the
    handler ``run`` calls can read the same bytes again.
    """
    key = request.headers.get(HEADER)
    if key is None or request.method != "POST":
        return await run()
    if not 0 < len(key) <= MAX_KEY or not key.isascii() or not key.isprintable():
        raise BadRequest(f"{HEADER} must be 1 to {MAX_KEY} printable ASCII characters")
    if not replies.window:
        return await run()
    body = await read_body(request, again=True)
    digest = hashlib.sha256()
    for item in (request.method, request.path, request.headers.get("Content-Type", "")):
        digest.update(item.encode() + b"\0")
    digest.update(body)
    fingerprint = digest.digest()
    scope = (principal, request.path, key)
    now = time.monotonic()
    kept = replies.get(scope, now)
    if kept is not None:
        if kept.fingerprint != fingerprint:
            raise UnprocessableContent(f"this {HEADER} was used for a different request")
        replay = CIMultiDict(kept.headers)
        replay["Idempotent-Replayed"] = "true"
        return web.Response(status=kept.status, body=kept.body, headers=replay)
    if scope in replies.running:
        raise Conflict(f"a request with this {HEADER} is still being served; retry later")
    replies.running.add(scope)
    try:
        response = await run()
    finally:
        replies.running.discard(scope)
    if 200 <= response.status < 300 and isinstance(response, web.Response):
        payload = response.body if isinstance(response.body, bytes) else b""
        headers = tuple(
            (name, response.headers[name]) for name in _KEPT_HEADERS if name in response.headers
        )
        replies.keep(scope, Kept(fingerprint, time.monotonic(), response.status, payload, headers))
    return response
