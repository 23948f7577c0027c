"""Access control over real HTTP: tokens, scopes, ownership, tenants, Basic, limits."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import json
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from joserfc import jwt
from joserfc.jwk import ECKey

from auth import User
from auth.clients import hash_secret
from feeds.config import FeedConfig
from gateway.server.app import build_app
from gateway.server.config import Config, IssuerConfig
from gateway.server.keys import CONFIG
from main import open_engine
from tests.app.gauges import until_waiting
from tests.app.oauth import DOMAIN, JSON, As, clients, token
from tests.conftest import Gateway, MakeGateway

pytestmark = pytest.mark.app

ISS = "http://gw.test"
EVERYTHING = "restms:read restms:publish restms:subscribe"


async def gateway_with(
    make_gateway: MakeGateway, **overrides: Any
) -> tuple[Gateway, dict[str, str]]:
    configured, secrets = await clients(
        alice=EVERYTHING,
        bob=EVERYTHING,
        reader="restms:read",
        weather="restms:publish:feed/weather.* restms:read",
        root="restms:admin",
    )
    overrides.setdefault("oauth_issuer", ISS)
    gw = await make_gateway(clients=configured, **overrides)
    return gw, secrets


async def as_client(gw: Gateway, secrets: dict[str, str], name: str) -> As:
    return As.bearer(gw, await token(gw, name, secrets[name]))


@contextlib.asynccontextmanager
async def serving(app: web.Application) -> AsyncIterator[int]:
    """Run a stand-in identity provider on 127.0.0.1; yields its port."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield runner.addresses[0][1]
    finally:
        await runner.cleanup()


def challenge(headers: Any) -> str:
    return ", ".join(headers.getall("WWW-Authenticate", []))


# ---------------------------------------------------------------- every route
async def test_a_route_added_after_the_app_is_built_refuses_to_start(tmp_path: Path) -> None:
    """Authentication wraps the routes build_app made: a later one would bypass it."""

    async def late(request: web.Request) -> web.Response:
        return web.Response(text="no principal asked for\n")

    config = Config(store="memory", data_dir=str(tmp_path))
    app = build_app(config, open_engine(config))
    app.router.add_get("/late", late)
    runner = web.AppRunner(app, access_log=None)
    with pytest.raises(RuntimeError, match="added after"):
        await runner.setup()
    await runner.cleanup()


# ---------------------------------------------------------------- scopes
async def test_a_token_grants_exactly_its_scopes(make_gateway: MakeGateway) -> None:
    gw, secrets = await gateway_with(make_gateway)
    reader = await as_client(gw, secrets, "reader")
    weather = await as_client(gw, secrets, "weather")
    root = await as_client(gw, secrets, "root")
    await root.feed("weather.rain")
    await root.feed("news")

    status, _, _ = await reader.call("GET", DOMAIN)
    assert status == 200
    status, text, headers = await reader.call("POST", "/restms/feed/news", {"message": [{}]})
    assert status == 403, text
    assert 'error="insufficient_scope"' in challenge(headers)
    assert 'scope="restms:publish"' in challenge(headers)
    assert headers["Content-Type"].startswith("text/plain")
    status, _, headers = await reader.call("POST", DOMAIN, {"pipe": [{}]})
    assert status == 403
    assert 'scope="restms:subscribe"' in challenge(headers)

    reply, _ = await weather.ok("POST", "/restms/feed/weather.rain", {"message": [{}]})
    assert "message" in reply["restms"]
    status, _, _ = await weather.call("POST", "/restms/feed/news", {"message": [{}]})
    assert status == 403  # outside its feed pattern
    status, _, _ = await weather.call("POST", DOMAIN, {"feed": [{"name": "weather.snow"}]})
    assert status == 201  # creating a feed inside the pattern is publishing there
    status, _, _ = await weather.call("POST", DOMAIN, {"feed": [{"name": "sports"}]})
    assert status == 403

    # A narrower token than the client may have: only what was asked for.
    narrow = As.bearer(gw, await token(gw, "alice", secrets["alice"], scope="restms:read"))
    status, _, _ = await narrow.call("POST", DOMAIN, {"pipe": [{}]})
    assert status == 403


