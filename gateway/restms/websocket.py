"""WebSocket on a pipe: messages pushed, acknowledged and published over one socket
(our extension; the protocol, its frames and close codes are in docs/BROWSER.md).

Theory of operation
-------------------
A ``GET`` on a pipe URI with ``Upgrade: websocket`` is dispatched here by
:func:`gateway.restms.resources.get_pipe`, after the look-up, visibility and scope checks
every GET of the pipe gets: another principal's pipe is 404 before any upgrade. The
socket speaks the ``restms.v1`` subprotocol. It is one more reader of the pipe cursor,
beside the asynclet and SSE (:mod:`gateway.restms.streams`):

* **Push.** Every message the pipe holds, oldest first, then each one as it arrives,
  is sent as one text frame: the document an SSE event carries, with the message's
  position. A client that reconnects may resume with ``?after=n`` (as SSE's
  ``Last-Event-ID``): only messages after position ``n`` are sent. When messages it
  would have been sent left the pipe unacknowledged (expired, dropped by overflow,
  dead-lettered, lost in a restart), a ``gap`` frame saying which comes first
  (:meth:`feeds.service.PipeInfo.gap`). A sent message is leased like a GET or an SSE
  event (delivered again at a new position unless acknowledged in time), and at most
  ``window`` sent messages wait for their acknowledgement at once: past that, the
  socket waits for the client.
* **Acknowledge.** An ``ack`` frame naming position ``n`` is a DELETE of message
  ``n``: it and every older message leave the pipe, on disk before any answer. What is
  not acknowledged stays, so a client that reconnects is sent it again.
* **Publish.** A ``publish`` frame names a feed and carries RestMS JSON messages. It
  takes one request from the principal's rate limit and goes through the same look-up,
  access checks and engine call as a POST to that feed (the publisher is passed in:
  :func:`gateway.restms.resources.publish_to`). Its answer is the count for each message.
* **Refusals.** A frame that cannot be served is answered with an ``error`` frame with
  the status and reason an HTTP request would have got, and the socket stays open;
  after ``websocket_max_errors`` refusals in a row it closes (1008). A frame over
  ``websocket_max_frame`` bytes is not read at all: aiohttp closes with 1009.
* **The end.** The pipe deleted (4404), the token expired (4401), the token or its
  client revoked (1008: :class:`gateway.auth.authn.Waiting` cancels the handler, which is then
  told :class:`~gateway.auth.authn.Revoked`), ``websocket_max_life`` reached (1000) and
  shutdown (1001) each send an ``end`` frame, then close with that code. A client
  that stops answering pings is dropped.

Two tasks share a socket: the handler's own reads client frames and answers them in
order (:meth:`Session.read`), the other pushes messages (:meth:`Session.push`).
aiohttp writes each frame whole, so their frames never interleave. Both go through one
cursor of the engine service (:meth:`feeds.service.EngineService.cursor`): the pusher
takes from it within the window and tells it what it sent (leased then), the reader
acknowledges through it. The cursor waits for a publish, an acknowledgement, a lease
running out, the pipe's deletion or shutdown, and pages messages in from disk; nothing
polls and nothing blocks the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import orjson
from aiohttp import WSMsgType, web

import restms
from auth.revocations import TOKEN_REVOKED
from feeds.service import Blob, Cursor, Gap, Message
from gateway.auth.authn import PRINCIPAL, Revoked, waiting
from gateway.restms import http, views
from gateway.server.keys import CONFIG
from gateway.server.requestid import stamp
from gateway.server.state import STATE
from restms.errors import (
    BadRequest,
    NotFound,
    RestMSError,
    ServiceUnavailable,
    TooManyRequests,
    UnsupportedMediaType,
)
from restms.specs import Duplicate
from restms.uris import Base

log = logging.getLogger(__name__)

PROTOCOL = "restms.v1"  # the subprotocol; offered protocols other than it are never chosen
CLOSE_WAIT = 2.0  # seconds a closing socket waits for the client's close frame
MAX_ID = 200  # characters of a client's correlation id at most
MAX_FEED = 2048  # characters of a publish frame's feed reference at most
MAX_POSITION = 2**63 - 1
TYPES = "ack, publish"

# A publisher: (the upgrade request, a feed name or URI, a RestMS JSON document of
# messages) -> the count for each message, raising RestMSError as a POST would.
Publisher = Callable[[web.Request, str, bytes], Awaitable[list[int]]]
Id = str | int


@dataclass(frozen=True, slots=True)
class End:
    """Why the gateway closes a socket: the close code and the reason it states."""

    code: int
    reason: str


DELETED = End(4404, "the pipe was deleted")
EXPIRED = End(4401, "the access token expired; reconnect with a fresh one")
LIFE = End(1000, "the socket reached its maximum life; reconnect")
SHUTDOWN = End(1001, "the gateway is shutting down; reconnect later")
ABUSE = End(1008, "too many refused frames in a row")
REVOKED = End(1008, "the access token's client was revoked")
REVOKED_ALONE = End(1008, "the access token was revoked")
BROKEN = End(1011, "internal error; it has been logged")


def revoked(why: str) -> End:
    """How a socket whose token was refused ends (``why``: :class:`Revoked`'s)."""
    return REVOKED_ALONE if why == TOKEN_REVOKED else REVOKED


# ---------------------------------------------------------------- client frames (sans-IO)
@dataclass(frozen=True, slots=True, kw_only=True)
class Ack:
    """``{"type": "ack", "position": n}``: delete message ``n`` and every older one."""

    position: int
    id: Id | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Publish:
    """``{"type": "publish", "feed": ..., "message": ...}``; ``body`` is the messages
    as the RestMS JSON document a POST would carry."""

    feed: str
    body: bytes
    id: Id | None = None


_MEMBERS = {"ack": {"type", "id", "position"}, "publish": {"type", "id", "feed", "message"}}


def frame_object(data: str) -> dict[str, object]:
    """A client frame's JSON object; 400 for anything else."""
    try:
        frame = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"malformed JSON: {exc}") from exc
    if not isinstance(frame, dict):
        raise BadRequest("a frame must be a JSON object")
    return frame


