"""Client connections: caps on how many are open, deadlines for reading a request.

aiohttp bounds the *size* of a request head (``max_line_size``, ``max_field_size``,
``max_headers``: a ``400`` and the connection closed) and closes a connection that
sits idle for ``keepalive_timeout``. It has no deadline for *reading* a request: its
keep-alive timer starts when the connection opens or a reply ends and is not pushed
back by incoming bytes, so a client dribbling a head is held until
``keepalive_timeout``, and one dribbling a body for as long as the handler waits.
This module adds what is missing, per connection (:class:`Connection`):

* **Caps.** A connection past ``max_connections`` in all, or past
  ``max_connections_per_ip`` from one peer address (an IPv6 one by its /64), is
  answered with a fixed ``503`` + ``Retry-After: 1`` + ``Connection: close`` and closed
  at once, before a byte is read. The reply costs one write of a constant and holds
  nothing, and tells a well-behaved client (a browser behind a busy NAT) to come back
  rather than showing it a reset; a client that already sent its request may still see
  a reset, because unread data makes the kernel answer the close with RST. It is
  counted in ``connection_made`` and released in ``connection_lost``, which asyncio
  calls exactly once for every connection it made; a TLS connection counts once its
  handshake is done.
* **Head deadline.** A connection has ``header_timeout`` from its accept to send its
  first whole request head, and each later head as long from its first byte; the
  handler starting stops the clock. When it runs out on a head begun the client gets
  ``408``; a connection that sent nothing at all is closed without a reply (as nginx
  does: a browser's preconnected socket must not read a reply to a request it never
  sent). Timing from the accept is what keeps silent connections from holding
  ``max_connections`` slots for aiohttp's whole ``keepalive_timeout``. (A later head
  that arrives whole in one read starts no clock: its handler starts before a clock
  could run out.)
* **Refused heads say why, and no more.** aiohttp's parser refuses a malformed or
  oversized head with a reason that quotes the bytes it choked on, the start of an
  oversized bearer token among them; the reply names the fault only (:func:`head_fault`).
* **Body deadline.** A request whose body has not fully arrived when its handler
  starts gets ``body_timeout`` for the rest of it; the end of the body stops it. When
  it runs out the connection is closed (the handler owns the reply, and is cancelled).
* **Never timed:** writing a reply. A stream, an SSE response or a long-poll holds its
  connection for as long as it lasts, whatever these deadlines are.

Bytes that arrive while a request is in hand (a pipelined request behind it) start no
clock; if they stop short of a whole head, aiohttp's keep-alive timer ends the wait, as
it ends an idle wait between requests.
Each connection keeps one timer handle that is re-armed lazily (a deadline is a float
store; the handle fires, finds a later deadline and sleeps again), so a keep-alive
connection serving many requests does not create a timer per request.

aiohttp surface this relies on, checked against aiohttp 3.14 (the test
``test_aiohttp_surface_is_what_connections_expect`` fails when it changes):

* ``web.AppRunner._make_server``, the hook by which a runner builds its
  ``web.Server`` (the protocol factory its sites listen with);
* ``web.Server(handler, request_factory=, handler_cancellation=, **handler_kwargs)``
  and its ``request_handler``, ``request_factory`` and ``handler_cancellation``;
* the request factory's arguments ``(message, payload, protocol, writer, task)``,
  called once per request just before its handler starts;
* ``web.RequestHandler(manager, loop=, **handler_kwargs)``, its asyncio protocol
  methods, its queue of parsed requests not yet handled, ``_messages`` (filled by
  ``data_received``), ``force_close()``, ``log_access(request, response, time)``, called once
  per request by ``finish_response`` when the reply is written (or the client went
  away while it was), and ``handle_error(request, status, exc, message)``, which builds
  the reply to a request head its parser refused (``exc`` is then the parser's
  ``HttpProcessingError``, one of the classes of ``aiohttp.http_exceptions``;
  ``LineTooLong.args`` is ``(line, limit, actual_size)``);
* ``RequestHandler._keepalive_handle``, its keep-alive timer: armed when a connection
  opens, and armed again by ``start()`` at a reply's end when it is None (as
  ``keep_alive()`` leaves it). While a request is in hand the timer cannot close the
  connection (it closes only one idle between requests), so :func:`waits` stops it for a
  request that waits (see there).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, cast

from aiohttp import StreamReader, hdrs, web
from aiohttp.abc import AbstractStreamWriter
from aiohttp.http import HttpProcessingError, RawRequestMessage
from aiohttp.http_exceptions import (
    BadHttpMethod,
    BadStatusLine,
    InvalidHeader,
    InvalidURLError,
    LineTooLong,
    PayloadEncodingError,
)

from auth.limits import Slots, address_key
from gateway.server import requestid
from gateway.server.config import Config

log = logging.getLogger(__name__)

AIOHTTP_CHECKED = "3.14"  # the aiohttp release series the surface above was read in

FIRST = "first request"  # from the accept until the first byte
HEAD = "request head"
BODY = "request body"


def _reply(status: str, text: str, *headers: str) -> bytes:
    body = text.encode()
    lines = (
        f"HTTP/1.1 {status}",
        f"Server: {requestid.SERVER}",
        "Content-Type: text/plain; charset=utf-8",
        f"Content-Length: {len(body)}",
        *headers,
        "Connection: close",
    )
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


BUSY = _reply("503 Service Unavailable", "too many open connections, retry\n", "Retry-After: 1")
SLOW_HEAD = _reply("408 Request Timeout", "request head not received in time\n")


class ConnectionLimits:
    """The caps and deadlines, and the counts they are checked against."""

    __slots__ = (
        "_per_peer",
        "body_timeout",
        "header_timeout",
        "max_connections",
        "open",
        "refused",
        "too_slow",
    )

    def __init__(
        self,
        *,
        max_connections: int,
        max_connections_per_ip: int,
        header_timeout: float,
        body_timeout: float,
    ) -> None:
        self.max_connections = max_connections
        self.header_timeout = header_timeout
        self.body_timeout = body_timeout
        self._per_peer = Slots(max_connections_per_ip)
        self.open = 0  # connections admitted and not yet lost
        self.refused = 0  # connections turned away at a cap
        self.too_slow = 0  # connections closed at a head or body deadline

    @classmethod
    def from_config(cls, config: Config) -> ConnectionLimits:
        return cls(
            max_connections=config.max_connections,
            max_connections_per_ip=config.max_connections_per_ip,
            header_timeout=config.header_timeout,
            body_timeout=config.body_timeout,
        )

    def from_peer(self, peer: str) -> int:
        """How many open connections come from ``peer`` (its /64, for IPv6)."""
        return self._per_peer.count(address_key(peer))

    def admit(self, peer: str) -> bool:
        # An IPv6 client is counted by its /64, as the secret checks count it: one
        # subscriber is usually given a whole /64, so its addresses are one client.
        if self.open >= self.max_connections or not self._per_peer.acquire(address_key(peer)):
            self.refused += 1
            return False
        self.open += 1
        return True

    def release(self, peer: str) -> None:
        self._per_peer.release(address_key(peer))
        self.open -= 1


class Connection(web.RequestHandler):
    """aiohttp's HTTP/1 protocol, under the caps and with the read deadlines."""

    __slots__ = ("_deadline", "_event_loop", "_handling", "_limits", "_peer", "_reading", "_timer")

    def __init__(
        self,
        manager: web.Server,
        *,
        limits: ConnectionLimits,
        loop: asyncio.AbstractEventLoop,
        **kwargs: Any,
    ) -> None:
        super().__init__(manager, loop=loop, **kwargs)
        self._limits = limits
        self._event_loop = loop
        self._peer: str | None = None  # set while admitted
        self._handling = False  # a handler runs (from its start to its reply's end)
        self._reading: str | None = None  # HEAD or BODY while a deadline runs
        self._deadline = 0.0
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        peername = transport.get_extra_info("peername")
        peer = str(peername[0]) if isinstance(peername, tuple) else ""
        if not self._limits.admit(peer):
            log.debug("%s: over the connection cap, refused", peer)
            cast(asyncio.Transport, transport).write(BUSY)
            transport.close()
            return
        self._peer = peer
        super().connection_made(transport)
        self._expect(FIRST, self._limits.header_timeout)

    def connection_lost(self, exc: BaseException | None) -> None:
        peer = self._peer
        if peer is None:  # refused: aiohttp never saw it
            return
        self._peer = None
        self._limits.release(peer)
        self._reading = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        super().connection_lost(exc)

    # The methods called for every request name their base class rather than use
    # super(): the zero-argument form builds a super object on each call, about as
    # costly as a call itself.
    def data_received(self, data: bytes) -> None:
        # aiohttp calls this with b"" too, when it resumes reading: test that first.
        if data and self._reading is None and not self._handling:
            if self._peer is None:
                return
            web.RequestHandler.data_received(self, data)
            # A head that came in whole is now in aiohttp's queue, and its handler's
            # start would stop the clock before it could run out: only a head still
            # short of its end starts one (a timer read and store less per request).
            if not self._messages:
                self._expect(HEAD, self._limits.header_timeout)
            return
        if self._reading == FIRST and data:
            self._reading = HEAD  # the clock started at the accept runs on
        web.RequestHandler.data_received(self, data)

    def request_started(self, payload: StreamReader) -> None:
        """The head is in and the handler starts: time the body, if it is still coming."""
        self._handling = True
        if payload.is_eof():
            self._reading = None
        else:
            self._expect(BODY, self._limits.body_timeout)
            payload.on_eof(self._body_received)

    def _body_received(self) -> None:
        if self._reading == BODY:
            self._reading = None

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if not isinstance(exc, HttpProcessingError):
            return super().handle_error(request, status, exc, message)
        # A malformed or oversized request head is the client's doing. aiohttp logs each
        # at ERROR with a traceback: anyone could fill the log. One debug line will do,
        # and like the reply it leaves out the bytes refused (a credential, maybe).
        fault = head_fault(exc)
        request_id = requestid.fresh()  # the head's own id, if any, is part of what was refused
        log.debug("%s: bad request head: %s request_id=%s", self._peer, fault, request_id)
        reply = web.Response(
            status=status,
            text=f"{fault}\n",
            headers={hdrs.SERVER: requestid.SERVER, requestid.X_REQUEST_ID: request_id},
        )
        reply.force_close()
        return reply

    def log_access(
        self, request: web.BaseRequest, response: web.StreamResponse, time: float | None
    ) -> None:
        # The reply's end. This is the one synchronous call aiohttp makes there: an
        # override of the finish_response coroutine would cost every request a coroutine.
        # When writing the reply fails otherwise, aiohttp closes the connection: no
        # request follows, and nothing needs the flag reset.
        self._handling = False
        web.RequestHandler.log_access(self, request, response, time)

    def _expect(self, what: str, timeout: float) -> None:
        loop = self._event_loop
        deadline = loop.time() + timeout
        self._reading, self._deadline = what, deadline
        timer = self._timer
        if timer is None or timer.when() > deadline:
            if timer is not None:
                timer.cancel()
            self._timer = loop.call_at(deadline, self._check)

    def _check(self) -> None:
        self._timer = None
        if self._reading is None or self.transport is None:
            return
        if self._event_loop.time() < self._deadline:  # a later deadline was set since
            self._timer = self._event_loop.call_at(self._deadline, self._check)
            return
        what, self._reading = self._reading, None
        self._limits.too_slow += 1
        log.debug("%s: %s not received in time, closing", self._peer, what)
        if what == HEAD:
            self.transport.write(SLOW_HEAD)
        self.force_close()


