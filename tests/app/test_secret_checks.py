"""Secrets checked over real HTTP: malformed Basic credentials, and the bounds on
secret checks per client address and per account (docs/AUTH.md, section 11)."""

from __future__ import annotations

import asyncio
import base64
import json
import logging

import pytest
import yarl

from auth import User
from auth.clients import hash_secret
from tests.app.oauth import DOMAIN, clients, token
from tests.conftest import Gateway, MakeGateway

pytestmark = pytest.mark.app

TOKEN_FORM = b"grant_type=client_credentials"


async def raw_request(
    gw: Gateway, head: bytes, body: bytes = b"", source: str = "127.0.0.1"
) -> tuple[int, bytes, bytes]:
    """(status, head, body) of one request sent as these very bytes (a client library
    would refuse to send some of them), from the loopback address ``source``; the head's
    ``Host: gw`` names the gateway's own address (another host is 421)."""
    url = yarl.URL(gw.url)
    head = head.replace(b"Host: gw\r\n", f"Host: {url.host}:{url.port}\r\n".encode())
    reader, writer = await asyncio.open_connection(url.host, url.port, local_addr=(source, 0))
    try:
        writer.write(head + b"Connection: close\r\n\r\n" + body)
        async with asyncio.timeout(10):
            reply = await reader.read()
    finally:
        writer.close()
    head_part, _, body_part = reply.partition(b"\r\n\r\n")
    return int(head_part.split(b" ", 2)[1]), head_part, body_part


# Basic credentials that do not decode: raw bytes that are not ASCII (valid UTF-8 or
# not) in the header itself, and base64 whose bytes are not UTF-8.
MALFORMED = (
    b"Basic \xc3\xa9=",
    b"Basic \xff\xfe",
    b"Basic " + base64.b64encode(b"legacy:s3cret") + b"\xff",
    b"Basic " + base64.b64encode(b"l\xe9gacy:s3cret"),
    b"Basic !!!",
)


@pytest.mark.parametrize("credentials", MALFORMED)
async def test_malformed_basic_credentials_are_401_without_a_traceback(
    make_gateway: MakeGateway, caplog: pytest.LogCaptureFixture, credentials: bytes
) -> None:
    password_hash = await asyncio.to_thread(hash_secret, "s3cret")
    user = User(name="legacy", password_hash=password_hash, scopes=("restms:admin",))
    configured, _ = await clients(app="restms:read")
    gw = await make_gateway(users=(user,), clients=configured)
    auth = b"Authorization: " + credentials + b"\r\n"
    with caplog.at_level(logging.INFO):
        for path in (DOMAIN.encode(), b"/admin/stats"):
            status, head, body = await raw_request(
                gw, b"GET " + path + b" HTTP/1.1\r\nHost: gw\r\n" + auth
            )
            assert status == 401, body
            assert b"Content-Type: text/plain" in head
            assert body.decode().strip() == "malformed Basic credentials"
            assert b'WWW-Authenticate: Basic realm="RestMS::"' in head
        status, head, body = await raw_request(
            gw,
            b"POST /oauth/token HTTP/1.1\r\nHost: gw\r\n"
            + auth
            + b"Content-Type: application/x-www-form-urlencoded\r\n"
            + b"Content-Length: %d\r\n" % len(TOKEN_FORM),
            TOKEN_FORM,
        )
        assert status == 401, body
        assert b"Content-Type: application/json" in head
        assert b'WWW-Authenticate: Basic realm="restms"' in head
        assert json.loads(body) == {
            "error": "invalid_client",
            "error_description": "malformed Basic credentials",
        }
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]


# ---------------------------------------------------------------- bounds on secret checks
async def ask_token(gw: Gateway, client_id: str, secret: str, source: str) -> tuple[int, str]:
    """(status, body) of a token request from ``source`` (any of 127.0.0.0/8)."""
    status, _, body = await ask_token_head(gw, client_id, secret, source)
    return status, body


async def ask_token_head(
    gw: Gateway, client_id: str, secret: str, source: str
) -> tuple[int, bytes, str]:
    """(status, head, body) of a token request from ``source``."""
    basic = base64.b64encode(f"{client_id}:{secret}".encode())
    status, head, body = await raw_request(
        gw,
        b"POST /oauth/token HTTP/1.1\r\nHost: gw\r\nAuthorization: Basic " + basic + b"\r\n"
        b"Content-Type: application/x-www-form-urlencoded\r\n"
        b"Content-Length: %d\r\n" % len(TOKEN_FORM),
        TOKEN_FORM,
        source,
    )
    return status, head, body.decode()


