"""An outbound bridge's internal pipe (no broker needed: the broker URL refuses).

* It is never collected as idle while its bridge runs, even with a full window and
  a broker away for longer than ``pipe_idle_timeout``.
* A definition edited between runs takes effect on the pipe found again.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bridges.amqp import owner_of
from bridges.config import parse
from feeds.config import FeedConfig
from tests.app.jsonapi import HJ, body
from tests.conftest import Gateway, MakeGateway

pytestmark = pytest.mark.app

FEEDS = (FeedConfig(name="orders", type="topic"),)


def definition(address: str, **more: object) -> dict[str, object]:
    return {"name": "out", "direction": "out", "urls": ["amqp://127.0.0.1:1"],
            "feed": "orders", "address": address, "target": "/queue/x", **more}  # fmt: skip


async def publish(gw: Gateway, address: str, count: int = 1) -> list[int]:
    messages = [{"address": address, "message_id": f"{address}-{i}"} for i in range(count)]
    async with gw.http.post(
        gw.uri("/restms/feed/orders"), data=body(message=messages), headers=HJ
    ) as r:
        assert r.status == 200, await r.text()
        reply = await r.json(content_type=None)
    return [int(m["count"]) for m in reply["restms"]["message"]]


async def test_the_bridge_pipe_outlives_the_idle_timeout(make_gateway: MakeGateway) -> None:
    gw = await make_gateway(
        feeds=FEEDS,
        bridges=(parse(definition("#", window=2)),),
        pipe_idle_timeout=0.5,
        sweep_interval=0.1,
    )
    assert await publish(gw, "o.x", 5) == [1] * 5
    [pipe] = gw.engine.pipes_of(owner_of("out"))
    await asyncio.sleep(2.0)  # four idle timeouts, the window full all along
    assert gw.engine.pipes_of(owner_of("out")) == [pipe]
    assert not pipe.deleted
    assert len(pipe.messages) == 5


async def test_an_edited_definition_takes_effect_after_a_restart(
    make_gateway: MakeGateway, tmp_path: Path
) -> None:
    data = str(tmp_path / "var")
    first = await make_gateway(feeds=FEEDS, bridges=(parse(definition("a.#")),), data_dir=data)
    assert await publish(first, "a.1") == [1]
    await first.stop()
    second = await make_gateway(feeds=FEEDS, bridges=(parse(definition("b.#")),), data_dir=data)
    [pipe] = second.engine.pipes_of(owner_of("out"))
    joins = [j.spec.address for j in pipe.joins.values() if not j.is_default]
    assert joins == ["b.#"]
    assert await publish(second, "a.2") == [0]  # the old join is gone
    assert await publish(second, "b.1") == [1]
    assert len(pipe.messages) == 2  # a.1 from the first run is still waiting, and b.1
