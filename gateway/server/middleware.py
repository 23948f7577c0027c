"""The concerns every request passes, around every route's handler.

In this order, each a readable unit of its own:

1. **Errors.** :func:`error_reply` turns every failure into a ``text/plain`` reply
   with a precise status (S4). It is the only place where exceptions become HTTP.
2. **Shutdown.** :meth:`gateway.server.shutdown.InFlight.admit` answers 503 once shutdown has
   begun and otherwise counts the request as in flight until its reply is made; once
   shutdown has begun, every reply closes its connection (``Connection: close``).
3. **Who.** :func:`gateway.server.proxies.relayed` takes the client's address, scheme and
   host from a trusted proxy's ``X-Forwarded-*`` headers (when ``trusted_proxies``
   names any); :meth:`gateway.server.hosts.Hosts.check` answers 421 to a host not served
   here (before a credential is checked for it); then
   :func:`gateway.auth.authn.authenticate` gives the request its principal, or answers 401
   or 429.
4. **Other origins and codings.** A CORS preflight (``OPTIONS`` with
   ``Access-Control-Request-Method``) is answered by :meth:`gateway.server.cors.Cors.preflight`
   before authentication, as browsers send no credentials with it; a body in a coding the
   gateway does not decode is refused (:func:`gateway.server.compression.check_request`);
   a large reply is compressed for a client that accepts it
   (:func:`gateway.server.compression.offer`). A request without any of those pays a
   comparison of its method and two header look-ups for them.
5. **Counting.** The reply's route, method, status and duration go to
   :meth:`gateway.admin.metrics.Requests.record` (plain dict counts, read by ``GET /metrics``).

Before all of them the request gets its id (:mod:`gateway.server.requestid`), which its
reply carries in ``X-Request-ID``; with tracing on, all of them run inside the request's
span (:func:`gateway.server.tracing.traced`).

Why not aiohttp middlewares: each costs every request a call through a partial, a
coroutine and a frame, and an app with any middleware pays for one more that aiohttp
adds itself (it sets and resets ``match_info.current_app`` around the handler). So
:func:`install`, last in ``build_app``, wraps each route's handler once in
:func:`_concerns`, which holds the app's state itself (``request.app`` and each
``app[KEY]`` are Python-level calls) and hands the request's path its
:class:`~gateway.server.state.State` in ``request[STATE]``. A route added after that would
bypass the concerns (authentication among them): start-up refuses to run then.

A request no route serves gets the router's answer, 404, or 405 with ``Allow`` when
the path is served for other methods. Without a middleware that answer would bypass
the concerns too, so :func:`install` adds a last route that matches every path,
:data:`UNROUTED`, whose handler finds it as the router does.

aiohttp surface this relies on (checked against aiohttp 3.14, as
:mod:`gateway.server.connections`): a route keeps its handler in ``_handler``, which
``route.handler`` and so the request's ``match_info.handler`` return.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from time import perf_counter
from typing import Any

from aiohttp import hdrs, web
from aiohttp.typedefs import Handler
from aiohttp.web_urldispatcher import AbstractRoute
from multidict import CIMultiDict

from gateway.admin.metrics import REQUESTS, Requests
from gateway.auth.authn import AUTH, authenticate, checks_every_path
from gateway.server import compression, requestid, tracing
from gateway.server.keys import CONFIG, SERVICE
from gateway.server.proxies import PROXIES, Proxies, relayed
from gateway.server.requestid import SERVER, X_REQUEST_ID
from gateway.server.shutdown import IN_FLIGHT, InFlight
from gateway.server.state import STATE, State
from restms.errors import (
    BadRequest,
    MethodNotAllowed,
    RestMSError,
    ServiceUnavailable,
    TooManyRequests,
)

log = logging.getLogger(__name__)

Wrapped = Callable[[web.Request], Coroutine[Any, Any, web.StreamResponse]]
UNROUTED = "unrouted"  # the name of the last route, for requests no other route serves
# Request headers the concerns look for (istr: looked up on every request).
_PREFLIGHT, _ORIGIN = hdrs.ACCESS_CONTROL_REQUEST_METHOD, hdrs.ORIGIN
_CODING, _ACCEPTED = hdrs.CONTENT_ENCODING, hdrs.ACCEPT_ENCODING
UNREADABLE = "the request body cannot be read: its Content-Encoding or chunked framing is broken"


def text_reply(
    status: int, reason: str, headers: CIMultiDict[str] | dict[str, str] | None = None
) -> web.Response:
    return web.Response(status=status, text=reason.rstrip() + "\n", headers=headers)


def install(app: web.Application) -> None:
    """Put the concerns around every route's handler of ``app``, once all are added."""
    router = app.router
    router.add_route(hdrs.METH_ANY, "/{path:.*}", _unrouted, name=UNROUTED)
    state = State(app[CONFIG], app[AUTH], app[SERVICE])
    in_flight, requests, proxies = app[IN_FLIGHT], app[REQUESTS], app.get(PROXIES)
    tracer = tracing.tracer(app[CONFIG])
    make_id = requestid.untraced if tracer is None else tracing.traced_id
    wrapped: set[Wrapped] = set()
    for route in router.routes():
        # Requests no route serves are counted as one route, (unmatched), as before.
        counted = None if route.name == UNROUTED else route
        handler = _concerns(
            route.handler, counted, checks_every_path(route), state, in_flight, requests, proxies,
            make_id,
        )  # fmt: skip
        if tracer is not None:
            path = route.resource.canonical if counted and route.resource else UNROUTED
            handler = tracing.traced(handler, tracer, path)
        route._handler = handler  # aiohttp's own attribute: see the docstring
        wrapped.add(handler)

    async def all_wrapped(app: web.Application) -> None:
        for route in router.routes():
            if route.handler not in wrapped:
                raise RuntimeError(f"route {route} was added after middleware.install")

    app.on_startup.insert(0, all_wrapped)  # before any cleanup context starts


