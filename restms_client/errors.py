"""One exception tree for everything the client can raise.

::

    RestMSError                      the root: catch this to catch them all
    ├── TransportError               no answer: connect refused, reset, timed out
    ├── ProtocolError                an answer the client cannot read as RestMS
    ├── GapError                     messages left the pipe unacknowledged (Gap)
    └── StatusError                  the gateway answered 4xx/5xx; .status, .reason
        ├── BadRequest               400
        ├── Unauthorized             401
        ├── Forbidden                403
        ├── NotFound                 404
        ├── NotAcceptable            406
        ├── Conflict                 409 (an Idempotency-Key still being served)
        ├── PreconditionFailed       412
        ├── PayloadTooLarge          413
        ├── UnsupportedMediaType     415
        ├── UnprocessableContent     422 (an Idempotency-Key reused for another request)
        ├── TooManyRequests          429
        ├── ServerError              500 and any other 5xx
        └── ServiceUnavailable       503

Every :class:`StatusError` keeps the status, the gateway's one-line ``text/plain``
reason, the request's method and URL, and ``Retry-After`` (seconds) when the gateway
sent it. The HTTP
library's own exceptions are converted in one place, the clients' request step, with
``raise ... from``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .values import Gap


class RestMSError(Exception):
    """The root of every error the client raises."""


class TransportError(RestMSError):
    """The request got no answer: the connection failed, was reset or timed out."""


class ProtocolError(RestMSError):
    """The gateway's answer is not what RestMS says it should be."""


class GapError(RestMSError):
    """Messages the reader would have been given left the pipe unacknowledged.

    They expired, were dropped by a full pipe's ``drop-oldest`` overflow, went to a
    dead-letter feed, or were kept in memory only when the gateway stopped
    (docs/EXTENSIONS.md §3, *Gaps*). ``gap`` says which positions.
    """

    def __init__(self, gap: Gap) -> None:
        super().__init__(
            f"positions {gap.first}-{gap.last} left the pipe unacknowledged "
            f"(the oldest held is {gap.earliest})"
        )
        self.gap = gap


class StatusError(RestMSError):
    """The gateway refused the request: ``status`` and its ``text/plain`` ``reason``."""

    status = 0

    def __init__(
        self,
        status: int,
        reason: str,
        *,
        url: str = "",
        method: str = "",
        retry_after: float | None = None,
    ) -> None:
        where = f" ({method} {url})".replace("( ", "(") if url else ""
        super().__init__(f"{status} {reason}{where}")
        self.status = status
        self.reason = reason
        self.url = url
        self.method = method
        self.retry_after = retry_after


class BadRequest(StatusError):
    status = 400


class Unauthorized(StatusError):
    status = 401


class Forbidden(StatusError):
    status = 403


class NotFound(StatusError):
    status = 404


class NotAcceptable(StatusError):
    status = 406


class Conflict(StatusError):
    status = 409


class PreconditionFailed(StatusError):
    status = 412


class PayloadTooLarge(StatusError):
    status = 413


class UnsupportedMediaType(StatusError):
    status = 415


class UnprocessableContent(StatusError):
    status = 422


class TooManyRequests(StatusError):
    status = 429


class ServerError(StatusError):
    status = 500


class ServiceUnavailable(StatusError):
    status = 503


_BY_STATUS: dict[int, type[StatusError]] = {
    cls.status: cls
    for cls in (
        BadRequest,
        Unauthorized,
        Forbidden,
        NotFound,
        NotAcceptable,
        Conflict,
        PreconditionFailed,
        PayloadTooLarge,
        UnsupportedMediaType,
        UnprocessableContent,
        TooManyRequests,
        ServerError,
        ServiceUnavailable,
    )
}


def status_error(
    status: int, reason: str, *, url: str = "", method: str = "", retry_after: float | None = None
) -> StatusError:
    """The exception for ``status``: its own class, else the class of its hundred."""
    cls = _BY_STATUS.get(status) or (ServerError if status >= 500 else StatusError)
    return cls(status, reason, url=url, method=method, retry_after=retry_after)
