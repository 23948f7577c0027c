"""RestMS resource handlers and the method table that dispatches to them (digest §1.2).

Each handler decodes the request, calls the engine and encodes the reply. Which
method is allowed on which resource is data (:data:`METHODS`): a handler, or the
reason a 403 gives (U10). Methods RestMS does not define get 405 with ``Allow``.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import quote

from aiohttp import hdrs, web

from auth import Principal
from feeds.engine import Engine
from feeds.model import (
    Domain,
    Feed,
    Join,
    Message,
    OnDisk,
    PartRef,
    Pipe,
    Slot,
    StagedContent,
)
from restms import fastpath, specs
from restms.errors import BadRequest, Forbidden, MethodNotAllowed, NotFound, ServiceUnavailable
from restms.media import (
    Format,
    accepts_event_stream,
    bare_type,
    body_format,
    looks_structured,
    negotiate,
)
from restms.uris import PREFIX, split_path, uri_path

from . import access, http, idempotency, spill, streams, views, webhooks, websocket
from .authn import PRINCIPAL, waiting
from .durability import committed
from .keys import REPLIES, STATE

Handler = Callable[[web.Request, Any], Awaitable[web.StreamResponse]]
OCTET_STREAM = "application/octet-stream"


# ---------------------------------------------------------------- domain
async def get_domain(request: web.Request, domain: Domain) -> web.StreamResponse:
    return await _get(
        request,
        f"d:{domain.name}",
        domain,
        lambda: views.domain(
            http.base(request),
            domain,
            request[STATE].engine,
            lambda f: access.readable(request, domain, f),
        ),
    )


async def post_domain(request: web.Request, domain: Domain) -> web.StreamResponse:
    """C1-C10: create a feed (201, or 200 for an existing public one) or a pipe (201)."""
    document, body_fmt = await http.read_document(request)
    fmt = http.reply_format(request, body_fmt)  # 406 before anything changes
    spec = specs.creation(document, slug=request.headers.get("Slug"))
    access.may_create(request, domain, spec)
    engine = request[STATE].engine
    base = http.base(request)
    if isinstance(spec, specs.PipeSpec):
        spec = await webhooks.admit(request, spec)  # a webhook pipe's callback: SSRF guard
        pipe = engine.create_pipe(domain, spec, http.principal(request))
        return http.document(
            request,
            views.pipe(base, pipe, engine, secret=webhooks.new_secret(spec, pipe)),
            fmt,
            key=f"p:{pipe.key}",
            resource=pipe,
            status=201,
            location=base.resource(pipe.key),
            no_cache=True,
        )
    feed, created = engine.create_feed(domain, spec, http.principal(request))
    return http.document(
        request,
        views.feed(base, feed),
        fmt,
        key=f"f:{feed.key}",
        resource=feed,
        status=201 if created else 200,
        location=views.feed_uri(base, feed),
    )


# ---------------------------------------------------------------- feeds
async def get_feed(request: web.Request, feed: Feed) -> web.StreamResponse:
    return await _get(request, f"f:{feed.key}", feed, lambda: views.feed(http.base(request), feed))


async def put_feed(request: web.Request, feed: Feed) -> web.StreamResponse:
    """R2, R3, F17: title and license; 204 for an empty body."""
    if feed.configured:
        raise Forbidden("configured feeds cannot be changed")
    engine = request[STATE].engine
    return await _put(
        request,
        f"f:{feed.key}",
        feed,
        "feed",
        lambda update: engine.update_feed(feed, update),
        lambda: views.feed(http.base(request), feed),
    )


async def delete_feed(request: web.Request, feed: Feed) -> web.StreamResponse:
    if feed.configured:
        raise Forbidden("configured feeds cannot be deleted")
    http.check_preconditions(request, f"f:{feed.key}", feed)
    request[STATE].engine.delete_feed(feed)
    return web.Response(status=200)


async def post_feed(request: web.Request, feed: Feed) -> web.StreamResponse:
    """M1-M3, M5-M12: a structured body publishes; anything else is staged."""
    headers = request.headers
    content_type = headers.get(hdrs.CONTENT_TYPE, "")
    body = await http.read_body(request)
    body_fmt = body_format(content_type)
    if body_fmt is None and not bare_type(content_type):  # M3: no type, sniff the body
        body_fmt = looks_structured(body)
    if body_fmt is None:
        staged = request[STATE].engine.stage(
            feed, body, content_type.strip() or OCTET_STREAM, http.principal(request)
        )
        # M1: 201 + Location, no Content-Type and an empty body.
        return web.Response(
            status=201, headers={"Location": http.base(request).resource(staged.key)}
        )
    fmt = negotiate(headers.get(hdrs.ACCEPT), body_fmt)  # 406 before anything is routed
    counts = await publish(request, feed, body, body_fmt)
    return web.Response(body=fastpath.counts(counts, fmt), content_type=fmt.media_type)


async def publish(request: web.Request, feed: Feed, body: bytes, fmt: Format) -> list[int]:
    """M5-M12: route the messages of a structured body into ``feed`` as the request's
    principal, and wait until they are on disk; the count for each message.

    The one publish path: a POST on a feed and a WebSocket publish frame both end here.
    """
    state = request[STATE]
    config, engine = state.config, state.engine
    messages = fastpath.messages(body, fmt, config.codec, config.limits)
    counts = engine.publish(feed, messages, request[PRINCIPAL].name)
    if not engine.journal:  # nothing durable changed (non-persistent messages)
        return counts
    try:
        await committed(request)
    except ServiceUnavailable:
        engine.forget(feed, messages)  # not accepted: a retry must not be a duplicate
        raise
    return counts


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
    target = FIND[kind](request[STATE].engine, name)
    access.visible(request[STATE], request[PRINCIPAL], target)
    if not isinstance(target, Feed):
        raise BadRequest(f"{where} is not a feed: only feeds are published to")
    access.may_publish(request, target)
    return await publish(request, target, body, Format.JSON)


# ---------------------------------------------------------------- pipes
async def get_pipe(request: web.Request, pipe: Pipe) -> web.StreamResponse:
    if websocket.requested(request):
        return await websocket.serve(request, pipe, publish_to)
    if accepts_event_stream(request.headers.get("Accept")):
        return await streams.sse(request, pipe)
    engine = request[STATE].engine
    await spill.ensure(request.app, pipe)  # the oldest messages, if they wait on disk
    return await _get(
        request,
        f"p:{pipe.key}",
        pipe,
        lambda: views.pipe(http.base(request), pipe, engine),
        no_cache=True,
    )


async def put_pipe(request: web.Request, pipe: Pipe) -> web.StreamResponse:
    """L8, Q15: a PUT on a pipe changes its title (and a webhook pipe's options)."""
    engine = request[STATE].engine
    return await _put(
        request,
        f"p:{pipe.key}",
        pipe,
        "pipe",
        lambda update: engine.update_pipe(pipe, update),
        lambda: views.pipe(http.base(request), pipe, engine),
        no_cache=True,
        check=lambda update: webhooks.admit_update(request, pipe, update),
    )


async def _put(
    request: web.Request,
    key: str,
    resource: Any,
    tag: str,
    apply: Callable[[specs.Update], object],
    render: Callable[[], Any],
    *,
    no_cache: bool = False,
    check: Callable[[specs.Update], Awaitable[None]] | None = None,
) -> web.StreamResponse:
    """R2, H5: 412 on a stale copy, 204 for an empty body, else update and show
    (``check``: what must be looked at, asynchronously, before anything changes)."""
    http.check_preconditions(request, key, resource)
    body = await http.read_body(request)
    if not body:
        return web.Response(status=204)
    body_fmt = http.request_format(request, body)
    fmt = http.reply_format(request, body_fmt)  # 406 before anything changes
    update = specs.update(http.decode(request, body, body_fmt), tag)
    if check is not None:
        await check(update)
        http.check_preconditions(request, key, resource)  # it may have changed meanwhile
    apply(update)
    return http.document(request, render(), fmt, key=key, resource=resource, no_cache=no_cache)


async def delete_pipe(request: web.Request, pipe: Pipe) -> web.StreamResponse:
    http.check_preconditions(request, f"p:{pipe.key}", pipe)
    request[STATE].engine.delete_pipe(pipe)
    return web.Response(status=200)


async def post_join(request: web.Request, pipe: Pipe) -> web.StreamResponse:
    """F10, F16, P4, G14: join the pipe to a feed (201, or 200 for an identical join)."""
    document, body_fmt = await http.read_document(request)
    fmt = http.reply_format(request, body_fmt)  # 406 before the join exists
    spec = specs.join(document)
    access.may_join(request, pipe, spec.feed_path)
    join, created = request[STATE].engine.create_join(pipe, spec)
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
async def get_join(request: web.Request, join: Join) -> web.StreamResponse:
    return await _get(request, f"j:{join.key}", join, lambda: views.join(http.base(request), join))


async def delete_join(request: web.Request, join: Join) -> web.StreamResponse:
    http.check_preconditions(request, f"j:{join.key}", join)
    request[STATE].engine.delete_join(join)
    return web.Response(status=200)


# ---------------------------------------------------------------- messages
async def get_message(request: web.Request, slot: Slot) -> web.StreamResponse:
    """A2, A5, A9, U11, P6: a message, waiting while the slot is the asynclet."""
    engine = request[STATE].engine
    pipe = slot.pipe
    await spill.ensure(request.app, pipe, slot.seq)
    if request.method == "HEAD":
        message = engine.message(slot)  # U11: HEAD never blocks
    elif pipe.type == "stream" and engine.pending(slot):
        return await streams.multipart(request, pipe)
    else:
        fmt = http.reply_format(request)  # 406 before waiting, not after
        message = await _present(request, slot)  # no wait, no slot
        if message is None:
            # A2, A9: the asynclet waits (a slot of the principal's), at most until its
            # token expires. The wait is in this frame, not a helper coroutine's: each
            # coroutine on the chain costs every waiting asynclet its frame.
            with waiting(request, "asynclet"):
                wait = http.bounded(request, request[STATE].config.max_wait)
                while True:
                    try:
                        message = await engine.wait_message(slot, wait)
                        break
                    except OnDisk:  # it arrived while we waited, and went to disk
                        await spill.ensure(request.app, pipe, slot.seq)
            if message is None:
                http.check_credentials(request)
                raise http.wait_expired(request, "asynclet")
    if message is None:
        raise NotFound("no message at this position yet")
    if request.method == "GET":
        engine.lease(pipe, message)  # at-least-once: redelivered unless acknowledged
    key = f"m:{pipe.key}.{slot.seq}"
    fmt = http.reply_format(request)
    unchanged = http.not_modified(request, key, message, fmt)
    if unchanged is not None:
        return unchanged
    return http.document(
        request,
        views.message(http.base(request), pipe, message),
        fmt,
        key=key,
        resource=message,
        no_cache=True,
    )


async def _present(request: web.Request, slot: Slot) -> Message | None:
    """The slot's message if it is there already (read back from disk if it went
    there), without waiting; get_message's asynclet waits in its own frame."""
    engine = request[STATE].engine
    while True:
        try:
            return await engine.wait_message(slot, 0.0)
        except OnDisk:  # it went to disk
            await spill.ensure(request.app, slot.pipe, slot.seq)


async def delete_message(request: web.Request, slot: Slot) -> web.StreamResponse:
    """D4, A7, D5, H5: acknowledge this message and every older one."""
    engine = request[STATE].engine
    await spill.ensure(request.app, slot.pipe, slot.seq)
    message = engine.message(slot)
    if message is not None:
        http.check_preconditions(request, f"m:{slot.pipe.key}.{slot.seq}", message)
    await spill.ack(request.app, slot)
    return web.Response(status=200)


# ---------------------------------------------------------------- contents
async def get_part(request: web.Request, ref: PartRef) -> web.StreamResponse:
    engine = request[STATE].engine
    await spill.ensure(request.app, ref.pipe, ref.seq)
    blob = engine.part(ref)
    message = engine.message(Slot(ref.pipe, ref.seq))
    arrived = message.arrived if message is not None else 0.0
    key = f"c:{ref.pipe.key}.{ref.seq}.{ref.index}"
    return http.opaque(request, blob.data, blob.content_type, key, arrived)


async def delete_part(request: web.Request, ref: PartRef) -> web.StreamResponse:
    await spill.ensure(request.app, ref.pipe, ref.seq)
    request[STATE].engine.delete_part(ref)
    return web.Response(status=200)


async def get_staged(request: web.Request, staged: StagedContent) -> web.StreamResponse:
    blob = staged.blob
    return http.opaque(request, blob.data, blob.content_type, f"s:{staged.key}", staged.modified)


async def delete_staged(request: web.Request, staged: StagedContent) -> web.StreamResponse:
    request[STATE].engine.delete_staged(staged)
    return web.Response(status=200)


# ---------------------------------------------------------------- shared GET
async def _get(
    request: web.Request,
    key: str,
    resource: Any,
    render: Callable[[], Any],
    *,
    no_cache: bool = False,
) -> web.StreamResponse:
    """GET with If-* first (H3, Q34), then When-* (H9-H11), then the document."""
    fmt: Format = http.reply_format(request)
    unchanged = http.not_modified(request, key, resource, fmt)
    if unchanged is not None:
        return unchanged
    await http.evented(request, key, resource, fmt)
    return http.document(request, render(), fmt, key=key, resource=resource, no_cache=no_cache)


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
    Domain: "domain",
    Feed: "feed",
    Pipe: "pipe",
    Join: "join",
    Slot: "message",
    PartRef: "content",
    StagedContent: "staged",
}