def frame_id(frame: dict[str, object]) -> Id | None:
    """The client's correlation id, echoed in the answer; 400 when it is not one."""
    ident = frame.get("id")
    if ident is None:
        return None
    if isinstance(ident, str) and len(ident) <= MAX_ID:
        return ident
    if isinstance(ident, int) and not isinstance(ident, bool) and abs(ident) < 2**53:
        return ident
    raise BadRequest(f"id must be a string of at most {MAX_ID} characters or a whole number")


def command(frame: dict[str, object], ident: Id | None) -> Ack | Publish:
    """What a client frame asks for; 400 naming what is wrong with it."""
    kind = frame.get("type")
    members = _MEMBERS.get(kind) if isinstance(kind, str) else None
    if members is None:
        raise BadRequest(f"unknown frame type {kind!r}: the types are {TYPES}")
    unknown = sorted(set(frame) - members)
    if unknown:
        raise BadRequest(f"unknown member {unknown[0]!r} in a {kind} frame")
    if kind == "ack":
        position = frame.get("position")
        if (
            not isinstance(position, int)
            or isinstance(position, bool)
            or not 0 <= position <= MAX_POSITION
        ):
            raise BadRequest("an ack frame needs position, a whole number from 0")
        return Ack(position=position, id=ident)
    feed = frame.get("feed")
    if not isinstance(feed, str) or not 0 < len(feed) <= MAX_FEED:
        raise BadRequest(f"a publish frame needs feed, a name or URI of 1 to {MAX_FEED} characters")
    messages = frame.get("message")
    if isinstance(messages, dict):
        messages = [messages]
    if not isinstance(messages, list):
        raise BadRequest("a publish frame needs message, a message object or a list of them")
    body = orjson.dumps({"restms": {"message": messages}})
    return Publish(feed=feed, body=body, id=ident)


