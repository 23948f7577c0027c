"""JWKS over real HTTP: a key rotated at the issuer's URL is picked up by the verifier."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from blockbuster import BlockBuster
from joserfc import jwt
from joserfc.jwk import ECKey, Key

from auth.tokens import JwtVerifier, TokenError, TrustedIssuer

pytestmark = pytest.mark.app

AUDIENCE = "restms"


class Issuer:
    """An authorization server's JWKS endpoint on 127.0.0.1, serving ``published``."""

    def __init__(self) -> None:
        self.published: list[Key] = []
        self.requests = 0
        self.url = ""

    async def jwks(self, request: web.Request) -> web.Response:
        self.requests += 1
        return web.json_response({"keys": [k.as_dict(private=False) for k in self.published]})


@pytest.fixture
async def issuer() -> AsyncIterator[Issuer]:
    served = Issuer()
    app = web.Application()
    app.router.add_get("/jwks", served.jwks)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    served.url = f"http://{host}:{port}"
    yield served
    await runner.cleanup()


def new_key(kid: str) -> Key:
    return ECKey.generate_key("P-256", parameters={"kid": kid})


def token(key: Key, iss: str, now: float) -> str:
    claims: dict[str, Any] = {"iss": iss, "aud": AUDIENCE, "sub": "alice", "exp": now + 60}
    return jwt.encode({"alg": "ES256", "kid": key.kid}, claims, key, algorithms=["ES256"])


async def test_rotation_at_the_jwks_url(issuer: Issuer, blockbuster: BlockBuster) -> None:
    now = 1_800_000_000.0
    old, new = await asyncio.gather(
        asyncio.to_thread(new_key, "2024-a"), asyncio.to_thread(new_key, "2024-b")
    )
    issuer.published = [old]
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:

        async def fetch(url: str) -> bytes:
            async with session.get(url) as reply:
                reply.raise_for_status()
                return await reply.read()

        trusted = TrustedIssuer(issuer=issuer.url, audience=AUDIENCE, jwks_url=issuer.url + "/jwks")
        verifier = JwtVerifier([trusted], fetch, refresh_interval=0.0, clock=lambda: now)
        signed_old = token(old, issuer.url, now)
        assert (await verifier.verify(signed_old)).subject == "alice"

        issuer.published = [old, new]  # rotation: the next key appears at the URL ...
        assert (await verifier.verify(token(new, issuer.url, now))).issuer == issuer.url
        assert issuer.requests == 2

        issuer.published = [new]  # ... and the old one is withdrawn
        unknown = token(await asyncio.to_thread(new_key, "2024-c"), issuer.url, now)
        with pytest.raises(TokenError, match="unknown"):
            await verifier.verify(unknown)  # an unknown kid makes it look again
        with pytest.raises(TokenError, match="unknown"):
            await verifier.verify(signed_old)
        assert issuer.requests == 4
