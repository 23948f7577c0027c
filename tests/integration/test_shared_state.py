"""The state gateway nodes share, in the real Redis Cluster: each store seen from two
connections (two nodes) of one namespace, its bounds, and its failures when the
cluster does not answer (``auth.cluster``, ``gateway.restms.idempotency``)."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from joserfc import jwt
from joserfc.jwk import KeySet

from auth.clients import Client, hash_secret
from auth.cluster import (
    AUTH_TAG,
    RedisBuckets,
    RedisClients,
    RedisRevocations,
    Shared,
    SharedStateError,
    for_settings,
    signing_key,
)
from auth.revocations import MARGIN
from gateway.restms.idempotency import Kept, RedisReplies
from restms.errors import Conflict, ServiceUnavailable
from tests.cluster_state import dead, namespace, other, redis_cluster, shared

__all__ = ["dead", "namespace", "other", "redis_cluster", "shared"]  # fixtures

pytestmark = pytest.mark.integration


# ---------------------------------------------------------------- signing key
async def test_every_node_signs_with_the_key_the_first_one_made(
    redis_cluster: str, namespace: str
) -> None:
    nodes = [Shared.open(redis_cluster, namespace) for _ in range(5)]
    try:
        keys = await asyncio.gather(*(signing_key(node) for node in nodes))
    finally:
        for node in nodes:
            await node.close()
    assert len({key.kid for key in keys}) == 1
    claims = {"sub": "app", "exp": int(time.time()) + 60}
    token = keys[0].sign(claims, typ="at+jwt")
    verified = jwt.decode(token, KeySet.import_key_set(keys[4].public_jwks()), algorithms=["ES256"])
    assert verified.claims["sub"] == "app"


async def test_another_namespace_has_another_key(shared: Shared, redis_cluster: str) -> None:
    mine = await signing_key(shared)
    elsewhere = Shared.open(redis_cluster, shared.namespace + "x")
    try:
        theirs = await signing_key(elsewhere)
        assert theirs.kid != mine.kid
    finally:
        await elsewhere.redis.delete(elsewhere.key(AUTH_TAG, "signing-key"))
        await elsewhere.close()


# ---------------------------------------------------------------- clients
async def test_a_client_added_on_one_node_is_known_on_another(
    shared: Shared, other: Shared
) -> None:
    configured = Client(
        client_id="ops",
        secret_hash=await asyncio.to_thread(hash_secret, "ops-secret"),
        scopes=("restms:admin",),
    )
    a, b = RedisClients(shared, [configured]), RedisClients(other, [configured])
    secret = await a.add("app", ["restms:read", "restms:publish"])
    found = await b.authenticate("app", secret)
    assert found is not None
    assert found.scopes == ("restms:read", "restms:publish")
    assert await b.authenticate("app", secret + "x") is None
    assert await b.authenticate("nobody", secret) is None
    assert await b.authenticate("ops", "ops-secret") == configured
    await b.add("zed", ["restms:read"])
    assert [c.client_id for c in await a.clients()] == ["ops", "app", "zed"]
    with pytest.raises(ValueError, match="exists already"):
        await b.add("app", ["restms:read"])
    with pytest.raises(ValueError, match="configuration"):
        await a.add("ops", ["restms:read"])
    with pytest.raises(ValueError, match="configured"):
        await a.remove("ops")
    with pytest.raises(ValueError, match="client id"):
        await a.add("no spaces", ["restms:read"])
    await b.remove("app")
    assert await a.get("app") is None
    with pytest.raises(KeyError):
        await a.remove("app")


async def test_a_damaged_entry_is_a_value_error(shared: Shared) -> None:
    clients = RedisClients(shared)
    await shared.redis.hset(shared.key(AUTH_TAG, "clients"), "bad", json.dumps({"scopes": 1}))
    with pytest.raises(ValueError, match="malformed"):
        await clients.get("bad")
    with pytest.raises(ValueError, match="malformed"):
        await clients.clients()


# ---------------------------------------------------------------- revocations
async def test_a_revocation_on_one_node_is_read_on_another(shared: Shared, other: Shared) -> None:
    a, b = RedisRevocations(shared, keep=630), RedisRevocations(other, keep=630)
    assert b.stale()  # never read: nothing judged on it
    assert await b.update() == []
    assert not b.stale()
    issued = time.time() - 5
    at = await a.record("app")
    assert a.refuses("app", issued)  # the node that revoked knows at once
    assert await b.update() == ["app"]
    assert b.at["app"] == at
    assert b.refuses("app", issued)
    assert b.refuses("app", at + MARGIN)  # a token request under way meanwhile
    assert not b.refuses("app", at + MARGIN + 1)  # a client re-added later
    assert not b.refuses("other", issued)
    assert await b.update() == []  # told once


async def test_the_later_revocation_holds_and_old_ones_go(shared: Shared, other: Shared) -> None:
    now = time.time()
    ahead = RedisRevocations(shared, keep=10, clock=lambda: now + 5)
    behind = RedisRevocations(other, keep=10, clock=lambda: now)
    past = RedisRevocations(other, keep=10, clock=lambda: now - 100)
    await past.record("old")  # no token issued before it is unexpired any more
    await ahead.record("app")
    assert await behind.record("app") == now + 5  # the later time stays; "old" goes
    reader = RedisRevocations(other, keep=10)
    assert await reader.update() == ["app"]
    assert reader.at == {"app": now + 5}
    assert await shared.redis.hkeys(shared.key(AUTH_TAG, "revoked")) == [b"app"]


async def test_a_list_not_read_lately_is_stale(
    shared: Shared, monkeypatch: pytest.MonkeyPatch
) -> None:
    from auth import cluster

    revocations = RedisRevocations(shared, keep=630)
    await revocations.update()  # the connection made: the next read is one round trip
    monkeypatch.setattr(cluster, "STALE_AFTER", 0.5)
    await revocations.update()
    assert not revocations.stale()
    await asyncio.sleep(0.6)
    assert revocations.stale()


# ---------------------------------------------------------------- failed secret checks
async def test_failed_checks_are_counted_across_nodes(shared: Shared, other: Shared) -> None:
    a, b = RedisBuckets(shared, rate=0.5, burst=2), RedisBuckets(other, rate=0.5, burst=2)
    first = time.monotonic()
    assert await a.take("alice") == 0.0
    assert await b.take("alice") == 0.0
    wait = await a.take("alice")
    # One token regained at 0.5 a second, counted from the first take (a loaded
    # machine may take a while between the calls).
    assert 2.0 - (time.monotonic() - first) - 0.1 < wait <= 2.0
    assert await b.take("bob") == 0.0  # another account
    await b.give("alice")
    assert await a.take("alice") == 0.0
    assert await b.take("alice") > 0
    key = a._key("alice")
    ttl = await shared.redis.pttl(key)
    assert 0 < ttl <= 5000  # forgotten once it would be full again (4 s, and a second)


async def test_no_bound_at_rate_zero_and_no_key(shared: Shared) -> None:
    off = RedisBuckets(shared, rate=0, burst=1)
    assert [await off.take("alice") for _ in range(5)] == [0.0] * 5
    assert await shared.redis.exists(off._key("alice")) == 0


# ---------------------------------------------------------------- Idempotency-Key
def reply(body: bytes = b"<ok/>", fingerprint: bytes = b"f" * 32) -> Kept:
    headers = (("Content-Type", "application/restms+xml"), ("Location", "http://x/p"))
    return Kept(fingerprint, 0.0, 201, body, headers)


async def test_a_reply_kept_by_one_node_is_replayed_by_another(
    shared: Shared, other: Shared
) -> None:
    a, b = RedisReplies(shared, 600, 100, 10_000), RedisReplies(other, 600, 100, 10_000)
    scope = ("alice", "/restms/feed/f", "k1")
    assert await a.begin(scope) is None  # running now, on a
    with pytest.raises(Conflict):
        await b.begin(scope)
    await a.end(scope, reply())
    kept = await b.begin(scope)
    assert kept is not None
    assert (kept.fingerprint, kept.status, kept.body) == (b"f" * 32, 201, b"<ok/>")
    assert kept.headers == reply().headers
    assert abs(kept.at - time.time()) < 5  # when, on the server's clock
    assert await b.begin(("bob", "/restms/feed/f", "k1")) is None  # per principal


async def test_a_failed_first_request_is_run_again(shared: Shared, other: Shared) -> None:
    a, b = RedisReplies(shared, 600, 100, 10_000), RedisReplies(other, 600, 100, 10_000)
    scope = ("alice", "/restms/feed/f", "k")
    assert await a.begin(scope) is None
    await a.end(scope, None)
    assert await b.begin(scope) is None


async def test_replies_are_bounded_by_count_bytes_and_window(shared: Shared) -> None:
    replies = RedisReplies(shared, 600, 2, 300)
    scopes = [("p", "/f", str(n)) for n in range(4)]
    for scope in scopes[:3]:
        await replies.begin(scope)
        await replies.end(scope, reply())
    assert await replies.begin(scopes[0]) is None  # the oldest went: over the count
    await replies.end(scopes[0], None)
    assert await replies.begin(scopes[2]) is not None
    await replies.begin(scopes[3])
    await replies.end(scopes[3], reply(b"x" * 200))  # over the bytes: the older ones go
    assert await replies.begin(scopes[1]) is None
    await replies.end(scopes[1], None)
    held = await shared.redis.get(shared.key("idem", "bytes"))
    assert 200 < int(held) <= 300
    big = ("p", "/f", "big")
    await replies.begin(big)
    await replies.end(big, reply(b"x" * 301))  # larger than the budget: not kept
    assert await replies.begin(big) is None
    short = RedisReplies(shared, 0.2, 100, 10_000)
    scope = ("p", "/f", "short")
    await short.begin(scope)
    await short.end(scope, reply())
    assert await short.begin(scope) is not None  # fresh: replayed
    await asyncio.sleep(0.3)
    assert await short.begin(scope) is None  # past the window: run again


# ---------------------------------------------------------------- a cluster that is down
async def test_the_oldest_replies_go_first_even_within_one_millisecond(shared: Shared) -> None:
    replies = RedisReplies(shared, 600, 10, 1_000_000)
    scopes = [("p", "/f", f"quick-{n}") for n in range(60)]
    for scope in scopes:
        await replies.begin(scope)
    for scope in scopes:  # one after the other: several in each millisecond
        await replies.end(scope, reply())
    kept = [scope for scope in scopes if await replies.begin(scope) is not None]
    assert kept == scopes[-10:]


async def test_a_cluster_that_does_not_answer_is_an_error_never_an_answer(dead: Shared) -> None:
    with pytest.raises(SharedStateError):
        await signing_key(dead)
    with pytest.raises(SharedStateError):
        await RedisClients(dead).authenticate("app", "secret")
    with pytest.raises(SharedStateError):
        await RedisClients(dead).add("app", ["restms:read"])
    revocations = RedisRevocations(dead, keep=630)
    with pytest.raises(SharedStateError):
        await revocations.update()
    assert revocations.stale()
    with pytest.raises(SharedStateError):
        await revocations.record("app")
    with pytest.raises(SharedStateError):
        await RedisBuckets(dead, rate=1, burst=1).take("alice")
    with pytest.raises(ServiceUnavailable):
        await RedisReplies(dead, 600, 100, 1000).begin(("p", "/f", "k"))
    await RedisReplies(dead, 600, 100, 1000).end(("p", "/f", "k"), reply())  # logged only


async def test_the_engine_setting_says_where_the_state_is() -> None:
    class Settings:
        engine = "embedded"
        redis_url = "redis://user:pw@127.0.0.1:7101"
        redis_namespace = "ns"

    assert for_settings(Settings()) is None
    Settings.engine = "redis"
    state = for_settings(Settings())
    assert state is not None
    try:
        assert state.key("t", "a", "b") == "{ns:t}:a:b"
        with pytest.raises(ValueError, match="namespace"):
            Shared(state.redis, "{bad}")
    finally:
        await state.close()
