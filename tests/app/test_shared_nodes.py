"""Two gateways sharing their auth state and Idempotency-Key replies in the real Redis
Cluster, each a real server on 127.0.0.1 (docs/AUTH.md, "Several nodes").

Their messages stay in embedded engines of their own (the cluster engine is another
piece of work): what is under test is the state ``build_app`` is given as
``shared``, here one namespace of the cluster for both gateways, as two nodes of one
gateway on ``engine = "redis"`` share it.

* A token issued by gateway A is accepted by gateway B (one signing key); a client
  added on A gets tokens from B (one registry).
* A client revoked on A is refused on B within a second.
* An Idempotency-Key retry sent to B after A answered returns A's reply, and nothing
  is published on B.
* Failed logins for one account are counted across both gateways.
* Where the shared state does not answer, the gateway answers 503: no token, no
  client, no retry run unchecked.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from blockbuster import BlockBuster

from auth import User
from auth.clients import hash_secret
from auth.cluster import STALE_AFTER, Shared
from gateway.auth.authn import AUTH
from gateway.server.app import build_app
from gateway.server.config import Config
from gateway.server.run import make_runner, start_site
from main import open_engine
from tests.app import process
from tests.app.oauth import DOMAIN, As, clients, token
from tests.cluster_state import DEAD, PrivateCluster, namespace, private_cluster, redis_cluster
from tests.conftest import Gateway

__all__ = ["namespace", "private_cluster", "redis_cluster"]  # fixtures

pytestmark = pytest.mark.app

EVERYTHING = "restms:read restms:publish restms:subscribe"
StartNode = Callable[..., Awaitable[Gateway]]


@pytest.fixture
async def node(
    tmp_path: Path, redis_cluster: str, namespace: str, blockbuster: BlockBuster
) -> AsyncIterator[StartNode]:
    """Start gateways (random ports, a data directory each) on the test's namespace."""
    started: list[Gateway] = []

    async def start(*, url: str = redis_cluster, **overrides: Any) -> Gateway:
        overrides.setdefault("analytics_preload", False)  # no JVM per node (tests/conftest.py)
        config = Config(port=0, data_dir=str(tmp_path / f"node{len(started)}"), **overrides)
        app = build_app(config, open_engine(config), shared=Shared.open(url, namespace))
        runner = make_runner(app, config)
        try:
            await runner.setup()
            await start_site(runner, config, "127.0.0.1", 0)
        except BaseException:
            await runner.cleanup()
            raise
        host, port = runner.addresses[0][:2]
        url = f"http://{host}:{port}"
        http = aiohttp.ClientSession(base_url=url, timeout=aiohttp.ClientTimeout(total=30))
        started.append(Gateway(url=url, app=app, http=http, runner=runner))
        return started[-1]

    yield start
    for gateway in started:
        await gateway.stop()


async def two(node: StartNode, **overrides: Any) -> tuple[Gateway, Gateway, str]:
    """Two gateways with a configured admin client ``root``; and its secret."""
    configured, secrets = await clients(root="restms:admin " + EVERYTHING)
    a = await node(clients=configured, **overrides)
    b = await node(clients=configured, **overrides)
    return a, b, secrets["root"]


async def add_client(gw: Gateway, root: As, client_id: str) -> str:
    added = {"client_id": client_id, "scopes": EVERYTHING.split()}
    async with gw.http.post("/admin/clients", json=added, headers=root.auth) as r:
        assert r.status == 201, await r.text()
        return str((await r.json())["client_secret"])


async def test_a_token_from_one_node_is_accepted_by_the_other(node: StartNode) -> None:
    a, b, root_secret = await two(node)
    async with a.http.get("/.well-known/jwks.json") as r:
        keys_a = await r.json()
    async with b.http.get("/.well-known/jwks.json") as r:
        assert await r.json() == keys_a  # one signing key
    root = As.bearer(a, await token(a, "root", root_secret))
    secret = await add_client(a, root, "app")
    from_b = await token(b, "app", secret)  # added on A, known on B
    for gw in (a, b):
        status, reply, _ = await As.bearer(gw, from_b).call("GET", DOMAIN)
        assert status == 200, reply
    async with b.http.get("/admin/clients", headers=root.auth) as r:  # A's token on B
        listed = await r.json()
    assert [c["client_id"] for c in listed["clients"]] == ["root", "app"]


