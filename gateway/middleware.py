"""Middleware: one per concern.

* :func:`errors` turns every failure into a ``text/plain`` reply with a precise
  status (S4). It is the only place where exceptions become HTTP.
* :func:`authenticate` decides the request's principal. Until OAuth arrives, a
  request from loopback (or any request when the server was started ``--insecure``)
  acts as the built-in ``guest`` principal; anything else gets 401.
"""

from __future__ import annotations

import asyncio
import logging

from aiohttp import web
from aiohttp.typedefs import Handler

from auth import principal_for
from restms.errors import MethodNotAllowed, RestMSError, ServiceUnavailable

from .keys import CONFIG, PRINCIPAL

log = logging.getLogger(__name__)


def text_reply(status: int, reason: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(status=status, text=reason.rstrip() + "\n", headers=headers)


@web.middleware
async def errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except RestMSError as exc:
        headers = {}
        if isinstance(exc, MethodNotAllowed):
            headers["Allow"] = ", ".join(exc.allow)
        if isinstance(exc, ServiceUnavailable):
            headers["Retry-After"] = str(exc.retry_after)
        return text_reply(exc.status, exc.reason, headers)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        headers = {k: v for k, v in exc.headers.items() if k in ("Allow", "Retry-After")}
        return text_reply(exc.status, exc.text or exc.reason, headers)
    except (asyncio.CancelledError, ConnectionError):
        raise
    except Exception:
        # The last resort: a bug, not bad input (bad input raises RestMSError above).
        # Logged with its traceback and answered 500; the fuzz test keeps this unreached.
        log.exception("unhandled error on %s %s", request.method, request.path)
        return text_reply(500, "internal error; it has been logged")


@web.middleware
async def authenticate(request: web.Request, handler: Handler) -> web.StreamResponse:
    principal = principal_for(request.remote, insecure=request.app[CONFIG].insecure)
    if principal is None:
        return text_reply(401, "authentication required: only loopback clients act as guest")
    request[PRINCIPAL] = principal
    return await handler(request)