def head_fault(exc: HttpProcessingError) -> str:
    """What was wrong with a request head aiohttp's parser refused, without its bytes.

    aiohttp's reasons quote what they refused (``Got more than 8190 bytes when reading:
    b'Authorization: Bearer eyJ...'``), llhttp's after a colon too; the sentences it
    writes without them (``Too many headers received``) have no colon, so what comes
    before one is kept for the faults not named here.
    """
    if isinstance(exc, LineTooLong):
        return f"Bad Request: the request line or a header is longer than {exc.args[1]} bytes"
    if isinstance(exc, InvalidHeader):
        return "Bad Request: malformed header"
    if isinstance(exc, InvalidURLError):
        return "Bad Request: malformed request target"
    if isinstance(exc, BadHttpMethod):
        https = exc.message == "Received HTTPS traffic on an HTTP port"
        return "Bad Request: HTTPS sent to an HTTP port" if https else "Bad Request: bad method"
    if isinstance(exc, BadStatusLine):
        return "Bad Request: malformed request line"
    if isinstance(exc, PayloadEncodingError):
        return "Bad Request: malformed body framing"
    first = exc.message.split(":", 1)[0].strip().splitlines()
    return f"Bad Request: {first[0][:80]}" if first else "Bad Request"


def waits(request: web.BaseRequest) -> None:
    """The request in hand is about to wait (an asynclet, an evented GET, a stream):
    stop aiohttp's keep-alive timer on its connection until the reply ends.

    That timer closes a connection idle between requests and does nothing while one is
    in hand; aiohttp arms it again when the reply ends. Held through a wait it is only
    memory: a uvloop timer costs about 550 bytes (handle, libuv timer, bound method,
    context, an entry in the loop's set), 5.5 MB for 10,000 waiting asynclets.
    """
    protocol = request.protocol
    timer = protocol._keepalive_handle
    if timer is not None:
        timer.cancel()
        protocol._keepalive_handle = None


