"""WebSocket on a pipe (our extension, docs/BROWSER.md): delivery, acknowledgement,
publishing and refused frames, against a real gateway on 127.0.0.1.

Decided behaviour under test:

* A GET on a pipe URI with ``Upgrade: websocket`` becomes a socket speaking
  ``restms.v1``. Every message held, then each new one, arrives in order as
  ``{"type": "message", "position": n, "restms": {...}}`` with the SSE event's document.
* ``{"type": "ack", "position": n}`` deletes ``n`` and every older message (answered
  with ``acked`` only when it carries an ``id``); what is not acknowledged is sent again
  on the next connection, or on this one once its lease runs out. At most ``window``
  sent messages wait for acknowledgement.
* ``{"type": "publish", "feed": ..., "message": ...}`` publishes as a POST to that feed
  would (same checks, same reasons), answered with ``published`` and the counts.
* A frame that cannot be served gets an ``error`` frame with the HTTP status and reason,
  the client's ``id`` echoed, and the socket stays open.
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest

from tests.app.jsonapi import AJ, DOMAIN, HJ, body, get, join, new_pipe, publish
from tests.conftest import Gateway, MakeGateway

pytestmark = pytest.mark.app

PROTOCOL = "restms.v1"
STEP = 2.0  # seconds any one frame may take to arrive
DEFAULT_FEED = "/restms/feed/default"


# ---------------------------------------------------------------- helpers
async def connect(
    gw: Gateway, uri: str, *, protocols: tuple[str, ...] = (PROTOCOL,), **kwargs: Any
) -> aiohttp.ClientWebSocketResponse:
    return await gw.http.ws_connect(uri, protocols=protocols, **kwargs)


async def receive(ws: aiohttp.ClientWebSocketResponse) -> dict[str, Any]:
    """The next frame, a JSON text frame."""
    found = await ws.receive(timeout=STEP)
    assert found.type is aiohttp.WSMsgType.TEXT, (found.type, found.data, found.extra)
    frame: dict[str, Any] = json.loads(found.data)
    return frame


async def expect(ws: aiohttp.ClientWebSocketResponse, kind: str) -> dict[str, Any]:
    frame = await receive(ws)
    assert frame["type"] == kind, frame
    return frame


async def deliveries(ws: aiohttp.ClientWebSocketResponse, count: int) -> list[dict[str, Any]]:
    return [await expect(ws, "message") for _ in range(count)]


def message(frame: dict[str, Any]) -> dict[str, Any]:
    (found,) = frame["restms"]["message"]
    return dict(found)


def ids(frames: list[dict[str, Any]]) -> list[str]:
    return [message(frame)["message_id"] for frame in frames]


async def ended(ws: aiohttp.ClientWebSocketResponse) -> tuple[dict[str, Any], int]:
    """The ``end`` frame, then the close frame: (the end frame, the close code)."""
    end = await expect(ws, "end")
    found = await ws.receive(timeout=STEP)
    assert found.type is aiohttp.WSMsgType.CLOSE, (found.type, found.data)
    assert end["code"] == found.data
    assert end["reason"] == found.extra
    return end, int(found.data)


async def quiet(ws: aiohttp.ClientWebSocketResponse, seconds: float) -> None:
    """Nothing arrives for ``seconds``."""
    try:
        found = await ws.receive(timeout=seconds)
    except TimeoutError:
        return
    raise AssertionError(f"unexpected frame {found.type} {found.data!r}")


def addressed(pipe: dict[str, Any], *values: str) -> list[dict[str, Any]]:
    """Messages for the default feed that reach ``pipe``, one per value (its message_id)."""
    return [
        {"address": pipe["name"], "message_id": v, "content": [{"type": "text/plain", "value": v}]}
        for v in values
    ]


async def send(gw: Gateway, pipe: dict[str, Any], *values: str) -> None:
    assert await publish(gw, DEFAULT_FEED, *addressed(pipe, *values)) == [1] * len(values)


async def held(gw: Gateway, pipe: dict[str, Any]) -> list[str]:
    """The message_ids the pipe holds, from an HTTP GET of the pipe."""
    status, reply = await get(gw, pipe["uri"])
    assert status == 200, reply
    listed = reply["restms"]["pipe"][0].get("message", [])
    return [m["message_id"] for m in listed if m.get("async") != "1"]


async def fanout(gw: Gateway, name: str) -> str:
    async with gw.http.post(
        DOMAIN, data=body(feed=[{"name": name, "type": "fanout"}]), headers=HJ
    ) as r:
        assert r.status == 201, await r.text()
        return r.headers["Location"]


# ---------------------------------------------------------------- delivery
async def test_held_and_new_messages_arrive_in_order_as_json_frames(gw: Gateway) -> None:
    pipe = await new_pipe(gw)
    await send(gw, pipe, "one", "two", "three")
    async with await connect(gw, pipe["uri"]) as ws:
        assert ws.protocol == PROTOCOL
        first = await deliveries(ws, 3)
        await send(gw, pipe, "four", "five")
        later = await deliveries(ws, 2)
        await quiet(ws, 0.2)
    frames = first + later
    assert ids(frames) == ["one", "two", "three", "four", "five"]
    positions = [frame["position"] for frame in frames]
    assert positions == sorted(positions)
    assert len(set(positions)) == 5
    for frame in frames:
        found = message(frame)
        assert found["href"].endswith(f".{frame['position']}")  # the URI to DELETE
        assert found["address"] == pipe["name"]
        assert found["content"] == [
            {"type": "text/plain", "encoding": "plain", "value": found["message_id"]}
        ]
        assert set(frame) == {"type", "position", "restms"}
    # The frame carries the document a GET of the message gives, plus its href.
    status, reply = await get(gw, message(frames[0])["href"])
    assert status == 200
    alone = reply["restms"]["message"][0]
    assert {k: v for k, v in message(frames[0]).items() if k != "href"} == alone
    # Reading over the socket removes nothing.
    assert await held(gw, pipe) == ["one", "two", "three", "four", "five"]


async def test_ack_removes_the_message_and_every_older_one(gw: Gateway) -> None:
    pipe = await new_pipe(gw)
    await send(gw, pipe, "a", "b", "c")
    async with await connect(gw, pipe["uri"]) as ws:
        frames = await deliveries(ws, 3)
        await ws.send_json({"type": "ack", "position": frames[1]["position"], "id": "ack-1"})
        acked = await expect(ws, "acked")
        assert acked == {
            "type": "acked",
            "position": frames[1]["position"],
            "removed": 2,
            "id": "ack-1",
        }
        assert await held(gw, pipe) == ["c"]
        for frame in frames[:2]:
            assert (await get(gw, message(frame)["href"]))[0] == 404
        # An ack without an id is not answered; it takes effect all the same.
        await ws.send_json({"type": "ack", "position": frames[2]["position"]})
        await quiet(ws, 0.2)
        assert await held(gw, pipe) == []
        # Acknowledging again, or a position not issued yet, removes nothing.
        await ws.send_json({"type": "ack", "position": frames[2]["position"], "id": 2})
        assert (await expect(ws, "acked"))["removed"] == 0
        await ws.send_json({"type": "ack", "position": 10**12, "id": 3})
        assert (await expect(ws, "acked"))["removed"] == 0
        await send(gw, pipe, "d")
        assert ids(await deliveries(ws, 1)) == ["d"]


async def test_what_is_not_acknowledged_comes_again_after_a_reconnect(gw: Gateway) -> None:
    pipe = await new_pipe(gw)
    await send(gw, pipe, "a", "b", "c")
    async with await connect(gw, pipe["uri"]) as ws:
        frames = await deliveries(ws, 3)
        await ws.send_json({"type": "ack", "position": frames[0]["position"], "id": 1})
        await expect(ws, "acked")
    await send(gw, pipe, "d")
    async with await connect(gw, pipe["uri"]) as ws:
        again = await deliveries(ws, 3)
        await quiet(ws, 0.2)
    assert ids(again) == ["b", "c", "d"]
    assert [f["position"] for f in again[:2]] == [f["position"] for f in frames[1:]]


async def test_a_message_whose_lease_runs_out_is_sent_again(make_gateway: MakeGateway) -> None:
    gw = await make_gateway(sweep_interval=0.05)
    status, reply, location = await _post(gw, DOMAIN, pipe=[{"lease": "0.3"}])
    assert status == 201, reply
    pipe = {**reply["restms"]["pipe"][0], "uri": location}
    await send(gw, pipe, "slow")
    async with await connect(gw, pipe["uri"]) as ws:
        (first,) = await deliveries(ws, 1)
        assert "delivery_count" not in message(first)
        (second,) = await deliveries(ws, 1)  # the lease ran out: at a new position
        assert message(second)["message_id"] == "slow"
        assert message(second)["delivery_count"] == "1"
        assert second["position"] > first["position"]
        await ws.send_json({"type": "ack", "position": second["position"], "id": 1})
        assert (await expect(ws, "acked"))["removed"] == 1
        await quiet(ws, 0.5)  # acknowledged in time: never again
    assert await held(gw, pipe) == []


async def test_no_more_than_the_window_waits_for_acknowledgement(
    make_gateway: MakeGateway,
) -> None:
    gw = await make_gateway(websocket_window=3)
    pipe = await new_pipe(gw)
    await send(gw, pipe, *[f"m{i}" for i in range(6)])
    async with await connect(gw, pipe["uri"]) as ws:
        frames = await deliveries(ws, 3)
        await quiet(ws, 0.3)
        await ws.send_json({"type": "ack", "position": frames[0]["position"]})
        frames += await deliveries(ws, 1)
        await quiet(ws, 0.3)
        await ws.send_json({"type": "ack", "position": frames[3]["position"]})
        frames += await deliveries(ws, 2)
        await quiet(ws, 0.3)
    assert ids(frames) == [f"m{i}" for i in range(6)]
    # A client may ask for a smaller window, never a larger one.
    async with await connect(gw, pipe["uri"] + "?window=1") as ws:
        frames = await deliveries(ws, 1)
        await quiet(ws, 0.3)
    assert ids(frames) == ["m4"]
    for bad in ("0", "4", "x", "-1", "1" * 40):
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await connect(gw, pipe["uri"] + f"?window={bad}")
        assert refused.value.status == 400


async def test_messages_on_disk_past_the_memory_budget_are_all_sent(
    make_gateway: MakeGateway,
) -> None:
    gw = await make_gateway(memory_budget=200_000, websocket_window=1000)
    pipe = await new_pipe(gw)
    values = [f"p{i:04d}" for i in range(800)]  # about 1,000 bytes each in memory
    messages = [{**m, "delivery_mode": "2"} for m in addressed(pipe, *values)]
    assert await publish(gw, DEFAULT_FEED, *messages) == [1] * len(values)
    assert gw.engine.resolve(pipe["name"]).spilled  # type: ignore[union-attr]
    async with await connect(gw, pipe["uri"]) as ws:
        frames = await deliveries(ws, len(values))
        await quiet(ws, 0.2)
    assert ids(frames) == values


async def test_each_pipe_gets_its_own_hrefs_in_a_fanout(gw: Gateway) -> None:
    """Frames of one message to many pipes differ in the pipe's own URIs only."""
    news = await fanout(gw, "wide")
    pipes = [await new_pipe(gw) for _ in range(3)]
    for pipe in pipes:
        await join(gw, pipe, news)
    async with gw.http.post(news, data=b"staged bytes", headers={"Content-Type": "x/y"}) as r:
        assert r.status == 201
        staged = r.headers["Location"]
    sockets = [await connect(gw, pipe["uri"]) for pipe in pipes]
    try:
        embedded = {"message_id": "e", "content": [{"type": "text/plain", "value": "same"}]}
        linked = {"message_id": "s", "content": [{"href": staged}]}
        assert await publish(gw, news, embedded, linked) == [3, 3]
        for pipe, ws in zip(pipes, sockets, strict=True):
            first, second = (message(frame) for frame in await deliveries(ws, 2))
            assert first["href"].endswith(f"/{pipe['name']}.1")
            assert first["content"] == [
                {"type": "text/plain", "encoding": "plain", "value": "same"}
            ]
            (content,) = second["content"]
            assert content["href"].endswith(f"/{pipe['name']}.2.0")  # this pipe's copy
            async with gw.http.get(content["href"]) as r:
                assert await r.read() == b"staged bytes"
    finally:
        for ws in sockets:
            await ws.close()


