"""Continuous readers of a pipe: Server-Sent Events and the stream pipe type.

Both are readers of the same pipe cursor as the asynclet (one queue model):

* **SSE** (any pipe, ``Accept: text/event-stream`` on the pipe URI): every message
  held in the pipe is sent as an event whose ``id`` is its position and whose data
  is the message document in RestMS JSON, with its ``href``. Messages stay in the
  pipe until the client DELETEs them (at-least-once). Reconnecting with
  ``Last-Event-ID: n`` resumes with the first message after position ``n``: nothing
  still held is skipped, nothing already sent is sent again. An id the pipe never
  issued starts from the oldest message held (repeats, never a silent gap). When
  messages the client would have been sent after that position left the pipe
  unacknowledged (expired, dropped by overflow, dead-lettered, lost in a restart), a
  ``gap`` event saying which and the earliest position held comes first
  (:meth:`feeds.service.PipeInfo.gap`).
* **stream pipes** (our extension, P6): a GET on the asynclet answers
  ``multipart/mixed`` over chunked transfer, one message document per part, and each
  message is deleted once its part is written (parts cannot be acknowledged).

Both end when the pipe is deleted, the client goes, ``stream_max`` seconds pass, the
request's access token expires (SSE says so with an ``expired`` event) or is revoked,
alone or with its client (a ``revoked`` event saying which;
:class:`gateway.auth.authn.Waiting` stops the stream), or the gateway shuts down: SSE
clients reconnect after ``retry``. Each open stream holds one of
its principal's waiting slots (``max_waits_per_principal``).

Both read through the engine service's cursor (:meth:`feeds.service.EngineService.cursor`),
which pages messages in from disk as the reader gets to them. A message is leased (or, on a
stream pipe, acknowledged) only once it was written: one the client never got stays where
it is. A reader behind takes its backlog a batch at a time and lets the gateway's other
requests run between two batches (:func:`give_way`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import orjson
from aiohttp import web

import restms
from feeds.service import Cursor, Message
from gateway.auth.authn import Revoked, waiting
from gateway.restms import http, views
from gateway.server.requestid import stamp
from gateway.server.state import STATE
from restms.errors import NotAcceptable, NotFound
from restms.media import Format
from restms.names import new_hash
from restms.uris import Base

BATCH = 256  # messages a reader takes from its cursor at a time


async def give_way() -> None:
    """Let the event loop run its other tasks before a reader takes its next batch.

    Nothing else makes a reader behind wait between two batches: the cursor has the
    next one in memory, and a socket whose client reads as fast as it is written
    takes every write at once. Without this one stream catching up holds every other
    request on the gateway until it has written its whole backlog.
    """
    await asyncio.sleep(0)


def _last_event_id(request: web.Request, asynclet: int) -> int:
    """The position to resume after: 0 (the oldest message held) unless the header
    names a position this pipe has shown (one before its asynclet)."""
    value = request.headers.get("Last-Event-ID", "").strip()
    if not (value.isascii() and value.isdigit() and len(value) <= 18):
        return 0
    after = int(value)
    return after if after < asynclet else 0


async def sse(request: web.Request, key: str) -> web.StreamResponse:
    """SSE on the pipe named ``key``, which the request may read (checked before)."""
    response = web.StreamResponse(
        headers={
            "Content-Type": "text/event-stream; charset=utf-8",
            "Cache-Control": "no-cache",
            "X-Accel-Buffering": "no",
        }
    )
    try:
        with waiting(request, "sse"):
            return await _sse(request, key, response)
    except Revoked as exc:
        return await _ended(response, b"event: revoked\ndata: %s\n\n" % exc.why.encode(), exc)


async def _sse(request: web.Request, key: str, response: web.StreamResponse) -> web.StreamResponse:
    config = request[STATE].config
    service = request[STATE].service
    base = http.base(request)
    # The handler checked the principal may read it: the gateway reads for it (None).
    pipe = await service.pipe(None, key)
    after = _last_event_id(request, pipe.asynclet)
    gap = pipe.gap(after + 1)
    cursor = service.cursor(None, key, after)
    stamp(response)
    await response.prepare(request)
    await response.write(b"retry: 2000\n\n")
    if gap is not None:  # before any message; no id, so a reconnect resumes where it did
        await response.write(b"event: gap\ndata: %s\n\n" % orjson.dumps(views.gap(gap)))
    deadline = time.monotonic() + http.bounded(request, config.stream_max)
    try:
        while True:
            remaining = deadline - time.monotonic()
            batch = await cursor.take(BATCH, wait=min(config.heartbeat, max(0.0, remaining)))
            if batch:  # one write a batch, not one a message: a reader behind gets many
                await response.write(b"".join(_event(base, message) for message in batch))
            for message in batch:  # written: each is leased, delivered again unless acknowledged
                await cursor.sent(message.position)
            if cursor.ended is not None or deadline - time.monotonic() <= 0:
                break
            if not batch:
                await response.write(b": keep-alive\n\n")
            else:
                await give_way()
        if cursor.ended == "deleted":
            await response.write(b"event: deleted\ndata: the pipe was deleted\n\n")
        elif http.credential_life(request) <= 0:
            await response.write(b"event: expired\ndata: the access token expired\n\n")
    except NotFound:  # deleted before the first look
        await response.write(b"event: deleted\ndata: the pipe was deleted\n\n")
    except ConnectionError:
        pass  # the client went away; its messages stay in the pipe
    finally:
        await cursor.close()
    return response


def _event(base: Base, message: Message) -> bytes:
    """A message's SSE event: its position as the id, its document as the data."""
    data = views.delivered_json(base, message, href=True)
    return b"id: %d\nevent: message\ndata: %s\n\n" % (message.position, data)


