"""Pages on other origins (``gateway/server/cors.py``, docs/BROWSER.md): preflight
answers, the headers of replies, the credentials rule and the WebSocket ``Origin``
check, over plain HTTP against a real gateway on 127.0.0.1. A real browser obeying
them is tested in ``tests/browser/test_cors.py``.

Decided behaviour under test:

* No origin is allowed by default: a preflight is ``403`` with a ``text/plain``
  reason, replies carry no CORS header, and a WebSocket upgrade from another origin is
  ``403``; the gateway's own origin and clients that send no ``Origin`` are served.
* ``cors_origins`` lists exact origins and patterns (``https://*.example.com``,
  ``http://localhost:*``) or ``*``; a preflight from one on any path (RestMS, OAuth,
  admin, unknown) is ``204`` without credentials, with the methods, the requested
  headers and ``Access-Control-Max-Age``; every reply to it, errors and streams
  included, names it in ``Access-Control-Allow-Origin`` and exposes the headers clients
  read. ``OPTIONS`` that is no preflight stays ``405`` (U11).
* ``cors_credentials`` adds ``Access-Control-Allow-Credentials: true`` and is refused
  with ``*``. ``websocket_origins`` overrides which pages may open sockets.
"""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest

from gateway.server.config import ConfigError, load
from gateway.server.cors import Origins
from main import _parser
from tests.app.jsonapi import AJ, DOMAIN, HJ, body, new_pipe
from tests.conftest import Gateway, MakeGateway

pytestmark = pytest.mark.app

APP = "http://app.example:3000"
OTHER = "http://evil.example:3000"
ORIGINS = f"{APP}, https://*.example.com http://localhost:*"
FEED = "/restms/feed/default"
EXPOSED = {
    "Location",
    "ETag",
    "Last-Modified",
    "Retry-After",
    "RestMS-Earliest-Position",
    "Idempotent-Replayed",
    "X-Request-ID",
}
ROUTES = [
    DOMAIN,
    FEED,
    "/restms/resource/nosuch",
    "/oauth/token",
    "/.well-known/oauth-authorization-server",
    "/admin/pipes",
    "/admin/clients",
    "/admin/stats",
    "/admin/bridges",
    "/metrics",
    "/openapi.json",
    "/analytics/summary",
    "/healthz",
    "/nothing/here",
]


def preflight_headers(origin: str, method: str = "POST", asked: str = "") -> dict[str, str]:
    headers = {"Origin": origin, "Access-Control-Request-Method": method}
    if asked:
        headers["Access-Control-Request-Headers"] = asked
    return headers


def split(value: str) -> set[str]:
    return {part.strip() for part in value.split(",") if part.strip()}


# ---------------------------------------------------------------- nothing by default
async def test_by_default_a_preflight_is_refused_with_a_reason(gw: Gateway) -> None:
    async with gw.http.options(FEED, headers=preflight_headers(APP)) as r:
        assert r.status == 403
        assert r.content_type == "text/plain"
        assert APP in await r.text()
        assert "Access-Control-Allow-Origin" not in r.headers


async def test_by_default_replies_carry_no_cors_header(gw: Gateway) -> None:
    async with gw.http.get(DOMAIN, headers={"Origin": APP, **AJ}) as r:
        assert r.status == 200
        assert not [h for h in r.headers if h.lower().startswith("access-control-")]
        assert "Origin" not in r.headers.getall("Vary", [])


async def test_options_that_is_no_preflight_stays_405(make_gateway: MakeGateway) -> None:
    gw = await make_gateway(cors_origins=APP)
    async with gw.http.options(FEED, headers={"Origin": APP}) as r:
        assert r.status == 405
        assert "GET" in r.headers["Allow"]


