"""What an operation asks of a client, and the retry policy, without I/O.

Every operation of the library (``ops.py``) is written once, as a generator that
yields *steps* and receives their results: :class:`Call` (send this request, get its
reply), :class:`Sleep`, :class:`Events` / :class:`NextEvent` (a Server-Sent Events
stream), :class:`Socket` / :class:`Receive` / :class:`SendFrame` (a WebSocket), and
:class:`Emit` (hand this delivery to the caller). The synchronous and the asyncio
client each run these generators with their own I/O, so both have the same
operations, retries and reading logic, and neither copies the other (the pattern of
sans-I/O protocol libraries such as h11). A failed request is thrown into the
generator as a :class:`~restms_client.errors.TransportError`.
"""

from __future__ import annotations

import logging
import random
import secrets
from collections.abc import Generator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from .errors import RestMSError, StatusError, TransportError, status_error
from .values import Message

T = TypeVar("T")
log = logging.getLogger("restms_client")


class Reply(Protocol):
    """What the operations read of an HTTP response (an ``httpx2.Response``)."""

    @property
    def status_code(self) -> int: ...
    @property
    def headers(self) -> Mapping[str, str]: ...
    @property
    def content(self) -> bytes: ...


@dataclass(frozen=True, slots=True)
class Call:
    """Send one request; the step's result is its :class:`Reply` (body read)."""

    method: str
    url: str
    headers: Mapping[str, str] = field(default_factory=dict)
    content: bytes | None = None
    timeout: float | None = None  # None: the client's default
    anonymous: bool = False  # sent without the client's OAuth token (token discovery)


@dataclass(frozen=True, slots=True)
class Sleep:
    seconds: float


@dataclass(frozen=True, slots=True)
class Events:
    """Open a Server-Sent Events stream; the result is an opaque stream handle, or a
    :class:`Reply` when the gateway answered with an error status."""

    call: Call


@dataclass(frozen=True, slots=True)
class NextEvent:
    """The next event of ``stream``: ``(event, data, id)``, or ``None`` at its end."""

    stream: object


@dataclass(frozen=True, slots=True)
class Close:
    """Close a stream or socket opened by :class:`Events` or :class:`Socket`."""

    stream: object


@dataclass(frozen=True, slots=True)
class Socket:
    """Open a WebSocket (subprotocol ``restms.v1``); the result is a socket handle."""

    url: str
    headers: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class Receive:
    """The next text frame of ``socket`` as a string, or ``None`` once it closed."""

    socket: object


@dataclass(frozen=True, slots=True)
class SendFrame:
    socket: object
    text: str


@dataclass(frozen=True, slots=True)
class Received:
    """A delivery read from a pipe, before the client binds its ``ack``."""

    message: Message
    href: str
    position: int
    delivery_count: int


@dataclass(frozen=True, slots=True)
class Emit:
    """Hand ``value`` (a :class:`Received` or a Gap) to the reader's caller."""

    value: object


Step = Call | Sleep | Events | NextEvent | Close | Socket | Receive | SendFrame | Emit
Op = Generator[Step, Any, T]


@dataclass(frozen=True, slots=True, kw_only=True)
class Retry:
    """When and how often a request is sent again.

    A request is retried on a connection failure or timeout and on the ``statuses``
    (429 and 503: the gateway asks to come back later), at most ``attempts`` times.
    The wait before retry ``n`` is drawn uniformly from 0 to
    ``min(max_backoff, backoff * 2**(n-1))`` ("full jitter", so that many clients
    refused at once do not come back at once), and is never shorter than the
    gateway's ``Retry-After``; a ``Retry-After`` over ``max_retry_after`` is not
    waited for (the error is raised). ``503`` with ``Retry-After: 0`` (an asynclet's
    wait ran out) is asked again at once and not counted. Retrying is safe: every
    POST carries an ``Idempotency-Key`` and every published message a
    ``message_id`` (docs/EXTENSIONS.md §6, §7); GET and DELETE are idempotent.
    """

    attempts: int = 10
    backoff: float = 0.1
    max_backoff: float = 5.0
    max_retry_after: float = 60.0
    statuses: frozenset[int] = frozenset({429, 503})

    def delay(self, attempt: int, retry_after: float | None) -> float:
        ceiling = min(self.max_backoff, self.backoff * 2 ** (attempt - 1))
        jitter = random.uniform(0, ceiling)  # noqa: S311 (spreading retries, not secrets)
        return jitter if retry_after is None else retry_after + jitter / 4


NO_RETRY = Retry(attempts=0)


def new_id() -> str:
    """A random id for a ``message_id`` or an ``Idempotency-Key`` (128 bits)."""
    return secrets.token_hex(16)


def retry_after(reply: Reply) -> float | None:
    value = reply.headers.get("retry-after")
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None  # an HTTP date: the gateway sends seconds; back off as usual


def error_of(reply: Reply, call: Call) -> StatusError:
    reason = reply.content[:1000].decode("utf-8", "replace").strip()
    return status_error(
        reply.status_code,
        reason,
        url=call.url,
        method=call.method,
        retry_after=retry_after(reply),
    )


def backoff(
    retry: Retry, attempt: int, failure: RestMSError, wait: float | None = None
) -> Op[None]:
    """Sleep before retry ``attempt``, or raise ``failure`` when the policy says stop."""
    if attempt > retry.attempts or (wait is not None and wait > retry.max_retry_after):
        raise failure
    delay = retry.delay(attempt, wait)
    log.info("retry %d in %.2f s after: %s", attempt, delay, failure)
    yield Sleep(delay)


def send(call: Call, retry: Retry, *, ok: frozenset[int] = frozenset()) -> Op[Reply]:
    """``call`` with ``retry``: its 2xx reply (or one of ``ok``), else the error."""
    attempt = 0
    while True:
        try:
            reply: Reply = yield call
        except TransportError as exc:
            failure: RestMSError = exc
            wait = None
        else:
            status = reply.status_code
            if status < 300 or status in ok:
                return reply
            failure = error_of(reply, call)
            if status not in retry.statuses:
                raise failure
            wait = retry_after(reply)
            if status == 503 and wait == 0:
                continue  # an expired asynclet wait: ask again, it is no failure
        attempt += 1
        yield from backoff(retry, attempt, failure, wait)