# ---------------------------------------------------------------- publishing
async def test_publish_over_the_socket_reaches_other_pipes(gw: Gateway) -> None:
    news = await fanout(gw, "news")
    mine, other = await new_pipe(gw), await new_pipe(gw)
    await join(gw, other, news)
    async with (
        await connect(gw, mine["uri"]) as ws,
        await connect(gw, other["uri"]) as reader,
    ):
        for n, where in enumerate(("news", "/restms/feed/news", news)):
            await ws.send_json(
                {
                    "type": "publish",
                    "feed": where,
                    "message": {"address": "x", "message_id": f"n{n}", "header": []},
                    "id": f"p{n}",
                }
            )
            reply = await expect(ws, "published")
            assert reply == {"type": "published", "message": [{"count": 1}], "id": f"p{n}"}
        got = await deliveries(reader, 3)
        assert ids(got) == ["n0", "n1", "n2"]
        assert message(got[0])["feed"].endswith("/restms/feed/news")
        # A list of messages, to the default feed, addressed to the other pipe.
        await ws.send_json(
            {"type": "publish", "feed": "default", "message": addressed(other, "d1", "d2")}
        )
        assert (await expect(ws, "published"))["message"] == [{"count": 1}, {"count": 1}]
        assert ids(await deliveries(reader, 2)) == ["d1", "d2"]
        # A repeated message_id is answered, not routed again.
        await ws.send_json(
            {"type": "publish", "feed": "default", "message": addressed(other, "d1"), "id": 9}
        )
        repeat = await expect(ws, "published")
        assert repeat == {
            "type": "published",
            "message": [{"count": 1, "duplicate": True}],
            "id": 9,
        }
        await quiet(reader, 0.2)
        await quiet(ws, 0.1)  # the publisher's own pipe got nothing
    assert await held(gw, other) == ["n0", "n1", "n2", "d1", "d2"]


