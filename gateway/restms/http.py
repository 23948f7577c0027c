"""Request and response plumbing shared by the resource handlers.

Reading bodies (with the size cap), choosing the representation (G9-G12), writing a
document with ``ETag``/``Last-Modified`` (H1, H2, H6), conditional GETs (H3, H4),
conditional PUT/DELETE (H5) and evented GETs (H9-H11) all live here, so handlers
stay a few lines: decode, call the engine, encode.
"""

from __future__ import annotations

import math
import time
from typing import Any, Protocol

import orjson
from aiohttp import hdrs, web

import restms
from feeds.service import Watched
from gateway.auth.authn import PRINCIPAL, bearer_challenge, waiting
from gateway.server import compression
from gateway.server.state import STATE
from restms.document import Document
from restms.errors import (
    BadRequest,
    PayloadTooLarge,
    PreconditionFailed,
    ServiceUnavailable,
    Unauthorized,
    UnsupportedMediaType,
)
from restms.httpdates import etag, etag_list, http_date, parse_http_date
from restms.media import Format, bare_type, body_format, looks_structured, negotiate
from restms.uris import Base

NO_CACHE = "no-cache"


class Versioned(Protocol):
    """Anything with validators: engine resources and messages."""

    @property
    def version(self) -> int: ...
    @property
    def modified(self) -> float: ...


def base(request: web.Request) -> Base:
    """What the reply's absolute URIs start with: ``public_url``, else the request's
    scheme and host (one the concerns checked is served here: :mod:`gateway.server.hosts`)."""
    public = request[STATE].config.hosts.public_base
    return public if public is not None else Base(request.scheme, request.host)


def origin(request: web.Request) -> str:
    """``scheme://host[:port]`` of the URIs :func:`base` builds, for the admin resources."""
    return request[STATE].config.hosts.public or f"{request.scheme}://{request.host}"


def credential_life(request: web.Request) -> float:
    """Seconds until the request's credentials (its bearer token) expire; inf if never."""
    expires = request[PRINCIPAL].expires
    return math.inf if expires is None else expires - time.time()


def bounded(request: web.Request, seconds: float) -> float:
    """A wait of ``seconds`` cut short where the request's token expires (PEERS 6)."""
    return max(0.0, min(seconds, credential_life(request)))


def check_credentials(request: web.Request) -> None:
    """401 ``invalid_token`` once the token a wait was made with has expired."""
    if credential_life(request) <= 0:
        raise Unauthorized(
            "the access token expired during the wait; retry with a fresh one",
            (bearer_challenge("invalid_token", "token expired"),),
        )


def principal(request: web.Request) -> str:
    """The name of the principal the request acts as: it owns what the request creates."""
    return request[PRINCIPAL].name


DECODED = web.RequestKey("decoded_body", bytes)  # a compressed body, once decoded
UNDECODABLE = "the request body does not decode from its Content-Encoding"


async def read_body(request: web.Request, *, again: bool = False) -> bytes:
    """The whole body, refusing anything over ``max_body`` with 413 before reading it.

    A body that came in whole with its head (most publishes) is taken as aiohttp holds
    it, in one piece, instead of through ``request.read()``'s loop and copy. With
    ``again`` it is read through ``request.read()``, which keeps what it read, so that
    a later read (the handler's, after an idempotent POST's check) gets the same bytes.
    """
    limit = request[STATE].config.max_body
    length = request.content_length
    if length is not None and length > limit:
        raise PayloadTooLarge(f"request body of {length} bytes is over the {limit}-byte limit")
    coding = compression.coding_of(request.headers)
    if coding is not None:  # decoded here, kept for a later read (``again``)
        body = request.get(DECODED)
        if body is None:
            try:
                body = await compression.read_decoded(request.content, coding, limit)
            except compression.Undecodable as exc:
                raise BadRequest(f"{UNDECODABLE}: {exc}") from exc
            request[DECODED] = body
        if len(body) > limit:
            raise PayloadTooLarge(f"request body is over the {limit}-byte limit")
        return body
    payload = request.content
    if not again and payload.is_eof() and not payload.at_eof():  # all in, none read
        body = payload.read_nowait()
        if len(body) > limit:  # unpacked (Content-Encoding) past the limit
            raise PayloadTooLarge(f"request body is over the {limit}-byte limit")
        return body
    try:
        return await request.read()  # after a read with ``again``: what that read
    except web.HTTPRequestEntityTooLarge as exc:
        raise PayloadTooLarge(f"request body is over the {limit}-byte limit") from exc


def json_reply(data: object, status: int = 200, location: str | None = None) -> web.Response:
    """A plain JSON reply of the admin resources (not a RestMS document), never cached."""
    headers = {"Cache-Control": "no-store"}
    if location:
        headers["Location"] = location
    return web.Response(
        body=orjson.dumps(data, option=orjson.OPT_INDENT_2),
        status=status,
        content_type="application/json",
        headers=headers,
    )


async def read_json(request: web.Request, what: str) -> Any:
    """The body of an admin request: ``what``, a JSON value (415 or 400 otherwise)."""
    if bare_type(request.headers.get("Content-Type", "")) != "application/json":
        raise UnsupportedMediaType(f"{what} is a JSON object (application/json)")
    body = await read_body(request)
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"{what} is not valid JSON: {exc}") from exc


