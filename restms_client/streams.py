"""The I/O of streams and sockets for both clients (the steps of ``readers.py``).

A stream or socket opened for an operation is registered on the operation's exit
stack, so it is closed when the operation ends, whatever way it ends, and closed
early by a :class:`~restms_client.steps.Close` step when the reader reconnects.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx2

from .errors import TransportError
from .readers import SUBPROTOCOL, StreamHandle
from .steps import Close, Events, NextEvent, Receive, SendFrame, Socket, Step


class _Stream(StreamHandle):
    """One opened SSE stream or WebSocket, with what closes it."""

    def __init__(self, source: Any, exits: Any) -> None:
        self.source = source  # an event iterator, or a WebSocket session
        self.exits = exits


def _handle(handle: object) -> _Stream:
    if not isinstance(handle, _Stream):
        raise TypeError(f"not a stream of this client: {handle!r}")
    return handle


def _event(event: Any) -> tuple[str, str, str] | None:
    return None if event is None else (event.event, event.data, event.id)


def _failed(step: Step, exc: Exception) -> Exception:
    """The library's error for what failed under a stream step: a TransportError for
    the network and the WebSocket layer; anything else is a bug, raised as it is."""
    network = isinstance(exc, httpx2.TransportError | OSError)
    if network or type(exc).__module__.startswith("httpx2.websockets"):
        return TransportError(f"{type(step).__name__}: {type(exc).__name__}: {exc}")
    return exc


def sync_step(http: httpx2.Client, step: Step, opened: contextlib.ExitStack) -> Any:
    """Do a stream step on a synchronous client."""
    try:
        return _sync_step(http, step, opened)
    except Exception as exc:
        if (failure := _failed(step, exc)) is exc:
            raise
        raise failure from exc


def _sync_step(http: httpx2.Client, step: Step, opened: contextlib.ExitStack) -> Any:
    if isinstance(step, Events):
        exits = opened.enter_context(contextlib.ExitStack())
        call = step.call
        source = exits.enter_context(http.sse(call.url, headers=call.headers, timeout=call.timeout))
        if source.response.status_code >= 300:
            source.response.read()
            exits.close()
            return source.response
        events: Iterator[Any] = iter(source)
        return _Stream(events, exits)
    if isinstance(step, NextEvent):
        return _event(next(_handle(step.stream).source, None))
    if isinstance(step, Close):
        _handle(step.stream).exits.close()
        return None
    if isinstance(step, Socket):
        exits = opened.enter_context(contextlib.ExitStack())
        session = exits.enter_context(
            http.websocket(step.url, headers=step.headers, subprotocols=[SUBPROTOCOL])
        )
        return _Stream(session, exits)
    if isinstance(step, Receive):
        return _text(_handle(step.socket).source.receive)
    if isinstance(step, SendFrame):
        _handle(step.socket).source.send_text(step.text)
        return None
    raise TypeError(f"not a step: {step!r}")


def _text(receive: Any) -> str | None:
    """The next text frame, or None once the socket closed."""
    while True:
        try:
            text = _text_of(receive())
        except Exception as exc:
            if type(exc).__name__ == "WebSocketDisconnect":
                return None
            raise
        if text is not _OTHER:
            return text


_OTHER = "\0other"  # a frame that is neither text nor a close (ping, bytes)


def _text_of(event: object) -> str | None:
    """A frame's text; None for a close; ``_OTHER`` for anything else."""
    import wsproto.events as ws

    if isinstance(event, ws.TextMessage):
        return str(event.data)
    if isinstance(event, ws.CloseConnection):
        return None
    return _OTHER


async def async_step(
    http: httpx2.AsyncClient, step: Step, opened: contextlib.AsyncExitStack
) -> Any:
    """Do a stream step on an asyncio client."""
    try:
        return await _async_step(http, step, opened)
    except Exception as exc:
        if (failure := _failed(step, exc)) is exc:
            raise
        raise failure from exc


async def _async_step(
    http: httpx2.AsyncClient, step: Step, opened: contextlib.AsyncExitStack
) -> Any:
    if isinstance(step, Events):
        exits = await opened.enter_async_context(contextlib.AsyncExitStack())
        call = step.call
        source = await exits.enter_async_context(
            http.sse(call.url, headers=call.headers, timeout=call.timeout)
        )
        if source.response.status_code >= 300:
            await source.response.aread()
            await exits.aclose()
            return source.response
        events: AsyncIterator[Any] = source.__aiter__()
        return _Stream(events, exits)
    if isinstance(step, NextEvent):
        return _event(await anext(_handle(step.stream).source, None))
    if isinstance(step, Close):
        await _handle(step.stream).exits.aclose()
        return None
    if isinstance(step, Socket):
        exits = await opened.enter_async_context(contextlib.AsyncExitStack())
        session = await exits.enter_async_context(
            http.websocket(step.url, headers=step.headers, subprotocols=[SUBPROTOCOL])
        )
        return _Stream(session, exits)
    if isinstance(step, Receive):
        return await _atext(_handle(step.socket).source)
    if isinstance(step, SendFrame):
        await _handle(step.socket).source.send_text(step.text)
        return None
    raise TypeError(f"not a step: {step!r}")


async def _atext(session: Any) -> str | None:
    while True:
        try:
            text = _text_of(await session.receive())
        except Exception as exc:
            if type(exc).__name__ == "WebSocketDisconnect":
                return None
            raise
        if text is not _OTHER:
            return text
