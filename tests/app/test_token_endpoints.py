"""RFC 7662 introspection and RFC 7009 revocation of the built-in issuer's tokens, against
a real gateway on 127.0.0.1 (docs/AUTH.md, section 2).

Decided behaviour under test (auth/token_endpoints.py, gateway/auth/oauth.py):

* The metadata document names both endpoints and their client authentication methods,
  the token endpoint's.
* Introspection answers ``{"active": false}``, and nothing else, for a token that is
  unknown, malformed, expired, revoked, of another issuer, or of another client when
  the asking client is not registered with ``restms:introspect``; an active token gets
  scope, client_id, sub, iss, aud, exp, iat, jti and token_type.
* Revocation of one of the client's own tokens refuses that token on every route
  (and that token alone); of another client's token, an unknown, expired or foreign
  one, it changes nothing; the answer is 200 either way.
* ``token_type_hint`` is ignored, whatever its value.
* An OAuth client library (authlib's) finds both endpoints in the metadata and uses
  them with either client authentication method.
* Bad client authentication is 401 ``invalid_client`` with ``WWW-Authenticate``; a
  malformed request 400 ``invalid_request``; JSON either way, never cached; and the
  bounds on secret checks are the token endpoint's (429 with ``Retry-After``).
"""

from __future__ import annotations

import asyncio
import base64
import gzip
import json
import re
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from authlib.integrations.requests_client import OAuth2Session
from authlib.oauth2.rfc7662 import IntrospectionToken
from joserfc.jwk import ECKey

from auth.clients import Client
from auth.issuer import Issuer, SigningKey
from gateway.auth.authn import PUBLIC, UNCHECKED_UNDER
from gateway.server.config import IssuerConfig
from gateway.server.keys import ISSUER
from tests.app.oauth import DOMAIN, As, clients, token
from tests.conftest import Gateway, MakeGateway

pytestmark = pytest.mark.app

ISS = "http://gw.test"
EVERYTHING = "restms:read restms:publish restms:subscribe"
INTROSPECT = "/oauth/introspect"
REVOKE = "/oauth/revoke"
INACTIVE = {"active": False}
GZIP_FORM = {"Content-Type": "application/x-www-form-urlencoded", "Content-Encoding": "gzip"}


