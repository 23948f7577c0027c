"""``Idempotency-Key`` on POST: a retried request gets the first reply, not a second effect.

A client that lost the reply to a POST (a publish, a pipe or feed creation, a staged
content) may send it again with the same ``Idempotency-Key`` header. The first
successful (2xx) reply is kept, per principal, path and key, for ``dedup_window``
seconds (at most ``idempotency_max`` replies and ``idempotency_bytes`` of bodies),
and a repeat gets it again with ``Idempotent-Replayed: true`` and no new effect.

* The same key with a different request (method, path, Content-Type or body): 422.
* The same key while the first request is still being served: 409, retry later.
* A failed request (4xx, 5xx) is not kept: retrying it runs it again.

Where they are kept (:class:`ReplyStore`): in one node's memory (:class:`Replies`), where
after a restart the per-feed ``message_id`` window (:mod:`feeds.dedup`, refilled from
the store) is what stops duplicates; or, when several nodes serve one gateway, in the
Redis Cluster (:class:`RedisReplies`), so that a retry sent to another node gets the
reply the first one gave, not a second publish (docs/AUTH.md, "Several nodes")::

    {N:idem}:replies     hash: scope digest -> reply (body size, meta JSON, body)
    {N:idem}:order       sorted set: scope digest by when kept (server ms)
    {N:idem}:bytes       the bytes of bodies the hash holds
    {N:idem}:run:<scope> "a first request is being served" (SET NX, 120 s at most)

A scope digest is the SHA-256 of principal, path and key. One hash tag keeps the
bounds (window, count, bytes: the same settings) exact with one script a call; the
three keys expire once nothing was kept for a window. If a node dies while it serves a
first request, its retry is answered 409 until :data:`RUNNING_TTL` passes. A Redis
that does not answer is a 503: a retry is never run again because its reply could
not be looked up.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from aiohttp import web
from multidict import CIMultiDict, istr

from auth.cluster import Shared, answering
from restms.errors import BadRequest, Conflict, ServiceUnavailable, UnprocessableContent

log = logging.getLogger(__name__)

HEADER = istr("Idempotency-Key")  # istr: looked up on every POST (see authn.authenticate)
MAX_KEY = 255
_KEPT_HEADERS = ("Content-Type", "Location")
TAG = "idem"
RUNNING_TTL = 120.0  # seconds a first request is taken to be running at most (shared store)

Scope = tuple[str, str, str]  # principal, path, key


class BodyReader(Protocol):
    """How the body is read: :func:`gateway.restms.http.read_body`."""

    async def __call__(self, request: web.Request, *, again: bool = ...) -> bytes: ...


@dataclass(frozen=True, slots=True)
class Kept:
    fingerprint: bytes
    at: float  # when kept: monotonic (one node's memory), or the Redis server's clock
    status: int
    body: bytes
    headers: tuple[tuple[str, str], ...]


class ReplyStore(Protocol):
    """Where the replies are kept, and which first requests are running."""

    @property
    def window(self) -> float:
        """Seconds a reply is kept (0: Idempotency-Key is not honoured)."""
        ...

    async def begin(self, scope: Scope) -> Kept | None:
        """The reply kept for ``scope``; else None, and ``scope`` is running from now
        on (:class:`Conflict` if it is running already)."""
        ...

    async def end(self, scope: Scope, kept: Kept | None) -> None:
        """``scope`` is no longer running; ``kept``, if given, is its reply to keep."""
        ...


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

    async def begin(self, scope: Scope) -> Kept | None:
        kept = self.get(scope, time.monotonic())
        if kept is not None:
            return kept
        if scope in self.running:
            raise Conflict(f"a request with this {HEADER} is still being served; retry later")
        self.running.add(scope)
        return None

    async def end(self, scope: Scope, kept: Kept | None) -> None:
        self.running.discard(scope)
        if kept is not None:
            self.keep(scope, kept)

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
    replies: ReplyStore,
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
    kept = await replies.begin(scope)
    if kept is not None:
        if kept.fingerprint != fingerprint:
            raise UnprocessableContent(f"this {HEADER} was used for a different request")
        replay = CIMultiDict(kept.headers)
        replay["Idempotent-Replayed"] = "true"
        return web.Response(status=kept.status, body=kept.body, headers=replay)
    reply = None
    try:
        response = await run()
        if 200 <= response.status < 300 and isinstance(response, web.Response):
            payload = response.body if isinstance(response.body, bytes) else b""
            headers = tuple(
                (name, response.headers[name]) for name in _KEPT_HEADERS if name in response.headers
            )
            reply = Kept(fingerprint, time.monotonic(), response.status, payload, headers)
    finally:
        await replies.end(scope, reply)
    return response


# A first request: the reply kept (1, value, when), or running already (2), or now
# running (0). KEYS replies, order, run; ARGV digest, window ms, running ttl ms.
_BEGIN = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local at = redis.call('ZSCORE', KEYS[2], ARGV[1])
if at and tonumber(at) > now - tonumber(ARGV[2]) then
  local kept = redis.call('HGET', KEYS[1], ARGV[1])
  if kept then return {1, kept, at} end
end
if redis.call('SET', KEYS[3], '1', 'NX', 'PX', ARGV[3]) then return {0} end
return {2}
"""
# The first request ended: not running; its reply kept if given, then the oldest
# dropped while there are more than the limit, more bytes than the budget, or they are
# older than the window. KEYS replies, order, bytes, run; ARGV digest, reply ("" for
# none), window ms, limit, budget.
_END = """
local function size(reply) return tonumber(string.match(reply, '^%d+')) end
redis.call('DEL', KEYS[4])
if ARGV[2] == '' then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local window, limit, budget = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local old = redis.call('HGET', KEYS[1], ARGV[1])
if old then redis.call('DECRBY', KEYS[3], size(old)) end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
-- Ordered by when each ended: one that ends in the same millisecond as the newest
-- still comes after it (equal scores would order by digest, and drop the wrong one).
local newest = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
if #newest > 0 and tonumber(newest[2]) >= now then now = tonumber(newest[2]) + 0.001 end
redis.call('ZADD', KEYS[2], now, ARGV[1])
local total = redis.call('INCRBY', KEYS[3], size(ARGV[2]))
while true do
  local first = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
  if #first == 0 then break end
  if redis.call('ZCARD', KEYS[2]) <= limit and total <= budget
      and tonumber(first[2]) > now - window then break end
  local gone = redis.call('HGET', KEYS[1], first[1])
  if gone then
    total = redis.call('DECRBY', KEYS[3], size(gone))
    redis.call('HDEL', KEYS[1], first[1])
  end
  redis.call('ZREM', KEYS[2], first[1])
end
for i = 1, 3 do redis.call('PEXPIRE', KEYS[i], window) end
return 1
"""


