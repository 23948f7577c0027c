"""Reading a pipe over Server-Sent Events or a WebSocket, without I/O.

Like the long-poll reader (``ops.poll``) these are generators of steps. Both are
pushes of the same pipe cursor (docs/EXTENSIONS.md §3, §11): the gateway sends every
message the pipe holds, then each new one. When the stream or socket ends (the
gateway's ``stream_max``, a restart, a broken connection) the reader opens it again
with the last position it handed out (``Last-Event-ID``, ``?after=``), so the
gateway goes on after it: nothing skipped, nothing sent twice. A ``gap`` the gateway
reports on resuming is surfaced as the long-poll reader's are.
"""

from __future__ import annotations

import json
from typing import Any

from . import codec
from .errors import GapError, NotFound, ProtocolError, RestMSError, StatusError, TransportError
from .ops import USER_AGENT, Core, GapHandler, ack, href_of, poll
from .steps import (
    Call,
    Close,
    Emit,
    Events,
    NextEvent,
    Op,
    Receive,
    Received,
    SendFrame,
    Socket,
    backoff,
    error_of,
)
from .values import Gap, Pipe

STREAM_TIMEOUT = 60.0  # seconds without a byte (the gateway sends one every 15 s)
SUBPROTOCOL = "restms.v1"
TRANSPORTS = ("auto", "poll", "sse", "websocket")


def reader(
    core: Core, pipe: Pipe | str, transport: str, *, auto_ack: bool, on_gap: GapHandler
) -> Op[None]:
    """The reader for ``transport`` (``auto`` is long-poll: plain requests only)."""
    if transport in ("auto", "poll"):
        return poll(core, pipe, auto_ack=auto_ack, on_gap=on_gap)
    if transport == "sse":
        return sse(core, pipe, auto_ack=auto_ack, on_gap=on_gap)
    if transport == "websocket":
        return websocket(core, pipe, auto_ack=auto_ack, on_gap=on_gap)
    raise ValueError(f"transport is one of {', '.join(TRANSPORTS)}")


def _report(gap: Gap, on_gap: GapHandler) -> None:
    if on_gap is None:
        raise GapError(gap)
    on_gap(gap)


def _gap(data: dict[str, Any]) -> Gap:
    return Gap(first=int(data["first"]), last=int(data["last"]), earliest=int(data["earliest"]))


def _received(document: dict[str, Any], position: int) -> Received:
    message, count, href = codec.read_message(document)
    if href is None:
        raise ProtocolError("a pushed message without its href")
    return Received(message, href, position, count)


def sse(core: Core, /, pipe: Pipe | str, *, auto_ack: bool, on_gap: GapHandler) -> Op[None]:
    """Read a pipe as a Server-Sent Events stream, for ever."""
    href = href_of(pipe)
    last: int | None = None
    attempt = 0
    while True:
        headers = {"Accept": "text/event-stream", "User-Agent": USER_AGENT}
        if last is not None:
            headers["Last-Event-ID"] = str(last)
        try:
            opening = Call("GET", href, headers, timeout=STREAM_TIMEOUT)
            stream = yield Events(opening)
            if not isinstance(stream, StreamHandle):
                raise error_of(stream, opening)
            attempt = 0
            while (event := (yield NextEvent(stream))) is not None:
                name, data, event_id = event
                if name == "gap":
                    _report(_gap(json.loads(data)), on_gap)
                elif name == "deleted":
                    raise NotFound(404, "the pipe was deleted", url=href)
                elif name == "message" and data:  # a "retry:" line alone is no message
                    received = _received(json.loads(data)["restms"], int(event_id))
                    last = received.position
                    yield Emit(received)
                    if auto_ack:
                        yield from ack(core, received.href)
            yield Close(stream)
        except RestMSError as exc:
            attempt = yield from _again(core, attempt, exc)


def websocket(core: Core, /, pipe: Pipe | str, *, auto_ack: bool, on_gap: GapHandler) -> Op[None]:
    """Read a pipe over a WebSocket (subprotocol ``restms.v1``), for ever."""
    href = href_of(pipe)
    base = "ws" + href.removeprefix("http")  # the pipe's own URI, upgraded
    last: int | None = None
    attempt = 0
    while True:
        url = base if last is None else f"{base}?after={last}"
        try:
            socket = yield Socket(url, {"User-Agent": USER_AGENT})
            attempt = 0
            while (frame := (yield Receive(socket))) is not None:
                data = json.loads(frame)
                kind = data.get("type")
                if kind == "gap":
                    _report(_gap(data), on_gap)
                elif kind == "message":
                    received = _received(data["restms"], int(data["position"]))
                    last = received.position
                    yield Emit(received)
                    if auto_ack:
                        ack_frame = {"type": "ack", "position": received.position}
                        yield SendFrame(socket, json.dumps(ack_frame))
                elif kind == "end" and data.get("code") == 4404:
                    raise NotFound(404, "the pipe was deleted", url=href)
                elif kind == "error":
                    raise ProtocolError(f"the gateway refused a frame: {data.get('reason')}")
            yield Close(socket)
        except RestMSError as exc:
            attempt = yield from _again(core, attempt, exc)


def _again(core: Core, attempt: int, failure: RestMSError) -> Op[int]:
    """Back off before opening the stream again (the next attempt's number), or raise
    ``failure`` when it is not worth another try or the policy says stop."""
    retriable = isinstance(failure, TransportError) or (
        isinstance(failure, StatusError) and failure.status in core.retry.statuses
    )
    if not retriable:
        raise failure
    wait = failure.retry_after if isinstance(failure, StatusError) else None
    yield from backoff(core.retry, attempt + 1, failure, wait)
    return attempt + 1


class StreamHandle:
    """What the clients return for an opened stream or socket (see ``streams.py``)."""
