"""One exception tree for the whole gateway, with an HTTP status hint on each class.

Lower layers (``restms``, ``feeds``, ``auth``, ``bridges``) raise these; ``gateway``
converts them to a ``text/plain`` reply in exactly one place (its error middleware).
Foreign exceptions (lxml, orjson, sqlite, ...) are converted where they are caught,
with ``raise ... from exc``, so the cause stays in the traceback.

    RestMSError                      500  (never raised directly)
    ├── BadRequest                   400  malformed document, unknown type, bad value
    ├── Unauthorized                 401  no or bad credentials (carries challenges)
    ├── Forbidden                    403  method or action not allowed on this resource
    │   └── InsufficientScope        403  the token lacks a scope (carries a challenge)
    ├── NotFound                     404  no such resource (or not yours)
    ├── MethodNotAllowed             405  a method RestMS does not define (carries Allow)
    ├── NotAcceptable                406  no representation the client accepts
    ├── Conflict                     409  the same Idempotency-Key is still being served
    ├── PreconditionFailed           412  If-Match / If-Unmodified-Since failed
    ├── PayloadTooLarge              413  body, document or count over a configured limit
    ├── UnsupportedMediaType         415  body in a media type we do not parse
    ├── MisdirectedRequest           421  a Host this gateway does not serve
    ├── UnprocessableContent         422  an Idempotency-Key reused for another request
    ├── TooManyRequests              429  rate limit or concurrent waits (carries Retry-After)
    ├── NotImplementedFeature        501  a feature we do not offer
    └── ServiceUnavailable           503  queue full, wait expired (carries Retry-After)
        └── NotCommitted             503  the store failed a commit: the change was not kept
"""

from __future__ import annotations


class RestMSError(Exception):
    """Root of the tree. ``str(error)`` is the one-sentence reason sent to the client."""

    status: int = 500

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class BadRequest(RestMSError):
    status = 400


class Unauthorized(RestMSError):
    """``challenges`` become ``WWW-Authenticate`` headers (RFC 9110 11.6.1, RFC 6750 3)."""

    status = 401

    def __init__(self, reason: str, challenges: tuple[str, ...] = ()) -> None:
        super().__init__(reason)
        self.challenges = challenges


class Forbidden(RestMSError):
    status = 403


class InsufficientScope(Forbidden):
    """A bearer token without the scope a request needs (RFC 6750 3.1)."""

    def __init__(self, reason: str, scope: str) -> None:
        super().__init__(reason)
        self.challenges = (f'Bearer realm="restms", error="insufficient_scope", scope="{scope}"',)


class NotFound(RestMSError):
    status = 404


class MethodNotAllowed(RestMSError):
    status = 405

    def __init__(self, reason: str, allow: tuple[str, ...]) -> None:
        super().__init__(reason)
        self.allow = allow


class NotAcceptable(RestMSError):
    status = 406


class Conflict(RestMSError):
    status = 409


class PreconditionFailed(RestMSError):
    status = 412


class PayloadTooLarge(RestMSError):
    status = 413


class UnsupportedMediaType(RestMSError):
    status = 415


class MisdirectedRequest(RestMSError):
    """A request for a host this server does not answer for (RFC 9110 7.4)."""

    status = 421


class UnprocessableContent(RestMSError):
    status = 422


class TooManyRequests(RestMSError):
    status = 429

    def __init__(self, reason: str, retry_after: int = 1) -> None:
        super().__init__(reason)
        self.retry_after = retry_after


class NotImplementedFeature(RestMSError):
    status = 501


class ServiceUnavailable(RestMSError):
    status = 503

    def __init__(self, reason: str, retry_after: int = 1, status: int = 503) -> None:
        super().__init__(reason)
        self.retry_after = retry_after
        # A9 legacy mode answers an expired wait with 500; everything else keeps 503.
        self.status = status


class NotCommitted(ServiceUnavailable):
    """A change the engine could not commit to its store, and so did not keep (a
    publish is withdrawn whole): the caller may make it again once the store is back."""
