"""The live page at ``/``: a small browser client of the public RestMS API (docs/BROWSER.md).

Theory of operation. The page is four static files in ``gateway/admin/static/`` (HTML,
one JavaScript module, one style sheet, an icon), written by hand: no build step,
no third-party code, nothing fetched from elsewhere. Everything it does goes
through the same public API any client uses, in RestMS JSON: it lists and creates
feeds on the default domain, publishes, creates a pipe and joins it, reads the pipe
as Server-Sent Events through ``fetch()`` (so a bearer token can be sent), and
acknowledges with DELETE. It is a client like any other, so it gets no privilege:
the requests it makes are authenticated and limited as everyone's are.

The files are read once, in a thread, when the app starts (:func:`page_context`),
and served from memory, each with a strong ``ETag`` (a digest of its bytes) and
``Cache-Control: no-cache``: a browser revalidates on every load and gets a
``304`` while the file is unchanged, so a new version of the gateway is picked
up at once without stale mixes of old HTML and new script.

The same module serves the analytics dashboard at ``/dashboard``
(docs/ANALYTICS.md, "The dashboard"): three more files (``dashboard.html``,
``dashboard.js``, ``dashboard.css``) under the same rules, whose script charts
``GET /analytics/...`` with the token the user pastes (shared with the live page
through ``sessionStorage``); only the data behind it needs a scope. Its charts are
drawn by uPlot, a third-party library vendored as released under
``static/vendor/uplot/`` (its license, version and digests in the README there) and
served like the rest: the dashboard loads nothing from elsewhere and works offline.

The same module serves the API's description (docs/API.md): ``/openapi.json``, the
OpenAPI file ``openapi/openapi.yaml`` converted to JSON once, in a thread, on the
first request for it (:class:`Description`; parsing 2,500 lines of YAML costs a
noticeable fraction of a second that a gateway nobody asks should not pay at start),
then served from memory; and the page at ``/api`` (``api.html``, ``api.js``,
``api.css``) whose script lists every operation from that JSON.

The page itself needs no credentials (its paths are in
:data:`gateway.auth.authn.PUBLIC`): a user on another machine must be able to load it
to paste a token into it. Every page response carries a strict
``Content-Security-Policy``: scripts, styles, images and connections from this
origin only, no inline script or style, no ``eval``, no plugins, no framing, no
form posts and no ``<base>``. The script never writes HTML from data: message
contents and server replies are shown with ``textContent``.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import orjson
import yaml
from aiohttp import web

from restms.httpdates import etag_list

STATIC = Path(__file__).resolve().parent / "static"
SPEC = Path(__file__).resolve().parents[2] / "openapi" / "openapi.yaml"
INDEX = "/"
DASHBOARD = "/dashboard"
API_PAGE = "/api"
API_SPEC = "/openapi.json"
SPEC_NAME = "openapi.json"  # not a file in STATIC: made from SPEC when the page loads
STATIC_PREFIX = "/static/"

# File name -> Content-Type. Only these files are served; the page links each one.
FILES: Mapping[str, str] = {
    "index.html": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
    "icon.svg": "image/svg+xml",
    "dashboard.html": "text/html; charset=utf-8",
    "dashboard.js": "text/javascript; charset=utf-8",
    "dashboard.css": "text/css; charset=utf-8",
    "api.html": "text/html; charset=utf-8",
    "api.js": "text/javascript; charset=utf-8",
    "api.css": "text/css; charset=utf-8",
    # Third-party, unchanged as released (static/vendor/uplot/README.md).
    "vendor/uplot/uPlot.esm.js": "text/javascript; charset=utf-8",
    "vendor/uplot/uPlot.min.css": "text/css; charset=utf-8",
    "vendor/uplot/LICENSE": "text/plain; charset=utf-8",
}
# Path -> file name: the routes (all public, see gateway.auth.authn.PUBLIC).
ROUTES: Mapping[str, str] = {
    INDEX: "index.html",
    DASHBOARD: "dashboard.html",
    API_PAGE: "api.html",
    API_SPEC: SPEC_NAME,
    **{STATIC_PREFIX + name: name for name in FILES if not name.endswith(".html")},
}
PATHS = frozenset(ROUTES)

CONTENT_SECURITY_POLICY = "; ".join(
    (
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self'",
        "connect-src 'self'",
        "manifest-src 'none'",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
    )
)
HEADERS: Mapping[str, str] = {
    "Cache-Control": "no-cache",
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Opener-Policy": "same-origin",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Asset:
    """One file of the page, as served: its bytes, type and validator."""

    body: bytes
    content_type: str
    etag: str

    def __post_init__(self) -> None:
        if not self.body:
            raise ValueError("a page file is empty")

    @classmethod
    def of(cls, body: bytes, content_type: str) -> Asset:
        digest = hashlib.blake2b(body, digest_size=12).hexdigest()
        return cls(body=body, content_type=content_type, etag=f'"{digest}"')


@dataclass(frozen=True, slots=True, kw_only=True)
class Page:
    """Every file of the page, by name."""

    files: Mapping[str, Asset]

    @classmethod
    def load(cls, directory: Path = STATIC) -> Page:
        """Read the files (blocking: call it in a thread)."""
        return cls(
            files={
                name: Asset.of((directory / name).read_bytes(), content_type)
                for name, content_type in FILES.items()
            }
        )


def spec_json(path: Path) -> bytes:
    """The OpenAPI file as JSON (blocking). YAML is the source: it is the one people edit."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's is ten times faster
    document = yaml.load(path.read_text(encoding="utf-8"), Loader=loader)  # noqa: S506 (safe)
    if not isinstance(document, dict) or "openapi" not in document:
        raise ValueError(f"{path} is not an OpenAPI document")
    return orjson.dumps(document)


class Description:
    """``/openapi.json``: converted once, on first use, in a thread; then from memory."""

    def __init__(self, path: Path = SPEC) -> None:
        self.path = path
        self._asset: Asset | None = None
        self._lock = asyncio.Lock()  # concurrent first requests share one conversion

    async def asset(self) -> Asset:
        if self._asset is None:
            async with self._lock:
                if self._asset is None:
                    body = await asyncio.to_thread(spec_json, self.path)
                    self._asset = Asset.of(body, "application/json")
        return self._asset


PAGE = web.AppKey("page", Page)
DESCRIPTION = web.AppKey("description", Description)


async def page_context(app: web.Application) -> AsyncIterator[None]:
    """Read the page's files once, off the loop, before the first request."""
    app[PAGE] = await asyncio.to_thread(Page.load)
    yield


def add_routes(app: web.Application) -> None:
    for path in ROUTES:
        app.router.add_get(path, serve)
    app[DESCRIPTION] = Description()
    app.cleanup_ctx.append(page_context)


async def serve(request: web.Request) -> web.Response:
    """A page file from memory; ``304`` when the client's copy is current."""
    name = ROUTES[request.path]
    if name == SPEC_NAME:
        file = await request.app[DESCRIPTION].asset()
    else:
        file = request.app[PAGE].files[name]
    headers = {**HEADERS, "ETag": file.etag}
    tags = etag_list(request.headers.get("If-None-Match"))
    if "*" in tags or file.etag in tags:
        return web.Response(status=304, headers=headers)
    headers["Content-Type"] = file.content_type
    return web.Response(body=file.body, headers=headers)