async def _post(gw: Gateway, uri: str, **children: Any) -> tuple[int, Any, str]:
    async with gw.http.post(uri, data=body(**children), headers=HJ) as r:
        text = await r.text()
        parsed = json.loads(text) if r.content_type.endswith("json") else text
        return r.status, parsed, r.headers.get("Location", "")


async def http_refusal(gw: Gateway, uri: str, messages: Any) -> tuple[int, str]:
    """The status and reason a POST of these messages to ``uri`` gets."""
    data = json.dumps({"restms": {"message": messages}}).encode()
    async with gw.http.post(uri, data=data, headers=HJ) as r:
        assert r.content_type == "text/plain"
        return r.status, (await r.text()).rstrip("\n")


REFUSED_PUBLISHES = [
    ("nosuch", "/restms/feed/nosuch", {"address": "x"}),
    ("/restms/resource/nosuchthing", "/restms/resource/nosuchthing", {"address": "x"}),
    ("default", DEFAULT_FEED, {"address": "x" * 1025}),
    ("default", DEFAULT_FEED, [{"address": "x", "content": [{"href": "/restms/resource/no"}]}]),
    ("default", DEFAULT_FEED, {"address": "x", "delivery_mode": "7"}),
    ("default", DEFAULT_FEED, {"address": "x", "content": [{"value": "c"}] * 17}),
    ("default", DEFAULT_FEED, []),
]