async def test_the_domain_lists_only_feeds_the_reader_may_read(make_gateway: MakeGateway) -> None:
    configured, secrets = await clients(
        root="restms:admin", some="restms:read:feed/weather.* restms:read:feed/default"
    )
    gw = await make_gateway(clients=configured, oauth_issuer=ISS)
    root = As.bearer(gw, await token(gw, "root", secrets["root"]))
    some = As.bearer(gw, await token(gw, "some", secrets["some"]))
    await root.feed("weather.rain")
    await root.feed("finance")
    listed, _ = await some.ok("GET", DOMAIN)
    names = {f["name"] for f in listed["restms"]["domain"][0]["feed"]}
    assert "weather.rain" in names
    assert "finance" not in names
    everything, _ = await root.ok("GET", DOMAIN)
    assert "finance" in {f["name"] for f in everything["restms"]["domain"][0]["feed"]}


# ---------------------------------------------------------------- refused tokens
def _key(gw: Gateway) -> ECKey:
    """The gateway's own signing key, read from its data directory (to forge with)."""
    pem = Path(gw.app[CONFIG].data_dir) / "oauth" / "signing-key.pem"
    return ECKey.import_key(pem.read_bytes())


def _claims(**changes: Any) -> dict[str, Any]:
    now = int(time.time())
    claims = {
        "iss": ISS,
        "sub": "alice",
        "aud": "restms",
        "iat": now,
        "nbf": now,
        "exp": now + 300,
        "scope": EVERYTHING,
        "jti": uuid.uuid4().hex,
    }
    claims.update(changes)
    return {k: v for k, v in claims.items() if v is not None}


