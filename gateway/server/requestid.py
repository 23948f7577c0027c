"""Request ids: every request gets one, its reply says it, every log line it causes names it.

Where the id comes from, first that applies (docs/TRACING.md, "Request ids"):

1. a valid ``X-Request-ID`` of the request (1 to :data:`MAX_LENGTH` characters among
   letters, digits and ``-_.:+/=@``), kept as it came: a proxy in front or the client
   chose it, and its own logs name the request by it;
2. with tracing on, the trace id of the request's span: a trace backend finds the
   request by the id the logs show (the same as 3 when a ``traceparent`` came);
3. the trace id of a valid W3C ``traceparent`` of the request;
4. else a new one, 32 hex digits like a trace id: a random prefix drawn once per
   process and a counter. Ids only need to be unique (not secret or unguessable), and
   the counter costs a fraction of drawing random bytes per request.

An invalid ``X-Request-ID`` or ``traceparent`` is ignored (a new id is made), never
refused: a bad correlation header is no reason to fail a request.

The id goes to the reply's ``X-Request-ID`` header and to :data:`CURRENT`, a context
variable: aiohttp runs each request in a task of its own, so what the request logs (its
errors, and the access log line written as its reply ends) sees its id, and nothing
else does. :class:`RequestIdFilter` adds it to those log records.
"""

from __future__ import annotations

import itertools
import logging
import os
import re
from collections.abc import Mapping
from contextvars import ContextVar

from aiohttp import hdrs, web

X_REQUEST_ID = "X-Request-ID"
# Every reply's Server header (aiohttp's default names the Python and aiohttp versions,
# which tells a scanner which known flaws to try).
SERVER = "restms-gateway"
TRACEPARENT = "traceparent"
MAX_LENGTH = 128
_SAFE = re.compile(rf"[A-Za-z0-9\-_.:+/=@]{{1,{MAX_LENGTH}}}").fullmatch
# W3C Trace Context, "traceparent Header": version, trace id, parent id, flags. A version
# other than 00 may append fields after the flags; ff is invalid, and so are all-zero ids.
_TRACEPARENT = re.compile(
    r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}(-.*)?"
).fullmatch
_ZERO_TRACE, _ZERO_PARENT = "0" * 32, "0" * 16

CURRENT: ContextVar[str | None] = ContextVar("request_id", default=None)

_PREFIX = os.urandom(8).hex()
_COUNTER = itertools.count(1)


def given(headers: Mapping[str, str]) -> str | None:
    """The request's valid ``X-Request-ID``, or None."""
    value = headers.get(X_REQUEST_ID)
    if value is not None and _SAFE(value):
        return value
    return None


def trace_id(traceparent: str) -> str | None:
    """The trace id of a valid W3C ``traceparent`` value, or None."""
    found = _TRACEPARENT(traceparent.strip())
    if found is None:
        return None
    version, trace, parent, more = found.groups()
    if version == "ff" or (version == "00" and more) or trace == _ZERO_TRACE:
        return None
    return None if parent == _ZERO_PARENT else trace


def untraced(request: web.Request) -> str:
    """The id of a request when tracing is off (1, 3 or 4 of the module docstring).

    Every request pays for this one: written out in one frame, no call for a header
    that is absent (docs/BENCHMARKS.md, section 19)."""
    headers = request.headers
    value = headers.get(X_REQUEST_ID)
    if value is not None and _SAFE(value):
        return value
    parent = headers.get(TRACEPARENT)
    if parent is not None and (found := trace_id(parent)) is not None:
        return found
    return f"{_PREFIX}{next(_COUNTER):016x}"  # new: unique across processes, 32 hex digits


def fresh() -> str:
    """A new id (4 of the module docstring): for a reply made before any request was
    read whole (a refused request head), which has no headers to take one from."""
    return f"{_PREFIX}{next(_COUNTER):016x}"


def stamp(response: web.StreamResponse) -> None:
    """Put the current request's id, and the Server header, on ``response``: for the
    replies a handler prepares itself (streams, SSE, WebSocket), before their head is
    written; the middleware does it for every other reply."""
    response.headers[hdrs.SERVER] = SERVER
    request_id = CURRENT.get()
    if request_id is not None:
        response.headers[X_REQUEST_ID] = request_id


class RequestIdFilter(logging.Filter):
    """Adds ``request_id`` (`` request_id=<id>`` inside a request, else "") to every
    record, for a format that ends in ``%(request_id)s``."""

    def filter(self, record: logging.LogRecord) -> bool:
        request_id = CURRENT.get()
        record.request_id = "" if request_id is None else f" request_id={request_id}"
        return True


LOG_FORMAT = "%(asctime)s %(levelname)s {who}%(name)s: %(message)s%(request_id)s"


def configure_logging(level: str, who: str = "") -> None:
    """The gateway's logging: one line an event on standard error, the request id at the
    end of the lines a request causes. ``who`` names a worker process (``worker 2 ``)."""
    logging.basicConfig(level=level.upper(), format=LOG_FORMAT.format(who=who))
    for handler in logging.getLogger().handlers:
        handler.addFilter(RequestIdFilter())