@pytest.mark.parametrize(("feed", "uri", "messages"), REFUSED_PUBLISHES)
async def test_a_refused_publish_gets_the_reason_a_post_gets(
    gw: Gateway, feed: str, uri: str, messages: Any
) -> None:
    listed = messages if isinstance(messages, list) else [messages]
    status, reason = await http_refusal(gw, uri, listed)
    assert 400 <= status < 500
    pipe = await new_pipe(gw)
    async with await connect(gw, pipe["uri"]) as ws:
        await ws.send_json({"type": "publish", "feed": feed, "message": messages, "id": "r"})
        error = await expect(ws, "error")
        assert error == {"type": "error", "status": status, "reason": reason, "id": "r"}
        # The socket stays open and serves the next frame.
        await send(gw, pipe, "after")
        assert ids(await deliveries(ws, 1)) == ["after"]


async def test_publish_to_what_is_not_a_feed_is_refused(gw: Gateway) -> None:
    pipe = await new_pipe(gw)
    async with await connect(gw, pipe["uri"]) as ws:
        for where in (pipe["uri"], DOMAIN, "/elsewhere/feed/x", "http://127.0.0.1/restms/"):
            await ws.send_json({"type": "publish", "feed": where, "message": {}})
            error = await expect(ws, "error")
            assert error["status"] in (400, 404), error
        assert await held(gw, pipe) == []