# ---------------------------------------------------------------- server frames
def _with_id(frame: dict[str, object], ident: Id | None) -> bytes:
    if ident is not None:
        frame["id"] = ident
    return orjson.dumps(frame)


def error_frame(exc: RestMSError, ident: Id | None) -> bytes:
    """The status and reason an HTTP request would have got (and its Retry-After)."""
    frame: dict[str, object] = {"type": "error", "status": exc.status, "reason": exc.reason}
    if isinstance(exc, ServiceUnavailable | TooManyRequests):
        frame["retry_after"] = exc.retry_after
    return _with_id(frame, ident)


def published_frame(counts: list[int], ident: Id | None) -> bytes:
    """A publish's answer: per message, how many joins took it (F18), and whether it
    was a repeat of a recent ``message_id`` that was not routed again."""
    answers = [
        {"count": int(n), "duplicate": True} if isinstance(n, Duplicate) else {"count": n}
        for n in counts
    ]
    return _with_id({"type": "published", "message": answers}, ident)


def end_frame(end: End) -> bytes:
    return orjson.dumps({"type": "end", "code": end.code, "reason": end.reason})


def gap_frame(gap: Gap) -> bytes:
    """Messages the client would have been sent that left the pipe unacknowledged."""
    return orjson.dumps({"type": "gap", **views.gap(gap)})


class Frames:
    """Message frames for one gateway's sockets.

    A frame is the document an SSE event carries, with the type and position in
    front. In a fan-out every pipe sends the same message and only its ``href`` (the
    pipe's key and the position) differs, so the rest of the last document rendered
    is kept and reused: the thousandth copy costs a format, not a render. Messages
    with staged contents name them per pipe and are rendered each time.
    """

    __slots__ = ("_key", "_tail")
    HEAD = b'{"restms":{"message":[{'

    def __init__(self) -> None:
        self._key: tuple[object, ...] | None = None
        self._tail = b""

    def message(self, base: Base, message: Message) -> bytes:
        parts = message.parts
        shared = not any(isinstance(part, Blob) for part in parts)
        key = (message.spec, base.root, message.feed, message.redeliveries, parts)
        if shared and key == self._key:
            tail = self._tail
        else:
            document = restms.to_json(views.doc(views.delivered_element(base, message)))
            tail = document[len(self.HEAD) :]  # the attributes after the href, and the rest
            if shared:
                self._key, self._tail = key, tail
        position = message.position
        href = orjson.dumps(base.resource(f"{message.pipe}.{position}"))
        return b'{"type":"message","position":%d,"restms":{"message":[{"href":%s,%s' % (
            position,
            href,
            tail,
        )


FRAMES = web.AppKey("websocket_frames", Frames)


# How many sockets the gateway itself closed, by close code: a 1011 is a fault the log
# holds the trace of (``restms_websocket_closes``, docs/METRICS.md).
CLOSES: web.AppKey[Counter[int]] = web.AppKey("websocket_closes")


# ---------------------------------------------------------------- the handler
def requested(request: web.Request) -> bool:
    """Whether a GET asks to become a WebSocket."""
    return request.method == "GET" and request.headers.get("Upgrade", "").lower() == "websocket"


def _window(request: web.Request, most: int) -> int:
    value = request.query.get("window")
    if value is None:
        return most
    if not (value.isascii() and value.isdigit() and len(value) <= 9 and 1 <= int(value) <= most):
        raise BadRequest(f"window must be a whole number from 1 to {most}")
    return int(value)


def _after(request: web.Request, asynclet: int) -> int:
    """The position to resume after (``?after=n``): 0 (the oldest message held) unless
    it names a position this pipe has shown (one before its asynclet), as SSE's
    ``Last-Event-ID`` does."""
    value = request.query.get("after")
    if value is None:
        return 0
    if not (value.isascii() and value.isdigit() and len(value) <= 18):
        raise BadRequest("after must be a whole number: the last position received")
    after = int(value)
    return after if after < asynclet else 0


