"""Bridges in the gateway: the engine service they reach the engine through, their
lifecycle on the app's cleanup context, and the admin resource that manages them at
run time.

Admin resource (JSON, ``restms:admin`` over the bridge's feed; docs/AMQP.md)::

    GET    /admin/bridges               every bridge the caller administers, with status
    POST   /admin/bridges               create one (201 + Location; 200 if identical)
    GET    /admin/bridges/{name}        one bridge's status
    DELETE /admin/bridges/{name}        stop and forget it (409 while messages wait,
                                        unless ?discard=true; 403 for configured ones)

On a cluster every node serves all four for every run-time bridge, whichever node
runs it (the definitions are shared through the engine: bridges/registry.py).

A federation link made here may reach only public addresses, or those
``federation_allow`` names (the SSRF guard of gateway/webhooks/guard.py): its
``remote`` and ``token_url`` are checked when it is created (403 naming why, for an
address literal the guard refuses or a name that resolves to one; a name that does not
resolve yet is let through), and again at every connection it makes
(gateway/federation/session.py), so a name that resolves elsewhere later, or a link kept
from a run under another configuration, is still held to the guard. Links of the
configuration file are the operator's: no guard.

AMQP 1.0 and ZeroMQ bridges made here are held to the same guard with their own setting,
``bridge_allow`` (gateway/admin/bridge_guard.py; docs/AMQP.md and docs/ZEROMQ.md,
"Security"): an AMQP ``urls`` host, or a ZeroMQ endpoint's host to connect to, that is
an address literal the guard refuses or a name that resolves to one is 403 when the
bridge is made; a ZeroMQ bridge binds only on loopback, or on what ``bridge_allow``
names (``tcp://ADDRESS``, ``tcp://*`` for every interface), and uses ``ipc://`` and
``inproc://`` endpoints only where an entry of that scheme allows them. Before each connection the
bridge asks the guard again and connects to the address it checked, not to the name
(proton and libzmq would look the name up again themselves): an AMQP bridge keeps the
name for the broker's virtual host and the TLS peer name; a ZeroMQ bridge looks its
peers' names up again every 30 s and opens its socket again when the address it uses
is no longer one the guard allows. Bridges of the configuration file: no guard.

And, public, the gateway's id that federation links name it by (docs/FEDERATION.md)::

    GET    /.well-known/restms-gateway  {"gateway_id": "..."}
"""

from __future__ import annotations

import asyncio
import secrets
import urllib.parse
from collections.abc import AsyncIterator
from pathlib import Path

from aiohttp import web

from auth import Principal
from bridges.base import Host
from bridges.common import OWNER_PREFIX
from bridges.config import BridgeConfig, parse
from bridges.federation.config import FederationConfig
from bridges.federation.remote import Auth, Remote
from bridges.registry import EngineKept, FileKept, Kept, Registry
from feeds.service import DEFAULT_DOMAIN, EngineService
from gateway.admin.bridge_guard import BridgeGuard
from gateway.auth.authn import PRINCIPAL
from gateway.federation.client import HttpRemote
from gateway.federation.session import RemoteSession
from gateway.restms import http
from gateway.server import tracing
from gateway.server.config import Config
from gateway.server.keys import CONFIG, SERVICE
from gateway.server.state import STATE
from gateway.webhooks.guard import Guard, split_allow
from restms.errors import (
    BadRequest,
    Conflict,
    Forbidden,
    InsufficientScope,
    NotFound,
    ServiceUnavailable,
)

BRIDGES_PATH = "/admin/bridges"
IDENTITY_PATH = "/.well-known/restms-gateway"
ID_SETTING = "gateway-id"
ID_TRIES = 5  # the engine may be failing over while the gateway starts: 5 s of pauses in all


def keep_bridge_pipe(owner: str) -> None:
    """409 for a bridge's own pipe (``owner`` is the pipe's), which goes with its bridge:
    deleted alone, the bridge would make another at once, and what waited in it to be
    sent would be lost."""
    if owner.startswith(OWNER_PREFIX):
        bridge = owner.removeprefix(OWNER_PREFIX)
        raise Conflict(
            f"pipe is bridge {bridge!r}'s: delete the bridge instead "
            f"({BRIDGES_PATH}/{bridge}), and its pipe goes with it"
        )


def remote_guard(config: Config) -> Guard:
    """The guard of federation links made at run time (module docstring)."""
    allow = split_allow(config.federation_allow)
    return Guard(allow, what="remote", setting="federation_allow")


def make_host(app: web.Application) -> Host:
    """What the bridges get: the app's engine service, the system feed, and the guards
    of bridges made at run time."""
    service, config = app[SERVICE], app[CONFIG]
    events = service.events
    tracer = tracing.tracer(config)  # None unless tracing is on (docs/TRACING.md)
    guard = remote_guard(config)  # one for every run-time link: it remembers literals

    def connect(
        auth: Auth,
        *,
        timeout: float,
        tls_ca: str = "",
        tls_verify: bool = True,
        guarded: bool = True,
    ) -> Remote:
        http = RemoteSession(
            auth,
            timeout=timeout,
            tls_ca=tls_ca,
            tls_verify=tls_verify,
            guard=guard if guarded else None,
        )
        return HttpRemote(http, tracer=tracer)

    return Host(
        engine=service,
        notify=events.bridge if events is not None else None,
        system_feed=events.name if events is not None else None,
        max_pipe_messages=config.max_pipe_messages,
        max_pipe_bytes=config.max_pipe_bytes,
        connect=connect,
        dead_letter_feed=config.dead_letter_feed,
        tracer=tracer,
        reach=BridgeGuard(config.bridge_allow),
    )


