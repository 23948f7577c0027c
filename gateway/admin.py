"""The admin resources for pipes, gateway statistics and OAuth clients (docs/ADMIN.md).

Plain JSON bodies (not RestMS documents), ``text/plain`` errors, never cached::

    GET    /admin/pipes                    every pipe the caller administers, summarised
    GET    /admin/pipes/{name}             one pipe, with its joins
    DELETE /admin/pipes/{name}/messages    purge: drop every message waiting in it
    GET    /admin/stats                    what the engine, bridges, webhooks and mirror count
    GET    /admin/clients                  the built-in issuer's clients (ids and scopes)
    POST   /admin/clients                  add one; the reply shows its secret, once
    DELETE /admin/clients/{id}             revoke: remove it, and refuse its tokens

Who may. A pipe belongs to a domain, not to a feed, so the pipe routes take a
``restms:admin`` scope that covers the pipe's domain and every feed in it
(``restms:admin`` or ``restms:admin:domain/D``); a narrower feed-qualified admin
scope administers bridges (gateway/bridging.py) but no pipes. A pipe's name is its
capability (U6): the list names pipes only to an admin of the whole gateway (an
unqualified ``restms:admin``); a domain admin sees a digest and the title, and
inspects or purges a pipe whose name it was given. Statistics span every domain and
clients may be granted any scope, so those routes take an unqualified
``restms:admin``. A principal with no admin scope at all gets 403 on every route
before anything is looked at, as for bridges.

Clients: :class:`auth.clients.ClientStore` does blocking file I/O and scrypt, so it is
called through ``asyncio.to_thread``; a revocation is on disk before the reply
(:mod:`auth.revocations`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
from collections import Counter
from collections.abc import Callable
from typing import Any, TypeVar

from aiohttp import web

from auth import GUEST, Principal
from auth.clients import ClientStore, check_client_id, check_scope_token
from feeds.model import Feed, Join, Pipe, Slot, StagedContent
from restms.errors import (
    BadRequest,
    Conflict,
    Forbidden,
    InsufficientScope,
    NotFound,
    ServiceUnavailable,
)

from . import durability, http, oauth, spill
from .authn import AUTH, PRINCIPAL
from .bridging import BRIDGES
from .keys import CONFIG, ENGINE, STORE
from .mirroring import MIRROR

PIPES_PATH = "/admin/pipes"
STATS_PATH = "/admin/stats"
CLIENTS_PATH = "/admin/clients"
MAX_SCOPES = 64  # scopes in one client definition
T = TypeVar("T")


# ---------------------------------------------------------------- who may
def _need_some_admin(request: web.Request) -> Principal:
    principal = request[PRINCIPAL]
    if not any(s.action == "admin" for s in principal.grants.scopes):
        raise InsufficientScope("the admin resources need the restms:admin scope", "restms:admin")
    return principal


def _need_gateway_admin(request: web.Request, what: str) -> Principal:
    principal = _need_some_admin(request)
    if not principal.grants.admin:
        raise InsufficientScope(f"{what} needs the unqualified restms:admin scope", "restms:admin")
    return principal


def _admins_domain(principal: Principal, domain: str) -> bool:
    """An admin scope over the whole domain: every feed in it, so every pipe."""
    return any(
        s.action == "admin" and s.feed == "*" and s.covers_domain(domain)
        for s in principal.grants.scopes
    )


# ---------------------------------------------------------------- pipes
def _digest(pipe: Pipe) -> str:
    return hashlib.sha256(pipe.key.encode()).hexdigest()[:12]


def _summary(pipe: Pipe, named: bool) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": pipe.key} if named else {}
    entry.update(
        digest=_digest(pipe),
        title=pipe.title,
        type=pipe.type,
        domain=pipe.domain.name,
        owner=pipe.owner,
        messages=len(pipe.messages) + pipe.spilled,
        on_disk=pipe.spilled,
        bytes=pipe.bytes + pipe.spilled_bytes,
        joins=len(pipe.joins),
        waiting=pipe.waiting,
        next=pipe.next_seq,
    )
    return entry


def _pipes(request: web.Request) -> list[Pipe]:
    return [r for r in request.app[ENGINE].private_resources() if isinstance(r, Pipe)]


async def list_pipes(request: web.Request) -> web.Response:
    principal = _need_some_admin(request)
    named = principal.grants.admin
    shown = [
        _summary(p, named) for p in _pipes(request) if _admins_domain(principal, p.domain.name)
    ]
    shown.sort(key=lambda entry: (entry["domain"], entry["owner"], entry["digest"]))
    return http.json_reply({"pipes": shown})


def _named_pipe(request: web.Request) -> Pipe:
    """The pipe the path names; to an admin of other domains it is absent (the same
    404 as for a name never used)."""
    principal = _need_some_admin(request)
    found = request.app[ENGINE].peek(request.match_info["name"])
    if not isinstance(found, Pipe) or not _admins_domain(principal, found.domain.name):
        raise NotFound("no pipe by that name")
    return found


async def get_pipe(request: web.Request) -> web.Response:
    pipe = _named_pipe(request)
    entry = _summary(pipe, True)
    entry.update(
        oldest=pipe.oldest() if pipe.messages else (pipe.spill_lo if pipe.spilled else None),
        durable=pipe.durable,
        max_messages=pipe.max_messages,
        max_bytes=pipe.max_bytes,
        overflow=pipe.overflow,
        lease=pipe.lease,
        max_deliveries=pipe.max_deliveries,
        pinned=pipe.pinned,
        webhook=pipe.hook.state if pipe.hook is not None else None,
        joined=[
            {
                "feed": join.feed.name,
                "feed_type": join.feed.type,
                "type": join.spec.type,
                "address": join.spec.address,
                "default": join.is_default,
            }
            for join in pipe.joins.values()
        ],
    )
    return http.json_reply(entry)


async def purge_pipe(request: web.Request) -> web.Response:
    """Drop every message in the pipe, in memory and on disk: an acknowledgement of
    its newest position (D4), so it is journalled and committed like one, and the
    pipe's positions go on from where they were."""
    pipe = _named_pipe(request)
    purged = await spill.ack(request.app, Slot(pipe, pipe.next_seq - 1))
    await durability.commit(request.app)
    return http.json_reply({"digest": _digest(pipe), "purged": purged, "next": pipe.next_seq})


