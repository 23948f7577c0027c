"""The admin resources for pipes, gateway statistics and OAuth clients (docs/ADMIN.md).

Plain JSON bodies (not RestMS documents; provisioning takes and returns the RestMS pipe
document, since it makes a RestMS pipe), ``text/plain`` errors, never cached::

    GET    /admin/pipes                    every pipe the caller administers, summarised
    POST   /admin/pipes?owner=P[&domain=D] provision: a pipe for P (a RestMS pipe document)
    GET    /admin/pipes/{name}             one pipe, with its joins
    DELETE /admin/pipes/{name}             delete it, whoever owns it, with its joins and messages
    DELETE /admin/pipes/{name}/messages    purge: drop every message waiting in it
    GET    /admin/stats                    what the engine, bridges, webhooks and mirror count
    GET    /admin/clients                  the built-in issuer's clients (ids and scopes)
    POST   /admin/clients                  add one; the reply shows its secret, once
    DELETE /admin/clients/{id}             revoke: remove it, and refuse its tokens

Who may. A pipe belongs to a domain, not to a feed, so the pipe routes take a
``restms:admin`` scope that covers the pipe's domain and every feed in it
(``restms:admin`` or ``restms:admin:domain/D``); a narrower feed-qualified admin
scope administers bridges (gateway/admin/bridging.py) but no pipes. A pipe's name is its
capability (U6): the list names pipes only to an admin of the whole gateway (an
unqualified ``restms:admin``); a domain admin sees a digest and the title, and
inspects, purges or deletes a pipe whose name it was given, and provisions pipes in
its domains. Statistics span every domain and clients may be granted any scope, so
those routes take an unqualified ``restms:admin``. A principal with no admin scope at
all gets 403 on every route before anything is looked at, as for bridges.

Clients: the registry (:class:`auth.clients.Clients`: one node's file, its calls in
threads, or the registry several nodes share in Redis) and the revocation list are
called from the loop; a revocation is kept (on disk, or in Redis) before the reply
(:mod:`auth.revocations`), and a store that fails is a retriable 503.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Awaitable
from typing import Any, TypeVar

from aiohttp import web

from auth import GUEST, Principal
from auth.clients import Clients, check_client_id, check_scope_token
from auth.principals import NAME
from auth.revocations import RevocationList
from feeds.service import DEFAULT_DOMAIN, PipeState
from gateway.admin import bridging
from gateway.admin.bridging import BRIDGES
from gateway.admin.mirroring import MIRROR
from gateway.auth.authn import PRINCIPAL
from gateway.restms import http, resources
from gateway.server.keys import CLIENTS
from gateway.server.state import STATE
from restms import specs
from restms.errors import (
    BadRequest,
    Conflict,
    Forbidden,
    InsufficientScope,
    NotFound,
    ServiceUnavailable,
)

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
# The service answers the gateway itself (principal None), which sees every pipe; who
# may see which is decided here, from the domain of the value it returns.
def _digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:12]


def _summary(state: PipeState, named: bool) -> dict[str, Any]:
    pipe = state.info
    entry: dict[str, Any] = {"name": pipe.key} if named else {}
    entry.update(
        digest=_digest(pipe.key),
        title=pipe.title,
        type=pipe.type,
        domain=pipe.domain,
        owner=pipe.owner,
        messages=pipe.held,
        on_disk=state.on_disk,
        bytes=state.bytes,
        joins=len(pipe.joins),
        waiting=state.waiting,
        next=pipe.asynclet,
    )
    return entry


async def list_pipes(request: web.Request) -> web.Response:
    principal = _need_some_admin(request)
    named = principal.grants.admin
    states = await request[STATE].service.pipe_states()
    shown = [_summary(s, named) for s in states if _admins_domain(principal, s.info.domain)]
    shown.sort(key=lambda entry: (entry["domain"], entry["owner"], entry["digest"]))
    return http.json_reply({"pipes": shown})


async def _named_pipe(request: web.Request) -> PipeState:
    """The pipe the path names; to an admin of other domains it is absent (the same
    404 as for a name never used)."""
    principal = _need_some_admin(request)
    try:
        found = await request[STATE].service.pipe_state(None, request.match_info["name"])
    except NotFound:
        found = None
    if found is None or not _admins_domain(principal, found.info.domain):
        raise NotFound("no pipe by that name")
    return found


async def get_pipe(request: web.Request) -> web.Response:
    state = await _named_pipe(request)
    pipe, service = state.info, request[STATE].service
    feeds = {join.feed: await service.feed(None, join.feed) for join in pipe.joins}
    entry = _summary(state, True)
    entry.update(
        oldest=pipe.oldest,
        durable=pipe.durable,
        max_messages=pipe.max_messages,
        max_bytes=pipe.max_bytes,
        overflow=pipe.overflow,
        lease=pipe.lease,
        max_deliveries=pipe.max_deliveries,
        pinned=state.pinned,
        webhook=state.webhook.state if state.webhook is not None else None,
        joined=[
            {
                "feed": feeds[join.feed].name,
                "feed_type": feeds[join.feed].type,
                "type": join.type,
                "address": join.address,
                "default": join.is_default,
            }
            for join in pipe.joins
        ],
    )
    return http.json_reply(entry)


async def purge_pipe(request: web.Request) -> web.Response:
    """Drop every message in the pipe, in memory and on disk: an acknowledgement of
    its newest position (D4), so it is journalled and committed like one, and the
    pipe's positions go on from where they were."""
    pipe = (await _named_pipe(request)).info
    purged = await request[STATE].service.purge(None, pipe.key)
    return http.json_reply({"digest": _digest(pipe.key), "purged": purged, "next": pipe.asynclet})


