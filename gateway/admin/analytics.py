"""Analytics over HTTP: ``GET /analytics/{query}`` (docs/ANALYTICS.md, "Interfaces").

Theory of operation. A thin handler: it checks the caller's scope, hands the query's
name and its query-string parameters to :class:`spark_sink.service.Analytics` (which
checks them, answers from its cache, or awaits the Spark worker process) and encodes
the answer as JSON. The event loop only awaits; Spark runs in the worker.

Who may ask: a principal with an unqualified ``restms:analytics`` or ``restms:admin``
scope. Analytics aggregate every domain and feed, so a scope narrowed to some of them
does not reach here (``403``). Answers carry ``X-Analytics-Cache``: ``miss`` (computed
for this request), ``shared`` (computed for an identical request at the same time) or
``hit`` (from the cache). Failures are ``text/plain``: ``400`` for a bad query or
parameter, ``503`` while the worker is starting, busy or failed (or always, when the
setting ``analytics`` is off: no worker at all), ``504`` when the
query outlived ``analytics_timeout`` (each with ``Retry-After``).

    GET /analytics                 the query names, the worker's state, the cache's counters
    GET /analytics/{query}?since=&until=&feed=&bucket=&limit=
    GET /admin/analytics           on or off, the worker's state (stopped, starting, ready,
                                   idle-released, failed) and since when, the cache

The worker starts in the background with the gateway (``analytics_preload``) and is
stopped with it; ``/admin/analytics`` is what a dashboard polls to show it.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from pathlib import Path

import orjson
from aiohttp import web

from auth import Principal
from gateway.auth.authn import PRINCIPAL
from gateway.server.config import Config
from gateway.server.keys import CONFIG
from restms.errors import BadRequest, InsufficientScope, ServiceUnavailable
from spark_sink.params import QUERIES
from spark_sink.service import Analytics, AnalyticsError, Refused, TimedOut, Worker, WorkerConfig

ANALYTICS = web.AppKey("analytics", Analytics)
PREFIX = "/analytics"
ADMIN_PATH = "/admin/analytics"
SCOPE = "restms:analytics"
RETRY_AFTER = 5  # seconds a refused client should wait


def make_analytics(config: Config) -> Analytics:
    """The service; its worker process starts on the first query."""
    home = Path(config.data_dir) / "analytics"
    worker = Worker(
        WorkerConfig(
            lake=config.lake,
            checkpoint=config.analytics_checkpoint or str(home / "checkpoint"),
            snapshot=str(home / "rolling.json"),
            master=config.analytics_master,
            interval=config.analytics_stream_interval,
            max_files=config.analytics_stream_files,
            partitions=config.analytics_partitions,
            memory=config.analytics_memory,
            stream=config.analytics_stream,
            start_timeout=config.analytics_start_timeout,
            log_file=str(home / "worker.log"),
        ),
        max_pending=config.analytics_max_pending,
        idle_seconds=config.analytics_idle_seconds,
    )
    return Analytics(
        worker,
        cache_seconds=config.analytics_cache_seconds,
        timeout=config.analytics_timeout,
        enabled=config.analytics,
    )


async def analytics_context(app: web.Application) -> AsyncIterator[None]:
    """The worker starts in the background (``analytics_preload``); stops with the app."""
    app[ANALYTICS].start(preload=app[CONFIG].analytics_preload)
    yield
    await app[ANALYTICS].stop()


def may_query(principal: Principal) -> bool:
    return any(
        s.action in ("analytics", "admin") and s.domain == "*" and s.feed == "*"
        for s in principal.grants.scopes
    )


def _need_scope(request: web.Request) -> None:
    if not may_query(request[PRINCIPAL]):
        raise InsufficientScope(
            "analytics need the restms:analytics (or restms:admin) scope, unqualified", SCOPE
        )


def _json(data: object, headers: dict[str, str]) -> web.Response:
    return web.Response(body=orjson.dumps(data), content_type="application/json", headers=headers)


async def index(request: web.Request) -> web.Response:
    _need_scope(request)
    service = request.app[ANALYTICS]
    found = {"queries": list(QUERIES), "worker": service.worker.status(), "cache": service.stats()}
    return _json(found, {"Cache-Control": "no-store"})


async def admin_status(request: web.Request) -> web.Response:
    """``GET /admin/analytics``: the service's status, for an admin or an analyst."""
    _need_scope(request)
    return _json(request.app[ANALYTICS].status(), {"Cache-Control": "no-store"})


async def query(request: web.Request) -> web.Response:
    _need_scope(request)
    service = request.app[ANALYTICS]
    raw: dict[str, str] = {}
    for key, value in request.query.items():
        if key in raw:
            raise BadRequest(f"parameter {key!r} is given twice")
        raw[key] = value
    try:
        result, how = await service.query(request.match_info["query"], raw)
    except Refused as exc:
        raise BadRequest(exc.reason) from None
    except TimedOut as exc:
        raise ServiceUnavailable(exc.reason, RETRY_AFTER, status=504) from None
    except AnalyticsError as exc:
        raise ServiceUnavailable(exc.reason, RETRY_AFTER) from None
    age = max(0, math.floor(service.cache_seconds))
    headers = {"X-Analytics-Cache": how, "Cache-Control": f"private, max-age={age}"}
    return _json(result, headers)


def add_routes(app: web.Application) -> None:
    """The routes and the service (no process starts until the first query)."""
    app[ANALYTICS] = make_analytics(app[CONFIG])
    app.router.add_get(PREFIX, index)
    app.router.add_get(PREFIX + "/{query}", query)
    app.router.add_get(ADMIN_PATH, admin_status)
    app.cleanup_ctx.append(analytics_context)