class RedisReplies:
    """Kept replies in the Redis Cluster, shared by every node (module docstring):
    the same window, count and byte bounds as :class:`Replies`, over all nodes."""

    def __init__(self, shared: Shared, window: float, limit: int, budget: int) -> None:
        self.window = window
        self.limit = limit
        self.budget = budget
        self._shared = shared
        self._replies = shared.key(TAG, "replies")
        self._order = shared.key(TAG, "order")
        self._bytes = shared.key(TAG, "bytes")
        self._begin = shared.redis.register_script(_BEGIN)
        self._end = shared.redis.register_script(_END)

    @staticmethod
    def _digest(scope: Scope) -> str:
        digest = hashlib.sha256()
        for part in scope:
            digest.update(part.encode("utf-8", "surrogatepass") + b"\0")
        return digest.hexdigest()

    def _running(self, digest: str) -> str:
        return self._shared.key(TAG, "run", digest)

    async def begin(self, scope: Scope) -> Kept | None:
        digest = self._digest(scope)
        keys = [self._replies, self._order, self._running(digest)]
        args: list[str | int] = [digest, int(self.window * 1000), int(RUNNING_TTL * 1000)]
        try:
            with answering():
                answer = await self._begin(keys=keys, args=args)
        except OSError as exc:
            raise ServiceUnavailable(f"{HEADER} replies cannot be looked up: {exc}") from exc
        if answer[0] == 2:
            raise Conflict(f"a request with this {HEADER} is still being served; retry later")
        if answer[0] == 0:
            return None
        return _decode(answer[1], float(answer[2]) / 1000)

    async def end(self, scope: Scope, kept: Kept | None) -> None:
        digest = self._digest(scope)
        value = b""
        if kept is not None and len(kept.body) <= self.budget:
            value = _encode(kept)
        keys = [self._replies, self._order, self._bytes, self._running(digest)]
        args: list[bytes | str | int] = [
            digest,
            value,
            int(self.window * 1000),
            self.limit,
            self.budget,
        ]
        # The reply is gone already: a failure here only loses what a retry would replay
        # (it then runs again, as after an embedded gateway's restart), so it is logged.
        try:
            with answering():
                await self._end(keys=keys, args=args)
        except OSError as exc:
            log.warning("an %s reply was not kept: %s", HEADER, exc)


def _encode(kept: Kept) -> bytes:
    """The body's size (what counts against the budget, as in :class:`Replies`), the
    rest as JSON, and the body: a line each but the body."""
    meta = {"fp": kept.fingerprint.hex(), "status": kept.status, "headers": kept.headers}
    head = b"%d\n" % len(kept.body) + json.dumps(meta, separators=(",", ":")).encode()
    return head + b"\n" + kept.body


def _decode(value: bytes, at: float) -> Kept:
    _, _, rest = value.partition(b"\n")
    meta, _, body = rest.partition(b"\n")
    data = json.loads(meta)
    headers = tuple((str(name), str(text)) for name, text in data["headers"])
    return Kept(bytes.fromhex(data["fp"]), at, int(data["status"]), body, headers)
