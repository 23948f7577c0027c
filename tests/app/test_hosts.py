"""The hosts a live gateway serves, and the origin of its URIs (gateway/server/hosts.py).

Decided behaviour under test:

* With neither ``public_url`` nor ``allowed_hosts``, only the gateway's own addresses
  are served (the address and port connected to, ``localhost`` on loopback); any
  other ``Host``, ``evil.example:666`` among them, is ``421`` and is never reflected.
* ``allowed_hosts`` admits its patterns, and URIs then name the request's host.
* ``public_url`` is the origin of every URI: ``Location``, hrefs in documents, the
  built-in issuer's ``iss``, whatever host the request named.
* A trusted proxy's ``X-Forwarded-Host`` is held to the same hosts.
"""

from __future__ import annotations

import json
import re

import aiohttp
import pytest
import yarl

from tests.app.jsonapi import DOMAIN, HJ, body
from tests.conftest import Gateway, MakeGateway

pytestmark = pytest.mark.app

EVIL = "evil.example:666"


async def call(
    gw: Gateway, method: str, path: str, host: str, **headers: str
) -> tuple[int, str, aiohttp.typedefs.LooseHeaders]:
    """One request naming ``host``; its status, body text and headers."""
    data = body(pipe=[{}]) if method == "POST" else None
    async with gw.http.request(
        method, path, data=data, headers={**HJ, "Host": host, **headers}
    ) as r:
        return r.status, await r.text(), r.headers


def port(gw: Gateway) -> int:
    found = yarl.URL(gw.url).port
    assert found is not None
    return found


def hrefs(text: str) -> list[str]:
    """Every absolute URI of ours in a JSON document."""
    return [h for h in re.findall(r'"href":\s*"([^"]+)"', text) if "restms.org" not in h]


async def test_a_host_not_served_is_421_and_never_reflected(gw: Gateway) -> None:
    for method, path in (("GET", DOMAIN), ("POST", DOMAIN), ("GET", "/healthz")):
        status, text, headers = await call(gw, method, path, EVIL)
        assert status == 421, (method, path, text)
        assert headers["Content-Type"].startswith("text/plain")
        assert text == f"Host {EVIL!r} is not served here\n"
        assert "Location" not in headers


async def test_the_gateways_own_addresses_are_served_by_default(gw: Gateway) -> None:
    own = port(gw)
    for host in (f"127.0.0.1:{own}", f"localhost:{own}", f"LOCALHOST.:{own}"):
        status, text, headers = await call(gw, "POST", DOMAIN, host)
        assert status == 201, (host, text)
        assert headers["Location"].startswith(f"http://{host}/restms/resource/")
    for host in (f"localhost:{own + 1}", "localhost", "127.0.0.1", f"gw.example.com:{own}"):
        status, text, _ = await call(gw, "GET", DOMAIN, host)
        assert status == 421, (host, text)


async def test_a_host_that_is_no_host_is_400(gw: Gateway) -> None:
    status, text, _ = await call(gw, "GET", DOMAIN, "a/b")
    assert status == 400
    assert text == "Host: 'a/b' is not a host[:port]\n"


async def test_allowed_hosts_admits_its_patterns(make_gateway: MakeGateway) -> None:
    gw = await make_gateway(allowed_hosts="gw.example.com, *.apps.example:8443")
    for host in ("gw.example.com", "gw.example.com:9000", "a.apps.example:8443"):
        status, text, headers = await call(gw, "POST", DOMAIN, host)
        assert status == 201, (host, text)
        assert headers["Location"].startswith(f"http://{host}/restms/resource/")
        status, text, _ = await call(gw, "GET", DOMAIN, host)
        assert status == 200
        assert hrefs(text)
        assert all(h.startswith(f"http://{host}/") for h in hrefs(text))
    for host in (EVIL, "apps.example:8443", "a.apps.example:9000", "evilgw.example.com"):
        status, text, _ = await call(gw, "GET", DOMAIN, host)
        assert status == 421, (host, text)
    status, _, _ = await call(gw, "GET", DOMAIN, f"127.0.0.1:{port(gw)}")
    assert status == 200  # its own address still served


async def test_public_url_is_the_origin_of_every_uri(make_gateway: MakeGateway) -> None:
    public = "https://gw.example.com"
    gw = await make_gateway(public_url=public)
    for host in (f"127.0.0.1:{port(gw)}", "gw.example.com", "gw.example.com:8443"):
        status, text, headers = await call(gw, "POST", DOMAIN, host)
        assert status == 201, (host, text)
        assert headers["Location"].startswith(f"{public}/restms/resource/")
        pipe = yarl.URL(headers["Location"]).path
        for path in (DOMAIN, pipe):
            status, text, _ = await call(gw, "GET", path, host)
            assert status == 200, text
            assert hrefs(text)
            assert all(h.startswith(f"{public}/") for h in hrefs(text)), text
    status, text, _ = await call(gw, "GET", DOMAIN, EVIL)
    assert status == 421
    async with gw.http.get("/.well-known/oauth-authorization-server") as r:
        metadata = json.loads(await r.text())
    assert metadata["issuer"] == public
    assert metadata["token_endpoint"] == f"{public}/oauth/token"


async def test_a_trusted_proxys_forwarded_host_is_held_to_the_same_hosts(
    make_gateway: MakeGateway,
) -> None:
    gw = await make_gateway(trusted_proxies="127.0.0.1", allowed_hosts="gw.example.com")
    own = f"127.0.0.1:{port(gw)}"
    relayed = {"X-Forwarded-Proto": "https"}
    status, text, headers = await call(
        gw, "POST", DOMAIN, own, **relayed, **{"X-Forwarded-Host": "gw.example.com"}
    )
    assert status == 201, text
    assert headers["Location"].startswith("https://gw.example.com/restms/resource/")
    status, text, headers = await call(
        gw, "POST", DOMAIN, own, **relayed, **{"X-Forwarded-Host": EVIL}
    )
    assert status == 421, text
    assert EVIL not in headers.get("Location", "")


async def test_allowed_hosts_star_serves_and_reflects_any_host(make_gateway: MakeGateway) -> None:
    gw = await make_gateway(allowed_hosts="*")
    status, text, headers = await call(gw, "POST", DOMAIN, EVIL)
    assert status == 201, text
    assert headers["Location"].startswith(f"http://{EVIL}/restms/resource/")
