"""Receiving a webhook pipe's deliveries: signatures checked, repeats dropped
(docs/WEBHOOKS.md §3-§6), for aiohttp, WSGI and ASGI.

:class:`Receiver` is the whole logic, without a framework: it answers the
gateway's verification ``GET`` with its challenge, and for each ``POST`` checks
``X-RestMS-Signature`` (HMAC-SHA256 of ``"<t>." + body`` with the pipe's secret,
``t`` within ``tolerance`` seconds of now), drops a repeat of an
``X-RestMS-Message-Id`` it handled within twice the tolerance, reads the message
and calls the handler. Its answers: ``204`` handled (or a repeat), ``401`` a bad
or stale signature (the gateway retries, then dead-letters), ``400`` an unreadable
body, and whatever status a handler's :class:`Refuse` names. An exception in the
handler is a ``500``, so the gateway tries again later. The adapters
:func:`aiohttp_handler`, :func:`wsgi_app` and :func:`asgi_app` only move bytes.
"""

from __future__ import annotations

import hashlib
import hmac
import inspect
import logging
import time
import urllib.parse
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from . import codec
from .errors import ProtocolError
from .values import Message

log = logging.getLogger("restms_client.webhooks")

SIGNATURE = "x-restms-signature"
MESSAGE_ID = "x-restms-message-id"
ATTEMPT = "x-restms-attempt"
TOLERANCE = 300.0  # seconds a signature's timestamp may be off
SEEN_MAX = 100_000  # ids remembered at most


def signature_ok(
    header: str, secret: str, body: bytes, *, tolerance: float = TOLERANCE, now: float | None = None
) -> bool:
    """Whether ``X-RestMS-Signature`` ``header`` signs ``body`` with ``secret``, recently."""
    stamps, macs = [], []
    for item in header.split(","):
        key, _, value = item.strip().partition("=")
        if key == "t":
            stamps.append(value)
        elif key == "v1":
            macs.append(value)
    if len(stamps) != 1 or not stamps[0].isdigit():
        return False
    if abs((time.time() if now is None else now) - int(stamps[0])) > tolerance:
        return False  # a replay of an old request, or a clock far off
    signed = stamps[0].encode() + b"." + body
    wanted = hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()
    return any(hmac.compare_digest(wanted, mac) for mac in macs)


@dataclass(frozen=True, slots=True, kw_only=True)
class Webhook:
    """One delivery: the message, its id towards this receiver and the attempt."""

    message: Message
    delivery_id: str
    attempt: int


class Refuse(Exception):
    """Raised by a handler to answer with ``status`` (4xx: the gateway retries)."""

    def __init__(self, status: int, reason: str = "") -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


Answer = tuple[int, str]  # status, text/plain body
Handler = Callable[[Webhook], Awaitable[None] | None]


