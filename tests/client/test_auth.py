"""Credentials against a real gateway: OAuth 2.0 client credentials (discovered,
cached, renewed before expiry), a bearer token given as is, HTTP Basic; and the
admin sub-client with an admin token."""

from __future__ import annotations

import time
from pathlib import Path

import httpx2
import pytest

from restms_client import (
    AsyncClient,
    Basic,
    Bearer,
    Client,
    ClientCredentials,
    Forbidden,
    Retry,
    Unauthorized,
)
from tests.client.conftest import MakeProcess, add_client, main_py
from tests.client.gateway import GatewayProcess

NO_RETRY = Retry(attempts=0)


def with_client(
    make_process: MakeProcess, client_id: str, scopes: str, env: dict[str, str] | None = None
) -> tuple[GatewayProcess, str]:
    """A gateway started with an OAuth client of its built-in issuer; its secret."""
    gateway = make_process(env, start=False)
    secret = add_client(gateway, client_id, scopes)
    gateway.start()
    return gateway, secret


def test_client_credentials_are_cached_and_renewed(make_process: MakeProcess) -> None:
    gateway, secret = with_client(
        make_process,
        "app",
        "restms:read restms:publish restms:subscribe",
        {"RESTMS_TOKEN_TTL": "8"},
    )
    credentials = ClientCredentials(client_id="app", client_secret=secret, leeway=5)
    assert secret not in repr(credentials)
    with Client(gateway.url, auth=credentials) as client:
        pipe = client.create_pipe(title="mine")
        token = client._http.token["access_token"]  # type: ignore[attr-defined]
        client.pipe(pipe)
        assert client._http.token["access_token"] == token  # type: ignore[attr-defined]  # kept
        # Once within the leeway of its expiry (as the client counts it), the next
        # request gets a new one: 3 s after it was issued, however long the above took.
        renew_at = client._http.token["expires_at"] - 5  # type: ignore[attr-defined]
        time.sleep(max(0.0, renew_at - time.time()) + 0.3)
        assert client.pipe(pipe).title == "mine"
        assert client._http.token["access_token"] != token  # type: ignore[attr-defined]

    wrong = ClientCredentials(client_id="app", client_secret="not-it")
    with Client(gateway.url, auth=wrong, retry=NO_RETRY) as client, pytest.raises(Unauthorized):
        client.create_pipe()


def test_a_bearer_token_given_as_is(make_process: MakeProcess) -> None:
    gateway, secret = with_client(make_process, "reader", "restms:read")
    reply = httpx2.post(
        gateway.url + "/oauth/token",
        data={"grant_type": "client_credentials"},
        auth=("reader", secret),
    )
    token = reply.json()["access_token"]
    with Client(gateway.url, auth=Bearer(token), retry=NO_RETRY) as client:
        assert client.domain().name == "default"
        with pytest.raises(Forbidden) as refused:
            client.create_feed("news", "fanout")  # read only
        assert "scope" in refused.value.reason
    with Client(gateway.url, auth=Bearer("not-a-token"), retry=NO_RETRY) as client:
        with pytest.raises(Unauthorized) as bad:
            client.domain()
        assert bad.value.status == 401
        assert bad.value.reason


def test_http_basic(make_process: MakeProcess, tmp_path: Path) -> None:
    probe = make_process(start=False)
    hashed = main_py(probe, "user", "hash", stdin="s3cret-words\n").strip().splitlines()[-1]
    config = tmp_path / "gateway.toml"
    config.write_text(
        f'[[users]]\nname = "legacy"\npassword_hash = "{hashed}"\n'
        'scopes = ["restms:read", "restms:publish", "restms:subscribe"]\n'
    )
    gateway = make_process(args=("--config", str(config)))
    with Client(gateway.url, auth=Basic("legacy", "s3cret-words")) as client:
        pipe = client.create_pipe(title="old school")
        assert client.pipe(pipe).title == "old school"
    wrong = Basic("legacy", "wrong")
    with Client(gateway.url, auth=wrong, retry=NO_RETRY) as client, pytest.raises(Unauthorized):
        client.domain()


def test_the_admin_sub_client(make_process: MakeProcess) -> None:
    scopes = "restms:admin restms:read restms:publish restms:subscribe"
    gateway, secret = with_client(make_process, "ops", scopes)
    with Client(
        gateway.url, auth=ClientCredentials(client_id="ops", client_secret=secret)
    ) as client:
        pipe = client.create_pipe(title="work")
        listed = {p["name"]: p for p in client.admin.pipes()}
        assert listed[pipe.name]["title"] == "work"
        assert client.admin.inspect_pipe(pipe.name)["title"] == "work"
        added = client.admin.add_client("worker", ["restms:read"])
        assert added["client_id"] == "worker"
        assert added["client_secret"]
        assert "worker" in {c["client_id"] for c in client.admin.clients()}
        assert client.admin.revoke_client("worker")["revoked"] == "worker"
        provisioned = client.admin.create_pipe("someone", title="for someone")
        assert provisioned.href == f"{gateway.url}/restms/resource/{provisioned.name}"
        assert provisioned.title == "for someone"
        assert client.admin.purge_pipe(pipe.name)["purged"] == 0
        assert client.admin.delete_pipe(pipe.name)["deleted"] == pipe.name
        assert "counters" in client.admin.stats()
        assert client.admin.bridges() == []


async def test_client_credentials_on_the_asyncio_client(make_process: MakeProcess) -> None:
    gateway, secret = with_client(
        make_process, "app", "restms:read restms:publish restms:subscribe"
    )
    credentials = ClientCredentials(client_id="app", client_secret=secret)
    async with AsyncClient(gateway.url, auth=credentials) as client:
        pipe = await client.create_pipe(title="async")
        assert (await client.pipe(pipe)).title == "async"
        with pytest.raises(Forbidden) as refused:
            await client.admin.stats()  # not an admin
        assert "restms:admin" in refused.value.reason
    wrong = ClientCredentials(client_id="app", client_secret="not-it")
    async with AsyncClient(gateway.url, auth=wrong, retry=NO_RETRY) as client:
        with pytest.raises(Unauthorized) as bad:
            await client.domain()
        assert "invalid_client" in bad.value.reason
