"""Middleware: one per concern.

* :func:`errors` turns every failure into a ``text/plain`` reply with a precise
  status (S4). It is the only place where exceptions become HTTP.

Who a request acts as is decided next, by :func:`gateway.authn.authenticate`.
"""

from __future__ import annotations

import asyncio
import logging

from aiohttp import web
from aiohttp.typedefs import Handler
from multidict import CIMultiDict

from restms.errors import MethodNotAllowed, RestMSError, ServiceUnavailable, TooManyRequests

log = logging.getLogger(__name__)


def text_reply(
    status: int, reason: str, headers: CIMultiDict[str] | dict[str, str] | None = None
) -> web.Response:
    return web.Response(status=status, text=reason.rstrip() + "\n", headers=headers)


@web.middleware
async def errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except RestMSError as exc:
        headers: CIMultiDict[str] = CIMultiDict()
        if isinstance(exc, MethodNotAllowed):
            headers["Allow"] = ", ".join(exc.allow)
        if isinstance(exc, ServiceUnavailable | TooManyRequests):
            headers["Retry-After"] = str(exc.retry_after)
        for challenge in getattr(exc, "challenges", ()):
            headers.add("WWW-Authenticate", challenge)
        return text_reply(exc.status, exc.reason, headers)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        kept = {k: v for k, v in exc.headers.items() if k in ("Allow", "Retry-After")}
        return text_reply(exc.status, exc.text or exc.reason, kept)
    except (asyncio.CancelledError, ConnectionError):
        raise
    except Exception:
        # The last resort: a bug, not bad input (bad input raises RestMSError above).
        # Logged with its traceback and answered 500; the fuzz test keeps this unreached.
        log.exception("unhandled error on %s %s", request.method, request.path)
        return text_reply(500, "internal error; it has been logged")