def _forge(key: ECKey, claims: dict[str, Any], **header: Any) -> str:
    return jwt.encode({"alg": "ES256", "kid": key.thumbprint(), **header}, claims, key)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _cases(key: ECKey) -> dict[str, str]:
    now = int(time.time())
    other = ECKey.generate_key("P-256", private=True)
    good = _forge(key, _claims())
    header = {"alg": "none", "typ": "JWT", "kid": key.thumbprint()}
    unsigned = f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(_claims()).encode())}."
    # The classic confusion: HS256 keyed with the issuer's public key bytes (built by
    # hand: the JOSE library itself refuses to make such a key).
    confused_head = _b64(json.dumps({"alg": "HS256", "kid": key.thumbprint()}).encode())
    confused_body = _b64(json.dumps(_claims()).encode())
    signing_input = f"{confused_head}.{confused_body}".encode()
    mac = hmac.new(key.as_pem(private=False), signing_input, hashlib.sha256).digest()
    confused = f"{confused_head}.{confused_body}.{_b64(mac)}"
    return {
        "expired": _forge(key, _claims(exp=now - 3600, iat=now - 7200, nbf=now - 7200)),
        "not yet valid": _forge(key, _claims(nbf=now + 3600)),
        "wrong issuer": _forge(key, _claims(iss="http://elsewhere.test")),
        "wrong audience": _forge(key, _claims(aud="someone-else")),
        "forged signature": _forge(other, _claims(), kid=key.thumbprint()),
        "alg none": unsigned,
        "hmac with the public key": confused,
        "unknown kid": _forge(other, _claims(), kid="no-such-key"),
        "truncated": good[: len(good) // 2],
        "no expiry": _forge(key, _claims(exp=None)),
        "garbage": "not-a-token",
    }


async def test_bad_tokens_are_refused_with_invalid_token(make_gateway: MakeGateway) -> None:
    gw, _secrets = await gateway_with(make_gateway)
    key = await asyncio.to_thread(_key, gw)
    good = As.bearer(gw, _forge(key, _claims()))
    status, _, _ = await good.call("GET", DOMAIN)
    assert status == 200  # the forging itself is right: only each change is refused
    for case, bad in _cases(key).items():
        status, text, headers = await As.bearer(gw, bad).call("GET", DOMAIN)
        assert status == 401, (case, text)
        assert 'error="invalid_token"' in challenge(headers), case
        assert headers["Content-Type"].startswith("text/plain"), case
        assert bad not in text, case  # the token is never echoed


async def test_missing_or_odd_credentials_get_a_challenge(make_gateway: MakeGateway) -> None:
    gw, _ = await gateway_with(make_gateway, anonymous=False)
    async with gw.http.get(DOMAIN) as r:
        assert r.status == 401
        offered = ", ".join(r.headers.getall("WWW-Authenticate"))
        assert 'Bearer realm="restms"' in offered
        assert "error=" not in offered  # RFC 6750 3.1: no error code without credentials
        assert 'Basic realm="RestMS::"' in offered
    async with gw.http.get(DOMAIN, headers={"Authorization": "Digest abc"}) as r:
        assert r.status == 401


# ---------------------------------------------------------------- external issuer, rotation
async def test_keys_from_an_external_jwks_url_rotate(make_gateway: MakeGateway) -> None:
    keys = {"current": ECKey.generate_key("P-256", private=True)}

    async def jwks(request: web.Request) -> web.Response:
        key = keys["current"]
        public = {**key.as_dict(private=False), "kid": key.thumbprint(), "alg": "ES256"}
        return web.json_response({"keys": [public]})

    idp = web.Application()
    idp.router.add_get("/jwks", jwks)
    async with serving(idp) as port:
        issuer = IssuerConfig(issuer="https://idp.test", jwks_url=f"http://127.0.0.1:{port}/jwks")
        gw = await make_gateway(issuers=(issuer,), jwks_refresh=0.0)

        def external(key: ECKey, sub: str) -> As:
            claims = _claims(iss="https://idp.test", sub=sub)
            return As.bearer(gw, _forge(key, claims))

        first = external(keys["current"], "carol")
        pipe = await first.pipe()
        keys["current"] = ECKey.generate_key("P-256", private=True)  # the issuer rotates
        second = external(keys["current"], "carol")
        status, _, _ = await second.call("GET", pipe)
        assert status == 200  # picked up at once, and the principal is the same
        pipe_doc, _ = await second.ok("GET", pipe)
        assert pipe_doc["restms"]["pipe"]
        retired = external(ECKey.generate_key("P-256", private=True), "carol")
        status, _, _headers = await retired.call("GET", pipe)
        assert status == 401
        # Principals of an external issuer are named after its host: no clash with ours.
        owners = {p.owner for p in gw.engine._private.values() if hasattr(p, "messages")}
        assert owners == {"idp.test/carol"}


async def in_pieces(request: web.Request, document: dict[str, Any]) -> web.StreamResponse:
    """The document sent chunked, in two writes a moment apart: a reader that takes one
    read for the whole body gets only the first half."""
    data = json.dumps(document).encode()
    reply = web.StreamResponse(headers={"Content-Type": "application/json"})
    reply.enable_chunked_encoding()
    await reply.prepare(request)
    await reply.write(data[: len(data) // 2])
    await asyncio.sleep(0.05)
    await reply.write(data[len(data) // 2 :])
    await reply.write_eof()
    return reply


async def test_keys_and_introspection_answers_sent_in_pieces_are_read_whole(
    make_gateway: MakeGateway,
) -> None:
    key = ECKey.generate_key("P-256", private=True)
    public = {**key.as_dict(private=False), "kid": key.thumbprint(), "alg": "ES256"}

    async def jwks(request: web.Request) -> web.StreamResponse:
        return await in_pieces(request, {"keys": [public]})

    async def introspect(request: web.Request) -> web.StreamResponse:
        exp = int(time.time()) + 300
        answer = {"active": True, "sub": "svc", "scope": EVERYTHING, "exp": exp}
        return await in_pieces(request, answer)

    idp = web.Application()
    idp.router.add_get("/jwks", jwks)
    idp.router.add_post("/introspect", introspect)
    async with serving(idp) as port:
        issuer = IssuerConfig(issuer="https://idp.test", jwks_url=f"http://127.0.0.1:{port}/jwks")
        gw = await make_gateway(
            issuers=(issuer,),
            introspection_url=f"http://127.0.0.1:{port}/introspect",
            introspection_client_id="gateway",
            introspection_client_secret="s3cret",
        )
        signed = As.bearer(gw, _forge(key, _claims(iss="https://idp.test", sub="carol")))
        status, text, _ = await signed.call("GET", DOMAIN)
        assert status == 200, text
        status, text, _ = await As.bearer(gw, "opaque-good").call("GET", DOMAIN)
        assert status == 200, text


async def test_an_issuers_keys_past_the_fetch_limit_are_refused(
    make_gateway: MakeGateway, caplog: pytest.LogCaptureFixture
) -> None:
    """A JWKS endpoint that sends more than the 1 MiB limit, chunked (no length to
    refuse it by): the gateway stops at the limit, has no keys, and answers 401, not 500."""

    async def jwks(request: web.Request) -> web.StreamResponse:
        reply = web.StreamResponse(headers={"Content-Type": "application/json"})
        reply.enable_chunked_encoding()
        await reply.prepare(request)
        try:
            for _ in range(64):  # 4 MiB offered, 64 KiB a write
                await reply.write(b" " * 65536)
            await reply.write_eof()
        except ConnectionError:
            pass  # the gateway hung up past its limit
        return reply

    idp = web.Application()
    idp.router.add_get("/jwks", jwks)
    async with serving(idp) as port:
        issuer = IssuerConfig(issuer="https://idp.test", jwks_url=f"http://127.0.0.1:{port}/jwks")
        gw = await make_gateway(issuers=(issuer,))
        key = ECKey.generate_key("P-256", private=True)
        signed = As.bearer(gw, _forge(key, _claims(iss="https://idp.test", sub="carol")))
        status, text, headers = await signed.call("GET", DOMAIN)
        assert status == 401, text
        assert headers["Content-Type"].startswith("text/plain")
        assert "token signing keys unavailable" in text
    assert "answered more than 1048576 bytes" in caplog.text


# ---------------------------------------------------------------- ownership
async def test_another_principals_resources_are_not_there(make_gateway: MakeGateway) -> None:
    gw, secrets = await gateway_with(make_gateway)
    alice, bob = await as_client(gw, secrets, "alice"), await as_client(gw, secrets, "bob")
    await alice.feed("orders")
    private_feed = await alice.feed()
    pipe = await alice.pipe()
    _reply, headers = await alice.ok("POST", pipe, {"join": [{"feed": "/restms/feed/orders"}]})
    join = headers["Location"]
    staged = await _stage(alice, "/restms/feed/orders")
    content = await _stage(alice, "/restms/feed/orders")
    await alice.ok("POST", "/restms/feed/orders", {"message": [{"content": [{"href": content}]}]})
    listed, _ = await alice.ok("GET", pipe)
    message = listed["restms"]["pipe"][0]["message"][0]["href"]
    got, _ = await alice.ok("GET", message)
    part = got["restms"]["message"][0]["content"][0]["href"]
    never = "/restms/resource/" + "x" * 22

    uris = {
        "pipe": pipe,
        "join": join,
        "message": message,
        "content": part,
        "staged": staged,
        "private feed": private_feed,
    }
    for what, uri in uris.items():
        for method in ("GET", "HEAD", "PUT", "POST"):
            document = {"pipe": [{"title": "x"}]} if method in ("PUT", "POST") else None
            status, text, _ = await bob.call(method, uri, document)
            assert status == 404, (what, method, text)
            mine_status, mine_text, _ = await bob.call(method, never, document)
            assert (status, text) == (mine_status, mine_text), (what, method)
        # DELETE answers as for a URI never issued (R4: 200), and deletes nothing.
        status, text, _ = await bob.call("DELETE", uri)
        assert (status, text) == await _status_text(bob, "DELETE", never), what
    for what, uri in uris.items():
        if what == "content":
            continue  # fetched contents may be deleted by their owner; still there now
        status, _, _ = await alice.call("GET", uri)
        assert status == 200, what
    # Bob cannot join alice's private feed either: as if it did not exist.
    bob_pipe = await bob.pipe()
    status, text, _ = await bob.call("POST", bob_pipe, {"join": [{"feed": private_feed}]})
    assert status == 400
    assert "no existing feed" in text
    # A reply_to naming alice's pipe lets bob publish to it, not read it.
    await bob.ok("POST", "/restms/feed/default", {"message": [{"address": pipe.rsplit("/", 1)[1]}]})


async def _stage(who: As, feed: str) -> str:
    async with who.gw.http.post(
        feed, data=b"payload", headers={**who.auth, "Content-Type": "text/plain"}
    ) as r:
        assert r.status == 201
        return r.headers["Location"]


async def _status_text(who: As, method: str, uri: str) -> tuple[int, Any]:
    status, text, _ = await who.call(method, uri)
    return status, text


async def test_only_the_creator_or_an_admin_changes_a_public_feed(
    make_gateway: MakeGateway,
) -> None:
    gw, secrets = await gateway_with(make_gateway)
    alice, bob = await as_client(gw, secrets, "alice"), await as_client(gw, secrets, "bob")
    root = await as_client(gw, secrets, "root")
    feed = await alice.feed("alice.news")
    status, text, _ = await bob.call("DELETE", feed)
    assert status == 403, text
    status, _, _ = await bob.call("PUT", feed, {"feed": [{"title": "mine now"}]})
    assert status == 403
    status, _, _ = await bob.call("GET", feed)
    assert status == 200  # public: others read it
    await alice.ok("PUT", feed, {"feed": [{"title": "still mine"}]})
    status, _, _ = await root.call("DELETE", feed)
    assert status == 200
    status, _, _ = await alice.call("GET", feed)
    assert status == 404


async def test_an_admin_deletes_another_principals_pipe(make_gateway: MakeGateway) -> None:
    """Another's pipe looks absent, and a DELETE of an absent URI is 200 (R4): for an
    admin of its domain that 200 is a deletion, never one that did nothing."""
    gw, secrets = await gateway_with(make_gateway)
    alice, bob = await as_client(gw, secrets, "alice"), await as_client(gw, secrets, "bob")
    root = await as_client(gw, secrets, "root")
    pipe = await alice.pipe()
    status, _, _ = await bob.call("DELETE", pipe)
    assert status == 200  # not an admin: nothing there for bob, nothing done
    await alice.ok("GET", pipe)
    status, _, _ = await root.call("DELETE", pipe)
    assert status == 200
    status, _, _ = await alice.call("GET", pipe)
    assert status == 404  # gone, its joins with it
    status, _, _ = await root.call("DELETE", pipe)
    assert status == 200  # still idempotent


async def test_a_configured_feed_is_refused_with_the_same_reason_to_everyone(
    make_gateway: MakeGateway,
) -> None:
    """Neither its creator (there is none) nor an admin may change a configured feed:
    a principal that may publish is told why, as an admin is, not that it lacks
    ownership."""
    gw, secrets = await gateway_with(make_gateway, feeds=(FeedConfig(name="orders"),))
    feed = "/restms/feed/orders"
    for name in ("alice", "root"):
        caller = await as_client(gw, secrets, name)
        for method, body in (("PUT", {"feed": [{"title": "mine now"}]}), ("DELETE", None)):
            status, text, _ = await caller.call(method, feed, body)
            assert (status, text.strip()) == (403, "configured feeds cannot be changed"), name


# ---------------------------------------------------------------- tenants
async def test_a_principal_sees_only_its_domains(make_gateway: MakeGateway) -> None:
    configured, secrets = await clients(
        alice="restms:read restms:publish restms:subscribe",
        bob="restms:read:domain/default restms:publish:domain/default "
        "restms:subscribe:domain/default",
    )
    gw = await make_gateway(
        clients=configured,
        oauth_issuer=ISS,
        domains=(("default", "Default"), ("acme", "Acme")),
        domain_principals=(("acme", ("alice",)),),
    )
    alice = As.bearer(gw, await token(gw, "alice", secrets["alice"]))
    bob = As.bearer(gw, await token(gw, "bob", secrets["bob"]))
    status, _, _ = await alice.call("GET", "/restms/domain/acme")
    assert status == 200
    _, headers = await alice.ok("POST", "/restms/domain/acme", {"feed": [{"name": "acme.orders"}]})
    feed = headers["Location"]
    for method in ("GET", "POST"):
        status, text, _ = await bob.call(method, "/restms/domain/acme", {"feed": [{}]})
        assert status == 404, method
        assert text == "no domain named 'acme'\n"  # as for a domain that does not exist
    status, text, _ = await bob.call("GET", feed)
    assert status == 404
    assert text == "no feed named 'acme.orders'\n"  # as for a feed that does not exist
    status, text, _ = await bob.call("POST", feed, {"message": [{}]})
    assert status == 404
    # Alice's pipe in acme can join acme's feed; bob's cannot (as if there were none).
    bob_pipe = await bob.pipe()
    status, _, _ = await bob.call("POST", bob_pipe, {"join": [{"feed": feed}]})
    assert status == 400
    status, _, _ = await bob.call("GET", "/restms/domain/default")
    assert status == 200


# ---------------------------------------------------------------- Basic and guests
async def test_basic_users_and_the_loopback_guest(make_gateway: MakeGateway) -> None:
    password_hash = await asyncio.to_thread(hash_secret, "s3cret")
    user = User(name="legacy", password_hash=password_hash, scopes=tuple(EVERYTHING.split()))
    gw = await make_gateway(users=(user,))

    def basic(name: str, password: str) -> As:
        encoded = base64.b64encode(f"{name}:{password}".encode()).decode()
        return As(gw, {"Authorization": f"Basic {encoded}"})

    legacy = basic("legacy", "s3cret")
    pipe = await legacy.pipe()
    status, _, _ = await legacy.call("GET", pipe)  # remembered: no second scrypt check
    assert status == 200
    status, _, headers = await basic("legacy", "wrong").call("GET", DOMAIN)
    assert status == 401
    assert 'Basic realm="RestMS::"' in challenge(headers)
    status, _, _ = await basic("nobody", "s3cret").call("GET", DOMAIN)
    assert status == 401
    status, _, _ = await As(gw, {"Authorization": "Basic !!!"}).call("GET", DOMAIN)
    assert status == 401
    guest = basic("guest", "guest")
    status, _, _ = await guest.call("GET", DOMAIN)
    assert status == 200  # from loopback
    status, _, _ = await guest.call("GET", pipe)
    assert status == 404  # the guest is not legacy
    anonymous = As(gw, {})
    guest_pipe = await anonymous.pipe()
    status, _, _ = await guest.call("GET", guest_pipe)
    assert status == 200  # anonymous loopback requests and guest/guest are one principal


async def test_guests_can_be_turned_off(make_gateway: MakeGateway) -> None:
    gw = await make_gateway(anonymous=False, guest_user=False)
    status, _, headers = await As(gw, {}).call("GET", DOMAIN)
    assert status == 401
    assert "Basic" not in challenge(headers)  # no Basic users at all: only Bearer offered
    encoded = base64.b64encode(b"guest:guest").decode()
    status, _, _ = await As(gw, {"Authorization": f"Basic {encoded}"}).call("GET", DOMAIN)
    assert status == 401


# ---------------------------------------------------------------- limits
async def test_rate_limit_answers_429_and_recovers(make_gateway: MakeGateway) -> None:
    gw = await make_gateway(rate_limit=20.0, rate_burst=5)
    guest = As(gw, {})
    statuses = [(await guest.call("GET", DOMAIN))[0] for _ in range(8)]
    assert statuses[:5] == [200] * 5
    assert 429 in statuses[5:]
    status, text, headers = await guest.call("GET", DOMAIN)
    assert status == 429
    assert int(headers["Retry-After"]) >= 1
    assert "rate limit" in text
    # Recovered within the Retry-After it was given (at 20/s, a request's worth is 50 ms)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + int(headers["Retry-After"])
    while (status := (await guest.call("GET", DOMAIN))[0]) == 429:
        assert loop.time() < deadline, "still refused after its Retry-After"
        await asyncio.sleep(0.02)
    assert status == 200


async def test_pipe_and_join_quotas(make_gateway: MakeGateway) -> None:
    gw = await make_gateway(max_pipes_per_principal=2, max_joins_per_principal=3)
    guest = As(gw, {})
    first = await guest.pipe()
    await guest.pipe()  # two pipes, two default joins
    status, text, _ = await guest.call("POST", DOMAIN, {"pipe": [{}]})
    assert status == 403
    assert "quota" in text
    await guest.feed("quota.feed")
    await guest.ok("POST", first, {"join": [{"feed": "/restms/feed/quota.feed"}]})
    status, text, _ = await guest.call(
        "POST", first, {"join": [{"feed": "/restms/feed/quota.feed", "address": "x"}]}
    )
    assert status == 403
    assert "join quota" in text
    await guest.ok("DELETE", first)  # its joins go with it
    await guest.pipe()


async def test_waiting_requests_per_principal_are_capped(make_gateway: MakeGateway) -> None:
    gw = await make_gateway(max_waits_per_principal=1, max_wait=5.0, metrics_access="loopback")
    guest = As(gw, {})
    pipe = await guest.pipe()
    listed, _ = await guest.ok("GET", pipe)
    asynclet = listed["restms"]["pipe"][0]["message"][-1]["href"]
    waiting = asyncio.create_task(guest.call("GET", asynclet))
    await until_waiting(gw, "asynclet", 1)  # the first holds the slot
    status, text, headers = await guest.call("GET", asynclet)
    assert status == 429, text
    assert headers["Retry-After"] == "1"
    await guest.ok(
        "POST", "/restms/feed/default", {"message": [{"address": pipe.rsplit("/", 1)[1]}]}
    )
    status, _, _ = await asyncio.wait_for(waiting, 5)
    assert status == 200
    await asyncio.sleep(0.05)
    status, _, _ = await guest.call("GET", DOMAIN, **{"When-None-Match": "*"})  # slot is free
    assert status in (200, 503)


async def test_a_wait_ends_when_its_token_expires(make_gateway: MakeGateway) -> None:
    configured, secrets = await clients(alice=EVERYTHING)
    gw = await make_gateway(clients=configured, oauth_issuer=ISS, token_ttl=1.0, max_wait=30.0)
    alice = As.bearer(gw, await token(gw, "alice", secrets["alice"]))
    pipe = await alice.pipe()
    listed, _ = await alice.ok("GET", pipe)
    asynclet = listed["restms"]["pipe"][0]["message"][-1]["href"]
    started = time.monotonic()
    status, text, headers = await alice.call("GET", asynclet)
    took = time.monotonic() - started
    assert status == 401, text
    assert 'error="invalid_token"' in challenge(headers)
    assert took < 3.0  # the token's life, not max_wait
    # An SSE stream opened with a fresh short-lived token ends with an "expired" event.
    alice = As.bearer(gw, await token(gw, "alice", secrets["alice"]))
    async with gw.http.get(
        pipe,
        headers={**alice.auth, "Accept": "text/event-stream"},
        timeout=aiohttp.ClientTimeout(total=10),
    ) as r:
        assert r.status == 200
        body = await r.text()
    assert "event: expired" in body
    # So does a stream pipe's multipart reply, and an evented GET.
    alice = As.bearer(gw, await token(gw, "alice", secrets["alice"]))
    _, created = await alice.ok("POST", DOMAIN, {"pipe": [{"type": "stream"}]})
    stream = created["Location"]
    listed, _ = await alice.ok("GET", stream)
    asynclet = listed["restms"]["pipe"][0]["message"][-1]["href"]
    started = time.monotonic()
    async with gw.http.get(
        asynclet, headers={**alice.auth, "Accept": JSON}, timeout=aiohttp.ClientTimeout(total=10)
    ) as r:
        assert r.content_type == "multipart/mixed"
        await r.read()  # the body ends: the stream closed when the token expired
    assert time.monotonic() - started < 3.0
    alice = As.bearer(gw, await token(gw, "alice", secrets["alice"]))
    _, current = await alice.ok("GET", DOMAIN)
    status, _, headers = await alice.call("GET", DOMAIN, **{"When-None-Match": current["ETag"]})
    assert status == 401
    assert 'error="invalid_token"' in challenge(headers)


async def test_only_an_external_issuer_can_be_trusted(
    make_gateway: MakeGateway, tmp_path: Path
) -> None:
    key = ECKey.generate_key("P-256", private=True)
    jwks = {"keys": [{**key.as_dict(private=False), "kid": key.thumbprint()}]}
    path = tmp_path / "jwks.json"
    await asyncio.to_thread(path.write_text, json.dumps(jwks), encoding="utf-8")
    issuer = IssuerConfig(issuer="https://idp.test", jwks_file=str(path), prefix="")
    gw = await make_gateway(issuers=(issuer,), builtin_issuer=False, anonymous=False)
    async with gw.http.post("/oauth/token", data={"grant_type": "client_credentials"}) as r:
        assert r.status == 404  # no built-in server: no token endpoint
    async with gw.http.get("/.well-known/jwks.json") as r:
        assert r.status == 404
    external = As.bearer(gw, _forge(key, _claims(iss="https://idp.test", sub="dave")))
    pipe = await external.pipe()
    assert gw.engine.resolve(pipe.rsplit("/", 1)[1]).owner == "dave"  # prefix ""
    ours = ECKey.generate_key("P-256", private=True)
    status, _, _ = await As.bearer(gw, _forge(ours, _claims())).call("GET", DOMAIN)
    assert status == 401  # a token in the built-in issuer's name means nothing here


async def test_a_request_relayed_by_a_local_proxy_is_not_a_guest(make_gateway: MakeGateway) -> None:
    gw = await make_gateway()
    status, _, _ = await As(gw, {}).call("GET", DOMAIN)
    assert status == 200
    for header in ("X-Forwarded-For", "Forwarded", "x-real-ip"):
        status, _, headers = await As(gw, {header: "for=192.0.2.60"}).call("GET", DOMAIN)
        assert status == 401, header
        assert "Bearer" in challenge(headers)


async def test_opaque_tokens_are_introspected_and_remembered(make_gateway: MakeGateway) -> None:
    calls: list[dict[str, str]] = []

    async def introspect(request: web.Request) -> web.Response:
        form = dict(await request.post())
        calls.append({**form, "authorization": request.headers.get("Authorization", "")})
        if form.get("token") == "opaque-good":
            return web.json_response(
                {
                    "active": True,
                    "sub": "svc",
                    "scope": EVERYTHING,
                    "exp": int(time.time()) + 300,
                }
            )
        return web.json_response({"active": False})

    idp = web.Application()
    idp.router.add_post("/introspect", introspect)
    async with serving(idp) as port:
        gw = await make_gateway(
            introspection_url=f"http://127.0.0.1:{port}/introspect",
            introspection_client_id="gateway",
            introspection_client_secret="s3cret",
        )
        good = As.bearer(gw, "opaque-good")
        pipe = await good.pipe()
        for _ in range(3):
            status, _, _ = await good.call("GET", pipe)
            assert status == 200
        assert len(calls) == 1  # remembered until its exp
        assert calls[0]["token"] == "opaque-good"
        assert calls[0]["authorization"] == aiohttp.encode_basic_auth("gateway", "s3cret")
        owners = {r.owner for r in gw.engine._private.values() if hasattr(r, "messages")}
        assert owners == {f"127.0.0.1:{port}/svc"}  # named after the endpoint: no clash
        status, _, headers = await As.bearer(gw, "opaque-revoked").call("GET", pipe)
        assert status == 401
        assert 'error="invalid_token"' in challenge(headers)


async def test_another_principals_staged_content_cannot_be_linked(
    make_gateway: MakeGateway,
) -> None:
    gw, secrets = await gateway_with(make_gateway)
    alice, bob = await as_client(gw, secrets, "alice"), await as_client(gw, secrets, "bob")
    await alice.feed("shared")
    staged = await _stage(alice, "/restms/feed/shared")
    message = {"message": [{"content": [{"href": staged}]}]}
    status, text, _ = await bob.call("POST", "/restms/feed/shared", message)
    assert status == 404, text  # as if it did not exist
    assert "does not exist" in text
    reply, _ = await alice.ok("POST", "/restms/feed/shared", message)  # still there for her
    assert reply["restms"]["message"]


async def test_token_requests_are_rate_limited_per_address(make_gateway: MakeGateway) -> None:
    gw, _ = await gateway_with(make_gateway)

    async def attempt(i: int) -> tuple[int, str]:
        basic = base64.b64encode(f"guess{i}:wrong".encode()).decode()  # no account's bound
        async with gw.http.post(
            "/oauth/token",
            data={"grant_type": "client_credentials"},
            headers={"Authorization": f"Basic {basic}"},
        ) as r:
            return r.status, r.headers.get("Retry-After", "")

    replies = await asyncio.gather(*(attempt(i) for i in range(40)))  # a guesser's burst
    statuses = [status for status, _ in replies]
    assert statuses.count(401) >= 20  # the burst of 20 checks (and what refilled)
    assert statuses.count(429) >= 10  # the rest refused without an scrypt check
    assert all(int(after) >= 1 for status, after in replies if status == 429)