def allowed(kind: str) -> tuple[str, ...]:
    table = METHODS[kind]
    names = [m for m, h in table.items() if not isinstance(h, str)]
    return tuple([*names, "HEAD"]) if "GET" in names else tuple(names)


def dispatch(
    request: web.Request, target: Any, method: str, engine: Engine, principal: Principal
) -> Handler:
    """The checks of the method table and of access for ``method`` on ``target``, then
    the handler that replies."""
    kind = _KINDS[type(target)]
    entry = METHODS[kind].get("GET" if method == "HEAD" else method)
    if entry is None:
        raise MethodNotAllowed(f"{method} is not defined on a {kind}", allowed(kind))
    if isinstance(entry, str):
        if not _exists(request, target):
            raise NotFound("no such resource")  # U12: absent positions are 404, not 403
        raise Forbidden(entry)
    access.check(engine, principal, method, target)
    return entry


async def _run(
    entry: Handler, request: web.Request, target: Any, engine: Engine
) -> web.StreamResponse:
    response = await entry(request, target)
    if engine.journal:  # no reply before what it reports is on disk
        await committed(request)
    return response


def _exists(request: web.Request, target: Any) -> bool:
    """Message positions and contents resolve by shape; say whether one is really there."""
    engine = request[STATE].engine
    if isinstance(target, Slot):
        found = engine.message(target) is not None or target.pipe.on_disk(target.seq)
        return found or engine.pending(target)
    if isinstance(target, PartRef):
        try:
            engine.part(target)
        except NotFound:
            return False
    return True