async def test_a_client_revoked_on_one_node_is_refused_on_the_other_within_a_second(
    node: StartNode,
) -> None:
    a, b, root_secret = await two(node, max_wait=60.0)
    root = As.bearer(a, await token(a, "root", root_secret))
    secret = await add_client(a, root, "app")
    app_on_b = As.bearer(b, await token(b, "app", secret))
    assert (await app_on_b.call("GET", DOMAIN))[0] == 200  # accepted, and cached
    pipe = await app_on_b.pipe()
    listed, _ = await app_on_b.ok("GET", pipe)
    asynclet = asyncio.create_task(  # waits on B for a message that never comes
        app_on_b.call("GET", listed["restms"]["pipe"][0]["message"][-1]["href"])
    )
    for _ in range(100):
        if b.app[AUTH].held.get("app"):
            break
        await asyncio.sleep(0.05)
    assert b.app[AUTH].held.get("app")
    async with a.http.delete("/admin/clients/app", headers=root.auth) as r:
        assert r.status == 200, await r.text()
    revoked = time.monotonic()
    async with asyncio.timeout(1.5):  # ended on B too, not left to its 60 s wait
        status, text, _ = await asynclet
    assert status == 401, text
    assert "revoked" in text
    while True:
        status, reply, headers = await app_on_b.call("GET", DOMAIN)
        if status == 401:
            break
        assert status == 200, reply
        assert time.monotonic() - revoked < 1.0, "still accepted on B a second later"
        await asyncio.sleep(0.05)
    assert "revoked" in headers["WWW-Authenticate"]
    async with b.http.post(
        "/oauth/token",
        data={"grant_type": "client_credentials"},
        headers={"Authorization": aiohttp.encode_basic_auth("app", secret)},
    ) as r:
        assert r.status == 401  # removed from the registry B reads too


async def pipe_on(who: As, feed: str) -> str:
    pipe = await who.pipe()
    await who.ok("POST", pipe, {"join": [{"feed": feed}]})
    return pipe


async def held(who: As, pipe: str) -> int:
    listed, _ = await who.ok("GET", pipe)
    return len(listed["restms"]["pipe"][0].get("message", [])) - 1  # less the asynclet


async def test_an_idempotent_retry_on_another_node_gets_the_first_reply(
    node: StartNode,
) -> None:
    a, b, root_secret = await two(node)
    on_a = As.bearer(a, await token(a, "root", root_secret))
    on_b = As.bearer(b, await token(b, "root", root_secret))
    feeds = [await who.feed("news") for who in (on_a, on_b)]  # one feed each engine
    pipes = [await pipe_on(who, feed) for who, feed in zip((on_a, on_b), feeds, strict=True)]
    path = "/restms/feed/news"
    publish = {"message": [{"message_id": "m1", "headers": {"n": "1"}}]}
    first = await on_a.call("POST", path, publish, **{"Idempotency-Key": "k1"})
    again = await on_b.call("POST", path, publish, **{"Idempotency-Key": "k1"})
    assert first[0] == again[0] == 200
    assert again[1] == first[1]
    assert again[2]["Idempotent-Replayed"] == "true"
    assert await held(on_a, pipes[0]) == 1
    assert await held(on_b, pipes[1]) == 0  # B did not publish it again
    other = {"message": [{"message_id": "m2"}]}
    status, reason, _ = await on_b.call("POST", path, other, **{"Idempotency-Key": "k1"})
    assert status == 422, reason  # the same key, another request: refused on B too