def _concerns(
    handler: Handler,
    route: AbstractRoute | None,
    checked: bool,
    state: State,
    in_flight: InFlight,
    requests: Requests,
    proxies: Proxies | None,
    make_id: Callable[[web.Request], str],
) -> Wrapped:
    config = state.config
    authenticator, hosts, cors = state.auth, config.hosts, config.cors
    compressing, min_bytes = config.compression, config.compression_min_bytes
    current_id = requestid.CURRENT

    async def concerns(request: web.Request) -> web.StreamResponse:
        began = perf_counter()
        request_id = make_id(request)
        current_id.set(request_id)  # this request's task alone: its log lines name it
        response: web.StreamResponse
        try:
            task = in_flight.admit(request)
            try:
                if proxies is not None:  # the client's address, scheme and host, as relayed
                    request = relayed(request, proxies)
                hosts.check(request)
                request[STATE] = state
                headers = request.headers
                if request.method == "OPTIONS" and _PREFLIGHT in headers and _ORIGIN in headers:
                    response = cors.preflight(request)  # before credentials: none are sent
                else:
                    if _CODING in headers:
                        compression.check_request(request)
                    # checked: the route's paths all need a principal (decided at install)
                    pending = authenticate(request, authenticator, always=checked)
                    if pending is not None:  # credentials to check
                        await pending
                    response = await handler(request)
                    if compressing and _ACCEPTED in headers:
                        await compression.offer(request, response, min_bytes)
            finally:
                in_flight.discard(task)
        except (RestMSError, web.HTTPException) as exc:
            response = error_reply(exc)
            requests.refused(exc)
        except web.RequestPayloadError:  # the parser's: a body that does not decode
            refusal = BadRequest(UNREADABLE)
            response = error_reply(refusal)
            requests.refused(refusal)
        except (asyncio.CancelledError, ConnectionError):
            raise
        except Exception:
            # The last resort: a bug, not bad input (bad input raises RestMSError above).
            # Logged with its traceback and answered 500; the fuzz test keeps this unreached.
            log.exception("unhandled error on %s %s", request.method, request.path)
            response = text_reply(500, "internal error; it has been logged")
        if in_flight.closing:  # shutdown: no request follows this reply on its connection
            response.force_close()  # aiohttp says "Connection: close" and closes after it
        # Too late for a reply its handler prepared (it has it: requestid.stamp), and
        # harmless there: cheaper than asking.
        response.headers[X_REQUEST_ID] = request_id
        response.headers[hdrs.SERVER] = SERVER
        requests.record(route, request.method, response.status, perf_counter() - began)
        return response

    return concerns


async def _unrouted(request: web.Request) -> web.StreamResponse:
    """What aiohttp's router answers a request no route serves: 405 with the methods
    the path is served for, if any (as the router, from every route but this one), else 404."""
    allowed: set[str] = set()
    for resource in request.app.router.resources():
        if resource.name != UNROUTED:
            allowed |= (await resource.resolve(request))[1]
    if allowed:
        raise web.HTTPMethodNotAllowed(request.method, allowed)
    raise web.HTTPNotFound()


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
