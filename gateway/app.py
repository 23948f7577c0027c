"""The application factory: routes, middleware, state and background work."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path

from aiohttp import web

from auth.issuer import JWKS_PATH, METADATA_PATH, TOKEN_PATH
from feeds.engine import Engine
from feeds.store import Store

from . import (
    admin,
    analytics,
    bridging,
    metrics,
    middleware,
    mirroring,
    oauth,
    page,
    proxies,
    readiness,
    resources,
)
from .authn import AUTH, Authenticator, auth_context
from .bridging import BRIDGES, bridges_context, make_registry
from .config import Config
from .durability import store_context
from .idempotency import Replies
from .keys import CONFIG, ENGINE, REPLIES, STORE
from .shutdown import IN_FLIGHT, InFlight
from .webhooks import HOOKS, Webhooks, webhooks_context
from .websocket import FRAMES, Frames

log = logging.getLogger(__name__)
ROOT = Path(__file__).resolve().parents[1]


def build_app(config: Config) -> web.Application:
    app = web.Application(client_max_size=config.max_body)
    app[CONFIG] = config
    app[ENGINE] = Engine(config.engine())
    app[REPLIES] = Replies(config.dedup_window, config.idempotency_max, config.idempotency_bytes)
    app[IN_FLIGHT] = InFlight()
    app[AUTH] = Authenticator(config)
    proxies.install(app, config.trusted_proxies)  # X-Forwarded-* (docs/OPERATIONS.md)
    if config.store == "sqlite":
        app[STORE] = Store(config.data_dir, synchronous=config.store_sync.upper())
    app[BRIDGES] = make_registry(app)
    app[HOOKS] = Webhooks(app)
    app[FRAMES] = Frames()  # WebSocket message frames (docs/BROWSER.md)
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
        app.router.add_post(TOKEN_PATH, oauth.token)
        app.router.add_get(JWKS_PATH, oauth.jwks)
        app.router.add_get(METADATA_PATH, oauth.metadata)
    app.on_shutdown.append(_end_waits)
    app.cleanup_ctx.append(mirroring.mirror_context)  # first in, last out: sees every event
    app.cleanup_ctx.append(auth_context)
    app.cleanup_ctx.append(store_context)
    app.cleanup_ctx.append(bridges_context)  # after the store: bridges stop before it closes
    app.cleanup_ctx.append(webhooks_context)  # the same for webhook pipes' workers
    app.cleanup_ctx.append(_sweeper)
    middleware.install(app)  # last: it wraps every route above, with the state made above
    return app


async def _end_waits(app: web.Application) -> None:
    """Whoever runs the app, waits end with a retriable 503 before handlers are cancelled."""
    app[ENGINE].shutdown()


async def healthz(request: web.Request) -> web.Response:
    return web.Response(text="ok\n")


async def extension_profile(request: web.Request) -> web.Response:
    """U9: the human-readable page of our extension profile (F12)."""
    page = ROOT / "docs" / "EXTENSIONS.md"
    text = await asyncio.to_thread(page.read_text, encoding="utf-8")
    return web.Response(text=text, content_type="text/markdown")


async def _sweeper(app: web.Application) -> AsyncIterator[None]:
    """M4: expire staged contents in the background."""
    engine, interval = app[ENGINE], app[CONFIG].sweep_interval

    async def run() -> None:
        while True:
            await asyncio.sleep(interval)
            expired = engine.sweep()
            if expired:
                log.info("staged contents expired", extra={"count": expired})

    task = asyncio.create_task(run(), name="staged-content-sweeper")
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
