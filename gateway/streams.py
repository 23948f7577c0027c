"""Continuous readers of a pipe: Server-Sent Events and the stream pipe type.

Both are readers of the same pipe cursor as the asynclet (one queue model):

* **SSE** (any pipe, ``Accept: text/event-stream`` on the pipe URI): every message
  held in the pipe is sent as an event whose ``id`` is its position and whose data
  is the message document in RestMS JSON, with its ``href``. Messages stay in the
  pipe until the client DELETEs them (at-least-once). Reconnecting with
  ``Last-Event-ID: n`` resumes with the first message after position ``n``: nothing
  still held is skipped, nothing already sent is sent again. An id the pipe never
  issued starts from the oldest message held (repeats, never a silent gap). Messages
  waiting on disk past the memory budget are read back as the reader gets to them.
* **stream pipes** (our extension, P6): a GET on the asynclet answers
  ``multipart/mixed`` over chunked transfer, one message document per part, and each
  message is deleted once its part is written (parts cannot be acknowledged).

Both end when the pipe is deleted, the client goes, ``stream_max`` seconds pass, the
request's access token expires (SSE says so with an ``expired`` event), or the gateway
shuts down (``engine.closing``): SSE clients reconnect after ``retry``. Each open
stream holds one of its principal's waiting slots (``max_waits_per_principal``).
"""

from __future__ import annotations

import time

from aiohttp import web

import restms
from feeds.model import Pipe, Slot
from restms.errors import NotAcceptable
from restms.media import Format
from restms.names import new_hash

from . import http, spill, views
from .authn import waiting
from .keys import CONFIG, ENGINE


def _last_event_id(request: web.Request, pipe: Pipe) -> int:
    """The position to resume after: 0 (the oldest message held) unless the header
    names a position this pipe has issued."""
    value = request.headers.get("Last-Event-ID", "").strip()
    if not (value.isascii() and value.isdigit() and len(value) <= 18):
        return 0
    after = int(value)
    return after if after < pipe.next_seq else 0


async def sse(request: web.Request, pipe: Pipe) -> web.StreamResponse:
    response = web.StreamResponse(
        headers={
            "Content-Type": "text/event-stream; charset=utf-8",
            "Cache-Control": "no-cache",
            "X-Accel-Buffering": "no",
        }
    )
    with waiting(request, "sse"):
        return await _sse(request, pipe, response)


async def _sse(
    request: web.Request, pipe: Pipe, response: web.StreamResponse
) -> web.StreamResponse:
    config = request.app[CONFIG]
    engine = request.app[ENGINE]
    base = http.base(request)
    after = _last_event_id(request, pipe)
    await response.prepare(request)
    await response.write(b"retry: 2000\n\n")
    deadline = time.monotonic() + http.bounded(request, config.stream_max)
    try:
        while not pipe.deleted:
            await spill.ahead(request.app, pipe, after)  # what waits on disk: read it back
            seen = pipe.version
            batch = list(engine.stream(pipe, after))
            for message in batch:
                data = restms.to_json(
                    views.doc(views.message_element(base, pipe, message, href=True))
                )
                await response.write(b"id: %d\nevent: message\ndata: %s\n\n" % (message.seq, data))
                engine.lease(pipe, message)  # sent: redelivered unless acknowledged in time
                after = message.seq
            remaining = deadline - time.monotonic()
            if remaining <= 0 or engine.closing:  # no await since the check: no lost wake-up
                break
            if batch and pipe.spilled:
                continue  # more waits on disk: read it back now
            if not await pipe.changed(min(config.heartbeat, remaining), seen):
                await response.write(b": keep-alive\n\n")
        if pipe.deleted:
            await response.write(b"event: deleted\ndata: the pipe was deleted\n\n")
        elif http.credential_life(request) <= 0:
            await response.write(b"event: expired\ndata: the access token expired\n\n")
    except ConnectionError:
        pass  # the client went away; its messages stay in the pipe
    return response


def _part_format(request: web.Request) -> Format:
    """Parts follow Accept; ``multipart/*`` (asked of the whole reply) means XML parts."""
    try:
        return http.reply_format(request)
    except NotAcceptable:
        if "multipart/" in request.headers.get("Accept", ""):
            return Format.XML
        raise


async def multipart(request: web.Request, pipe: Pipe) -> web.StreamResponse:
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
    with waiting(request, "stream"):
        return await _multipart(request, pipe, response, fmt, boundary)


async def _multipart(
    request: web.Request, pipe: Pipe, response: web.StreamResponse, fmt: Format, boundary: str
) -> web.StreamResponse:
    config = request.app[CONFIG]
    engine = request.app[ENGINE]
    base = http.base(request)
    await response.prepare(request)
    head = f"\r\nContent-Type: {fmt.media_type}\r\n\r\n".encode()
    delimiter = f"\r\n--{boundary}".encode()
    await response.write(delimiter[2:])
    deadline = time.monotonic() + http.bounded(request, config.stream_max)
    try:
        while not pipe.deleted:
            await spill.ensure(request.app, pipe)
            for message in list(engine.stream(pipe, 0)):
                body = restms.encode(views.message(base, pipe, message, embed=True), fmt)
                await response.write(head + body + delimiter)
                engine.delivered(pipe, message)
                engine.ack(Slot(pipe, message.seq))
            remaining = deadline - time.monotonic()
            if remaining <= 0 or engine.closing:
                break
            if not pipe.messages:  # what arrived during a write is sent before waiting
                await pipe.changed(remaining)
        await response.write(b"--\r\n")
        await response.write_eof()
    except ConnectionError:
        pass
    return response
