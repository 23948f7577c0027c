"""How the live page's files are served (``gateway/admin/page.py``); the page itself is
tested in a browser in ``tests/browser/``.

Decided behaviour under test:

* ``/`` and the three files under ``/static/`` answer with their exact bytes, the
  right ``Content-Type``, ``Cache-Control: no-cache``, a strong ``ETag`` (``304`` on
  ``If-None-Match``), ``nosniff`` and a strict Content-Security-Policy.
* They need no credentials, even where the loopback guest is off, so a user can
  load the page to paste a token; the API behind it still does.
* Other methods get ``405`` with ``Allow``; other files under ``/static/`` do not
  exist.
* The page has no inline script or style, and loads nothing from elsewhere.
* ``/openapi.json`` is ``openapi/openapi.yaml`` as JSON, with the page's validator and
  no credentials; the API page at ``/api`` obeys the same rules as the live page and
  writes no HTML from the description.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import orjson
import pytest
import yaml

from gateway.admin.page import CONTENT_SECURITY_POLICY, Description
from tests.conftest import Gateway, MakeGateway

pytestmark = pytest.mark.app

ROOT = Path(__file__).resolve().parents[2]
STATIC = ROOT / "gateway" / "admin" / "static"
FILES = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/static/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/static/style.css": ("style.css", "text/css; charset=utf-8"),
    "/static/icon.svg": ("icon.svg", "image/svg+xml"),
    "/api": ("api.html", "text/html; charset=utf-8"),
    "/static/api.js": ("api.js", "text/javascript; charset=utf-8"),
    "/static/api.css": ("api.css", "text/css; charset=utf-8"),
}
SPEC = ROOT / "openapi" / "openapi.yaml"


@pytest.mark.parametrize("path", list(FILES))
async def test_each_file_is_served_with_its_type_validator_and_policy(
    gw: Gateway, path: str
) -> None:
    name, content_type = FILES[path]
    async with gw.http.get(path) as r:
        assert r.status == 200
        assert r.headers["Content-Type"] == content_type
        assert await r.read() == await asyncio.to_thread((STATIC / name).read_bytes)
        assert r.headers["Cache-Control"] == "no-cache"
        assert r.headers["X-Content-Type-Options"] == "nosniff"
        assert r.headers["Content-Security-Policy"] == CONTENT_SECURITY_POLICY
        tag = r.headers["ETag"]
        coded = "Content-Encoding" in r.headers  # then the tag's weak form (other bytes)
    assert re.fullmatch(r'(W/)?"[0-9a-f]{24}"', tag)
    assert tag.startswith("W/") == coded, tag
    async with gw.http.get(path, headers={"If-None-Match": f'"other", {tag}'}) as r:
        assert r.status == 304
        assert r.headers["ETag"] == tag
        assert await r.read() == b""
    async with gw.http.get(path, headers={"If-None-Match": '"other"'}) as r:
        assert r.status == 200
    async with gw.http.head(path) as r:
        assert r.status == 200
        assert r.headers["Content-Type"] == content_type


def test_the_policy_allows_this_origin_only() -> None:
    directives = dict(d.split(" ", 1) for d in CONTENT_SECURITY_POLICY.split("; "))
    assert directives["default-src"] == "'none'"
    for name in ("script-src", "style-src", "img-src", "connect-src"):
        assert directives[name] == "'self'", name
    for name in ("base-uri", "form-action", "frame-ancestors"):
        assert directives[name] == "'none'", name
    assert "unsafe" not in CONTENT_SECURITY_POLICY
    spec = yaml.safe_load((ROOT / "openapi" / "openapi.yaml").read_text(encoding="utf-8"))
    described = spec["components"]["headers"]["PageContentSecurityPolicy"]["schema"]["const"]
    assert described == CONTENT_SECURITY_POLICY


@pytest.mark.parametrize(
    ("page", "script", "links"),
    [
        ("index.html", "app.js", ()),
        ("api.html", "api.js", ("/openapi.json", "/static/api.css")),
    ],
)
def test_the_page_has_no_inline_code_and_nothing_from_elsewhere(
    page: str, script: str, links: tuple[str, ...]
) -> None:
    html = (STATIC / page).read_text(encoding="utf-8")
    module = f'<script type="module" src="/static/{script}">'
    assert re.findall(r"<script\b[^>]*>", html) == [module]
    assert "<style" not in html
    assert not re.search(r"\son[a-z]+=|\sstyle=|javascript:", html)
    references = re.findall(r'(?:src|href)="([^"#]+)"', html)
    own = ["/static/icon.svg", "/static/style.css", f"/static/{script}", *links]
    assert sorted(set(references)) == sorted(own)
    code = (STATIC / script).read_text(encoding="utf-8")
    for unsafe in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
        assert unsafe not in code, unsafe


async def test_the_page_needs_no_credentials_but_the_api_does(make_gateway: MakeGateway) -> None:
    gw = await make_gateway(anonymous=False)
    for path in [*FILES, "/openapi.json"]:
        async with gw.http.get(path) as r:
            assert r.status == 200, path
    async with gw.http.get("/restms/domain/default") as r:
        assert r.status == 401
    async with gw.http.get("/static/other.js") as r:
        assert r.status == 401  # not a page file: the usual rules apply
        assert r.content_type == "text/plain"


async def test_other_methods_and_files_are_refused_as_text(gw: Gateway) -> None:
    async with gw.http.post("/", data=b"x") as r:
        assert r.status == 405
        assert r.headers["Allow"] == "GET,HEAD"
        assert r.content_type == "text/plain"
    traversal = "/static/../gateway/admin/page.py"
    for path in ("/static/", "/static/index.html", traversal, "/index.html"):
        async with gw.http.get(path) as r:
            assert r.status == 404, path
            assert r.content_type == "text/plain"


async def test_the_description_is_served_as_json(make_gateway: MakeGateway) -> None:
    gw = await make_gateway(anonymous=False)
    expected = yaml.safe_load(await asyncio.to_thread(SPEC.read_text, encoding="utf-8"))
    async with gw.http.get("/openapi.json") as r:
        assert r.status == 200
        assert r.headers["Content-Type"] == "application/json"
        assert r.headers["Cache-Control"] == "no-cache"
        assert orjson.loads(await r.read()) == expected
        tag = r.headers["ETag"]
    assert expected["openapi"].startswith("3.1.")
    async with gw.http.get("/openapi.json", headers={"If-None-Match": tag}) as r:
        assert r.status == 304
    async with gw.http.head("/openapi.json") as r:
        assert r.status == 200


async def test_the_description_is_read_once(tmp_path: Path) -> None:
    spec = tmp_path / "openapi.yaml"
    spec.write_text("openapi: 3.1.0\ninfo: {title: t, version: '1'}\npaths: {}\n")
    description = Description(spec)
    first, second = await asyncio.gather(description.asset(), description.asset())
    assert first is second
    assert orjson.loads(first.body)["openapi"] == "3.1.0"
    spec.write_text("- not read again\n")
    assert await description.asset() is first
    with pytest.raises(ValueError, match="not an OpenAPI document"):
        await Description(spec).asset()
