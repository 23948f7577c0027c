"""RestMS resource handlers and the method table that dispatches to them (digest §1.2).

Each handler decodes the request, calls the engine and encodes the reply. Which
method is allowed on which resource is data (:data:`METHODS`): a handler, or the
reason a 403 gives (U10). Methods RestMS does not define get 405 with ``Allow``.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn
from urllib.parse import quote

from aiohttp import hdrs, web

from auth import Principal
from feeds.service import (
    HIDDEN,
    ContentRef,
    DomainInfo,
    EngineService,
    FeedInfo,
    JoinInfo,
    Listing,
    PipeInfo,
    Slot,
    StagedInfo,
    Watched,
)
from gateway.auth.authn import PRINCIPAL, waiting
from gateway.restms import access, http, idempotency, streams, views, websocket
from gateway.server.keys import REPLIES
from gateway.server.state import STATE
from gateway.webhooks import delivery as webhooks
from restms import fastpath, specs
from restms.document import Document
from restms.errors import BadRequest, Forbidden, MethodNotAllowed, NotFound
from restms.media import (
    Format,
    accepts_event_stream,
    bare_type,
    body_format,
    looks_structured,
    negotiate,
)
from restms.uris import PREFIX, split_path, uri_path

Handler = Callable[[web.Request, Any], Awaitable[web.StreamResponse]]
OCTET_STREAM = "application/octet-stream"


def _service(request: web.Request) -> EngineService:
    return request[STATE].service


# ---------------------------------------------------------------- domain
async def get_domain(request: web.Request, domain: DomainInfo) -> web.StreamResponse:
    async def render(now: DomainInfo) -> Document:
        feeds = await _service(request).listed_feeds(now.name)
        shown = functools.partial(access.readable, request, now)
        return views.domain(http.base(request), now, feeds, shown)

    return await _get(request, f"d:{domain.name}", domain, render)


async def post_domain(request: web.Request, domain: DomainInfo) -> web.StreamResponse:
    """C1-C10: create a feed (201, or 200 for an existing public one) or a pipe (201)."""
    document, body_fmt = await http.read_document(request)
    fmt = http.reply_format(request, body_fmt)  # 406 before anything changes
    spec = specs.creation(document, slug=request.headers.get("Slug"))
    await access.may_create(request, domain, spec)
    if isinstance(spec, specs.PipeSpec):
        return await new_pipe(request, domain.name, spec, http.principal(request), fmt)
    base = http.base(request)
    feed, created = await _service(request).create_feed(http.principal(request), domain.name, spec)
    return http.document(
        request,
        views.feed(base, feed),
        fmt,
        key=f"f:{feed.key}",
        resource=feed,
        status=201 if created else 200,
        location=views.feed_uri(base, feed),
    )


async def new_pipe(
    request: web.Request, domain: str, spec: specs.PipeSpec, owner: str, fmt: Format
) -> web.StreamResponse:
    """C5, C9: the pipe ``owner`` gets in the domain named ``domain``, and its document
    (201); the RestMS POST and the admin's provisioning (gateway/admin/api.py) both
    create pipes here."""
    spec = await webhooks.admit(request, spec)  # a webhook pipe's callback: SSRF guard
    base = http.base(request)
    pipe = await _service(request).create_pipe(owner, domain, spec)
    made = pipe.webhook.options.secret if pipe.webhook is not None else None
    listing = Listing(messages=(), asynclet=pipe.asynclet)  # a new pipe holds nothing
    return http.document(
        request,
        views.pipe(base, pipe, listing, secret=webhooks.new_secret(spec, made)),
        fmt,
        key=f"p:{pipe.key}",
        resource=pipe,
        status=201,
        location=base.resource(pipe.key),
        no_cache=True,
    )


# ---------------------------------------------------------------- feeds
async def get_feed(request: web.Request, feed: FeedInfo) -> web.StreamResponse:
    async def render(now: FeedInfo) -> Document:
        return views.feed(http.base(request), now)

    return await _get(request, f"f:{feed.key}", feed, render)


async def put_feed(request: web.Request, feed: FeedInfo) -> web.StreamResponse:
    """R2, R3, F17: title and license; 204 for an empty body."""
    if feed.configured:
        raise Forbidden("configured feeds cannot be changed")
    service = _service(request)

    async def apply(update: specs.Update) -> FeedInfo:
        # access.check let the principal change it (its creator, or an admin)
        return await service.update_feed(None, feed.key, update)

    async def render(now: FeedInfo) -> Document:
        return views.feed(http.base(request), now)

    return await _put(request, f"f:{feed.key}", feed, "feed", apply, render)


async def delete_feed(request: web.Request, feed: FeedInfo) -> web.StreamResponse:
    if feed.configured:
        raise Forbidden("configured feeds cannot be deleted")
    http.check_preconditions(request, f"f:{feed.key}", feed)
    # access.check let the principal delete it (its creator, or an admin); R4: gone
    # meanwhile is what this DELETE asked
    with contextlib.suppress(NotFound):
        await _service(request).delete_feed(None, feed.key)
    return web.Response(status=200)


async def post_feed(request: web.Request, feed: FeedInfo) -> web.StreamResponse:
    """M1-M3, M5-M12: a structured body publishes; anything else is staged."""
    headers = request.headers
    content_type = headers.get(hdrs.CONTENT_TYPE, "")
    body = await http.read_body(request)
    body_fmt = body_format(content_type)
    if body_fmt is None and not bare_type(content_type):  # M3: no type, sniff the body
        body_fmt = looks_structured(body)
    if body_fmt is None:
        staged = await _service(request).stage(
            http.principal(request), feed.key, body, content_type.strip() or OCTET_STREAM
        )
        # M1: 201 + Location, no Content-Type and an empty body.
        return web.Response(
            status=201, headers={"Location": http.base(request).resource(staged.key)}
        )
    fmt = negotiate(headers.get(hdrs.ACCEPT), body_fmt)  # 406 before anything is routed
    counts = await publish(request, feed, body, body_fmt)
    return web.Response(body=fastpath.counts(counts, fmt), content_type=fmt.media_type)


async def publish(request: web.Request, feed: FeedInfo, body: bytes, fmt: Format) -> list[int]:
    """M5-M12: route the messages of a structured body into ``feed`` as the request's
    principal; the count for each message. The engine returns once what must be on disk
    is (a failed commit is a 503 and leaves nothing behind).

    The one publish path: a POST on a feed and a WebSocket publish frame both end here.
    """
    state = request[STATE]
    config = state.config
    messages = fastpath.messages(body, fmt, config.codec, config.limits)
    counts = await state.service.publish_counts(request[PRINCIPAL].name, feed.key, messages)
    return list(counts)


async def publish_to(request: web.Request, where: str, body: bytes) -> list[int]:
    """A WebSocket publish frame: ``where`` names a feed (its public name, or its URI,
    absolute or path only) and ``body`` is a RestMS JSON document of messages.

    The feed is looked up and checked as a POST on its URI would be (404 when it is
    not there for this principal, 403 without the publish scope), then published to
    by :func:`publish`.
    """
    path = where if "/" in where else f"{PREFIX}feed/{quote(where, safe='')}"
    found = split_path(uri_path(path))
    if found is None:
        raise NotFound(f"no RestMS resource at {where}")
    kind, name = found
    state, principal = request[STATE], request[PRINCIPAL]
    target = await find(state.service, kind, principal.name, name)
    access.visible(state, principal, target)
    if not isinstance(target, FeedInfo):
        raise BadRequest(f"{where} is not a feed: only feeds are published to")
    access.may_publish(request, target)
    return await publish(request, target, body, Format.JSON)


# ---------------------------------------------------------------- pipes
async def get_pipe(request: web.Request, pipe: PipeInfo) -> web.StreamResponse:
    if websocket.requested(request):
        return await websocket.serve(request, pipe.key, publish_to)
    if accepts_event_stream(request.headers.get("Accept")):
        return await streams.sse(request, pipe.key)
    service, me = _service(request), http.principal(request)
    shown = pipe

    async def render(now: PipeInfo) -> Document:
        nonlocal shown
        shown = now
        return views.pipe(http.base(request), now, await service.listing(me, now.key))

    response = await _get(request, f"p:{pipe.key}", pipe, render, no_cache=True)
    if response.status == 200:  # where a reader can start now (docs/PROTOCOL.md)
        response.headers[views.EARLIEST] = str(shown.earliest)
    return response


async def put_pipe(request: web.Request, pipe: PipeInfo) -> web.StreamResponse:
    """L8, Q15: a PUT on a pipe changes its title (and a webhook pipe's options)."""
    service, me = _service(request), http.principal(request)

    async def apply(update: specs.Update) -> PipeInfo:
        return await service.update_pipe(me, pipe.key, update)

    async def render(now: PipeInfo) -> Document:
        return views.pipe(http.base(request), now, await service.listing(me, now.key))

    async def check(update: specs.Update) -> PipeInfo:
        await webhooks.admit_update(request, pipe.webhook is not None, update)
        return await service.pipe(me, pipe.key)  # it may have changed meanwhile

    return await _put(
        request, f"p:{pipe.key}", pipe, "pipe", apply, render, no_cache=True, check=check
    )


async def _put(
    request: web.Request,
    key: str,
    resource: Watched,
    tag: str,
    apply: Callable[[specs.Update], Awaitable[Watched]],
    render: Callable[[Watched], Awaitable[Document]],
    *,
    no_cache: bool = False,
    check: Callable[[specs.Update], Awaitable[Watched]] | None = None,
) -> web.StreamResponse:
    """R2, H5: 412 on a stale copy, 204 for an empty body, else update and show
    (``check``: what must be looked at, asynchronously, before anything changes; it
    answers the resource as it is then)."""
    http.check_preconditions(request, key, resource)
    body = await http.read_body(request)
    if not body:
        return web.Response(status=204)
    body_fmt = http.request_format(request, body)
    fmt = http.reply_format(request, body_fmt)  # 406 before anything changes
    update = specs.update(http.decode(request, body, body_fmt), tag)
    if check is not None:
        http.check_preconditions(request, key, await check(update))
    now = await apply(update)
    return http.document(request, await render(now), fmt, key=key, resource=now, no_cache=no_cache)


async def delete_pipe(request: web.Request, pipe: PipeInfo) -> web.StreamResponse:
    http.check_preconditions(request, f"p:{pipe.key}", pipe)
    # Its owner's, or another's that an admin of its domain deletes (access.admin_deletes)
    with contextlib.suppress(NotFound):  # R4: gone meanwhile is what this DELETE asked
        await _service(request).delete_pipe(None, pipe.key)
    return web.Response(status=200)


async def post_join(request: web.Request, pipe: PipeInfo) -> web.StreamResponse:
    """F10, F16, P4, G14: join the pipe to a feed (201, or 200 for an identical join)."""
    document, body_fmt = await http.read_document(request)
    fmt = http.reply_format(request, body_fmt)  # 406 before the join exists
    spec = specs.join(document)
    await access.may_join(request, pipe, spec.feed_path)
    join, created = await _service(request).create_join(http.principal(request), pipe.key, spec)
    base = http.base(request)
    return http.document(
        request,
        views.join(base, join),
        fmt,
        key=f"j:{join.key}",
        resource=join,
        status=201 if created else 200,
        location=base.resource(join.key),
    )


# ---------------------------------------------------------------- joins
async def get_join(request: web.Request, join: JoinInfo) -> web.StreamResponse:
    async def render(now: JoinInfo) -> Document:
        return views.join(http.base(request), now)

    return await _get(request, f"j:{join.key}", join, render)


async def delete_join(request: web.Request, join: JoinInfo) -> web.StreamResponse:
    http.check_preconditions(request, f"j:{join.key}", join)
    await _service(request).delete_join(http.principal(request), join.key)
    return web.Response(status=200)


# ---------------------------------------------------------------- messages
async def get_message(request: web.Request, slot: Slot) -> web.StreamResponse:
    """A2, A5, A9, U11, P6: a message, waiting while the slot is the asynclet."""
    state = request[STATE]
    service, me, pipe, seq = state.service, request[PRINCIPAL].name, slot.pipe, slot.position
    try:
        if request.method == "HEAD":
            message = await service.look(me, pipe, seq)  # U11: HEAD never blocks
        elif slot.pipe_type == "stream" and (await service.pipe(me, pipe)).asynclet == seq:
            return await streams.multipart(request, pipe)
        else:
            fmt = http.reply_format(request)  # 406 before waiting, not after
            # at-least-once: a read message is leased, redelivered unless acknowledged
            message = await service.read(me, pipe, seq, lease=True)  # no wait, no slot
            if message is None:
                # A2, A9: the asynclet waits (a slot of the principal's), at most until
                # its token expires. The wait is in this frame, not a helper coroutine's:
                # each coroutine on the chain costs every waiting asynclet its frame.
                with waiting(request, "asynclet"):
                    wait = http.bounded(request, state.config.max_wait)
                    message = await service.read(me, pipe, seq, wait=wait, lease=True)
                if message is None:
                    http.check_credentials(request)
                    raise http.wait_expired(request, "asynclet")
    except NotFound as exc:
        return await _gone(request, slot, exc.reason)
    if message is None:
        return await _gone(request, slot, "no message at this position yet")
    key = f"m:{pipe}.{seq}"
    fmt = http.reply_format(request)
    unchanged = http.not_modified(request, key, message, fmt)
    if unchanged is not None:
        return unchanged
    return http.document(
        request,
        views.message(http.base(request), message),
        fmt,
        key=key,
        resource=message,
        no_cache=True,
    )


async def _gone(request: web.Request, slot: Slot, reason: str) -> web.Response:
    """404 for a position with no message. One before the oldest the pipe holds (gone:
    acknowledged, or lost unacknowledged) names that oldest in RestMS-Earliest-Position,
    so that a reader that fell behind knows where to go on (docs/PROTOCOL.md)."""
    try:
        found = await _service(request).pipe(request[PRINCIPAL].name, slot.pipe)
    except NotFound:  # the pipe went too: what the read said stands
        raise NotFound(reason) from None
    if slot.position >= found.earliest:
        raise NotFound(reason)
    headers = {views.EARLIEST: str(found.earliest)}
    return web.Response(status=404, text=reason.rstrip() + "\n", headers=headers)


async def delete_message(request: web.Request, slot: Slot) -> web.StreamResponse:
    """D4, A7, D5, H5: acknowledge this message and every older one."""
    service, me = _service(request), request[PRINCIPAL].name
    headers = request.headers
    if "If-Match" in headers or "If-Unmodified-Since" in headers:  # H5
        message = await service.look(me, slot.pipe, slot.position)
        if message is not None:
            http.check_preconditions(request, f"m:{slot.pipe}.{slot.position}", message)
    await service.ack(me, slot.pipe, slot.position)
    return web.Response(status=200)


# ---------------------------------------------------------------- contents
async def get_part(request: web.Request, ref: ContentRef) -> web.StreamResponse:
    service, me = _service(request), http.principal(request)
    blob = await service.content(me, ref)
    message = await service.look(me, ref.pipe, ref.position)
    arrived = message.arrived if message is not None else 0.0
    key = f"c:{ref.pipe}.{ref.position}.{ref.index}"
    return http.opaque(request, blob.data, blob.content_type, key, arrived)


async def delete_part(request: web.Request, ref: ContentRef) -> web.StreamResponse:
    await _service(request).delete_content(http.principal(request), ref)
    return web.Response(status=200)


async def get_staged(request: web.Request, staged: StagedInfo) -> web.StreamResponse:
    _, blob = await _service(request).staged(http.principal(request), staged.key)
    return http.opaque(request, blob.data, blob.content_type, f"s:{staged.key}", staged.modified)


async def delete_staged(request: web.Request, staged: StagedInfo) -> web.StreamResponse:
    await _service(request).delete_staged(http.principal(request), staged.key)
    return web.Response(status=200)


# ---------------------------------------------------------------- shared GET
async def _get(
    request: web.Request,
    key: str,
    resource: Watched,
    render: Callable[[Watched], Awaitable[Document]],
    *,
    no_cache: bool = False,
) -> web.StreamResponse:
    """GET with If-* first (H3, Q34), then When-* (H9-H11), then the document."""
    fmt: Format = http.reply_format(request)
    unchanged = http.not_modified(request, key, resource, fmt)
    if unchanged is not None:
        return unchanged
    now = await http.evented(request, key, resource, fmt)
    return http.document(request, await render(now), fmt, key=key, resource=now, no_cache=no_cache)


# ---------------------------------------------------------------- the method table
METHODS: dict[str, dict[str, Handler | str]] = {
    "domain": {
        "GET": get_domain,
        "POST": post_domain,
        "PUT": "a domain cannot be changed",
        "DELETE": "a domain cannot be deleted",
    },
    "feed": {"GET": get_feed, "PUT": put_feed, "DELETE": delete_feed, "POST": post_feed},
    "pipe": {"GET": get_pipe, "PUT": put_pipe, "DELETE": delete_pipe, "POST": post_join},
    "join": {
        "GET": get_join,
        "PUT": "a join cannot be changed; delete it and create another",
        "DELETE": delete_join,
        "POST": "nothing can be created under a join",
    },
    "message": {
        "GET": get_message,
        "PUT": "a message cannot be changed",
        "DELETE": delete_message,
        "POST": "nothing can be created under a message",
    },
    "content": {
        "GET": get_part,
        "PUT": "a content cannot be changed",
        "DELETE": delete_part,
        "POST": "nothing can be created under a content",
    },
    "staged": {
        "GET": get_staged,
        "PUT": "a content cannot be changed",
        "DELETE": delete_staged,
        "POST": "nothing can be created under a content",
    },
}
_KINDS: dict[type, str] = {
    DomainInfo: "domain",
    FeedInfo: "feed",
    PipeInfo: "pipe",
    JoinInfo: "join",
    Slot: "message",
    ContentRef: "content",
    StagedInfo: "staged",
}


def allowed(kind: str) -> tuple[str, ...]:
    table = METHODS[kind]
    names = [m for m, h in table.items() if not isinstance(h, str)]
    return tuple([*names, "HEAD"]) if "GET" in names else tuple(names)


def dispatch(target: Any, method: str, principal: Principal) -> Handler | str:
    """The checks of the method table and of access for ``method`` on ``target``: the
    handler that replies, or the reason the method is refused (403, see :func:`refuse`)."""
    kind = _KINDS[type(target)]
    entry = METHODS[kind].get("GET" if method == "HEAD" else method)
    if entry is None:
        raise MethodNotAllowed(f"{method} is not defined on a {kind}", allowed(kind))
    if not isinstance(entry, str):
        access.check(principal, method, target)
    return entry


async def refuse(request: web.Request, target: Any, reason: str) -> NoReturn:
    """The 403 of a method the table refuses on ``target``: 404 instead for a position
    or content that is not there (U12: they resolve by shape)."""
    service, me = request[STATE].service, request[PRINCIPAL].name
    if isinstance(target, Slot | ContentRef) and not await service.exists(me, target):
        raise NotFound(HIDDEN)
    raise Forbidden(reason)


async def find(service: EngineService, kind: str, principal: str, name: str) -> Any:
    """What ``/restms/{kind}/{name}`` names, as ``principal`` may see it (404 otherwise)."""
    if kind == "feed":
        found = await service.feed(principal, name)
        if found.name is None:  # a private feed is named by /restms/resource/ alone
            raise NotFound(f"no feed named {name!r}")
        return found
    if kind == "resource":
        return await service.resolve(principal, name)
    return await service.domain(name)


def handler(kind: str) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """The handler of the ``/restms/{kind}/{name}`` route."""
    return functools.partial(handle, kind=kind)


async def handle(request: web.Request, kind: str) -> web.StreamResponse:
    """Entry point for every ``/restms/{kind}/{name}`` route (see :func:`handler`)."""
    # Read once and passed on: each read from the request is a Python-level call.
    state, principal, method = request[STATE], request[PRINCIPAL], request.method
    service, name = state.service, request.match_info["name"]
    target: Any = None
    try:
        target = await find(service, kind, principal.name, name)
        access.visible(state, principal, target)  # another tenant's: not there
    except NotFound:
        if method != "DELETE":
            raise
        if kind == "resource":  # another's pipe: an admin of its domain may delete it
            try:
                target = await service.resolve(None, name)
            except NotFound:
                target = None
        if not access.admin_deletes(principal, target):
            return web.Response(status=200)  # R4, L10: DELETE is idempotent
    entry = dispatch(target, method, principal)
    if isinstance(entry, str):
        await refuse(request, target, entry)
    if method == "POST" and idempotency.HEADER in request.headers:
        return await idempotency.once(
            request,
            request.app[REPLIES],
            principal.name,
            http.read_body,
            # A partial, not a lambda: a lambda's cells would cost every request
            # (and every waiting asynclet) four cell objects, made when handle starts.
            functools.partial(entry, request, target),
        )
    # Each engine service call returns once what it changed is committed: the reply
    # never goes out before what it reports is on disk.
    return await entry(request, target)


async def unknown(request: web.Request) -> web.StreamResponse:
    """U12: any other path under /restms/ is no resource."""
    raise NotFound(f"no RestMS resource at {request.path}")


__all__ = ["METHODS", "Format", "handle", "handler", "new_pipe", "unknown"]