async def test_failed_logins_are_counted_across_nodes(node: StartNode) -> None:
    password_hash = await asyncio.to_thread(hash_secret, "right")
    alice = User(name="alice", password_hash=password_hash, scopes=("restms:read",))
    a, b, _ = await two(node, users=(alice,), account_failure_rate=0.01, account_failure_burst=2)

    async def login(gw: Gateway, password: str) -> tuple[int, str]:
        auth = {"Authorization": aiohttp.encode_basic_auth("alice", password)}
        async with gw.http.get(DOMAIN, headers=auth) as r:
            return r.status, await r.text()

    assert (await login(a, "wrong-1"))[0] == 401
    assert (await login(b, "wrong-2"))[0] == 401
    status, reason = await login(a, "wrong-3")  # the third failure, whichever node
    assert status == 429, reason
    assert "account" in reason
    status, reason = await login(b, "wrong-4")
    assert status == 429, reason


async def test_a_shared_state_that_stops_answering_is_a_503(
    node: StartNode, private_cluster: PrivateCluster
) -> None:
    password_hash = await asyncio.to_thread(hash_secret, "right")
    alice = User(name="alice", password_hash=password_hash, scopes=("restms:read",))
    configured, secrets = await clients(root="restms:admin " + EVERYTHING)
    a = await node(url=private_cluster.url, clients=configured, users=(alice,))
    root = As.bearer(a, await token(a, "root", secrets["root"]))
    feed = await root.feed("news")
    pipe = await pipe_on(root, feed)
    secret = await add_client(a, root, "app")
    private_cluster.kill()
    stopped = time.monotonic()
    async with a.http.post(
        "/oauth/token",
        data={"grant_type": "client_credentials"},
        headers={"Authorization": aiohttp.encode_basic_auth("app", secret)},
    ) as r:
        assert r.status == 503
        assert (await r.json())["error"] == "temporarily_unavailable"
        assert r.headers["Retry-After"]
    async with a.http.post(
        "/admin/clients", json={"client_id": "x", "scopes": ["restms:read"]}, headers=root.auth
    ) as r:
        assert r.status == 503, await r.text()
    publish = {"message": [{"message_id": "m1"}]}
    status, _, _ = await root.call("POST", feed, publish, **{"Idempotency-Key": "k"})
    assert status == 503  # not run without its key looked up
    login = {"Authorization": aiohttp.encode_basic_auth("alice", "wrong")}
    async with a.http.get(DOMAIN, headers=login) as r:
        assert r.status == 503, await r.text()  # the account's bound cannot be checked
    while True:  # the revocation list goes stale: tokens of the built-in issuer refused
        status, reason, _ = await root.call("GET", DOMAIN)
        if status == 503:
            break
        assert status == 200, reason
        assert time.monotonic() - stopped < STALE_AFTER + 3, "tokens still accepted"
        await asyncio.sleep(0.2)
    assert "revocation list" in reason
    status, reason, _ = await As(a, {}).call("GET", pipe)  # the loopback guest: no token
    assert status in (200, 403, 404), reason  # decided without the shared state


async def test_a_node_cannot_start_without_its_shared_state(node: StartNode) -> None:
    with pytest.raises(OSError, match="did not answer"):
        await node(url=DEAD, redis_start_wait=0.5)


async def test_serve_says_why_it_cannot_start_without_its_shared_state(tmp_path: Path) -> None:
    """``main.py serve`` on a cluster that does not answer: it waits for it as long as
    ``redis_start_wait`` says, then exits with status 1 and one line naming the cause
    and the address (its password hidden), no traceback."""
    dead = DEAD.replace("redis://", "redis://user:hush@", 1)
    began = time.monotonic()
    status, _, err = await process.main_py(
        "serve", "--engine", "redis", "--redis-url", dead, "--port", "0",
        "--data-dir", str(tmp_path / "var"),
        env={"RESTMS_REDIS_START_WAIT": "2"},
    )  # fmt: skip
    assert status == 1, err
    assert time.monotonic() - began >= 1.5, err
    assert "waiting up to 2 s for the cluster" in err, err
    assert "cannot start: the shared state did not answer" in err, err
    assert "user:***@" in err, err
    assert "hush" not in err, err
    assert "Traceback" not in err, err
