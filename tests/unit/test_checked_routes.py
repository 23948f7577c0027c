"""The routes whose every path needs a principal, decided once at install (authn)."""

from __future__ import annotations

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from gateway.auth.authn import UNCHECKED, UNCHECKED_UNDER, checks_every_path
from gateway.server.app import build_app
from gateway.server.config import Config
from main import open_engine


async def _ok(request: web.Request) -> web.Response:
    return web.Response()


@pytest.mark.parametrize(
    ("template", "checked"),
    [
        ("/restms/feed/{name}", True),
        ("/admin/pipes", True),
        ("/admin/{name}", True),
        ("/metrics", False),  # unchecked itself
        ("/healthz", False),
        ("/health", False),  # a beginning of an unchecked path: in doubt
        ("/", False),
        ("/{path:.*}", False),
        ("/oauth/token", False),
        ("/oa{x}", False),  # may match /oauth/...
        ("/.well-known/{name}", False),
    ],
)
def test_the_fixed_beginning_decides(template: str, checked: bool) -> None:
    app = web.Application()
    route = app.router.add_route("GET", template, _ok)
    assert checks_every_path(route) is checked


PATHS = [
    *sorted(UNCHECKED),
    *(f"{under}x" for under in UNCHECKED_UNDER),
    "/oauth/token",
    "/.well-known/jwks.json",
    "/restms/feed/x",
    "/restms/%2E%2E/healthz",
    "/admin/pipes",
    "/nothing/here",
]


@pytest.mark.parametrize("path", PATHS)
async def test_no_unchecked_path_reaches_a_checked_route(path: str) -> None:
    config = Config(builtin_issuer=True)
    app = build_app(config, open_engine(config))
    for method in ("GET", "POST"):
        match = await app.router.resolve(make_mocked_request(method, path, app=app))
        unchecked = path in UNCHECKED or path.startswith(UNCHECKED_UNDER)
        assert not (unchecked and checks_every_path(match.route)), (method, path)
