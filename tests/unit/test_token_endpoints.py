"""Introspection and revocation of the built-in issuer's tokens, without HTTP
(auth/token_endpoints.py); the HTTP side is tests/app/test_token_endpoints.py."""

from __future__ import annotations

from typing import Any

import pytest
from joserfc.jwk import ECKey

from auth.clients import Client
from auth.cluster import RedisRevocations, Shared
from auth.issuer import InvalidClient, InvalidRequest, Issuer, SigningKey, Unavailable
from auth.revocations import Revocations
from auth.token_endpoints import INTROSPECT_SCOPE, OwnTokens, parse_token_query
from auth.tokens import JwtVerifier, TrustedIssuer

FORM = "application/x-www-form-urlencoded"
ISS = "https://gw.example"
NOW = 1_800_000_000.0


def client(name: str, *scopes: str) -> Client:
    return Client(client_id=name, secret_hash="scrypt$x", scopes=scopes or ("restms:read",))


async def no_fetch(url: str) -> bytes:
    raise AssertionError("the issuer's own keys are given, never fetched")


@pytest.fixture(scope="module")
def key() -> SigningKey:
    return SigningKey(ECKey.generate_key("P-256", private=True))


def own(key: SigningKey, revocations: Any, ended: list[str]) -> OwnTokens:
    trusted = TrustedIssuer(issuer=ISS, audience="restms", keys=key.public_jwks())
    verifier = JwtVerifier([trusted], no_fetch, leeway=30, clock=lambda: NOW)
    return OwnTokens(verifier, "restms", revocations, ended.append, clock=lambda: NOW)


def issued(key: SigningKey, to: Client, at: float = NOW) -> str:
    return str(Issuer(ISS, "restms", key, 600, clock=lambda: at).token(to, None)["access_token"])


def test_a_query_needs_a_token_and_one_client_authentication() -> None:
    query = parse_token_query(FORM, b"token=abc&token_type_hint=whatever", "Basic YTpi")
    assert (query.client_id, query.client_secret, query.token) == ("a", "b", "abc")
    assert "abc" not in repr(query)
    assert "'b'" not in repr(query)
    with pytest.raises(InvalidRequest, match="token is missing"):
        parse_token_query(FORM, b"token=", "Basic YTpi")
    with pytest.raises(InvalidClient, match="client authentication is required"):
        parse_token_query(FORM, b"token=abc", None)
    with pytest.raises(InvalidRequest, match="one client authentication method"):
        parse_token_query(FORM, b"token=abc&client_secret=b", "Basic YTpi")


async def test_revoking_records_the_token_and_tells_the_gateway(key: SigningKey) -> None:
    ended: list[str] = []
    revocations = Revocations(None, 630, lambda: NOW)
    tokens = own(key, revocations, ended)
    app, other = client("app"), client("other")
    tok = issued(key, app)
    assert (await tokens.introspect(app, tok))["active"]
    assert not await tokens.revoke(other, tok)  # not its own: nothing
    assert not await tokens.revoke(app, issued(key, app, NOW - 700))  # expired: nothing
    assert not await tokens.revoke(app, "garbage")
    assert ended == []
    assert await tokens.revoke(app, tok)
    (entry,) = ended
    assert entry.startswith("app:")
    assert entry in revocations.at
    assert await tokens.introspect(app, tok) == {"active": False}


async def test_others_tokens_need_the_introspect_scope(key: SigningKey) -> None:
    tokens = own(key, Revocations(None, 630, lambda: NOW), [])
    tok = issued(key, client("app"))
    assert await tokens.introspect(client("other"), tok) == {"active": False}
    answer = await tokens.introspect(client("rs", INTROSPECT_SCOPE), tok)
    assert (answer["active"], answer["client_id"]) == (True, "app")


async def test_a_revocation_list_too_old_to_judge_by_is_unavailable(key: SigningKey) -> None:
    """On several nodes, a list not read for a while (the cluster not answering) is never
    taken for "not revoked": 503 (no connection is made: the list was never read)."""
    shared = Shared.open("redis://127.0.0.1:1", "unit-test")
    try:
        tokens = own(key, RedisRevocations(shared, 630), [])
        with pytest.raises(Unavailable):
            await tokens.introspect(client("app"), issued(key, client("app")))
        # what is not an active token needs no list to say so
        assert await tokens.introspect(client("app"), "garbage") == {"active": False}
    finally:
        await shared.close()