def request_format(request: web.Request, body: bytes) -> Format:
    """The structured format of a PUT or POST body (G8, G10).

    No (or an empty) ``Content-Type`` means XML, as the draft says, unless the body
    is plainly a RestMS JSON document; a type we do not parse gives 415.
    """
    content_type = request.headers.get("Content-Type")
    if not bare_type(content_type):
        return looks_structured(body) or Format.XML
    fmt = body_format(content_type)
    if fmt is None:
        raise UnsupportedMediaType(
            "send application/restms+xml, application/restms+json or text/xml, "
            f"not {request.headers.get('Content-Type') or 'no Content-Type'}"
        )
    return fmt


def decode(request: web.Request, body: bytes, fmt: Format) -> Document:
    return restms.decode(body, fmt, request[STATE].config.codec)


async def read_document(request: web.Request) -> tuple[Document, Format]:
    body = await read_body(request)
    fmt = request_format(request, body)
    return decode(request, body, fmt), fmt


def reply_format(request: web.Request, body_fmt: Format | None = None) -> Format:
    return negotiate(request.headers.get(hdrs.ACCEPT), body_fmt)


def tag_for(key: str, resource: Versioned, fmt: Format) -> str:
    return etag(key, resource.version, fmt.tag)


def document(
    request: web.Request,
    document: Document,
    fmt: Format,
    *,
    key: str,
    resource: Versioned | None,
    status: int = 200,
    location: str | None = None,
    no_cache: bool = False,
) -> web.Response:
    """A structured reply with its validators (H1, H2, H6, H8) and optional Location."""
    headers = {"Content-Type": fmt.media_type}
    if resource is not None:
        headers["ETag"] = tag_for(key, resource, fmt)
        headers["Last-Modified"] = http_date(resource.modified)
    if location is not None:
        headers["Location"] = location
    if no_cache:
        headers["Cache-Control"] = NO_CACHE
    return web.Response(status=status, body=restms.encode(document, fmt), headers=headers)


def not_modified(
    request: web.Request, key: str, resource: Versioned, fmt: Format
) -> web.Response | None:
    """H3: 304 when every validator the client sent says its copy is current."""
    return _not_modified(request, tag_for(key, resource, fmt), resource.modified)


def _not_modified(request: web.Request, current: str, modified: float) -> web.Response | None:
    inm = request.headers.get("If-None-Match")
    ims = request.headers.get("If-Modified-Since")
    if inm is None and ims is None:
        return None
    if inm is not None:
        tags = etag_list(inm)
        if "*" not in tags and current not in tags:
            return None
    if ims is not None:
        since = parse_http_date(ims)
        if since is None or int(modified) > since:
            return None
    return web.Response(status=304, headers={"ETag": current, "Last-Modified": http_date(modified)})


def opaque(
    request: web.Request, data: bytes, content_type: str, key: str, modified: float
) -> web.Response:
    """A content's exact bytes and type (D2), with validators: contents never change."""
    current = etag(key, 1, "c")
    unchanged = _not_modified(request, current, modified)
    if unchanged is not None:
        return unchanged
    headers = {
        "Content-Type": content_type,
        "ETag": current,
        "Last-Modified": http_date(modified),
        "Cache-Control": NO_CACHE,
    }
    return web.Response(body=data, headers=headers)


def check_preconditions(request: web.Request, key: str, resource: Versioned) -> None:
    """H5: 412 when If-Match or If-Unmodified-Since says the client's copy is stale."""
    im = request.headers.get("If-Match")
    if im is not None:
        tags = etag_list(im)
        current = {tag_for(key, resource, fmt) for fmt in Format}
        if "*" not in tags and not current.intersection(tags):
            raise PreconditionFailed("If-Match: the resource has changed")
    ius = request.headers.get("If-Unmodified-Since")
    if ius is not None:
        since = parse_http_date(ius)
        if since is None or int(resource.modified) > since:
            raise PreconditionFailed("If-Unmodified-Since: the resource has changed")


def wait_expired(request: web.Request, what: str) -> ServiceUnavailable:
    """A9: 503 + Retry-After: 0, or 500 in the compatibility mode for older clients."""
    status = request[STATE].config.expired_wait_status
    return ServiceUnavailable(f"{what} wait expired, retry", retry_after=0, status=status)


async def evented(request: web.Request, key: str, resource: Watched, fmt: Format) -> Watched:
    """H9-H11: hold a GET until When-None-Match / When-Modified-After both hold; the
    resource as it is then (``resource`` itself when the GET did not wait)."""
    wnm = request.headers.get("When-None-Match")
    wma = request.headers.get("When-Modified-After")
    if (wnm is None and wma is None) or request.method == "HEAD":
        return resource  # HEAD never waits (U11)
    tags = etag_list(wnm) if wnm is not None else []
    after = parse_http_date(wma) if wma is not None else None
    if wma is not None and after is None:
        raise restms.BadRequest("When-Modified-After is not an HTTP date")
    state = request[STATE]
    service, me = state.service, request[PRINCIPAL].name
    deadline = time.monotonic() + bounded(request, state.config.max_wait)
    with waiting(request, "evented"):
        while True:
            etag_ok = not tags or tag_for(key, resource, fmt) not in tags
            date_ok = after is None or int(resource.modified) > after
            if etag_ok and date_ok:
                return resource
            # 404 once deleted; shutdown ends the wait with a retriable 503, not a hang
            changed = await service.changed(me, resource, deadline - time.monotonic())
            if changed is None:
                check_credentials(request)
                raise wait_expired(request, "evented GET")
            resource = changed