async def serve(request: web.Request, key: str, publish: Publisher) -> web.StreamResponse:
    """Upgrade to a WebSocket on the pipe named ``key`` (which the request may read:
    checked before) and serve it until it closes.

    Everything that can be refused is refused before the upgrade, as a text/plain
    reply: a page of an origin not allowed (403), a bad ``window`` or ``after`` (400),
    a malformed upgrade (400), no slot left (429).
    """
    config = request[STATE].config
    config.cors.check_socket(request)  # browsers let any page try (docs/BROWSER.md)
    window = _window(request, config.websocket_window)
    pipe = await request[STATE].service.pipe(None, key)  # the gateway reads for it
    after = _after(request, pipe.asynclet)
    ws = web.WebSocketResponse(
        protocols=(PROTOCOL,),
        heartbeat=config.websocket_heartbeat,
        max_msg_size=config.websocket_max_frame,
        timeout=CLOSE_WAIT,
    )
    if not ws.can_prepare(request).ok:
        raise BadRequest(
            "not a WebSocket upgrade: it needs Connection: Upgrade, Upgrade: websocket, "
            "Sec-WebSocket-Version: 13 and a Sec-WebSocket-Key"
        )
    session = Session(request, ws, key, window, publish, after, pipe.gap(after + 1))
    stamp(ws)
    try:
        with waiting(request, "websocket"):
            await ws.prepare(request)
            await session.run()
    except Revoked as exc:
        if not ws.prepared:
            raise  # not upgraded yet: a plain 401
        await session.finish(revoked(exc.why))
    return ws


