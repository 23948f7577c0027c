"""Per-principal quotas over real HTTP: each principal's share of the staging budget,
feeds per principal (over a restart too)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from yarl import URL

from tests.app.oauth import DOMAIN, As, clients, token
from tests.conftest import Gateway, MakeGateway

pytestmark = pytest.mark.app

EVERYTHING = "restms:read restms:publish restms:subscribe"
FEED = "/restms/feed/default"


async def two_principals(make_gateway: MakeGateway, **overrides: Any) -> tuple[Gateway, As, As]:
    configured, secrets = await clients(alice=EVERYTHING, bob=EVERYTHING)
    gw = await make_gateway(clients=configured, oauth_issuer="http://gw.test", **overrides)
    alice, bob = await asyncio.gather(
        *(token(gw, name, secrets[name]) for name in ("alice", "bob"))
    )
    return gw, As.bearer(gw, alice), As.bearer(gw, bob)


async def stage(who: As, size: int) -> tuple[int, str, Any]:
    """POST ``size`` opaque bytes to the default feed as ``who``: status, text, headers."""
    headers = {**who.auth, "Content-Type": "application/octet-stream"}
    async with who.gw.http.post(FEED, data=b"s" * size, headers=headers) as r:
        return r.status, await r.text(), r.headers


# ---------------------------------------------------------------- staged contents
async def test_each_principal_has_its_share_of_the_staging_budget(
    make_gateway: MakeGateway,
) -> None:
    """One principal that keeps its share full gets 429 about its own quota; another
    can still stage, until the global ceiling answers 503 for everyone."""
    gw, alice, bob = await two_principals(
        make_gateway, max_staged_bytes=1500, max_staged_bytes_per_principal=1000
    )
    staged = []
    for _ in range(4):
        status, text, headers = await stage(alice, 250)
        assert status == 201, text
        staged.append(headers["Location"])
    for _ in range(10):  # it keeps asking
        status, text, headers = await stage(alice, 250)
        assert status == 429, text
        assert headers["Content-Type"].startswith("text/plain")
        assert headers["Retry-After"] == "5"
        assert "staging quota reached: 1000 bytes" in text
    status, text, _ = await stage(bob, 500)
    assert status == 201, text  # the other principal is unaffected
    status, text, headers = await stage(bob, 1)
    assert status == 503, text  # the global ceiling still holds
    assert "Retry-After" in headers
    # a staged content a message uses frees its bytes from its owner's share
    await alice.ok("POST", FEED, {"message": [{"content": [{"href": staged[0]}]}]})
    status, text, _ = await stage(alice, 250)
    assert status == 201, text
    assert gw.engine.census().staged_bytes == 1500


async def test_a_content_larger_than_a_share_is_413(make_gateway: MakeGateway) -> None:
    _, alice, _ = await two_principals(make_gateway, max_staged_bytes_per_principal=100)
    status, text, _ = await stage(alice, 101)
    assert status == 413, text
    assert "100 bytes at most" in text


# ---------------------------------------------------------------- feeds
async def test_feeds_per_principal_are_capped_and_counted_over_a_restart(
    make_gateway: MakeGateway,
) -> None:
    configured, secrets = await clients(alice=EVERYTHING, bob=EVERYTHING)

    async def start() -> tuple[Gateway, As, As]:
        gw = await make_gateway(
            clients=configured, oauth_issuer="http://gw.test", max_feeds_per_principal=2
        )
        alice, bob = [As.bearer(gw, await token(gw, n, secrets[n])) for n in ("alice", "bob")]
        return gw, alice, bob

    gw, alice, bob = await start()
    first = URL(await alice.feed("alice.one")).path  # the restarted one has another port
    await alice.feed()  # a private feed counts too
    status, text, headers = await alice.call("POST", DOMAIN, {"feed": [{"name": "alice.three"}]})
    assert status == 403, text
    assert headers["Content-Type"].startswith("text/plain")
    assert "feed quota reached: 2 feeds per principal" in text
    status, _, _ = await alice.call("POST", DOMAIN, {"feed": [{"name": "alice.one"}]})
    assert status == 200  # C3: asking for an existing public feed creates nothing
    await bob.feed("bob.one")  # another principal is unaffected
    await gw.stop()

    gw, alice, bob = await start()  # the same data directory: the feeds came back
    status, text, _ = await alice.call("POST", DOMAIN, {"feed": [{}]})
    assert status == 403, text
    await alice.ok("DELETE", first)
    await alice.feed("alice.three")  # deleting one freed a slot
    await bob.feed("bob.two")