# ---------------------------------------------------------------- statistics
async def stats(request: web.Request) -> web.Response:
    _need_gateway_admin(request, "the gateway's statistics")
    app = request.app
    engine = app[ENGINE]
    kinds: Counter[str] = Counter()
    in_memory = on_disk = 0
    for resource in engine.private_resources():
        if isinstance(resource, Pipe):
            kinds["pipes"] += 1
            in_memory += len(resource.messages)
            on_disk += resource.spilled
        elif isinstance(resource, Join):
            kinds["joins"] += 1
        elif isinstance(resource, Feed):
            kinds["private_feeds"] += 1
        elif isinstance(resource, StagedContent):
            kinds["staged"] += 1
    feeds = [*engine.public_feeds.values()]
    queued = sum(len(feed.queue) for feed in feeds)
    document = {
        "domains": len(engine.domains),
        "feeds": {"public": len(feeds), "private": kinds["private_feeds"]},
        "pipes": kinds["pipes"],
        "joins": kinds["joins"],
        "staged": kinds["staged"],
        "messages": {"in_memory": in_memory, "on_disk": on_disk, "queued": queued},
        "bytes_held": engine.held,
        "counters": dataclasses.asdict(engine.counters),
        "store": "sqlite" if app.get(STORE) is not None else "memory",
        "bridges": _bridges(app),
        "webhooks": _webhooks(app),
        "mirror": _mirror(app),
    }
    return http.json_reply(document)


def _bridges(app: web.Application) -> dict[str, Any]:
    states: Counter[str] = Counter()
    counters: Counter[str] = Counter()
    backlog = 0
    for bridge in app[BRIDGES]:
        status = bridge.status()
        states[str(status.get("state"))] += 1
        backlog += int(status.get("backlog", 0))
        counters.update(status.get("counters", {}))
    return {
        "total": sum(states.values()),
        "states": dict(states),
        "backlog": backlog,
        "counters": dict(counters),
    }


def _webhooks(app: web.Application) -> dict[str, Any]:
    states: Counter[str] = Counter()
    delivered = failures = dead = 0
    for pipe in app[ENGINE].hooks.values():
        hook = pipe.hook
        if hook is None:
            continue
        states[hook.state] += 1
        delivered += hook.delivered
        failures += hook.failures
        dead += hook.dead
    return {
        "pipes": sum(states.values()),
        "states": dict(states),
        "delivered": delivered,
        "failures": failures,
        "dead_lettered": dead,
    }


def _mirror(app: web.Application) -> dict[str, Any]:
    mirror = app.get(MIRROR)
    if mirror is None:
        return {"enabled": False}
    return mirror.status()  # as GET /admin/mirror shows it (the lake's password redacted)