class Session:
    """One open socket on one pipe: what it has sent, and how it ends."""

    __slots__ = (
        "cursor",
        "end",
        "ending",
        "gap",
        "publish",
        "refused",
        "request",
        "window",
        "ws",
    )

    def __init__(
        self,
        request: web.Request,
        ws: web.WebSocketResponse,
        key: str,
        window: int,
        publish: Publisher,
        after: int = 0,
        gap: Gap | None = None,
    ) -> None:
        self.request = request
        self.ws = ws
        self.window = window
        self.publish = publish
        # The gateway reads for the principal (None): the handler checked it may.
        self.cursor: Cursor = request[STATE].service.cursor(None, key, after)
        self.cursor.window(window)
        self.gap = gap  # what it lost since ``after``: told before the first message
        self.refused = 0  # frames refused in a row
        self.end: End | None = None  # set once the gateway closes the socket
        self.ending = False  # the pusher is closing the socket itself

    async def run(self) -> None:
        pusher = asyncio.create_task(self.push(), name="websocket-push")
        try:
            await self.read()
        except Exception:
            # A bug, not bad input (bad input is answered with an error frame).
            log.exception("WebSocket session failed")
            await self.finish(BROKEN)
        finally:
            if not self.ending:
                pusher.cancel()  # the client went, or the reader ended the socket
            try:
                await asyncio.wait([pusher])
            finally:
                pusher.cancel()  # this handler itself was cancelled
                await self.cursor.close()

    # ------------------------------------------------------------ server -> client
    async def push(self) -> None:
        """Send what the pipe holds and what arrives, within the window, until the end;
        then say why and close."""
        try:
            end = await self._push()
        except NotFound:  # deleted before the first look
            end = DELETED
        except ServiceUnavailable as exc:  # what waits on disk cannot be read back now
            end = End(1013, exc.reason)
        except ConnectionError:
            return  # the client went away; its messages stay in the pipe
        except Exception:
            # A bug, not the client's doing: logged, and the client is told.
            log.exception("WebSocket push failed")
            end = BROKEN
        self.ending = True
        await self.finish(end)

    async def _push(self) -> End:
        request, cursor, ws = self.request, self.cursor, self.ws
        app = request.app
        frames = app[FRAMES]
        base = http.base(request)
        life = http.bounded(request, app[CONFIG].websocket_max_life)
        deadline = time.monotonic() + life
        if self.gap is not None:
            await ws.send_frame(gap_frame(self.gap), WSMsgType.TEXT)
        while True:
            # Within the window (the cursor's): at most that many sent and unacknowledged.
            # So the take after a batch waits (for an acknowledgement or a new message),
            # and the gateway's other requests run between two batches (streams.give_way).
            remaining = max(0.0, deadline - time.monotonic())
            for message in await cursor.take(self.window, wait=remaining):
                await ws.send_frame(frames.message(base, message), WSMsgType.TEXT)
                await cursor.sent(message.position)  # delivered again unless acknowledged
            if cursor.ended is not None or deadline - time.monotonic() <= 0:
                break
        if cursor.ended == "deleted":
            return DELETED
        if cursor.ended is not None:  # the engine is closing (or closed this cursor)
            return SHUTDOWN
        return EXPIRED if http.credential_life(request) <= 0 else LIFE

    async def finish(self, end: End) -> None:
        """Say why, then close with that code (once)."""
        if self.end is not None:
            return
        self.end = end
        self.request.app[CLOSES][end.code] += 1
        with contextlib.suppress(ConnectionError):
            await self.ws.send_frame(end_frame(end), WSMsgType.TEXT)
        await self.ws.close(code=end.code, message=end.reason.encode()[:123])

    # ------------------------------------------------------------ client -> server
    async def read(self) -> None:
        """Answer the client's frames in order until the socket closes."""
        request = self.request
        limit = request[STATE].config.websocket_max_errors
        authenticator, principal = request[STATE].auth, request[PRINCIPAL]
        async for received in self.ws:
            if http.credential_life(request) <= 0:
                await self.finish(EXPIRED)  # nothing is served on an expired token
                return
            why = authenticator.refuses(principal)
            if why:  # nor on a revoked one
                await self.finish(revoked(why))
                return
            if received.type is WSMsgType.TEXT:
                answer = await self.answer(received.data)
            elif received.type is WSMsgType.BINARY:
                self.refused += 1
                refusal = UnsupportedMediaType("binary frames are not read: send JSON text")
                answer = error_frame(refusal, None)
            else:
                continue  # an error: aiohttp has closed the socket (1009 for a frame too big)
            try:
                if answer is not None:
                    await self.ws.send_frame(answer, WSMsgType.TEXT)
            except ConnectionError:
                return
            if self.refused >= limit:
                await self.finish(ABUSE)
                return

    async def answer(self, data: str) -> bytes | None:
        """Serve one text frame: its answer, or None (an ack without an id)."""
        ident: Id | None = None
        try:
            frame = frame_object(data)
            ident = frame_id(frame)
            asked = command(frame, ident)
            if isinstance(asked, Ack):
                answer = await self.ack(asked)
            else:
                answer = await self.publish_frame(asked)
        except RestMSError as exc:
            self.refused += 1
            return error_frame(exc, ident)
        self.refused = 0
        return answer

    async def ack(self, asked: Ack) -> bytes | None:
        """D4 for ``position``: this message and every older one leave the pipe.

        Without an id nobody waits for an answer: the journal's next background commit
        (within ``journal_interval``) writes it, and a crash before that only delivers
        those messages again. With an id the answer waits until it is on disk.
        """
        try:
            removed = await self.cursor.ack(asked.position, wait=asked.id is not None)
        except NotFound:  # the pipe went: nothing left to remove (the socket ends with 4404)
            removed = 0
        if asked.id is None:
            return None
        frame = {"type": "acked", "position": asked.position, "removed": removed}
        return _with_id(frame, asked.id)

    async def publish_frame(self, asked: Publish) -> bytes:
        request = self.request
        request[STATE].auth.take(request[PRINCIPAL])  # a publish frame is a request
        counts = await self.publish(request, asked.feed, asked.body)
        return published_frame(counts, asked.id)


__all__ = [
    "CLOSES",
    "FRAMES",
    "PROTOCOL",
    "End",
    "Frames",
    "Session",
    "requested",
    "serve",
]