# How each kind's ``{name}`` is found. Each kind has a route of its own, whose handler
# is handed its finder (:func:`handler`): asking the matched route its name would be
# three Python-level property calls a request.
FIND: dict[str, Callable[[Engine, str], Any]] = {
    "domain": Engine.domain,
    "feed": Engine.public_feed,
    "resource": Engine.resolve,
}


def handler(kind: str) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """The handler of the ``/restms/{kind}/{name}`` route."""
    return functools.partial(handle, find=FIND[kind])


async def handle(request: web.Request, find: Callable[[Engine, str], Any]) -> web.StreamResponse:
    """Entry point for every ``/restms/{kind}/{name}`` route (see :func:`handler`)."""
    # Read once and passed on: each read from the request is a Python-level call.
    state, principal, method = request[STATE], request[PRINCIPAL], request.method
    engine = state.engine
    try:
        target = find(engine, request.match_info["name"])
        access.visible(state, principal, target)  # another's, or another tenant's: not there
    except NotFound:
        if method == "DELETE":
            return web.Response(status=200)  # R4, L10: DELETE is idempotent
        raise
    entry = dispatch(request, target, method, engine, principal)
    if method == "POST" and idempotency.HEADER in request.headers:
        return await idempotency.once(
            request,
            request.app[REPLIES],
            principal.name,
            http.read_body,
            # A partial, not a lambda: a lambda's cells would cost every request
            # (and every waiting asynclet) four cell objects, made when handle starts.
            functools.partial(_run, entry, request, target, engine),
        )
    # What _run does, without the coroutine it would cost every request.
    response = await entry(request, target)
    if engine.journal:  # no reply before what it reports is on disk
        await committed(request)
    return response


async def unknown(request: web.Request) -> web.StreamResponse:
    """U12: any other path under /restms/ is no resource."""
    raise NotFound(f"no RestMS resource at {request.path}")


__all__ = ["METHODS", "Format", "handle", "handler", "unknown"]
