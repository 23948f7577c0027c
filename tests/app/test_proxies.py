"""A trusted reverse proxy's X-Forwarded-* headers, on a live gateway (gateway/server/proxies.py).

The proxy here is the test client on 127.0.0.1: trusted when ``trusted_proxies``
names that address, untrusted when it names another.
"""

from __future__ import annotations

import asyncio
import base64

from tests.app.oauth import DOMAIN, As, clients, token
from tests.conftest import MakeGateway

ISS = "https://gw.example.com"
RELAYED = {
    "X-Forwarded-For": "192.0.2.7",
    "X-Forwarded-Proto": "https",
    "X-Forwarded-Host": "gw.example.com:8443",
}


async def _alice(make_gateway: MakeGateway, trusted: str, allowed: str = "gw.example.com") -> As:
    configured, secrets = await clients(alice="restms:read restms:publish restms:subscribe")
    gw = await make_gateway(
        clients=configured, oauth_issuer=ISS, trusted_proxies=trusted, allowed_hosts=allowed
    )
    return As.bearer(gw, await token(gw, "alice", secrets["alice"]))


async def test_uris_name_the_scheme_and_host_the_trusted_proxy_saw(
    make_gateway: MakeGateway,
) -> None:
    alice = await _alice(make_gateway, "127.0.0.1")
    status, _, headers = await alice.call("POST", DOMAIN, {"pipe": [{}]}, **RELAYED)
    assert status == 201
    pipe = headers["Location"]
    assert pipe.startswith("https://gw.example.com:8443/restms/resource/"), pipe
    path = pipe.removeprefix("https://gw.example.com:8443")
    status, document, _ = await alice.call("GET", path, **RELAYED)
    assert status == 200
    join = document["restms"]["pipe"][0]["join"][0]["href"]
    assert join.startswith("https://gw.example.com:8443/restms/resource/"), join
    # The same pipe asked for directly: the gateway's own address again.
    _, direct, _ = await alice.call("GET", path)
    assert direct["restms"]["pipe"][0]["join"][0]["href"].startswith(alice.gw.url)


async def test_an_untrusted_peer_cannot_claim_a_scheme_host_or_address(
    make_gateway: MakeGateway,
) -> None:
    alice = await _alice(make_gateway, "192.0.2.1, 10.0.0.0/8")
    status, _, headers = await alice.call("POST", DOMAIN, {"pipe": [{}]}, **RELAYED)
    assert status == 201
    assert headers["Location"].startswith(f"{alice.gw.url}/restms/resource/")


async def test_limits_per_address_see_the_relayed_client(make_gateway: MakeGateway) -> None:
    """The secret-check limit (5 a second, 20 at once, per address) counts the client
    the proxy names: one client using it up leaves the next one its own."""
    alice = await _alice(make_gateway, "127.0.0.1")

    def wrong(name: str) -> As:  # each guess at another account: no account's bound is hit
        basic = base64.b64encode(f"{name}:nope".encode()).decode()
        return As(alice.gw, {"Authorization": f"Basic {basic}"})

    replies = await asyncio.gather(  # at once: the bucket has no time to refill
        *(
            wrong(f"user{i}").call("GET", DOMAIN, **{"X-Forwarded-For": "192.0.2.7"})
            for i in range(40)
        )
    )
    statuses = sorted(status for status, _, _ in replies)
    assert set(statuses) == {401, 429}, statuses  # checked until the burst is used up
    status, reply, _ = await wrong("other").call("GET", DOMAIN, **{"X-Forwarded-For": "192.0.2.8"})
    assert status == 401, reply  # another client: checked, not refused


async def test_a_relayed_request_without_credentials_is_not_the_guest(
    make_gateway: MakeGateway,
) -> None:
    alice = await _alice(make_gateway, "127.0.0.1")
    status, _, _ = await As(alice.gw, {}).call("GET", DOMAIN, **RELAYED)
    assert status == 401
    status, _, _ = await As(alice.gw, {}).call("GET", DOMAIN)
    assert status == 200  # the loopback guest, asking directly


async def test_a_forwarding_header_the_proxy_got_wrong_is_a_400_naming_it(
    make_gateway: MakeGateway,
) -> None:
    alice = await _alice(make_gateway, "127.0.0.1")
    for header, value, reason in (
        ("X-Forwarded-For", "192.0.2.7, unknown", "X-Forwarded-For: 'unknown' is not an address"),
        ("X-Forwarded-Proto", "ftp", "X-Forwarded-Proto: 'ftp' is neither http nor https"),
        ("X-Forwarded-Host", "a/b", "X-Forwarded-Host: 'a/b' is not a host[:port]"),
    ):
        status, text, headers = await alice.call("GET", DOMAIN, **{header: value})
        assert status == 400, (header, text)
        assert headers["Content-Type"].startswith("text/plain")
        assert text.strip() == reason