async def delete_pipe(request: web.Request) -> web.Response:
    """Delete another principal's pipe as its owner's RestMS DELETE does (R5): the
    engine's one deletion, so its joins and messages go, work a queueing feed gave it
    goes back, its webhook stops; on disk before the reply. A bridge's own pipe is
    refused: the bridge would make another at once."""
    pipe = (await _named_pipe(request)).info
    bridging.keep_bridge_pipe(pipe.owner)
    deleted = {
        "deleted": pipe.key,
        "digest": _digest(pipe.key),
        "owner": pipe.owner,
        "messages": pipe.held,
        "joins": len(pipe.joins),
    }
    await request[STATE].service.delete_pipe(None, pipe.key)
    return http.json_reply(deleted)


async def provision_pipe(request: web.Request) -> web.StreamResponse:
    """A pipe for the principal ``?owner=`` names, in ``?domain=`` (default: default),
    made from a RestMS pipe document as that principal's own POST would make it, within
    its pipe quota; the owner then uses it as its own and nobody else sees it."""
    principal = _need_some_admin(request)
    owner, domain = _provisioned_for(request)
    service = request[STATE].service
    known = {found.name for found in await service.domains()}
    if domain not in known or not _admins_domain(principal, domain):
        raise NotFound(f"no domain named {domain!r} that you administer whole")
    document, body_fmt = await http.read_document(request)
    fmt = http.reply_format(request, body_fmt)  # 406 before anything changes
    spec = specs.creation(document)
    if not isinstance(spec, specs.PipeSpec):
        raise BadRequest("provisioning makes pipes: send a <pipe> document, not a feed")
    cap = request[STATE].config.max_pipes_per_principal
    if len(await service.pipes(owner)) >= cap:
        raise Forbidden(f"pipe quota reached: {owner!r} owns {cap} pipes, the most allowed")
    reply = await resources.new_pipe(request, domain, spec, owner, fmt)
    reply.headers["Cache-Control"] = "no-store"  # as every admin reply (a webhook's secret)
    return reply


def _provisioned_for(request: web.Request) -> tuple[str, str]:
    query = request.query
    if set(query) - {"owner", "domain"} or any(len(query.getall(k)) > 1 for k in query):
        raise BadRequest("provisioning takes ?owner=PRINCIPAL and optionally &domain=D, once each")
    owner = query.get("owner")
    if owner is None:
        raise BadRequest("provisioning needs ?owner=PRINCIPAL: the principal the pipe is for")
    if not NAME.fullmatch(owner):
        raise BadRequest(f"owner {owner!r} is no principal name: 1 to 200 of A-Z a-z 0-9 ._@:/+-")
    return owner, query.get("domain", DEFAULT_DOMAIN)


