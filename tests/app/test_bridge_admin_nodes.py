"""Run-time bridges through the admin resource, on one gateway and on three cluster
nodes behind a round-robin proxy (tests/nodes.py): each request goes to the next node,
so a bridge made through one node is listed, refused, read and deleted through the
others (docs/CLUSTER.md, "Bridges"; docs/ADMIN.md).

No broker: every bridge points at a port nothing listens on (tests/app/test_bridge_admin.py).
"""

from __future__ import annotations

from typing import Any

import pytest

import bridges.registry
from tests.app.jsonapi import publish
from tests.app.test_bridge_admin import (
    ADMIN,
    admin_gateway,
    call,
    outbound,
    plain,
    until,
)
from tests.conftest import MakeGateway

pytestmark = [pytest.mark.nodes, pytest.mark.timeout(120)]


async def names(gw: Any, auth: str) -> list[list[str]]:
    """What three list requests in a row answer (on nodes: one from each node)."""
    answers = []
    for _ in range(3):
        status, listed, _ = await call(gw, auth, "GET")
        assert status == 200, listed
        answers.append([b["name"] for b in listed["bridges"]])
    return answers


async def test_a_bridge_made_through_one_node_is_listed_and_deleted_through_the_others(
    make_gateway: MakeGateway,
) -> None:
    gw, auth = await admin_gateway(make_gateway)
    root = auth["root"]
    status, reply, _ = await call(gw, root, "POST", definition=outbound(password="s3cret"))
    assert status == 201, reply
    assert reply["definition"]["password"] == "***"
    for _ in range(3):  # at once through every node, before its next look
        status, shown, _ = await call(gw, root, "GET", f"{ADMIN}/out")
        assert (status, shown["name"]) == (200, "out"), shown
    # The same again (the next node): 200; a different one under its name: 409.
    status, reply, _ = await call(gw, root, "POST", definition=outbound(password="s3cret"))
    assert status == 200, reply
    plain(
        await call(gw, root, "POST", definition=outbound(password="other")),
        409,
        "a different bridge named 'out' exists",
    )

    async def everywhere() -> bool:
        return await names(gw, root) == [["out"]] * 3

    await until(everywhere, "the bridge listed through every node")
    for _ in range(3):
        status, shown, _ = await call(gw, root, "GET", f"{ADMIN}/out")
        assert status == 200, shown
        assert (shown["name"], shown["configured"]) == ("out", False)

    # Two messages wait in its pipe (nothing listens where it sends): every node
    # refuses to delete it without ?discard=true, the one running it or not.
    async def two_wait() -> bool:
        return await publish(gw, "/restms/feed/orders", {"address": "a"}) == [1]

    await until(two_wait, "the bridge's pipe joined to its feed")
    assert await publish(gw, "/restms/feed/orders", {"address": "b"}) == [1]
    for _ in range(3):
        plain(await call(gw, root, "DELETE", f"{ADMIN}/out"), 409, "has 2 messages waiting")
    status, reply, _ = await call(gw, root, "DELETE", f"{ADMIN}/out?discard=true")
    assert (status, reply) == (200, {"deleted": "out", "discarded": 2})

    async def nowhere() -> bool:
        return await names(gw, root) == [[]] * 3

    await until(nowhere, "the bridge gone from every node")
    for _ in range(3):
        plain(await call(gw, root, "DELETE", f"{ADMIN}/out"), 404, "no bridge named 'out'")
    # Its name is free again, on every node.
    status, reply, _ = await call(gw, root, "POST", definition=outbound(target="/queue/again"))
    assert status == 201, reply


async def test_run_time_bridges_are_bounded_in_number_and_size(
    make_gateway: MakeGateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bridges.registry, "MAX_KEPT", 2)
    gw, auth = await admin_gateway(make_gateway)
    root = auth["root"]
    big = outbound("big", headers={"x-big": "v" * bridges.registry.MAX_DEFINITION})
    plain(await call(gw, root, "POST", definition=big), 413, "may take 4000 characters")
    for name in ("one", "two"):
        status, reply, _ = await call(gw, root, "POST", definition=outbound(name))
        assert status == 201, reply
    for _ in range(3):  # refused through every node
        plain(
            await call(gw, root, "POST", definition=outbound("three")),
            409,
            "at most 2 run-time bridges",
        )
    status, reply, _ = await call(gw, root, "DELETE", f"{ADMIN}/one")
    assert status == 200, reply
    status, reply, _ = await call(gw, root, "POST", definition=outbound("three"))
    assert status == 201, reply

    async def settled() -> bool:
        return [sorted(n) for n in await names(gw, root)] == [["three", "two"]] * 3

    await until(settled, "two bridges listed through every node")