def make_registry(app: web.Application) -> Registry:
    """The bridges; run-time ones kept in the data directory (the embedded engine,
    one process), or in the engine, shared by every node of a cluster (docs/CLUSTER.md)."""
    config = app[CONFIG]
    kept: Kept
    if config.clustered:
        kept = EngineKept(app[SERVICE])
    else:
        kept = FileKept(
            Path(config.data_dir) / "bridges.json" if config.store == "sqlite" else None
        )
    return Registry(make_host(app), config.bridges, kept=kept, max_body=config.max_body)


BRIDGES = web.AppKey("bridges", Registry)


async def bridges_context(app: web.Application) -> AsyncIterator[None]:
    """Start every bridge once the store is restored; stop them before it closes."""
    registry = app[BRIDGES]
    await registry.start(await gateway_id(app[SERVICE], app[CONFIG].gateway_id))
    yield
    await registry.stop()


async def gateway_id(service: EngineService, configured: str) -> str:
    """The gateway's id: the configured one, else the one the engine keeps, made the
    first time (so every node sharing the engine has the same)."""
    if configured:
        return configured
    attempt = 0
    while True:
        try:
            return await service.keep_setting(ID_SETTING, secrets.token_urlsafe(12), only_new=True)
        except ServiceUnavailable:
            attempt += 1
            if attempt == ID_TRIES:
                raise
            await asyncio.sleep(0.5 * attempt)


async def identity(request: web.Request) -> web.Response:
    return http.json_reply({"gateway_id": request.app[BRIDGES].gateway_id})


# ---------------------------------------------------------------- the admin resource
async def _may_admin(principal: Principal, service: EngineService, feed: str) -> bool:
    """Whether ``principal`` administers the public feed named ``feed`` (a feed not
    made yet: as in the default domain, where a bridge's feed is made)."""
    try:
        found = await service.feed(None, feed)
    except NotFound:
        found = None
    domain = found.domain if found is not None and found.name is not None else DEFAULT_DOMAIN
    return principal.grants.allows("admin", domain, feed)


async def _need_admin(request: web.Request, feed: str) -> None:
    if not await _may_admin(request[PRINCIPAL], request[STATE].service, feed):
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
    service = request[STATE].service
    shown = [
        b.status()
        for b in request.app[BRIDGES]
        if await _may_admin(principal, service, b.config.feed)
    ]
    return http.json_reply({"bridges": shown})


async def create_bridge(request: web.Request) -> web.Response:
    _need_some_admin(request)
    entry = await http.read_json(request, "a bridge definition")
    try:
        config = parse(entry)
    except ValueError as exc:
        raise BadRequest(str(exc)) from exc
    await _need_admin(request, config.feed)
    if isinstance(config, FederationConfig):
        await _admit_remote(request.app[CONFIG], config)
    else:
        await BridgeGuard(request.app[CONFIG].bridge_allow).admit(config)
    bridge, created = await request.app[BRIDGES].create(config)
    location = f"{http.origin(request)}{BRIDGES_PATH}/{bridge.name}"
    return http.json_reply(bridge.status(), 201 if created else 200, location)


async def _admit_remote(config: Config, link: FederationConfig) -> None:
    """403 when the run-time link's ``remote`` or ``token_url`` is an address the guard
    refuses, or a name that resolves to one (module docstring). After the admin check:
    who may not make the link learns nothing of where names lead."""
    guard = remote_guard(config)
    for key in ("remote", "token_url"):
        url = getattr(link, key)
        if not url:
            continue
        try:
            reason = await guard.examine(urllib.parse.urlsplit(url).hostname or "")
        except (OSError, TimeoutError):
            continue  # not resolvable yet: each connection is checked (client.py)
        if reason is not None:
            raise Forbidden(
                f"bridge {link.name}: {key}: {reason}: a federation link made at run time "
                "may reach only public addresses, or those federation_allow names"
            )


async def _visible_bridge(request: web.Request) -> BridgeConfig:
    """The definition of the bridge the path names (on a cluster, perhaps one made
    through another node a moment ago); to an admin of other feeds it is absent (the
    same 404 as for a name never used)."""
    principal = _need_some_admin(request)
    name = request.match_info["name"]
    config = await request.app[BRIDGES].definition(name)
    if not await _may_admin(principal, request[STATE].service, config.feed):
        raise NotFound(f"no bridge named {name!r}")
    return config


async def get_bridge(request: web.Request) -> web.Response:
    config = await _visible_bridge(request)
    return http.json_reply(request.app[BRIDGES].get(config.name).status())


async def delete_bridge(request: web.Request) -> web.Response:
    config = await _visible_bridge(request)
    discard = request.query.get("discard", "").lower() in ("1", "true", "yes")
    dropped = await request.app[BRIDGES].delete(config.name, discard=discard)
    return http.json_reply({"deleted": config.name, "discarded": dropped})


def add_routes(app: web.Application) -> None:
    app.router.add_get(BRIDGES_PATH, list_bridges)
    app.router.add_post(BRIDGES_PATH, create_bridge)
    app.router.add_get(BRIDGES_PATH + "/{name}", get_bridge)
    app.router.add_delete(BRIDGES_PATH + "/{name}", delete_bridge)
    app.router.add_get(IDENTITY_PATH, identity)
