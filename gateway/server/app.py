"""The application factory: routes, middleware, state and background work."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from aiohttp import web

from auth import cluster
from auth.cluster import Shared
from feeds.service import EngineService
from gateway.admin import analytics, bridging, metrics, mirroring, page
from gateway.admin import api as admin
from gateway.admin.bridging import BRIDGES, bridges_context, make_registry
from gateway.auth import oauth
from gateway.auth.authn import AUTH, Authenticator
from gateway.auth.startup import auth_context
from gateway.restms import resources
from gateway.restms.idempotency import RedisReplies, Replies, ReplyStore
from gateway.restms.websocket import CLOSES, FRAMES, Frames
from gateway.server import cors, middleware, proxies, readiness, tracing
from gateway.server.config import Config
from gateway.server.keys import CONFIG, REPLIES, SERVICE
from gateway.server.shutdown import IN_FLIGHT, InFlight
from gateway.webhooks.delivery import HOOKS, Webhooks, webhooks_context

log = logging.getLogger(__name__)
ROOT = Path(__file__).resolve().parents[2]


def build_app(
    config: Config, engine: EngineService, *, shared: Shared | None = None
) -> web.Application:
    """The gateway's app over ``engine`` (made by the composition root, main.py's
    ``open_engine``), which the app starts and closes with its cleanup contexts.

    ``shared`` is where the state several nodes share lives (OAuth signing key,
    clients, revocations, failed-login bounds, Idempotency-Key replies: docs/AUTH.md,
    "Several nodes"); None follows ``engine``: the Redis Cluster at ``redis_url`` for
    ``engine = "redis"``, else this node's data directory and memory. Tests give one of
    their own (a namespace on the cluster) to gateways whose messages stay embedded.
    The app closes it when it stops.
    """
    if shared is None:
        shared = cluster.for_settings(config)
    app = web.Application(client_max_size=config.max_body)
    app[CONFIG] = config
    window, limit, budget = config.dedup_window, config.idempotency_max, config.idempotency_bytes
    replies: ReplyStore = (
        Replies(window, limit, budget)
        if shared is None
        else RedisReplies(shared, window, limit, budget)
    )
    app[REPLIES] = replies
    app[IN_FLIGHT] = InFlight()
    app[AUTH] = Authenticator(config, shared)
    proxies.install(app, config.trusted_proxies)  # X-Forwarded-* (docs/OPERATIONS.md)
    cors.install(app, config.cors)  # pages of other origins (docs/BROWSER.md)
    tracer = tracing.tracer(config)  # None unless tracing is on (docs/TRACING.md)
    app[SERVICE] = engine if tracer is None else tracing.traced_engine(engine, tracer)
    app[BRIDGES] = make_registry(app)
    app[HOOKS] = Webhooks(app)
    app[FRAMES] = Frames()  # WebSocket message frames (docs/BROWSER.md)
    app[CLOSES] = Counter()
    for kind in ("domain", "feed", "resource"):
        app.router.add_route("*", f"/restms/{kind}/{{name}}", resources.handler(kind), name=kind)
    app.router.add_route("*", "/restms/{tail:.*}", resources.unknown)
    app.router.add_get("/profile/x-gateway", extension_profile)
    app.router.add_get("/healthz", healthz)
    readiness.add_routes(app)  # GET /readyz (docs/METRICS.md)
    metrics.add_routes(app)  # GET /metrics, and the per-request counts the middleware keeps
    bridging.add_routes(app)
    admin.add_routes(app)  # /admin/pipes, /admin/stats, /admin/clients (docs/ADMIN.md)
    mirroring.add_routes(app)  # the traffic mirror and GET /admin/mirror (docs/ANALYTICS.md)
    page.add_routes(app)  # the live page at / (docs/BROWSER.md)
    analytics.add_routes(app)  # GET /analytics/... over a Spark worker (docs/ANALYTICS.md)
    if config.builtin_issuer:  # the issuer itself is made at start-up (its key is read)
        oauth.serve(app)  # token, introspection, revocation, JWKS, metadata
    app.on_shutdown.append(_end_waits)
    app.cleanup_ctx.append(mirroring.mirror_context)  # first in, last out: sees every event
    if shared is not None:  # first ready, then closed after everything using it
        app.cleanup_ctx.append(_shared_context(shared, config.redis_start_wait))
    app.cleanup_ctx.append(auth_context)
    app.cleanup_ctx.append(_engine_context)
    app.cleanup_ctx.append(bridges_context)  # after the store: bridges stop before it closes
    app.cleanup_ctx.append(webhooks_context)  # the same for webhook pipes' workers
    middleware.install(app)  # last: it wraps every route above, with the state made above
    return app


async def _engine_context(app: web.Application) -> AsyncIterator[None]:
    """Start the engine (it restores what it keeps); close it once the bridges and
    webhook workers, started after it, have stopped."""
    await asyncio.to_thread(Path(app[CONFIG].data_dir).mkdir, parents=True, exist_ok=True)
    service = app[SERVICE]
    await service.start()
    yield
    await service.close()


def _shared_context(
    shared: Shared, start_wait: float
) -> Callable[[web.Application], AsyncIterator[None]]:
    """The shared state waited for at start (a cluster failing over, a seed node
    loading its data), before anything else reads it; closed last."""

    async def ready_then_closing(app: web.Application) -> AsyncIterator[None]:
        try:
            await shared.ready(start_wait)
            yield
        finally:
            await shared.close()

    return ready_then_closing


def begin_shutdown(app: web.Application) -> None:
    """Shutdown's first step: a request that arrives from now on, and every wait, are
    answered a retriable 503; streams end (docs/ARCHITECTURE.md, "Graceful shutdown")."""
    app[IN_FLIGHT].close()
    app[SERVICE].shutdown()


async def _end_waits(app: web.Application) -> None:
    """Whoever runs the app, waits end before handlers are cancelled."""
    begin_shutdown(app)


async def healthz(request: web.Request) -> web.Response:
    return web.Response(text="ok\n")


async def extension_profile(request: web.Request) -> web.Response:
    """U9: the human-readable page of our extension profile (F12)."""
    page = ROOT / "docs" / "EXTENSIONS.md"
    text = await asyncio.to_thread(page.read_text, encoding="utf-8")
    return web.Response(text=text, content_type="text/markdown")