# ---------------------------------------------------------------- preflight
@pytest.mark.parametrize("path", ROUTES)
async def test_preflight_is_answered_on_every_route_without_credentials(
    make_gateway: MakeGateway, path: str
) -> None:
    # anonymous off: a request without credentials would be 401, a preflight is not
    gw = await make_gateway(cors_origins=ORIGINS, anonymous=False, cors_max_age=120)
    asked = "authorization, content-type, idempotency-key, if-match"
    async with gw.http.options(path, headers=preflight_headers(APP, "DELETE", asked)) as r:
        assert r.status == 204, await r.text()
        assert r.headers["Access-Control-Allow-Origin"] == APP
        assert {"GET", "HEAD", "POST", "PUT", "DELETE"} <= split(
            r.headers["Access-Control-Allow-Methods"]
        )
        assert split(r.headers["Access-Control-Allow-Headers"]) == split(asked)
        assert r.headers["Access-Control-Max-Age"] == "120"
        assert "Origin" in r.headers.getall("Vary")
        assert "Access-Control-Allow-Credentials" not in r.headers


@pytest.mark.parametrize(
    ("origin", "allowed"),
    [
        (APP, True),
        ("http://app.example:3001", False),  # another port
        ("https://app.example:3000", False),  # another scheme
        ("https://a.example.com", True),
        ("https://a.b.example.com", True),
        ("https://example.com", False),  # the pattern is for names under it
        ("https://evilexample.com", False),
        ("https://a.example.com.evil.net", False),
        ("http://a.example.com", False),
        ("http://localhost:5173", True),
        ("http://localhost", True),
        ("http://localhost.evil.net:80", False),
        ("null", False),
        (OTHER, False),
    ],
)
async def test_exact_origins_and_patterns(
    make_gateway: MakeGateway, origin: str, allowed: bool
) -> None:
    gw = await make_gateway(cors_origins=ORIGINS)
    async with gw.http.options(FEED, headers=preflight_headers(origin)) as r:
        assert r.status == (204 if allowed else 403)
        assert r.headers.get("Access-Control-Allow-Origin") == (origin if allowed else None)


async def test_a_strange_requested_header_list_is_not_echoed(make_gateway: MakeGateway) -> None:
    gw = await make_gateway(cors_origins=APP)
    asked = "content-type, bad header\u00e9"
    async with gw.http.options(FEED, headers=preflight_headers(APP, "POST", asked)) as r:
        assert r.status == 204
        assert "Access-Control-Allow-Headers" not in r.headers


async def test_private_network_access_is_granted_to_allowed_origins(
    make_gateway: MakeGateway,
) -> None:
    gw = await make_gateway(cors_origins=APP)
    ask = {"Access-Control-Request-Private-Network": "true"}
    async with gw.http.options(FEED, headers={**preflight_headers(APP), **ask}) as r:
        assert r.headers["Access-Control-Allow-Private-Network"] == "true"
    async with gw.http.options(FEED, headers={**preflight_headers(OTHER), **ask}) as r:
        assert r.status == 403
        assert "Access-Control-Allow-Private-Network" not in r.headers


# ---------------------------------------------------------------- replies
async def test_a_publish_reply_names_the_origin_and_exposes_headers(
    make_gateway: MakeGateway,
) -> None:
    gw = await make_gateway(cors_origins=ORIGINS)
    message = {"address": "a", "content": [{"type": "text/plain", "value": "x"}]}
    headers = {**HJ, "Origin": APP}
    async with gw.http.post(FEED, data=body(message=[message]), headers=headers) as r:
        assert r.status == 200
        assert r.headers["Access-Control-Allow-Origin"] == APP
        assert split(r.headers["Access-Control-Expose-Headers"]) >= EXPOSED
        assert "Origin" in r.headers.getall("Vary")
    async with gw.http.post(
        FEED, data=body(message=[message]), headers={**HJ, "Origin": OTHER}
    ) as r:
        assert r.status == 200  # served: the browser, not the gateway, hides the reply
        assert "Access-Control-Allow-Origin" not in r.headers
        assert "Origin" in r.headers.getall("Vary")


async def test_errors_carry_the_headers_too(make_gateway: MakeGateway) -> None:
    gw = await make_gateway(cors_origins=APP, anonymous=False)
    async with gw.http.get(DOMAIN, headers={"Origin": APP}) as r:
        assert r.status == 401  # the page can read why, and the challenge
        assert r.headers["Access-Control-Allow-Origin"] == APP
        assert "WWW-Authenticate" in split(r.headers["Access-Control-Expose-Headers"])
    async with gw.http.get("/restms/resource/nosuch", headers={"Origin": APP}) as r:
        assert r.status in (401, 404)
        assert r.headers["Access-Control-Allow-Origin"] == APP