class Receiver:
    """The framework-free receiver of one webhook pipe (``secret`` is its key)."""

    def __init__(self, secret: str, handler: Handler, *, tolerance: float = TOLERANCE) -> None:
        self._secret = secret
        self._handler = handler
        self._tolerance = tolerance
        self._seen: OrderedDict[str, float] = OrderedDict()

    def __repr__(self) -> str:
        return f"Receiver(handler={self._handler!r})"  # never the secret

    def verification(self, query: str) -> Answer:
        """The answer to the gateway's ``GET`` asking whether this receiver wants the
        pipe's messages: its challenge, echoed."""
        params = urllib.parse.parse_qs(query)
        if params.get("restms.mode") != ["subscribe"] or "restms.challenge" not in params:
            return 400, "not a webhook verification"
        return 200, params["restms.challenge"][0]

    def check(self, headers: Mapping[str, str], body: bytes) -> Webhook | Answer:
        """A delivery's :class:`Webhook`, or the answer that ends it here."""
        lower = {k.lower(): v for k, v in headers.items()}
        if not signature_ok(
            lower.get(SIGNATURE, ""), self._secret, body, tolerance=self._tolerance
        ):
            return 401, "bad or stale signature"
        delivery_id = lower.get(MESSAGE_ID, "")
        if self._repeat(delivery_id):
            return 204, ""
        try:
            tree = codec.decode(body, lower.get("content-type", codec.JSON))
            message, _, _ = codec.read_message(tree)
        except ProtocolError as exc:
            return 400, str(exc)
        attempt = lower.get(ATTEMPT, "1")
        return Webhook(
            message=message,
            delivery_id=delivery_id,
            attempt=int(attempt) if attempt.isdigit() else 1,
        )

    def handled(self, webhook: Webhook) -> None:
        """Remember ``webhook`` as handled: a repeat of it is answered 204 unread."""
        now = time.monotonic()
        self._seen[webhook.delivery_id] = now
        while self._seen and (
            len(self._seen) > SEEN_MAX
            or now - next(iter(self._seen.values())) > 2 * self._tolerance
        ):
            self._seen.popitem(last=False)

    def _repeat(self, delivery_id: str) -> bool:
        at = self._seen.get(delivery_id)
        return at is not None and time.monotonic() - at <= 2 * self._tolerance

    def _begin(
        self, method: str, query: str, headers: Mapping[str, str], body: bytes
    ) -> Webhook | Answer:
        return self.verification(query) if method == "GET" else self.check(headers, body)

    def handle(self, method: str, query: str, headers: Mapping[str, str], body: bytes) -> Answer:
        """The whole exchange for a synchronous handler (WSGI)."""
        webhook = self._begin(method, query, headers, body)
        if not isinstance(webhook, Webhook):
            return webhook
        try:
            if inspect.isawaitable(self._handler(webhook)):
                raise TypeError("an async handler needs aiohttp_handler or asgi_app")
        except Refuse as refused:
            return refused.status, refused.reason
        self.handled(webhook)
        return 204, ""

    async def ahandle(
        self, method: str, query: str, headers: Mapping[str, str], body: bytes
    ) -> Answer:
        """The whole exchange, awaiting the handler if it is a coroutine (aiohttp, ASGI)."""
        webhook = self._begin(method, query, headers, body)
        if isinstance(webhook, Webhook):
            try:
                outcome = self._handler(webhook)
                if inspect.isawaitable(outcome):
                    await outcome
            except Refuse as refused:
                return refused.status, refused.reason
            self.handled(webhook)
            return 204, ""
        return webhook


def aiohttp_handler(receiver: Receiver) -> Callable[[Any], Awaitable[Any]]:
    """An aiohttp request handler: ``app.router.add_route("*", "/hook", ...)``."""
    from aiohttp import web

    async def hook(request: web.Request) -> web.Response:
        body = await request.read()
        status, text = await receiver.ahandle(
            request.method, request.query_string, request.headers, body
        )
        return web.Response(status=status, text=text or None, content_type="text/plain")

    return hook


def wsgi_app(receiver: Receiver) -> Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]:
    """A WSGI application for ``receiver`` (a synchronous handler)."""

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        length = int(environ.get("CONTENT_LENGTH") or 0)
        body = environ["wsgi.input"].read(length) if length > 0 else b""
        headers = {
            key[5:].replace("_", "-"): value
            for key, value in environ.items()
            if key.startswith("HTTP_")
        }
        headers["content-type"] = environ.get("CONTENT_TYPE", "")
        status, text = receiver.handle(
            environ["REQUEST_METHOD"], environ.get("QUERY_STRING", ""), headers, body
        )
        start_response(
            f"{status} {_PHRASES.get(status, 'Status')}", [("Content-Type", "text/plain")]
        )
        return [text.encode()]

    return app


def asgi_app(receiver: Receiver) -> Callable[..., Awaitable[None]]:
    """An ASGI (HTTP) application for ``receiver`` (a handler sync or async)."""

    async def app(
        scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]
    ) -> None:
        if scope["type"] != "http":
            return
        chunks = []
        while True:
            event = await receive()
            chunks.append(event.get("body", b""))
            if not event.get("more_body"):
                break
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        query = scope.get("query_string", b"").decode("latin-1")
        status, text = await receiver.ahandle(scope["method"], query, headers, b"".join(chunks))
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", b"text/plain")],
            }
        )
        await send({"type": "http.response.body", "body": text.encode()})

    return app


_PHRASES = {
    200: "OK",
    204: "No Content",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    500: "Internal Server Error",
}
