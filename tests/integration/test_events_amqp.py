"""Management events with the real RabbitMQ on 127.0.0.1:5672 (docs/EVENTS.md).

* An AMQP bridge's link reports ``bridge.amqp.up`` when it connects, and
  ``bridge.amqp.down`` (``was`` up) when the broker goes away, then up again.
* Events leave by a bridge like any message: a bridge out of the system feed puts
  them on a RabbitMQ queue, their headers as AMQP application properties.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from tests.app.test_events import Watcher
from tests.conftest import MakeGateway
from tests.integration.broker import Broker
from tests.integration.gw import gateway, new_pipe, outbound, up

pytestmark = pytest.mark.integration


@pytest.mark.alone  # the broker stops
async def test_a_bridge_link_up_down_and_up_again(
    make_gateway: MakeGateway, broker: Broker, queue_name: str
) -> None:
    await asyncio.to_thread(broker.declare_queue, queue_name)
    gw = await gateway(
        make_gateway,
        guest_scopes="restms:admin",
        events_interval=0.5,
        bridge_allow="127.0.0.1",  # the broker, for a bridge made at run time
    )
    watcher = await Watcher.start(gw, "bridge.amqp.*")
    definition = outbound("out", f"/queue/{queue_name}")
    async with gw.http.post("/admin/bridges", json=definition) as r:
        assert r.status == 201, await r.text()
    await up(gw, "out")
    first = await watcher.event("bridge.amqp.up", timeout=20)
    assert first.headers["object"] == "out"
    assert first.details["url"] == "amqp://guest:***@127.0.0.1:5672"  # redacted
    await asyncio.to_thread(broker.stop_app)
    try:
        down = await watcher.event("bridge.amqp.down", timeout=30)
        assert (down.details["was"], down.details["state"]) == ("up", "retrying")
    finally:
        await asyncio.to_thread(broker.start_app)
    again = await watcher.event("bridge.amqp.up", timeout=60)
    assert again.headers["object"] == "out"


async def test_events_leave_by_a_bridge_out_of_the_system_feed(
    make_gateway: MakeGateway, broker: Broker, queue_name: str
) -> None:
    await asyncio.to_thread(broker.declare_queue, queue_name)
    events = {**outbound("events", f"/queue/{queue_name}"), "feed": "restms.system"}
    gw = await gateway(make_gateway, events)
    await up(gw, "events")
    pipe = await new_pipe(gw, "orders")  # pipe.created and join.created go out
    seen: dict[str, dict[str, object]] = {}
    async with asyncio.timeout(20):
        while "pipe.created" not in seen:
            got = await asyncio.to_thread(broker.get, queue_name, 10.0)
            assert got is not None
            _, props, payload = got
            document = json.loads(payload)
            assert props.content_type == "application/json"
            # the headers are AMQP 1.0 application properties, which RabbitMQ hands an
            # AMQP 0-9-1 consumer encoded as they came
            carried = props.headers["x-amqp-1.0-app-properties"]
            for header in ("event", "kind", "object", document["event"], document["object"]):
                assert header.encode() in carried
            seen[document["event"]] = {"properties": carried, "body": document}
    created = seen["pipe.created"]
    assert created["body"]["principal"] == "guest"  # type: ignore[index]
    key = pipe.rsplit("/", 1)[1]
    assert key not in json.dumps(seen, default=str)  # the pipe's name: never
    assert "guest:guest" not in json.dumps(seen, default=str)
