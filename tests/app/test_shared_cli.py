"""``main.py client add|list|remove|revoke`` with ``engine = "redis"`` edits the client
registry and revocation list every node shares, against the real Redis Cluster and a
real gateway on 127.0.0.1 reading them (docs/AUTH.md, section 16).

The command line works on the namespace of the configuration (``redis_namespace``):
here the test's own, which the gateway node reads too.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

from tests.app.oauth import DOMAIN, As, token
from tests.app.process import main_py
from tests.app.test_shared_nodes import StartNode, node
from tests.cluster_state import URL, namespace, redis_cluster

__all__ = ["namespace", "node", "redis_cluster"]  # fixtures

pytestmark = pytest.mark.app

REDIS = {"RESTMS_ENGINE": "redis", "RESTMS_REDIS_URL": URL}


@pytest.fixture
def client_id() -> str:
    return f"cli-{uuid.uuid4().hex[:12]}"


async def test_the_command_line_edits_the_registry_every_node_reads(
    node: StartNode, client_id: str, namespace: str
) -> None:
    gw = await node()
    env = {**REDIS, "RESTMS_REDIS_NAMESPACE": namespace}
    code, out, err = await main_py("client", "add", client_id, "--scopes", "restms:read", env=env)
    assert code == 0, err
    secret = out.split("client_secret: ", 1)[1].split()[0]
    code, out, err = await main_py("client", "list", env=env)
    assert code == 0, err
    assert f"{client_id}\trestms:read" in out.splitlines()
    reader = As.bearer(gw, await token(gw, client_id, secret))
    assert (await reader.call("GET", DOMAIN))[0] == 200
    code, out, err = await main_py("client", "revoke", client_id, env=env)
    assert code == 0, err
    revoked = time.monotonic()
    while (status := (await reader.call("GET", DOMAIN))[0]) == 200:
        assert time.monotonic() - revoked < 1.0, "still accepted a second later"
        await asyncio.sleep(0.05)
    assert status == 401
    code, _, err = await main_py("client", "remove", client_id, env=env)
    assert code == 2
    assert f"no client {client_id!r} in the shared client registry" in err


async def test_a_cluster_that_does_not_answer_is_a_clear_error() -> None:
    env = {**REDIS, "RESTMS_REDIS_URL": "redis://127.0.0.1:7199"}
    code, _, err = await main_py("client", "list", env=env)
    assert code == 2
    assert "the shared state did not answer" in err
