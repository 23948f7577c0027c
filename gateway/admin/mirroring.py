"""The traffic mirror in the gateway: its lifecycle and its admin resource.

The mirror (:mod:`spark_sink.mirror`) is built with the app when ``mirror`` is on and
started on the cleanup context before anything else, so its writer runs before
bridges and webhook workers start and is stopped after they (and the store) have
stopped: the engine service's sink is taken away first, then everything queued is written
and the open files are closed and renamed into the lake.

Admin resource (JSON, an unqualified ``restms:admin``; docs/ANALYTICS.md)::

    GET /admin/mirror    the mirror's counters and settings ({"enabled": false} when off)
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import orjson
from aiohttp import web

from gateway.auth.authn import PRINCIPAL
from gateway.server.config import Config
from gateway.server.keys import CONFIG, SERVICE
from gateway.server.state import STATE
from restms.errors import InsufficientScope
from spark_sink.mirror import Mirror, MirrorConfig, redact
from spark_sink.spill import default_directory

MIRROR = web.AppKey("mirror", Mirror)
MIRROR_PATH = "/admin/mirror"
STOP_WAIT = 30.0  # seconds the writer gets to write what is queued on shutdown


def make_mirror(config: Config) -> Mirror | None:
    if not config.mirror:
        return None
    return Mirror(
        MirrorConfig(
            lake=config.lake,
            queue=config.mirror_queue,
            rotate_bytes=config.mirror_rotate_bytes,
            rotate_seconds=config.mirror_rotate_seconds,
            spill_dir=default_directory(config.data_dir),
            spill_bytes=config.mirror_spill_bytes,
            compact_after=config.mirror_compact_after,
            retention_days=config.mirror_retention_days,
        )
    )


async def mirror_context(app: web.Application) -> AsyncIterator[None]:
    """Start the writer and plug the engine service into it; on the way out, unplug,
    then write what is queued (off the loop: it is file I/O)."""
    mirror = app.get(MIRROR)
    if mirror is None:
        yield
        return
    service = app[SERVICE]
    mirror.start()
    service.mirror_to(mirror.sink)
    try:
        yield
    finally:
        service.mirror_to(None)
        await asyncio.to_thread(mirror.stop, STOP_WAIT)


async def get_mirror(request: web.Request) -> web.Response:
    if not request[PRINCIPAL].grants.admin:
        raise InsufficientScope("the mirror's status needs the restms:admin scope", "restms:admin")
    mirror = request.app.get(MIRROR)
    status: dict[str, Any]
    if mirror is not None:
        status = mirror.status()
    else:
        status = {"enabled": False, "lake": redact(request[STATE].config.lake)}
    return web.Response(
        body=orjson.dumps(status, option=orjson.OPT_INDENT_2),
        content_type="application/json",
        headers={"Cache-Control": "no-store"},
    )


def add_routes(app: web.Application) -> None:
    app.router.add_get(MIRROR_PATH, get_mirror)
    mirror = make_mirror(app[CONFIG])
    if mirror is not None:
        app[MIRROR] = mirror