# ---------------------------------------------------------------- refused frames
BAD_FRAMES = [
    ("{", 400, "malformed JSON"),
    ("[1, 2]", 400, "a frame must be a JSON object"),
    ('"ack"', 400, "a frame must be a JSON object"),
    ("{}", 400, "unknown frame type None"),
    ('{"type": "nack"}', 400, "unknown frame type 'nack'"),
    ('{"type": 5}', 400, "unknown frame type 5"),
    ('{"type": "ack"}', 400, "an ack frame needs position"),
    ('{"type": "ack", "position": -1}', 400, "an ack frame needs position"),
    ('{"type": "ack", "position": "3"}', 400, "an ack frame needs position"),
    ('{"type": "ack", "position": true}', 400, "an ack frame needs position"),
    ('{"type": "ack", "position": 1.5}', 400, "an ack frame needs position"),
    ('{"type": "ack", "position": 99999999999999999999}', 400, "an ack frame needs position"),
    ('{"type": "ack", "positon": 1}', 400, "unknown member 'positon' in a ack frame"),
    ('{"type": "publish", "message": {}}', 400, "a publish frame needs feed"),
    ('{"type": "publish", "feed": "", "message": {}}', 400, "a publish frame needs feed"),
    ('{"type": "publish", "feed": "default"}', 400, "a publish frame needs message"),
    ('{"type": "publish", "feed": "default", "message": 1}', 400, "a publish frame needs message"),
    ('{"type": "ack", "position": 1, "id": {}}', 400, "id must be a string"),
    ('{"type": "ack", "position": 1, "id": 1e300}', 400, "id must be a string"),
]


@pytest.mark.parametrize(("text", "status", "reason"), BAD_FRAMES)
async def test_a_malformed_frame_gets_an_error_frame_and_the_socket_stays_open(
    gw: Gateway, text: str, status: int, reason: str
) -> None:
    pipe = await new_pipe(gw)
    async with await connect(gw, pipe["uri"]) as ws:
        await ws.send_str(text)
        error = await expect(ws, "error")
        assert error["status"] == status
        assert error["reason"].startswith(reason), error
        await send(gw, pipe, "still")
        assert ids(await deliveries(ws, 1)) == ["still"]


async def test_the_id_of_a_refused_frame_is_echoed_when_it_is_one(gw: Gateway) -> None:
    pipe = await new_pipe(gw)
    async with await connect(gw, pipe["uri"]) as ws:
        await ws.send_json({"type": "ack", "id": "x1"})
        assert (await expect(ws, "error"))["id"] == "x1"
        await ws.send_json({"type": "nope", "id": 77})
        assert (await expect(ws, "error"))["id"] == 77
        await ws.send_json({"type": "ack", "position": 1, "id": ["not", "an", "id"]})
        assert "id" not in await expect(ws, "error")


async def test_a_binary_frame_is_refused_with_415(gw: Gateway) -> None:
    pipe = await new_pipe(gw)
    async with await connect(gw, pipe["uri"]) as ws:
        await ws.send_bytes(b'{"type": "ack", "position": 1}')
        error = await expect(ws, "error")
        assert error == {
            "type": "error",
            "status": 415,
            "reason": "binary frames are not read: send JSON text",
        }
        await ws.send_json({"type": "ack", "position": 1, "id": 1})
        assert (await expect(ws, "acked"))["removed"] == 0


async def test_a_pipe_uri_without_upgrade_is_still_the_pipe_document(gw: Gateway) -> None:
    pipe = await new_pipe(gw)
    async with gw.http.get(pipe["uri"], headers={**AJ, "Upgrade": "websocket"}) as r:
        assert r.status == 400  # an upgrade asked for without its other headers
        assert r.content_type == "text/plain"
        assert "Sec-WebSocket-Key" in await r.text()
    async with gw.http.get(pipe["uri"], headers=AJ) as r:
        assert r.status == 200