# ---------------------------------------------------------------- clients
async def _in_thread(call: Callable[..., T], *args: Any) -> T:
    """A blocking file operation of the client store or revocation list, off the loop;
    a disk that fails (full, read-only) is a retriable 503, not a 500."""
    try:
        return await asyncio.to_thread(call, *args)
    except OSError as exc:
        raise ServiceUnavailable(f"the OAuth files cannot be written: {exc.strerror}", 5) from exc


def _clients(request: web.Request) -> ClientStore:
    _need_gateway_admin(request, "managing clients")
    store = request.app.get(oauth.CLIENTS)
    if store is None:
        raise NotFound("this gateway runs no built-in authorization server (builtin_issuer)")
    return store


async def list_clients(request: web.Request) -> web.Response:
    store = _clients(request)
    configured = {c.client_id for c in request.app[CONFIG].clients}
    try:
        found = await _in_thread(store.clients)
    except ValueError as exc:  # the file was damaged by hand
        raise Conflict(str(exc)) from exc
    shown = [
        {
            "client_id": c.client_id,
            "scopes": list(c.scopes),
            "configured": c.client_id in configured,
        }
        for c in found
    ]
    return http.json_reply({"clients": shown})


def _definition(entry: Any) -> tuple[str, tuple[str, ...]]:
    if not isinstance(entry, dict) or set(entry) - {"client_id", "scopes"}:
        raise BadRequest('a client is {"client_id": "...", "scopes": ["...", ...]}, nothing else')
    client_id, scopes = entry.get("client_id"), entry.get("scopes")
    if not isinstance(client_id, str):
        raise BadRequest("client_id must be a string")
    if (
        not isinstance(scopes, list)
        or not scopes
        or len(scopes) > MAX_SCOPES
        or not all(isinstance(s, str) for s in scopes)
    ):
        raise BadRequest(f"scopes must be a list of 1 to {MAX_SCOPES} strings")
    try:
        check_client_id(client_id)
        return client_id, tuple(dict.fromkeys(check_scope_token(s) for s in scopes))
    except ValueError as exc:
        raise BadRequest(str(exc)) from exc


async def add_client(request: web.Request) -> web.Response:
    store = _clients(request)
    client_id, scopes = _definition(await http.read_json(request, "a client definition"))
    if client_id == GUEST:
        raise BadRequest(f"{GUEST!r} is the loopback guest: choose another client id")
    try:
        secret = await _in_thread(store.add, client_id, scopes)
    except ValueError as exc:  # taken, or configured
        raise Conflict(str(exc)) from exc
    location = f"{request.url.origin()}{CLIENTS_PATH}/{client_id}"
    reply = {"client_id": client_id, "scopes": list(scopes), "client_secret": secret}
    return http.json_reply(reply, 201, location)


async def revoke_client(request: web.Request) -> web.Response:
    """Record the revocation, remove the client, then record it again.

    The first record comes before anything else changes, so a failure (503) leaves the
    client as it was and a retry starts over; from then on its tokens are refused. The
    second moves the time past the removal, so a token request that read the clients
    file before the removal but signed after the first record is refused too.
    """
    store = _clients(request)
    client_id = request.match_info["id"]
    if any(c.client_id == client_id for c in request.app[CONFIG].clients):
        raise Forbidden(f"client {client_id!r} is in the configuration file: remove it there")
    revocations = request.app[AUTH].revocations
    try:
        known = await _in_thread(store.get, client_id)
    except ValueError as exc:  # the file was damaged by hand
        raise Conflict(str(exc)) from exc
    if known is None or revocations is None:
        raise NotFound(f"no client {client_id!r}")
    await _in_thread(revocations.revoke, client_id)
    try:
        await _in_thread(store.remove, client_id)
    except KeyError:
        pass  # removed meanwhile by someone else: revoked all the same
    except ValueError as exc:
        raise Conflict(str(exc)) from exc
    at = await _in_thread(revocations.revoke, client_id)
    return http.json_reply({"revoked": client_id, "at": at})


def add_routes(app: web.Application) -> None:
    app.router.add_get(PIPES_PATH, list_pipes)
    app.router.add_get(PIPES_PATH + "/{name}", get_pipe)
    app.router.add_delete(PIPES_PATH + "/{name}/messages", purge_pipe)
    app.router.add_get(STATS_PATH, stats)
    app.router.add_get(CLIENTS_PATH, list_clients)
    app.router.add_post(CLIENTS_PATH, add_client)
    app.router.add_delete(CLIENTS_PATH + "/{id}", revoke_client)