class _Server(web.Server):
    """The app's low-level server, making :class:`Connection` protocols."""

    def __init__(
        self, made: web.Server, limits: ConnectionLimits, handler_kwargs: dict[str, Any]
    ) -> None:
        app_factory = made.request_factory

        def request_factory(
            message: RawRequestMessage,
            payload: StreamReader,
            protocol: Connection,  # what this server's __call__ makes
            writer: AbstractStreamWriter,
            task: asyncio.Task[None],
        ) -> web.BaseRequest:
            protocol.request_started(payload)
            return app_factory(message, payload, protocol, writer, task)

        self._event_loop = asyncio.get_running_loop()
        super().__init__(
            made.request_handler,
            request_factory=request_factory,  # type: ignore[arg-type]  # Connection only
            handler_cancellation=made.handler_cancellation,
            loop=self._event_loop,
            **handler_kwargs,
        )
        self._limits = limits
        self._handler_kwargs = handler_kwargs

    def __call__(self) -> Connection:
        return Connection(self, limits=self._limits, loop=self._event_loop, **self._handler_kwargs)


class GatewayRunner(web.AppRunner):
    """An ``AppRunner`` whose connections are :class:`Connection` under one set of limits.

    ``handler_kwargs`` go to every connection's ``RequestHandler`` (keep-alive, head
    size limits, access log); the other keywords are ``AppRunner``'s.
    """

    __slots__ = ("_handler_kwargs", "limits")

    def __init__(
        self,
        app: web.Application,
        *,
        limits: ConnectionLimits,
        handler_kwargs: dict[str, Any],
        **runner_kwargs: Any,
    ) -> None:
        super().__init__(app, **runner_kwargs, **handler_kwargs)
        self.limits = limits
        self._handler_kwargs = handler_kwargs

    async def _make_server(self) -> web.Server:
        made = await super()._make_server()  # runs the app's startup, freezes it
        return _Server(made, self.limits, self._handler_kwargs)