async def test_a_server_sent_event_stream_carries_the_headers(make_gateway: MakeGateway) -> None:
    gw = await make_gateway(cors_origins=APP)
    pipe = await new_pipe(gw)
    headers = {"Origin": APP, "Accept": "text/event-stream"}
    async with gw.http.get(pipe["uri"], headers=headers) as r:
        assert r.status == 200
        assert r.content_type == "text/event-stream"
        assert r.headers["Access-Control-Allow-Origin"] == APP


async def test_any_origin_is_star_and_never_with_credentials(make_gateway: MakeGateway) -> None:
    gw = await make_gateway(cors_origins="*")
    async with gw.http.options(FEED, headers=preflight_headers(OTHER)) as r:
        assert r.status == 204
        assert r.headers["Access-Control-Allow-Origin"] == "*"
        assert "Access-Control-Allow-Credentials" not in r.headers
    async with gw.http.get(DOMAIN, headers={"Origin": OTHER, **AJ}) as r:
        assert r.headers["Access-Control-Allow-Origin"] == "*"
        assert "Origin" not in r.headers.getall("Vary", [])
    with pytest.raises(ConfigError, match="cors_credentials cannot be combined"):
        load(env={"RESTMS_CORS_ORIGINS": f"{APP},*", "RESTMS_CORS_CREDENTIALS": "true"})


async def test_credentials_are_allowed_for_listed_origins_only(make_gateway: MakeGateway) -> None:
    gw = await make_gateway(cors_origins=APP, cors_credentials=True)
    async with gw.http.options(FEED, headers=preflight_headers(APP)) as r:
        assert r.headers["Access-Control-Allow-Origin"] == APP
        assert r.headers["Access-Control-Allow-Credentials"] == "true"
    async with gw.http.get(DOMAIN, headers={"Origin": APP, **AJ}) as r:
        assert r.headers["Access-Control-Allow-Credentials"] == "true"
    async with gw.http.get(DOMAIN, headers={"Origin": OTHER, **AJ}) as r:
        assert "Access-Control-Allow-Credentials" not in r.headers


# ---------------------------------------------------------------- WebSocket
async def upgrade_status(gw: Gateway, uri: str, origin: str | None) -> int:
    """101 when the socket opened, else the refusal's status."""
    try:
        ws = await gw.http.ws_connect(uri, protocols=("restms.v1",), origin=origin)
    except aiohttp.WSServerHandshakeError as exc:
        return exc.status
    await ws.close()
    return 101


async def test_websocket_from_another_origin_is_refused_by_default(gw: Gateway) -> None:
    pipe = await new_pipe(gw)
    assert await upgrade_status(gw, pipe["uri"], OTHER) == 403
    assert await upgrade_status(gw, pipe["uri"], None) == 101  # not a browser
    assert await upgrade_status(gw, pipe["uri"], gw.url) == 101  # the gateway's own pages
    async with gw.http.get(pipe["uri"], headers={"Origin": OTHER, "Upgrade": "websocket"}) as r:
        assert r.status == 403
        assert "websocket_origins" in await r.text()


async def test_websocket_follows_cors_origins(make_gateway: MakeGateway) -> None:
    gw = await make_gateway(cors_origins=ORIGINS)
    pipe = await new_pipe(gw)
    assert await upgrade_status(gw, pipe["uri"], APP) == 101
    assert await upgrade_status(gw, pipe["uri"], "https://a.example.com") == 101
    assert await upgrade_status(gw, pipe["uri"], OTHER) == 403


async def test_websocket_origins_override_cors_origins(make_gateway: MakeGateway) -> None:
    gw = await make_gateway(cors_origins=APP, websocket_origins=OTHER)
    pipe = await new_pipe(gw)
    assert await upgrade_status(gw, pipe["uri"], OTHER) == 101
    assert await upgrade_status(gw, pipe["uri"], APP) == 403
    anyone = await make_gateway(websocket_origins="*")
    pipe = await new_pipe(anyone)
    assert await upgrade_status(anyone, pipe["uri"], OTHER) == 101


