"""The middleware: one layer that every request passes, calling one function per concern.

In this order, each a readable unit of its own:

1. **Errors.** :func:`error_reply` turns every failure into a ``text/plain`` reply
   with a precise status (S4). It is the only place where exceptions become HTTP.
2. **Shutdown.** :meth:`gateway.shutdown.InFlight.admit` answers 503 once shutdown has
   begun and otherwise counts the request as in flight until its reply is made; once
   shutdown has begun, every reply closes its connection (``Connection: close``).
3. **Who.** :func:`gateway.proxies.relayed` takes the client's address, scheme and
   host from a trusted proxy's ``X-Forwarded-*`` headers (when ``trusted_proxies``
   names any); then :func:`gateway.authn.authenticate` gives the request its principal, or
   answers 401 or 429.
4. **Counting.** The reply's route, method, status and duration go to
   :meth:`gateway.metrics.Requests.record` (plain dict counts, read by ``GET /metrics``).

They were three aiohttp middlewares. Each layer costs every request a call through a
partial, a coroutine and a frame, about 2 % of a small publish, so the concerns are
plain functions now and one middleware calls them in turn. It is made per app, once
the app's state exists (:func:`install`, last in ``build_app``), and holds that state
itself: ``request.app`` and each ``app[KEY]`` are Python-level calls, which reading the
state key by key on every request paid for. It hands the request's path its
:class:`~gateway.keys.State` in ``request[STATE]``.
"""

from __future__ import annotations

import asyncio
import logging
from time import perf_counter

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware
from multidict import CIMultiDict

from restms.errors import MethodNotAllowed, RestMSError, ServiceUnavailable, TooManyRequests

from .authn import AUTH, authenticate
from .keys import CONFIG, ENGINE, STATE, State
from .metrics import REQUESTS, Requests
from .proxies import PROXIES, Proxies, relayed
from .shutdown import IN_FLIGHT, InFlight

log = logging.getLogger(__name__)


def text_reply(
    status: int, reason: str, headers: CIMultiDict[str] | dict[str, str] | None = None
) -> web.Response:
    return web.Response(status=status, text=reason.rstrip() + "\n", headers=headers)


def install(app: web.Application) -> None:
    """Put the gateway's middleware on ``app``, once its state is all there."""
    state = State(app[CONFIG], app[ENGINE], app[AUTH])
    app.middlewares.append(_middleware(state, app[IN_FLIGHT], app[REQUESTS], app.get(PROXIES)))


def _middleware(
    state: State, in_flight: InFlight, requests: Requests, proxies: Proxies | None
) -> Middleware:
    engine, authenticator = state.engine, state.auth

    @web.middleware
    async def gateway(request: web.Request, handler: Handler) -> web.StreamResponse:
        began = perf_counter()
        response: web.StreamResponse
        try:
            task = in_flight.admit(engine, request)
            try:
                if proxies is not None:  # the client's address, scheme and host, as relayed
                    request = relayed(request, proxies)
                request[STATE] = state
                pending = authenticate(request, authenticator)
                if pending is not None:  # credentials to check
                    await pending
                response = await handler(request)
            finally:
                in_flight.discard(task)
        except (RestMSError, web.HTTPException) as exc:
            response = error_reply(exc)
            requests.refused(exc)
        except (asyncio.CancelledError, ConnectionError):
            raise
        except Exception:
            # The last resort: a bug, not bad input (bad input raises RestMSError above).
            # Logged with its traceback and answered 500; the fuzz test keeps this unreached.
            log.exception("unhandled error on %s %s", request.method, request.path)
            response = text_reply(500, "internal error; it has been logged")
        if engine.closing:  # shutdown: no request follows this reply on its connection
            response.force_close()  # aiohttp says "Connection: close" and closes after it
        requests.record(request.match_info, request.method, response.status, perf_counter() - began)
        return response

    return gateway


def error_reply(exc: RestMSError | web.HTTPException) -> web.Response:
    """The ``text/plain`` reply to a refusal, with the headers its status calls for.

    An ``HTTPException`` below 400 (a redirect) is not a failure: it is raised again.
    """
    if isinstance(exc, web.HTTPException):
        if exc.status < 400:
            raise exc
        kept = {k: v for k, v in exc.headers.items() if k in ("Allow", "Retry-After")}
        return text_reply(exc.status, exc.text or exc.reason, kept)
    headers: CIMultiDict[str] = CIMultiDict()
    if isinstance(exc, MethodNotAllowed):
        headers["Allow"] = ", ".join(exc.allow)
    if isinstance(exc, ServiceUnavailable | TooManyRequests):
        headers["Retry-After"] = str(exc.retry_after)
    for challenge in getattr(exc, "challenges", ()):
        headers.add("WWW-Authenticate", challenge)
    return text_reply(exc.status, exc.reason, headers)