def _part_format(request: web.Request) -> Format:
    """Parts follow Accept; ``multipart/*`` (asked of the whole reply) means XML parts."""
    try:
        return http.reply_format(request)
    except NotAcceptable:
        if "multipart/" in request.headers.get("Accept", ""):
            return Format.XML
        raise


async def multipart(request: web.Request, key: str) -> web.StreamResponse:
    """P6: one message document per part; each message is deleted once written.

    Each part is followed at once by the next delimiter, so a reader can finish a
    part without waiting for the next message.
    """
    fmt = _part_format(request)
    boundary = new_hash()
    response = web.StreamResponse(
        headers={
            "Content-Type": f"multipart/mixed; boundary={boundary}",
            "Cache-Control": "no-cache",
        }
    )
    response.enable_chunked_encoding()
    try:
        with waiting(request, "stream"):
            return await _multipart(request, key, response, fmt, boundary)
    except Revoked as exc:
        return await _ended(response, b"--\r\n", exc)  # after a part's delimiter


async def _ended(response: web.StreamResponse, last: bytes, exc: Revoked) -> web.StreamResponse:
    """A stream whose token was revoked while it ran ends with ``last`` (``exc``, a
    plain 401, if it had not begun)."""
    if not response.prepared:
        raise exc
    with contextlib.suppress(ConnectionError):
        await response.write(last)
    return response


async def _multipart(
    request: web.Request, key: str, response: web.StreamResponse, fmt: Format, boundary: str
) -> web.StreamResponse:
    config = request[STATE].config
    cursor: Cursor = request[STATE].service.cursor(None, key)  # checked by the handler
    base = http.base(request)
    stamp(response)
    await response.prepare(request)
    head = f"\r\nContent-Type: {fmt.media_type}\r\n\r\n".encode()
    delimiter = f"\r\n--{boundary}".encode()
    await response.write(delimiter[2:])
    deadline = time.monotonic() + http.bounded(request, config.stream_max)
    try:
        while True:
            remaining = max(0.0, deadline - time.monotonic())
            for message in await cursor.take(BATCH, wait=remaining):
                document = views.doc(views.delivered_element(base, message, embed=True))
                await response.write(head + restms.encode(document, fmt) + delimiter)
                await cursor.sent(message.position)
                # Written: it leaves the pipe (committed within the journal's interval).
                await cursor.ack(message.position, wait=False)
            if cursor.ended is not None or deadline - time.monotonic() <= 0:
                break
            await give_way()
        await response.write(b"--\r\n")
        await response.write_eof()
    except NotFound:  # deleted before the first look
        with contextlib.suppress(ConnectionError):
            await response.write(b"--\r\n")
            await response.write_eof()
    except ConnectionError:
        pass
    finally:
        await cursor.close()
    return response