# ---------------------------------------------------------------- statistics
async def stats(request: web.Request) -> web.Response:
    _need_gateway_admin(request, "the gateway's statistics")
    app, service = request.app, request[STATE].service
    counted, figures = await service.inventory(), await service.stats()
    census = figures.census
    public = [
        feed for domain in await service.domains() for feed in await service.feeds(domain.name)
    ]
    document = {
        "domains": counted.domains,
        "feeds": {"public": counted.public_feeds, "private": counted.private_feeds},
        "pipes": counted.pipes,
        "joins": counted.joins,
        "staged": counted.staged,
        "messages": {
            "in_memory": census.messages - census.on_disk,
            "on_disk": census.on_disk,
            "queued": sum(feed.queued for feed in public),
        },
        "bytes_held": census.held_bytes,
        "counters": dict(figures.counters),
        "store": figures.store.kind if figures.store is not None else "memory",
        "bridges": _bridges(app),
        "webhooks": _webhooks(await service.pipe_states()),
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


def _webhooks(pipes: tuple[PipeState, ...]) -> dict[str, Any]:
    states: Counter[str] = Counter()
    delivered = failures = dead = 0
    for pipe in pipes:
        hook = pipe.webhook
        if hook is None:
            continue
        states[hook.state] += 1
        delivered += hook.delivered
        failures += hook.failures
        dead += hook.dead_lettered
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
async def _stored(call: Awaitable[T]) -> T:
    """An operation of the client registry or revocation list; a store that fails (a
    disk full or read-only, a Redis Cluster that does not answer) is a retriable 503,
    not a 500."""
    try:
        return await call
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise ServiceUnavailable(f"the OAuth clients cannot be written: {reason}", 5) from exc


def _clients(request: web.Request) -> Clients:
    _need_gateway_admin(request, "managing clients")
    store = request.app.get(CLIENTS)
    if store is None:
        raise NotFound("this gateway runs no built-in authorization server (builtin_issuer)")
    return store


async def list_clients(request: web.Request) -> web.Response:
    store = _clients(request)
    configured = {c.client_id for c in request[STATE].config.clients}
    try:
        found = await _stored(store.clients())
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
        secret = await _stored(store.add(client_id, scopes))
    except ValueError as exc:  # taken, or configured
        raise Conflict(str(exc)) from exc
    location = f"{http.origin(request)}{CLIENTS_PATH}/{client_id}"
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
    if any(c.client_id == client_id for c in request[STATE].config.clients):
        raise Forbidden(f"client {client_id!r} is in the configuration file: remove it there")
    revocations = request[STATE].auth.revocations
    try:
        known = await _stored(store.get(client_id))
    except ValueError as exc:  # the file was damaged by hand
        raise Conflict(str(exc)) from exc
    if known is None or revocations is None:
        raise NotFound(f"no client {client_id!r}")
    await _revoke(revocations, client_id)
    request[STATE].auth.end_revoked(client_id)  # its open waits, streams and sockets
    try:
        await _stored(store.remove(client_id))
    except KeyError:
        pass  # removed meanwhile by someone else: revoked all the same
    except ValueError as exc:
        raise Conflict(str(exc)) from exc
    at = await _revoke(revocations, client_id)
    return http.json_reply({"revoked": client_id, "at": at})


async def _revoke(revocations: RevocationList, client_id: str) -> float:
    try:
        return await _stored(revocations.record(client_id))
    except ValueError as exc:  # the list was damaged by hand: not overwritten
        raise Conflict(str(exc)) from exc


def add_routes(app: web.Application) -> None:
    app.router.add_get(PIPES_PATH, list_pipes)
    app.router.add_post(PIPES_PATH, provision_pipe)
    app.router.add_get(PIPES_PATH + "/{name}", get_pipe)
    app.router.add_delete(PIPES_PATH + "/{name}", delete_pipe)
    app.router.add_delete(PIPES_PATH + "/{name}/messages", purge_pipe)
    app.router.add_get(STATS_PATH, stats)
    app.router.add_get(CLIENTS_PATH, list_clients)
    app.router.add_post(CLIENTS_PATH, add_client)
    app.router.add_delete(CLIENTS_PATH + "/{id}", revoke_client)
