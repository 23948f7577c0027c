"""Bridge traffic in the mirror: a ZeroMQ push bridge out and a pull bridge in, against
real zmq sockets on 127.0.0.1 in the test (docs/ANALYTICS.md, docs/ZEROMQ.md).

Decided behaviour under test: each message a bridge passes to its far side is one
``bridge_out`` event (the bridge's name, its pipe as a digest, the bridge's principal),
each message it publishes from the far side one ``bridge_in`` event (and a ``publish``);
the bridge's pipe name appears nowhere in the lake.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import Counter
from typing import Any, cast

import pytest
import zmq
import zmq.asyncio

from bridges.config import parse
from bridges.zeromq import ZmqBridge
from feeds.config import FeedConfig
from gateway.admin.bridging import BRIDGES
from tests.app.test_mirror import checked_lake, lake_of
from tests.app.test_webhooks import until
from tests.conftest import MakeGateway
from tests.integration.gw import publish

pytestmark = pytest.mark.timeout(60)

WAIT = 10.0
FEEDS = (FeedConfig(name="orders", type="fanout"), FeedConfig(name="incoming", type="fanout"))


def zmq_bridge(name: str, socket: str, feed: str) -> dict[str, Any]:
    return {"kind": "zeromq", "name": name, "socket": socket, "feed": feed,
            "endpoints": ["tcp://127.0.0.1:*"]}  # fmt: skip


async def test_bridge_traffic_is_mirrored(make_gateway: MakeGateway) -> None:
    bridges = (zmq_bridge("out", "push", "orders"), zmq_bridge("in", "pull", "incoming"))
    gw = await make_gateway(feeds=FEEDS, bridges=tuple(parse(b) for b in bridges))

    def bridge(name: str) -> ZmqBridge:
        return cast(ZmqBridge, gw.app[BRIDGES].get(name))

    await until(lambda: all(bridge(n).health.state.name == "up" for n in ("out", "in")), "up")
    context = zmq.asyncio.Context()
    puller, pusher = context.socket(zmq.PULL), context.socket(zmq.PUSH)
    try:
        puller.connect(bridge("out").bound[0])
        pusher.connect(bridge("in").bound[0])
        sent = [{"address": "eu.1", "message_id": f"o{i}", "content": [{"value": "hello"}]}
                for i in range(3)]  # fmt: skip
        assert await publish(gw, "orders", *sent) == [1, 1, 1]
        async with asyncio.timeout(WAIT):
            frames = [await puller.recv_multipart() for _ in range(3)]
        assert [f[2] for f in frames] == [b"hello"] * 3
        await until(lambda: bridge("out").backlog() == 0, "the far side's acceptance")
        for i in range(2):
            envelope = b'{"v":1,"p":{"message_id":"i%d"}}' % i
            await pusher.send_multipart([b"eu.2", envelope, b"world"])
        await until(lambda: bridge("in").counters.published == 2, "two published")
        out_pipe = bridge("out").pipe
        assert out_pipe is not None
        pipe_name = out_pipe.key
    finally:
        puller.close(linger=0)
        pusher.close(linger=0)
        context.term()
    lake = lake_of(gw)
    await gw.stop()
    rows = await asyncio.to_thread(checked_lake, lake)
    assert all(pipe_name not in str(value) for row in rows for value in row.values())
    bridged = [r for r in rows if r["bridge"] is not None]
    assert Counter((r["event"], r["bridge"]) for r in bridged) == {
        ("bridge_out", "out"): 3,
        ("bridge_in", "in"): 2,
    }
    digest = hashlib.sha256(pipe_name.encode()).hexdigest()[:12]
    out = [r for r in bridged if r["event"] == "bridge_out"]
    assert {(r["feed"], r["pipe"], r["principal"], r["outcome"]) for r in out} == {
        ("orders", digest, "#bridge/out", "ok")
    }
    assert sorted(r["message_id"] for r in out) == ["o0", "o1", "o2"]
    into = [r for r in bridged if r["event"] == "bridge_in"]
    # A message's size counts its address and properties with its content.
    size = len("eu.2") + len("message_id") + len("i0") + len("world")
    assert {(r["feed"], r["address"], r["principal"], r["size"]) for r in into} == {
        ("incoming", "eu.2", "#bridge/in", size)
    }
    assert sorted(r["message_id"] for r in into) == ["i0", "i1"]
    published = Counter(r["feed"] for r in rows if r["event"] == "publish")
    assert published == {"orders": 3, "incoming": 2}


async def test_a_message_a_bridge_dead_letters_is_mirrored_as_passed_on(
    make_gateway: MakeGateway,
) -> None:
    """ANALYTICS.md: ``bridge_out`` is a bridge done with a message, sent or (refused by
    the far side, here unmappable) dead-lettered; the dead letter is its own event."""
    gw = await make_gateway(feeds=FEEDS, bridges=(parse(zmq_bridge("out", "push", "orders")),))

    def bridge() -> ZmqBridge:
        return cast(ZmqBridge, gw.app[BRIDGES].get("out"))

    await until(lambda: bridge().health.state.name == "up", "up")
    two = {"address": "eu.1", "message_id": "two", "content": [{"value": "a"}, {"value": "b"}]}
    assert await publish(gw, "orders", two) == [1]
    await until(lambda: bridge().counters.dead_lettered == 1, "the dead letter")
    await until(lambda: bridge().backlog() == 0, "the pipe emptied")
    lake = lake_of(gw)
    await gw.stop()
    rows = await asyncio.to_thread(checked_lake, lake)
    events = Counter(r["event"] for r in rows if r["message_id"] == "two")
    assert (events["bridge_out"], events["dead_letter"]) == (1, 1)
