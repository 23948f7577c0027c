"""Bridges in the gateway: the port they reach the engine through, their lifecycle on
the app's cleanup context, and the admin resource that manages them at run time.

Admin resource (JSON, ``restms:admin`` over the bridge's feed; docs/AMQP.md)::

    GET    /admin/bridges               every bridge the caller administers, with status
    POST   /admin/bridges               create one (201 + Location; 200 if identical)
    GET    /admin/bridges/{name}        one bridge's status
    DELETE /admin/bridges/{name}        stop and forget it (409 while messages wait,
                                        unless ?discard=true; 403 for configured ones)
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

from aiohttp import web

from auth import Principal
from bridges.config import parse
from bridges.registry import AnyBridge, Registry
from feeds.engine import Engine
from feeds.model import Pipe, Slot
from restms.errors import (
    BadRequest,
    Forbidden,
    InsufficientScope,
    NotFound,
)

from . import durability, http, spill
from .authn import PRINCIPAL
from .keys import CONFIG, ENGINE

BRIDGES_PATH = "/admin/bridges"


class AppPort:
    """What bridges may do with this gateway (:class:`bridges.base.Port`)."""

    def __init__(self, app: web.Application) -> None:
        self._app = app

    @property
    def engine(self) -> Engine:
        return self._app[ENGINE]

    async def commit(self) -> None:
        await durability.commit(self._app)

    async def ensure(self, pipe: Pipe) -> None:
        await spill.ensure(self._app, pipe)

    async def ack(self, slot: Slot) -> int:
        return await spill.ack(self._app, slot)


def make_registry(app: web.Application) -> Registry:
    config = app[CONFIG]
    state = Path(config.data_dir) / "bridges.json" if config.store == "sqlite" else None
    return Registry(AppPort(app), config.bridges, state_file=state, max_body=config.max_body)


BRIDGES = web.AppKey("bridges", Registry)


async def bridges_context(app: web.Application) -> AsyncIterator[None]:
    """Start every bridge once the store is restored; stop them before it closes."""
    registry = app[BRIDGES]
    await registry.start()
    yield
    await registry.stop()


# ---------------------------------------------------------------- the admin resource
def _may_admin(principal: Principal, engine: Engine, feed: str) -> bool:
    found = engine.public_feeds.get(feed)
    domain = found.domain.name if found is not None else engine.default_feed.domain.name
    return principal.grants.allows("admin", domain, feed)


def _need_admin(request: web.Request, feed: str) -> None:
    if not _may_admin(request[PRINCIPAL], request.app[ENGINE], feed):
        raise InsufficientScope(
            f"bridges need the restms:admin scope for feed {feed!r}", "restms:admin"
        )


def _need_some_admin(request: web.Request) -> Principal:
    """403 before anything else for a principal that administers no feed at all, so
    it can neither list bridges nor tell a bridge's name from one never made."""
    principal = request[PRINCIPAL]
    if not any(s.action == "admin" for s in principal.grants.scopes):
        raise InsufficientScope("bridges need the restms:admin scope", "restms:admin")
    return principal


async def list_bridges(request: web.Request) -> web.Response:
    principal = _need_some_admin(request)
    engine = request.app[ENGINE]
    shown = [
        b.status() for b in request.app[BRIDGES] if _may_admin(principal, engine, b.config.feed)
    ]
    return http.json_reply({"bridges": shown})


async def create_bridge(request: web.Request) -> web.Response:
    _need_some_admin(request)
    entry = await http.read_json(request, "a bridge definition")
    try:
        config = parse(entry)
    except ValueError as exc:
        raise BadRequest(str(exc)) from exc
    _need_admin(request, config.feed)
    bridge, created = await request.app[BRIDGES].create(config)
    location = f"{request.url.origin()}{BRIDGES_PATH}/{bridge.name}"
    return http.json_reply(bridge.status(), 201 if created else 200, location)


def _visible_bridge(request: web.Request) -> AnyBridge:
    """The bridge the path names; to an admin of other feeds it is absent (the same 404
    as for a name never used)."""
    principal = _need_some_admin(request)
    name = request.match_info["name"]
    bridge = request.app[BRIDGES].get(name)
    if not _may_admin(principal, request.app[ENGINE], bridge.config.feed):
        raise NotFound(f"no bridge named {name!r}")
    return bridge


async def get_bridge(request: web.Request) -> web.Response:
    return http.json_reply(_visible_bridge(request).status())


async def delete_bridge(request: web.Request) -> web.Response:
    bridge = _visible_bridge(request)
    registry = request.app[BRIDGES]
    discard = request.query.get("discard", "").lower() in ("1", "true", "yes")
    if bridge.configured:
        raise Forbidden(f"bridge {bridge.name!r} is in the configuration file: remove it there")
    dropped = await registry.delete(bridge.name, discard=discard)
    return http.json_reply({"deleted": bridge.name, "discarded": dropped})


def add_routes(app: web.Application) -> None:
    app.router.add_get(BRIDGES_PATH, list_bridges)
    app.router.add_post(BRIDGES_PATH, create_bridge)
    app.router.add_get(BRIDGES_PATH + "/{name}", get_bridge)
    app.router.add_delete(BRIDGES_PATH + "/{name}", delete_bridge)