ACCOUNT_BOUND = {"account_failure_burst": 3, "account_failure_rate": 0.01}


async def test_guesses_from_rotating_addresses_meet_the_account_bound(
    make_gateway: MakeGateway,
) -> None:
    """Each guess from an address of its own (so no address's bound is reached): after
    account_failure_burst failures the account's checks are refused, from any address,
    the right secret too while its holder has not succeeded yet; another account is
    not affected."""
    configured, secrets = await clients(alice="restms:read", bob="restms:read")
    gw = await make_gateway(clients=configured, **ACCOUNT_BOUND)
    answers = [await ask_token(gw, "alice", "wrong", f"127.0.0.{i}") for i in range(2, 12)]
    assert [status for status, _ in answers] == [401] * 3 + [429] * 7
    # An OAuth error document, as the endpoint's other refusals are (RFC 6749 5.2).
    assert json.loads(answers[-1][1]) == {
        "error": "temporarily_unavailable",
        "error_description": "too many failed secret checks for this account",
    }
    status, head, _ = await ask_token_head(gw, "alice", "wrong", "127.0.0.12")
    assert status == 429
    assert b"Content-Type: application/json" in head
    assert b"Retry-After: " in head
    status, _ = await ask_token(gw, "alice", secrets["alice"], "127.0.0.20")
    assert status == 429  # not yet known right: it waits as the guesser does
    status, _ = await ask_token(gw, "bob", secrets["bob"], "127.0.0.21")
    assert status == 200


async def test_a_known_secret_passes_whoever_guesses_from_its_address(
    make_gateway: MakeGateway,
) -> None:
    """A guesser that empties both the bucket of the address it shares with the holder
    and the holder's account bucket does not stop the holder, whose secret checked
    right before, for a moment: not from that address, nor from another."""
    configured, secrets = await clients(alice="restms:read")
    gw = await make_gateway(clients=configured, **ACCOUNT_BOUND)
    await token(gw, "alice", secrets["alice"])  # the holder, once
    shared = "127.0.0.1"
    guesses = await asyncio.gather(
        *(ask_token(gw, "alice", f"guess{i}", shared) for i in range(30))
    )
    reasons = {json.loads(body)["error_description"] for status, body in guesses if status == 429}
    assert reasons == {
        "too many failed secret checks for this account",
        "too many secret checks from this address",
    }
    for source in (shared, "127.0.0.9"):
        status, body = await ask_token(gw, "alice", secrets["alice"], source)
        assert status == 200, body
    status, _ = await ask_token(gw, "alice", "guess", shared)
    assert status == 429  # the guesser still is refused


async def test_basic_logins_meet_the_account_bound_and_wait_no_longer_than_it(
    make_gateway: MakeGateway,
) -> None:
    """Basic passwords are bounded per account as client secrets are, and a holder
    refused while its account is over the bound gets in once Retry-After has passed
    (at most 1 / account_failure_rate seconds)."""
    password_hash = await asyncio.to_thread(hash_secret, "s3cret")
    user = User(name="legacy", password_hash=password_hash, scopes=("restms:read",))
    gw = await make_gateway(users=(user,), account_failure_burst=2, account_failure_rate=1.0)

    async def login(password: str, source: str) -> tuple[int, bytes]:
        basic = base64.b64encode(f"legacy:{password}".encode())
        status, head, _ = await raw_request(
            gw,
            b"GET " + DOMAIN.encode() + b" HTTP/1.1\r\nHost: gw\r\n"
            b"Authorization: Basic " + basic + b"\r\n",
            source=source,
        )
        return status, head

    statuses = [(await login("wrong", f"127.0.0.{i}"))[0] for i in range(2, 6)]
    assert statuses[:2] == [401, 401]
    assert 429 in statuses[2:]
    status, head = await login("s3cret", "127.0.0.7")
    if status == 429:  # the bucket had not refilled yet: Retry-After says when it will
        (after,) = [
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.startswith(b"Retry-After")
        ]
        assert after <= 1
        await asyncio.sleep(after)
        status, head = await login("s3cret", "127.0.0.7")
    assert status == 200, head
