"""The built-in authorization server over real HTTP: token endpoint, JWKS, metadata, CLI.

The server is a bare ``web.Application`` with only :func:`gateway.auth.oauth.add_routes`
(no gateway middleware), on 127.0.0.1, with the blocking-call detector on.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote_plus

import aiohttp
import pytest
from aiohttp import web
from blockbuster import BlockBuster
from joserfc import jwt
from joserfc.jwk import KeySet

from auth.clients import CLIENTS_FILE, Client, ClientStore, hash_secret
from auth.issuer import KEY_FILE, Issuer, SigningKey
from gateway.auth.oauth import PUBLIC_PATHS, add_routes
from tests.app.process import main_py

pytestmark = pytest.mark.app

FORM = {"grant_type": "client_credentials"}
# a configured client whose id and secret need RFC 6749 form-encoding inside Basic
ODD_ID, ODD_SECRET = "ops.team", "p@ss w:rd+%"


@dataclass
class Server:
    http: aiohttp.ClientSession
    issuer: Issuer
    data: Path
    secret: str  # of the client "app", scopes restms:read restms:publish

    async def token(
        self, data: dict[str, str], headers: dict[str, str] | None = None
    ) -> aiohttp.ClientResponse:
        response = await self.http.post("/oauth/token", data=data, headers=headers)
        await response.read()
        return response


@pytest.fixture
def data(tmp_path: Path) -> Path:
    return tmp_path / "var"


@pytest.fixture
def secret(data: Path) -> str:
    """Set up before the loop runs (this is blocking file I/O and hashing)."""
    return ClientStore(data / CLIENTS_FILE).add("app", ["restms:read", "restms:publish"])


@pytest.fixture
async def server(data: Path, secret: str, blockbuster: BlockBuster) -> AsyncIterator[Server]:
    key = await asyncio.to_thread(SigningKey.load_or_create, data / KEY_FILE)
    odd = Client(
        client_id=ODD_ID,
        secret_hash=await asyncio.to_thread(hash_secret, ODD_SECRET),
        scopes=("restms:admin",),
    )
    issuer = Issuer("https://gw.example", "restms", key, 600, scopes=["restms:read"])
    app = web.Application()
    add_routes(app, issuer, ClientStore(data / CLIENTS_FILE, [odd]))
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    async with aiohttp.ClientSession(base_url=f"http://{host}:{port}") as http:
        yield Server(http=http, issuer=issuer, data=data, secret=secret)
    await runner.cleanup()


async def verified_claims(server: Server, token: str) -> dict[str, Any]:
    """Verify a token as a resource server would: with the JWKS fetched over HTTP."""
    async with server.http.get("/.well-known/jwks.json") as r:
        keys = KeySet.import_key_set(await r.json())
    return jwt.decode(token, keys, algorithms=["ES256"]).claims


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": aiohttp.encode_basic_auth(user, password)}


def assert_no_store(response: aiohttp.ClientResponse) -> None:
    assert response.headers["Cache-Control"] == "no-store"
    assert response.headers["Pragma"] == "no-cache"
    assert response.content_type == "application/json"


async def assert_error(response: aiohttp.ClientResponse, status: int, error: str) -> dict[str, Any]:
    assert response.status == status
    assert_no_store(response)
    document = await response.json()
    assert document["error"] == error
    assert document["error_description"]
    if status == 401:
        assert response.headers["WWW-Authenticate"] == 'Basic realm="restms"'
    return document


# -- issuing --------------------------------------------------------------------------


async def test_client_secret_basic(server: Server) -> None:
    r = await server.token(FORM, basic("app", server.secret))
    assert r.status == 200
    assert_no_store(r)
    reply = await r.json()
    assert reply["token_type"] == "Bearer"
    assert reply["expires_in"] == 600
    assert reply["scope"] == "restms:read restms:publish"
    claims = await verified_claims(server, reply["access_token"])
    assert claims["sub"] == claims["client_id"] == "app"
    assert claims["iss"] == "https://gw.example"
    assert claims["aud"] == "restms"
    assert claims["scope"] == "restms:read restms:publish"


async def test_client_secret_post_with_a_narrower_scope(server: Server) -> None:
    form = {**FORM, "client_id": "app", "client_secret": server.secret, "scope": "restms:read"}
    r = await server.token(form)
    assert r.status == 200
    assert_no_store(r)
    reply = await r.json()
    assert reply["scope"] == "restms:read"
    assert (await verified_claims(server, reply["access_token"]))["scope"] == "restms:read"


async def test_basic_credentials_are_form_decoded(server: Server) -> None:
    r = await server.token(FORM, basic(quote_plus(ODD_ID), quote_plus(ODD_SECRET)))
    assert r.status == 200, await r.text()
    assert (await r.json())["scope"] == "restms:admin"
    unencoded = await server.token(FORM, basic(ODD_ID, ODD_SECRET))
    await assert_error(unencoded, 401, "invalid_client")  # "+" and "%" decode otherwise


async def test_a_client_added_while_running_works_at_once(server: Server) -> None:
    other = ClientStore(server.data / CLIENTS_FILE)  # as `main.py client add` does
    late = await asyncio.to_thread(other.add, "late", ["restms:read"])
    r = await server.token(FORM, basic("late", late))
    assert r.status == 200
    await asyncio.to_thread(other.remove, "late")
    r = await server.token(FORM, basic("late", late))
    await assert_error(r, 401, "invalid_client")


# -- refusing -------------------------------------------------------------------------


async def test_wrong_secret_and_unknown_client_look_the_same(server: Server) -> None:
    wrong = await server.token(FORM, basic("app", server.secret + "x"))
    unknown = await server.token(FORM, basic("nobody", server.secret))
    posted = await server.token({**FORM, "client_id": "app", "client_secret": "nope"})
    documents = [await assert_error(r, 401, "invalid_client") for r in (wrong, unknown, posted)]
    assert documents[0] == documents[1] == documents[2]


async def test_no_client_authentication(server: Server) -> None:
    await assert_error(await server.token(FORM), 401, "invalid_client")


async def test_wrong_grant_type(server: Server) -> None:
    form = {"grant_type": "password", "username": "u", "password": "p"}
    r = await server.token(form, basic("app", server.secret))
    await assert_error(r, 400, "unsupported_grant_type")


async def test_scope_beyond_the_clients_is_refused(server: Server) -> None:
    form = {**FORM, "scope": "restms:read restms:admin"}
    r = await server.token(form, basic("app", server.secret))
    await assert_error(r, 400, "invalid_scope")


async def test_only_form_bodies(server: Server) -> None:
    async with server.http.post(
        "/oauth/token",
        json={**FORM, "client_id": "app", "client_secret": server.secret},
    ) as r:
        await assert_error(r, 400, "invalid_request")


async def test_two_authentication_methods_at_once(server: Server) -> None:
    form = {**FORM, "client_id": "app", "client_secret": server.secret}
    r = await server.token(form, basic("app", server.secret))
    await assert_error(r, 400, "invalid_request")


async def test_repeated_parameters(server: Server) -> None:
    body = (
        f"grant_type=client_credentials&client_id=app&client_secret={server.secret}&scope=a&scope=b"
    )
    headers = {"Content-Type": "application/x-www-form-urlencoded"}
    async with server.http.post("/oauth/token", data=body, headers=headers) as r:
        await assert_error(r, 400, "invalid_request")


async def test_large_bodies_are_refused_with_or_without_a_length(server: Server) -> None:
    body = b"grant_type=client_credentials&pad=" + b"x" * 9000
    headers = {"Content-Type": "application/x-www-form-urlencoded"}
    async with server.http.post("/oauth/token", data=body, headers=headers) as r:
        await assert_error(r, 400, "invalid_request")

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(10):
            yield b"x" * 1000

    async with server.http.post("/oauth/token", data=chunks(), headers=headers) as r:
        assert r.request_info.headers.get("Transfer-Encoding") == "chunked"
        await assert_error(r, 400, "invalid_request")


async def test_other_methods_on_the_token_endpoint(server: Server) -> None:
    async with server.http.get("/oauth/token") as r:
        assert r.status == 405


# -- documents ------------------------------------------------------------------------


async def test_metadata_document(server: Server) -> None:
    async with server.http.get("/.well-known/oauth-authorization-server") as r:
        assert r.status == 200
        assert r.content_type == "application/json"
        document = await r.json()
    assert document == server.issuer.metadata()
    assert document["token_endpoint"] == "https://gw.example/oauth/token"
    assert document["jwks_uri"] == "https://gw.example/.well-known/jwks.json"
    assert document["grant_types_supported"] == ["client_credentials"]
    assert document["scopes_supported"] == ["restms:read"]


async def test_jwks_document(server: Server) -> None:
    async with server.http.get("/.well-known/jwks.json") as r:
        assert r.status == 200
        assert r.content_type == "application/json"
        document = await r.json()
    (key,) = document["keys"]
    assert "d" not in key
    assert key["kid"] == server.issuer.key.kid
    assert (key["kty"], key["crv"], key["alg"], key["use"]) == ("EC", "P-256", "ES256", "sig")


def test_public_paths_are_the_five_routes() -> None:
    assert {
        "/oauth/token",
        "/oauth/introspect",
        "/oauth/revoke",
        "/.well-known/jwks.json",
        "/.well-known/oauth-authorization-server",
    } == PUBLIC_PATHS


# -- the command line -----------------------------------------------------------------


async def cli(*args: str) -> tuple[int, str, str]:
    return await main_py("client", *args)


async def test_cli_adds_lists_and_removes_clients_a_running_server_honours(
    server: Server,
) -> None:
    where = ("--data-dir", str(server.data))
    code, out, err = await cli("add", "robot", "--scopes", "restms:read restms:x", *where)
    assert (code, err) == (0, "")
    lines = dict(line.split(": ", 1) for line in out.splitlines() if ": " in line)
    assert lines["client_id"] == "robot"
    assert "cannot be shown again" in out
    secret = lines["client_secret"]

    r = await server.token(FORM, basic("robot", secret))
    assert r.status == 200
    assert (await r.json())["scope"] == "restms:read restms:x"

    code, out, _ = await cli("list", *where)
    assert code == 0
    assert out.splitlines() == ["app\trestms:read restms:publish", "robot\trestms:read restms:x"]
    assert secret not in out
    assert "scrypt" not in out

    code, _, err = await cli("add", "robot", "--scopes", "restms:read", *where)
    assert code == 2
    assert "exists already" in err
    code, _, err = await cli("add", "bad/name", "--scopes", "restms:read", *where)
    assert code == 2
    assert "client id" in err

    code, _, _ = await cli("remove", "robot", *where)
    assert code == 0
    r = await server.token(FORM, basic("robot", secret))
    assert r.status == 401
    code, _, err = await cli("remove", "robot", *where)
    assert code == 2
    assert "no client 'robot'" in err