@pytest.mark.parametrize("public_url", ["https://gw.example.com", "https://gw.example.com:443"])
async def test_the_public_url_is_the_gateways_own_origin(
    make_gateway: MakeGateway, public_url: str
) -> None:
    """Browsers leave the scheme's own port out of ``Origin``: before, with
    ``public_url = "https://gw.example.com:443"`` the gateway's own live page, whose
    Origin is ``https://gw.example.com``, was refused its WebSocket (403)."""
    gw = await make_gateway(public_url=public_url)
    pipe = await new_pipe(gw)
    path = "/" + pipe["uri"].split("/", 3)[3]
    headers = {"Host": "gw.example.com"}
    ws = await gw.http.ws_connect(
        path, protocols=("restms.v1",), origin="https://gw.example.com", headers=headers
    )
    await ws.close()


# ---------------------------------------------------------------- configuration
def test_origins_come_from_toml_environment_and_flag(tmp_path: Path) -> None:
    toml = tmp_path / "gw.toml"
    toml.write_text('cors_origins = ["https://a.example", "https://*.b.example"]\n')
    config = load(str(toml), env={})
    assert config.cors.origins.allows("https://a.example")
    assert config.cors.origins.allows("https://x.b.example")
    config = load(env={"RESTMS_CORS_ORIGINS": "https://a.example,https://c.example:8443"})
    assert config.cors.origins.allows("https://c.example:8443")
    assert not config.cors.origins.allows("https://c.example")
    args = _parser().parse_args(["serve", "--cors-origins", "https://d.example"])
    assert args.cors_origins == "https://d.example"


@pytest.mark.parametrize(
    "entry",
    [
        "app.example",  # no scheme
        "ftp://app.example",
        "https://app.example/path",
        "https://a*.example.com",
        "https://*",
        "https://user@app.example",
        "https://app.example:99999",
        "null",
        "https://[zz]",  # not an address
    ],
)
def test_a_bad_origin_is_a_configuration_error(entry: str) -> None:
    with pytest.raises(ConfigError, match="cors_origins"):
        load(env={"RESTMS_CORS_ORIGINS": entry})


@pytest.mark.parametrize(
    ("entry", "ascii_form"),
    [
        ("https://bücher.example", "https://xn--bcher-kva.example"),
        ("https://*.bücher.example:8443", "https://*.xn--bcher-kva.example:8443"),
    ],
)
def test_an_international_name_is_refused_with_its_ascii_form(entry: str, ascii_form: str) -> None:
    """Browsers send a host's ASCII form in ``Origin``; before, such an entry was refused
    with "a * may stand only for leftmost labels or the port", which it has none of."""
    with pytest.raises(ConfigError, match="cors_origins") as refused:
        load(env={"RESTMS_CORS_ORIGINS": entry})
    assert ascii_form in str(refused.value)
    assert "a * may stand" not in str(refused.value)
    assert Origins(ascii_form).allows(ascii_form.replace("*", "shop"))


async def test_a_long_requested_header_list_is_echoed_in_whole_names(
    make_gateway: MakeGateway,
) -> None:
    """A list longer than the gateway echoes loses its last names, never part of one:
    before, the cut could leave half a name (``x-h2`` of ``x-h27``) in the reply."""
    gw = await make_gateway(cors_origins=APP)
    names = [f"x-header-{i}" for i in range(300)]  # about 3,800 characters
    asked = ", ".join(names)
    async with gw.http.options(FEED, headers=preflight_headers(APP, "PUT", asked)) as r:
        assert r.status == 204
        echoed = r.headers["Access-Control-Allow-Headers"].split(", ")
    assert echoed == names[: len(echoed)]
    assert 100 < len(echoed) < 300


def test_the_scheme_default_port_is_the_origin_without_port() -> None:
    assert Origins("https://app.example:443").allows("https://app.example")
    assert Origins("HTTP://App.Example").allows("http://app.example")