def basic(client_id: str, secret: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{client_id}:{secret}".encode()).decode()}


async def post(
    gw: Gateway, path: str, form: dict[str, str], headers: dict[str, str] | None = None
) -> tuple[int, Any, Any]:
    """(status, parsed JSON or raw text, headers) of a form POST."""
    async with gw.http.post(path, data=form, headers=headers) as r:
        text = await r.text()
        body = await r.json() if r.content_type == "application/json" else text
        return r.status, body, r.headers


async def setting(make_gateway: MakeGateway, **overrides: Any) -> tuple[Gateway, dict[str, str]]:
    """A gateway with clients ``app`` and ``other`` (everything but admin) and ``rs``, a
    resource server that may introspect any token; their secrets."""
    configured, secrets = await clients(app=EVERYTHING, other=EVERYTHING, rs="restms:introspect")
    gw = await make_gateway(clients=configured, oauth_issuer=ISS, **overrides)
    return gw, secrets


async def introspect(gw: Gateway, who: str, secret: str, tok: str, **more: str) -> Any:
    status, body, headers = await post(gw, INTROSPECT, {"token": tok, **more}, basic(who, secret))
    assert status == 200, body
    assert headers["Content-Type"] == "application/json"
    assert headers["Cache-Control"] == "no-store"
    return body


async def revoke(gw: Gateway, who: str, secret: str, tok: str, **more: str) -> None:
    status, body, headers = await post(gw, REVOKE, {"token": tok, **more}, basic(who, secret))
    assert (status, body) == (200, "")
    assert headers["Cache-Control"] == "no-store"


def signed_by(gw: Gateway, key: SigningKey, *, ago: float = 0.0, client: str = "app") -> str:
    """A token for ``client`` signed with ``key`` as the gateway's issuer would, issued
    ``ago`` seconds ago (600 s of life)."""
    issuer = gw.app[ISSUER]
    past = Issuer(issuer.issuer, issuer.audience, key, 600, clock=lambda: time.time() - ago)
    fake = Client(client_id=client, secret_hash="scrypt$x", scopes=tuple(EVERYTHING.split()))
    return str(past.token(fake, None)["access_token"])


# ---------------------------------------------------------------- discovery


async def test_the_metadata_names_both_endpoints_and_how_clients_authenticate(
    make_gateway: MakeGateway,
) -> None:
    gw, secrets = await setting(make_gateway)
    async with gw.http.get("/.well-known/oauth-authorization-server") as r:
        assert r.status == 200
        document = await r.json()
    assert document["introspection_endpoint"] == ISS + INTROSPECT
    assert document["revocation_endpoint"] == ISS + REVOKE
    methods = ["client_secret_basic", "client_secret_post"]
    assert document["token_endpoint_auth_methods_supported"] == methods
    assert document["introspection_endpoint_auth_methods_supported"] == methods
    assert document["revocation_endpoint_auth_methods_supported"] == methods
    # and what it names is served, with either method
    tok = await token(gw, "app", secrets["app"])
    form = {"token": tok, "client_id": "app", "client_secret": secrets["app"]}
    status, body, _ = await post(gw, INTROSPECT, form)
    assert (status, body["active"]) == (200, True)
    status, body, _ = await post(gw, REVOKE, form)
    assert (status, body) == (200, "")


def as_a_library_would(
    base: str, document: dict[str, Any], client_id: str, secret: str, method: str
) -> list[Any]:
    """authlib's OAuth 2.0 client (requests): a token from the token endpoint, then
    introspected, revoked and introspected again at the endpoints the metadata names
    (their paths, on ``base``). Blocking: run it in a thread."""

    def here(url: str) -> str:
        return base + urlsplit(url).path

    with OAuth2Session(client_id, secret, token_endpoint_auth_method=method) as session:
        session.revocation_endpoint_auth_method = method
        issued = session.fetch_token(
            here(document["token_endpoint"]), grant_type="client_credentials"
        )
        tok = issued["access_token"]
        before = session.introspect_token(here(document["introspection_endpoint"]), token=tok)
        revoked = session.revoke_token(
            here(document["revocation_endpoint"]), token=tok, token_type_hint="access_token"
        )
        after = session.introspect_token(here(document["introspection_endpoint"]), token=tok)
    return [before.status_code, before.json(), revoked.status_code, after.json()]


@pytest.mark.parametrize("method", ["client_secret_basic", "client_secret_post"])
async def test_an_oauth_library_finds_and_uses_both_endpoints(
    make_gateway: MakeGateway, method: str
) -> None:
    gw, secrets = await setting(make_gateway)
    async with gw.http.get("/.well-known/oauth-authorization-server") as r:
        document = await r.json()
    assert method in document["introspection_endpoint_auth_methods_supported"]
    assert method in document["revocation_endpoint_auth_methods_supported"]
    status, before, revoked, after = await asyncio.to_thread(
        as_a_library_would, gw.url, document, "app", secrets["app"], method
    )
    assert (status, before["active"], before["client_id"]) == (200, True, "app")
    assert IntrospectionToken(before).get_scope() == EVERYTHING  # authlib reads the answer
    assert (revoked, after) == (200, INACTIVE)


# ---------------------------------------------------------------- introspection


async def test_an_active_token_is_described(make_gateway: MakeGateway) -> None:
    gw, secrets = await setting(make_gateway)
    before = int(time.time())
    tok = await token(gw, "app", secrets["app"], scope="restms:read restms:publish")
    answer = await introspect(gw, "app", secrets["app"], tok)
    jti = answer.pop("jti")
    assert re.fullmatch(r"[A-Za-z0-9_-]{22}", jti)
    iat = answer.pop("iat")
    assert before <= iat <= time.time()
    assert answer == {
        "active": True,
        "scope": "restms:read restms:publish",
        "client_id": "app",
        "sub": "app",
        "iss": ISS,
        "aud": "restms",
        "exp": iat + 600,
        "token_type": "Bearer",
    }
    # the resource server may introspect it too; the same answer
    assert await introspect(gw, "rs", secrets["rs"], tok) == {**answer, "iat": iat, "jti": jti}


async def test_unknown_malformed_expired_and_foreign_tokens_are_inactive(
    make_gateway: MakeGateway,
) -> None:
    gw, secrets = await setting(make_gateway)
    elsewhere = SigningKey(await asyncio.to_thread(ECKey.generate_key, "P-256", private=True))
    own = gw.app[ISSUER].key
    refused = {
        "not a token": "opaque-token-nobody-issued",
        "malformed JWT": "eyJ.eyJ.abc",
        "expired a second ago": signed_by(gw, own, ago=601),
        "signed with another key": signed_by(gw, elsewhere),
        "another client's, asked by a client without restms:introspect": await token(
            gw, "other", secrets["other"]
        ),
    }
    for what, tok in refused.items():
        for who in ("app", "rs"):
            if who == "rs" and what.startswith("another client's"):
                continue  # rs may: below
            assert await introspect(gw, who, secrets[who], tok) == INACTIVE, (what, who)
    assert (await introspect(gw, "rs", secrets["rs"], refused[list(refused)[-1]]))["active"]
    # A token that expired past the leeway is refused by the routes too; one inside
    # the leeway still passes there but is inactive here (exp is past).
    assert (await As.bearer(gw, refused["expired a second ago"]).call("GET", DOMAIN))[0] == 200
    expired = signed_by(gw, own, ago=700)
    assert (await As.bearer(gw, expired).call("GET", DOMAIN))[0] == 401
    assert await introspect(gw, "app", secrets["app"], expired) == INACTIVE


async def test_another_issuers_token_is_inactive(make_gateway: MakeGateway, tmp_path: Path) -> None:
    """A JWT of an issuer the gateway trusts for its routes is still not the built-in
    issuer's own: introspection judges only those."""
    key = SigningKey(await asyncio.to_thread(ECKey.generate_key, "P-256", private=True))
    path = tmp_path / "idp-jwks.json"
    await asyncio.to_thread(path.write_text, json.dumps(key.public_jwks()))
    trusted = IssuerConfig(issuer="https://idp.test", jwks_file=str(path), prefix="")
    gw, secrets = await setting(make_gateway, issuers=(trusted,))
    other = Issuer("https://idp.test", "restms", key, 600)
    fake = Client(client_id="app", secret_hash="scrypt$x", scopes=tuple(EVERYTHING.split()))
    tok = str(other.token(fake, None)["access_token"])
    assert (await As.bearer(gw, tok).call("GET", DOMAIN))[0] == 200  # the routes take it
    assert await introspect(gw, "app", secrets["app"], tok) == INACTIVE
    assert await introspect(gw, "rs", secrets["rs"], tok) == INACTIVE


async def test_the_hint_is_ignored_whatever_it_says(make_gateway: MakeGateway) -> None:
    gw, secrets = await setting(make_gateway)
    tok = await token(gw, "app", secrets["app"])
    plain = await introspect(gw, "app", secrets["app"], tok)
    assert plain["active"]
    for hint in ("access_token", "refresh_token", "id_token", "no-such-type", ""):
        assert await introspect(gw, "app", secrets["app"], tok, token_type_hint=hint) == plain
    await revoke(gw, "app", secrets["app"], tok, token_type_hint="refresh_token")
    assert await introspect(gw, "app", secrets["app"], tok) == INACTIVE


async def with_admin(make_gateway: MakeGateway) -> tuple[Gateway, As, dict[str, str]]:
    """A gateway with an admin client ``root`` (as a bearer) and a resource server
    ``rs``; their secrets."""
    configured, secrets = await clients(root="restms:admin", rs="restms:introspect")
    gw = await make_gateway(clients=configured, oauth_issuer=ISS)
    return gw, As.bearer(gw, await token(gw, "root", secrets["root"])), secrets


async def add_worker(gw: Gateway, root: As) -> str:
    """The client ``worker`` added at run time; its secret."""
    added = {"client_id": "worker", "scopes": ["restms:read"]}
    async with gw.http.post("/admin/clients", json=added, headers=root.auth) as r:
        assert r.status == 201, await r.text()
        return str((await r.json())["client_secret"])


async def test_a_token_of_a_revoked_client_is_inactive(make_gateway: MakeGateway) -> None:
    gw, root, secrets = await with_admin(make_gateway)
    tok = await token(gw, "worker", await add_worker(gw, root))
    assert (await introspect(gw, "rs", secrets["rs"], tok))["active"]
    async with gw.http.delete("/admin/clients/worker", headers=root.auth) as r:
        assert r.status == 200
    assert await introspect(gw, "rs", secrets["rs"], tok) == INACTIVE


# ---------------------------------------------------------------- revocation


async def protected_routes(gw: Gateway) -> list[tuple[str, str]]:
    """(method, path) of every route that takes credentials, variables filled in: all
    but the public ones (the page, health, the issuer's own); /metrics among them."""
    found = set()
    for route in gw.app.router.routes():
        resource = route.resource
        if resource is None:
            continue
        path = re.sub(r"\{[^}]*\}", "x", resource.canonical)
        if path in PUBLIC or path.startswith(UNCHECKED_UNDER):
            continue
        methods = ("GET", "POST", "PUT", "DELETE") if route.method == "*" else (route.method,)
        found.update((method, path) for method in methods)
    return sorted(found)


async def test_a_revoked_token_is_refused_on_every_route(make_gateway: MakeGateway) -> None:
    gw, secrets = await setting(make_gateway)
    tok = await token(gw, "app", secrets["app"])
    kept = await token(gw, "app", secrets["app"])  # another token of the same client
    app = As.bearer(gw, tok)
    pipe = await app.pipe()
    await revoke(gw, "app", secrets["app"], tok)
    routes = await protected_routes(gw)
    assert ("GET", "/metrics") in routes
    assert len(routes) > 30, routes  # RestMS, admin, bridges, analytics, metrics...
    for method, path in [*routes, ("GET", pipe), ("GET", DOMAIN)]:
        status, text, headers = await app.call(method, path)
        assert status == 401, (method, path, status, text)
        if method != "HEAD":  # which has no body
            assert text.strip() == "bearer token refused: the token was revoked", (method, path)
        assert headers["WWW-Authenticate"] == (
            'Bearer realm="restms", error="invalid_token", '
            'error_description="the token was revoked"'
        )
    # the client's other token, and the client itself, are untouched
    assert (await As.bearer(gw, kept).call("GET", pipe))[0] == 200
    assert (await introspect(gw, "app", secrets["app"], kept))["active"]
    assert await introspect(gw, "app", secrets["app"], tok) == INACTIVE
    assert await introspect(gw, "rs", secrets["rs"], tok) == INACTIVE
    await revoke(gw, "app", secrets["app"], tok)  # again: 200, nothing more


async def test_revoking_what_is_not_ones_own_changes_nothing(make_gateway: MakeGateway) -> None:
    gw, secrets = await setting(make_gateway)
    others = await token(gw, "other", secrets["other"])
    await revoke(gw, "app", secrets["app"], others)  # 200, ignored
    await revoke(gw, "rs", secrets["rs"], others)  # may introspect it, not revoke it
    assert (await As.bearer(gw, others).call("GET", DOMAIN))[0] == 200
    assert (await introspect(gw, "other", secrets["other"], others))["active"]
    for nothing in ("opaque-token-nobody-issued", signed_by(gw, gw.app[ISSUER].key, ago=700)):
        await revoke(gw, "app", secrets["app"], nothing)


# ---------------------------------------------------------------- refusals


@pytest.fixture
async def served(make_gateway: MakeGateway) -> tuple[Gateway, dict[str, str], str]:
    """:func:`setting`, and a token of ``app``."""
    gw, secrets = await setting(make_gateway)
    return gw, secrets, await token(gw, "app", secrets["app"])


@pytest.mark.parametrize("path", [INTROSPECT, REVOKE])
async def test_bad_client_authentication_is_401_with_a_challenge(
    served: tuple[Gateway, dict[str, str], str], path: str
) -> None:
    gw, secrets, tok = served
    wrong = [
        ({"token": tok}, basic("app", "wrong")),
        ({"token": tok}, basic("nobody", secrets["app"])),
        ({"token": tok}, None),
        ({"token": tok, "client_id": "app"}, None),
        ({"token": tok, "client_id": "app", "client_secret": "wrong"}, None),
        ({"token": tok}, {"Authorization": "Basic !!!"}),
        ({"token": tok}, {"Authorization": f"Bearer {tok}"}),
    ]
    for form, headers in wrong:
        status, body, replied = await post(gw, path, form, headers)
        assert status == 401, (form, headers, body)
        assert body["error"] == "invalid_client"
        assert replied["WWW-Authenticate"] == 'Basic realm="restms"'
        assert replied["Cache-Control"] == "no-store"
    assert (await introspect(gw, "app", secrets["app"], tok))["active"]  # nothing revoked


@pytest.mark.parametrize("path", [INTROSPECT, REVOKE])
async def test_malformed_requests_are_400_invalid_request(
    served: tuple[Gateway, dict[str, str], str], path: str
) -> None:
    gw, secrets, tok = served
    auth = basic("app", secrets["app"])
    cases: list[tuple[Any, dict[str, str]]] = [
        ({}, auth),  # no token
        ({"token": ""}, auth),
        (f"token={tok}&token={tok}", {**auth, "Content-Type": "application/x-www-form-urlencoded"}),
        (b'{"token": "x"}', {**auth, "Content-Type": "application/json"}),
        (b"token=%ff", {**auth, "Content-Type": "application/x-www-form-urlencoded"}),
        ({"token": tok, "client_id": "app", "client_secret": secrets["app"]}, auth),  # two ways
        ({"token": "x" * 9000}, auth),  # over the form limit
        # a gzip form cut short, and a small one that unpacks past the limit
        (gzip.compress(f"token={tok}".encode())[:-4], {**auth, **GZIP_FORM}),
        (gzip.compress(b"token=" + b"x" * 100_000), {**auth, **GZIP_FORM}),
    ]
    for form, headers in cases:
        async with gw.http.post(path, data=form, headers=headers) as r:
            assert r.status == 400, (form, await r.text())
            assert r.content_type == "application/json"
            assert (await r.json())["error"] == "invalid_request"
            assert r.headers["Cache-Control"] == "no-store"
    async with gw.http.get(path, headers=auth) as r:
        assert r.status == 405
    # the token in the URL (which access logs and proxies keep): said so, not "missing"
    async with gw.http.post(f"{path}?token={tok}", headers=auth) as r:
        assert r.status == 400
        answer = await r.json()
        assert answer["error"] == "invalid_request"
        assert "form body" in answer["error_description"]
    whole = gzip.compress(f"token={tok}".encode())  # a whole compressed form is read
    async with gw.http.post(path, data=whole, headers={**auth, **GZIP_FORM}) as r:
        assert r.status == 200, await r.text()


async def test_secret_checks_are_bounded_as_at_the_token_endpoint(
    make_gateway: MakeGateway,
) -> None:
    gw, secrets = await setting(make_gateway, account_failure_burst=2, account_failure_rate=0.01)
    tok = await token(gw, "app", secrets["app"])
    # failures at any of the three endpoints come out of one bucket per account
    grant = {"grant_type": "client_credentials"}
    assert (await post(gw, "/oauth/token", grant, basic("app", "x")))[0] == 401
    assert (await post(gw, INTROSPECT, {"token": tok}, basic("app", "x")))[0] == 401
    for path in (REVOKE, INTROSPECT, "/oauth/token"):
        form = grant if path == "/oauth/token" else {"token": tok}
        status, body, headers = await post(gw, path, form, basic("app", "y"))
        assert status == 429, (path, body)
        assert body["error"] == "temporarily_unavailable"
        assert int(headers["Retry-After"]) >= 1
    # the holder of the right secret, known right before, is not locked out
    assert (await introspect(gw, "app", secrets["app"], tok))["active"]


async def test_a_resource_server_introspects_often_without_meeting_the_bounds(
    make_gateway: MakeGateway,
) -> None:
    """A client secret that checked right is not checked with scrypt again (nor counted
    against the bounds on secret checks, 20 at once and 5 a second from one address):
    a resource server introspects token after token; a wrong secret is still bounded."""
    gw, secrets = await setting(make_gateway)
    tok = await token(gw, "app", secrets["app"])
    began = time.monotonic()
    for _ in range(120):  # six times the burst, faster than the bound's refill
        assert (await introspect(gw, "rs", secrets["rs"], tok))["active"]
    took = time.monotonic() - began
    assert took < 120 / 5, f"120 introspections took {took:.1f} s"
    statuses = [
        (await post(gw, INTROSPECT, {"token": tok}, basic("rs", "x")))[0] for _ in range(30)
    ]
    assert statuses[0] == 401, statuses
    assert set(statuses) == {401, 429}, statuses


async def test_a_removed_client_secret_checked_before_is_refused(
    make_gateway: MakeGateway,
) -> None:
    """Remembering a secret that checked right never outlives the client: removed, or
    added again under the same id with a new secret, the old secret is refused."""
    gw, root, _ = await with_admin(make_gateway)
    old = await add_worker(gw, root)
    tok = await token(gw, "worker", old)
    assert (await introspect(gw, "worker", old, tok))["active"]  # checked right: remembered
    async with gw.http.delete("/admin/clients/worker", headers=root.auth) as r:
        assert r.status == 200
    status, body, _ = await post(gw, INTROSPECT, {"token": tok}, basic("worker", old))
    assert (status, body["error"]) == (401, "invalid_client")
    new = await add_worker(gw, root)
    status, body, _ = await post(gw, INTROSPECT, {"token": tok}, basic("worker", old))
    assert (status, body["error"]) == (401, "invalid_client")
    assert (await post(gw, INTROSPECT, {"token": tok}, basic("worker", new)))[0] == 200
