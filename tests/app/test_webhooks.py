"""Webhook pipes (our extension, docs/WEBHOOKS.md) against real receivers.

Every test starts a real gateway and a real receiver, an aiohttp server on 127.0.0.1
that answers as the test tells it and records what it got. The gateway allows
127.0.0.1 (``webhook_allow``) and retries quickly (backoff base 0.05 s, cap 0.2 s).

Decided behaviour under test:

* A webhook pipe is created like any pipe, with ``callback`` (required) and optional
  ``secret``, ``concurrency``, ``timeout``, ``max_attempts`` and ``max_age``; bad values
  and refused addresses are 400 with a reason. A generated secret is shown once.
* Before anything is delivered the receiver must answer a GET with the challenge.
* Each delivery is a signed POST of the message document with a stable message id and
  the attempt number; 2xx delivers, 410 ends, anything else is retried, and after
  ``max_attempts`` or ``max_age`` the message is dead-lettered.
* The pipe document shows the delivery state.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import hmac
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web
from multidict import CIMultiDictProxy

from tests.app.jsonapi import AJ, DOMAIN, HJ, JSON, body, delete, get, join, new_pipe, post
from tests.app.xmlapi import XML, call, doc
from tests.conftest import Gateway, MakeGateway

SECRET = "test-webhook-secret-0123456789"
FAST = {"webhook_allow": "127.0.0.1", "webhook_backoff_base": 0.05, "webhook_backoff_cap": 0.2}
WAIT = 5.0  # seconds any awaited event may take


# ---------------------------------------------------------------- the receiver


@dataclasses.dataclass
class Delivery:
    request: web.Request
    body: bytes

    @property
    def headers(self) -> CIMultiDictProxy[str]:
        return self.request.headers

    @property
    def attempt(self) -> int:
        return int(self.headers["X-RestMS-Attempt"])

    @property
    def message_id(self) -> str:
        return self.headers["X-RestMS-Message-Id"]

    @property
    def message(self) -> dict[str, Any]:
        found: dict[str, Any] = json.loads(self.body)["restms"]["message"][0]
        return found

    def signed_with(self, secret: str, tolerance: float = 300.0) -> bool:
        """The receiver's check, written apart from the gateway's code."""
        parts = dict(item.split("=", 1) for item in self.headers["X-RestMS-Signature"].split(","))
        stamp = parts["t"]
        if abs(time.time() - int(stamp)) > tolerance:
            return False
        mac = hmac.new(secret.encode(), stamp.encode() + b"." + self.body, hashlib.sha256)
        return hmac.compare_digest(mac.hexdigest(), parts["v1"])


Answer = Callable[[Delivery], Awaitable[web.StreamResponse]]


async def accept(_: Delivery) -> web.StreamResponse:
    return web.Response(status=204)


class Receiver:
    """A webhook receiver on 127.0.0.1: answers verification GETs with their challenge
    (unless told otherwise) and POSTs with :attr:`answer`, recording both."""

    def __init__(self) -> None:
        self.answer: Answer = accept
        self.challenge: Callable[[str], web.Response] = lambda c: web.Response(text=c)
        self.verifications: list[dict[str, str]] = []
        self.deliveries: list[Delivery] = []
        self.in_flight = 0
        self.most_in_flight = 0
        self.elsewhere = 0  # requests to any other path
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def start(self) -> Receiver:
        app = web.Application()
        app.router.add_route("*", "/hook", self._hook)
        app.router.add_route("*", "/{tail:.*}", self._other)
        self._runner = web.AppRunner(app, shutdown_timeout=0.5)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}/hook"
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _other(self, request: web.Request) -> web.StreamResponse:
        self.elsewhere += 1
        return web.Response(status=200)

    async def _hook(self, request: web.Request) -> web.StreamResponse:
        if request.method == "GET":
            self.verifications.append(dict(request.query))
            return self.challenge(request.query.get("restms.challenge", ""))
        delivery = Delivery(request, await request.read())
        self.deliveries.append(delivery)
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            return await self.answer(delivery)
        finally:
            self.in_flight -= 1

    def ids(self) -> list[str]:
        return [d.message["message_id"] for d in self.deliveries]


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    found = await Receiver().start()
    yield found
    await found.stop()


async def until(check: Callable[[], Any], what: str, timeout: float = WAIT) -> None:
    """Wait (bounded) until ``check()`` is true."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


# ---------------------------------------------------------------- gateway helpers


async def webhook(gw: Gateway, callback: str, **attrs: Any) -> dict[str, Any]:
    """Create a webhook pipe (201); its element, plus ``uri``."""
    status, reply, location = await post(
        gw, DOMAIN, pipe=[{"type": "webhook", "callback": callback, **attrs}]
    )
    assert status == 201, reply
    pipe: dict[str, Any] = reply["restms"]["pipe"][0]
    pipe["uri"] = location
    return pipe


async def state(gw: Gateway, pipe: dict[str, Any]) -> dict[str, Any]:
    status, reply = await get(gw, pipe["uri"])
    assert status == 200, reply
    found: dict[str, Any] = reply["restms"]["pipe"][0]
    return found


async def until_state(gw: Gateway, pipe: dict[str, Any], **wanted: str) -> dict[str, Any]:
    """Wait until the pipe document shows these attribute values; the document."""
    deadline = time.monotonic() + WAIT
    while True:
        found = await state(gw, pipe)
        if all(found.get(k) == v for k, v in wanted.items()):
            return found
        if time.monotonic() > deadline:
            shown = {k: found.get(k) for k in wanted}
            raise AssertionError(f"pipe shows {shown}, not {wanted}: {found}")
        await asyncio.sleep(0.02)


async def send(gw: Gateway, pipe: dict[str, Any], *ids: str, **extra: Any) -> None:
    """Publish one message per id, addressed to the pipe through the default feed."""
    messages = [
        {"address": pipe["name"], "message_id": i, "content": [{"value": f"body {i}"}], **extra}
        for i in ids
    ]
    status, reply, _ = await post(gw, "/restms/feed/default", message=messages)
    assert status == 200, reply
    assert [m["count"] for m in reply["restms"]["message"]] == ["1"] * len(ids)


@pytest.fixture
async def gw(make_gateway: MakeGateway) -> Gateway:
    return await make_gateway(**FAST)


# ---------------------------------------------------------------- creating


async def test_create_in_json_shows_options_state_and_the_generated_secret_once(
    gw: Gateway, receiver: Receiver
) -> None:
    pipe = await webhook(gw, receiver.url, concurrency=2, timeout="2.5", max_attempts=3)
    assert pipe["type"] == "webhook"
    assert pipe["callback"] == receiver.url
    assert (pipe["concurrency"], pipe["timeout"], pipe["max_attempts"]) == ("2", "2.5", "3")
    assert pipe["max_age"] == "86400"  # the default
    assert pipe["state"] == "verifying"
    secret = pipe["secret"]
    assert len(secret) >= 32
    later = await until_state(gw, pipe, state="active")
    assert "secret" not in later
    assert later["pending"] == "0"
    assert later["last_status"] == "200"
    # the generated secret signs what is sent
    await send(gw, pipe, "m1")
    await until(lambda: receiver.deliveries, "a delivery")
    assert receiver.deliveries[0].signed_with(secret)


async def test_create_in_xml_with_a_secret_shows_no_secret(gw: Gateway, receiver: Receiver) -> None:
    created = await call(
        gw,
        "POST",
        DOMAIN,
        doc(f'<pipe type="webhook" callback="{receiver.url}" secret="{SECRET}" max_age="60"/>'),
    )
    assert created.status == 201, created.body
    element = created.top()
    assert element.get("type") == "webhook"
    assert element.get("secret") is None  # given by the client: never shown back
    assert element.get("max_age") == "60"
    assert element.get("state") == "verifying"
    deadline = time.monotonic() + WAIT
    while True:
        again = await call(gw, "GET", created.headers["Location"], Accept=XML)
        if again.top().get("state") == "active" or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.02)
    shown = again.top()
    assert shown.get("state") == "active"
    assert shown.get("secret") is None
    for name in ("pending", "attempts", "last_status", "failures", "delivered", "dead_lettered"):
        assert shown.get(name) is not None, name
    assert SECRET.encode() not in again.body


@pytest.mark.parametrize(
    ("attrs", "reason"),
    [
        ({"type": "webhook"}, "needs a callback"),
        ({"type": "webhook", "callback": "ftp://127.0.0.1/x"}, "http:// or https://"),
        ({"type": "webhook", "callback": "/hook"}, "http:// or https://"),
        ({"type": "webhook", "callback": "http://u:p@127.0.0.1/"}, "user name or password"),
        ({"type": "", "callback": "http://127.0.0.1/"}, "for webhook pipes only"),
        ({"type": "webhook", "callback": "http://127.0.0.1/", "concurrency": 17}, "at most 16"),
        ({"type": "webhook", "callback": "http://127.0.0.1/", "timeout": 61}, "at most 60"),
        ({"type": "webhook", "callback": "http://127.0.0.1/", "timeout": 0}, "more than 0"),
        ({"type": "webhook", "callback": "http://127.0.0.1/", "max_attempts": 101}, "at most"),
        ({"type": "webhook", "callback": "http://127.0.0.1/", "secret": "short"}, "secret"),
    ],
)
async def test_bad_webhook_pipes_are_400(gw: Gateway, attrs: dict[str, Any], reason: str) -> None:
    async with gw.http.post(DOMAIN, data=body(pipe=[attrs]), headers=HJ) as r:
        assert r.status == 400
        assert r.content_type == "text/plain"
        assert reason in await r.text()
    assert not gw.engine.hooks


@pytest.mark.parametrize(
    ("callback", "reason"),
    [
        ("http://127.0.0.1:9/hook", "loopback"),
        ("http://localhost:9/hook", "loopback"),
        ("http://[::1]:9/hook", "loopback"),
        ("http://[::ffff:127.0.0.1]:9/hook", "loopback"),
        ("http://10.1.2.3/hook", "private"),
        ("http://192.168.0.10/hook", "private"),
        ("http://169.254.169.254/latest/meta-data/", "link-local"),
        ("http://[fd00::1]/hook", "unique-local"),
        ("http://[fe80::1]/hook", "link-local"),
        ("http://0.0.0.0/hook", "unspecified"),
        ("http://224.0.0.1/hook", "multicast"),
        ("http://100.64.0.1/hook", "reserved"),
        ("http://does-not-exist.invalid/hook", "does not resolve"),
    ],
)
async def test_private_callbacks_are_refused_at_creation(
    make_gateway: MakeGateway, callback: str, reason: str
) -> None:
    gw = await make_gateway()  # nothing allowed
    async with gw.http.post(
        DOMAIN, data=body(pipe=[{"type": "webhook", "callback": callback}]), headers=HJ
    ) as r:
        assert r.status == 400
        assert r.content_type == "text/plain"
        assert reason in await r.text()
    assert not gw.engine.hooks


# ---------------------------------------------------------------- verification


async def test_verification_comes_first_and_names_the_pipe(gw: Gateway, receiver: Receiver) -> None:
    seen_before: list[int] = []

    async def answer(_: Delivery) -> web.StreamResponse:
        seen_before.append(len(receiver.verifications))
        return web.Response(status=200)

    receiver.answer = answer
    pipe = await webhook(gw, receiver.url + "?tenant=a", secret=SECRET)
    await send(gw, pipe, "m1")  # may arrive before the verification ends: it waits
    await until(lambda: receiver.deliveries, "the delivery")
    (query,) = receiver.verifications
    assert query["restms.mode"] == "subscribe"
    assert query["restms.pipe"] == pipe["uri"]
    assert query["tenant"] == "a"  # the callback's own query is kept
    assert len(query["restms.challenge"]) >= 24
    assert seen_before == [1]


async def test_public_url_names_the_pipe_in_verification_and_deliveries(
    make_gateway: MakeGateway, receiver: Receiver
) -> None:
    gw = await make_gateway(public_url="https://gw.example.com", **FAST)
    pipe = await webhook(gw, receiver.url)
    assert pipe["uri"].startswith("https://gw.example.com/restms/resource/")
    await send(gw, pipe, "m1")
    await until(lambda: receiver.deliveries, "the delivery")
    (query,) = receiver.verifications
    assert query["restms.pipe"] == pipe["uri"]


@pytest.mark.parametrize(
    ("answer", "status", "error"),
    [
        (lambda c: web.Response(text="not " + c), "200", "not the challenge"),
        (lambda c: web.Response(status=404, text=c), "404", "answered 404"),
        (lambda c: web.Response(status=302, headers={"Location": "/x"}), "302", "answered 302"),
    ],
)
async def test_refused_verification_delivers_nothing(
    gw: Gateway,
    receiver: Receiver,
    answer: Callable[[str], web.Response],
    status: str,
    error: str,
) -> None:
    receiver.challenge = answer
    pipe = await webhook(gw, receiver.url, secret=SECRET)
    shown = await until_state(gw, pipe, state="failed")
    assert shown["last_status"] == status
    assert error in shown["last_error"]
    await send(gw, pipe, "m1")
    await asyncio.sleep(0.3)
    assert receiver.deliveries == []
    assert receiver.elsewhere == 0  # no redirect followed
    assert (await state(gw, pipe))["pending"] == "1"


async def test_put_of_the_callback_verifies_again_and_delivers_what_waited(
    gw: Gateway, receiver: Receiver
) -> None:
    receiver.challenge = lambda c: web.Response(status=500)
    pipe = await webhook(gw, receiver.url, secret=SECRET)
    await until_state(gw, pipe, state="failed")
    await send(gw, pipe, "m1")
    receiver.challenge = lambda c: web.Response(text=c)
    second = await Receiver().start()
    try:
        # the same callback again on a failed pipe: verified again
        status, reply, _ = await put(gw, pipe, callback=receiver.url)
        assert status == 200, reply
        assert reply["restms"]["pipe"][0]["state"] == "verifying"
        await until(lambda: receiver.deliveries, "the waiting message")
        assert len(receiver.verifications) == 2
        # another callback: verified before anything goes there; the secret stays
        status, reply, _ = await put(gw, pipe, callback=second.url, title="moved")
        assert status == 200, reply
        shown = reply["restms"]["pipe"][0]
        assert (shown["callback"], shown["title"]) == (second.url, "moved")
        await until_state(gw, pipe, state="active")
        await send(gw, pipe, "m2")
        await until(lambda: second.deliveries, "a delivery to the new callback")
        assert second.verifications
        assert second.ids() == ["m2"]
        assert second.deliveries[0].signed_with(SECRET)
        # a PUT echoing the document changes nothing and verifies nothing
        status, _, _ = await put(gw, pipe, **{k: v for k, v in shown.items() if k != "join"})
        assert status == 200
        assert len(second.verifications) == 1
    finally:
        await second.stop()


async def put(gw: Gateway, pipe: dict[str, Any], **attrs: Any) -> tuple[int, Any, str]:
    async with gw.http.put(pipe["uri"], data=body(pipe=[attrs]), headers=HJ) as r:
        text = await r.text()
        return r.status, (json.loads(text) if r.content_type == JSON else text), ""


async def test_put_refuses_private_callbacks_and_webhook_options_elsewhere(
    gw: Gateway, receiver: Receiver
) -> None:
    pipe = await webhook(gw, receiver.url, secret=SECRET)
    status, reply, _ = await put(gw, pipe, callback="http://10.0.0.1/x")
    assert status == 400
    assert "private" in reply
    status, reply, _ = await put(gw, pipe, concurrency=99)
    assert status == 400
    assert "at most 16" in reply
    assert (await state(gw, pipe))["callback"] == receiver.url
    plain = await new_pipe(gw)
    status, reply, _ = await put(gw, plain, callback=receiver.url)
    assert status == 400
    assert "webhook pipes" in reply


# ---------------------------------------------------------------- delivery


async def test_delivery_is_a_signed_post_of_the_message_document(
    gw: Gateway, receiver: Receiver
) -> None:
    pipe = await webhook(gw, receiver.url, secret=SECRET)
    await until_state(gw, pipe, state="active")
    async with gw.http.post(
        "/restms/feed/default", data=b"\x00\x01binary", headers={"Content-Type": "image/x-test"}
    ) as r:
        assert r.status == 201
        staged = r.headers["Location"]
    message = {
        "address": pipe["name"],
        "message_id": "order-1",
        "reply_to": "replies",
        "header": [{"name": "region", "value": "eu"}],
        "content": [{"type": "text/plain", "value": "first"}, {"href": staged}],
    }
    status, reply, _ = await post(gw, "/restms/feed/default", message=[message])
    assert status == 200, reply
    await until(lambda: receiver.deliveries, "the delivery")
    (got,) = receiver.deliveries
    assert got.headers["Content-Type"] == JSON
    assert got.signed_with(SECRET)
    assert not got.signed_with("another-secret-that-is-long")
    assert got.attempt == 1
    assert pipe["name"] not in got.message_id  # the pipe's name is its capability
    sent = got.message
    assert (sent["message_id"], sent["reply_to"], sent["address"]) == (
        "order-1",
        "replies",
        pipe["name"],
    )
    assert sent["header"] == [{"name": "region", "value": "eu"}]
    assert sent["content"][0] == {"type": "text/plain", "encoding": "plain", "value": "first"}
    assert sent["content"][1]["type"] == "image/x-test"
    assert sent["content"][1]["encoding"] == "base64"  # embedded: nothing to fetch back
    assert "href" not in sent
    shown = await until_state(gw, pipe, delivered="1")
    assert shown["pending"] == "0"
    assert shown["last_status"] == "204"
    assert shown["last_attempt"].endswith("Z")


async def test_one_at_a_time_in_order_by_default(gw: Gateway, receiver: Receiver) -> None:
    async def slowish(_: Delivery) -> web.StreamResponse:
        await asyncio.sleep(0.005)
        return web.Response(status=200)

    receiver.answer = slowish
    pipe = await webhook(gw, receiver.url, secret=SECRET)
    ids = [f"m{i}" for i in range(30)]
    await send(gw, pipe, *ids)
    await until(lambda: len(receiver.deliveries) == 30, "30 deliveries")
    assert receiver.ids() == ids
    assert receiver.most_in_flight == 1
    assert [d.attempt for d in receiver.deliveries] == [1] * 30
    await until_state(gw, pipe, delivered="30", pending="0")


async def test_concurrency_overlaps_deliveries(gw: Gateway, receiver: Receiver) -> None:
    async def slow(_: Delivery) -> web.StreamResponse:
        await asyncio.sleep(0.2)
        return web.Response(status=200)

    receiver.answer = slow
    pipe = await webhook(gw, receiver.url, secret=SECRET, concurrency=4)
    await until_state(gw, pipe, state="active")
    ids = [f"m{i}" for i in range(12)]
    await send(gw, pipe, *ids)
    await until(lambda: len(receiver.deliveries) == 12, "12 deliveries")
    assert sorted(receiver.ids()) == sorted(ids)
    assert receiver.most_in_flight == 4
    await until_state(gw, pipe, delivered="12", pending="0")


async def test_failures_are_retried_with_the_same_id_and_growing_attempts(
    gw: Gateway, receiver: Receiver
) -> None:
    statuses = iter([500, 429, 404])

    async def flaky(_: Delivery) -> web.StreamResponse:
        return web.Response(status=next(statuses, 200))

    receiver.answer = flaky
    pipe = await webhook(gw, receiver.url, secret=SECRET)
    await send(gw, pipe, "m1", "m2")
    await until(lambda: len(receiver.deliveries) == 5, "5 attempts")
    assert [(d.message["message_id"], d.attempt) for d in receiver.deliveries] == [
        ("m1", 1),
        ("m1", 2),
        ("m1", 3),
        ("m1", 4),
        ("m2", 1),  # in order: m2 waited for m1
    ]
    assert len({d.message_id for d in receiver.deliveries[:4]}) == 1
    assert all(d.signed_with(SECRET) for d in receiver.deliveries)
    shown = await until_state(gw, pipe, delivered="2", state="active")
    assert (shown["failures"], shown["attempts"], shown["next_attempt"]) == ("3", "0", "")


async def test_a_slow_receiver_times_out_and_is_retried(gw: Gateway, receiver: Receiver) -> None:
    async def first_slow(delivery: Delivery) -> web.StreamResponse:
        if delivery.attempt == 1:
            await asyncio.sleep(3)
        return web.Response(status=200)

    receiver.answer = first_slow
    pipe = await webhook(gw, receiver.url, secret=SECRET, timeout="0.3")
    await send(gw, pipe, "m1")
    await until(lambda: len(receiver.deliveries) == 2, "the second attempt")
    shown = await until_state(gw, pipe, delivered="1")
    assert shown["failures"] == "1"
    assert [d.attempt for d in receiver.deliveries] == [1, 2]


async def test_retrying_state_shows_the_next_attempt(make_gateway: MakeGateway) -> None:
    receiver = await Receiver().start()
    try:
        gw = await make_gateway(
            webhook_allow="127.0.0.1", webhook_backoff_base=30.0, webhook_backoff_cap=30.0
        )

        async def refuse(_: Delivery) -> web.StreamResponse:
            return web.Response(status=503)

        receiver.answer = refuse
        pipe = await webhook(gw, receiver.url, secret=SECRET)
        await send(gw, pipe, "m1")
        shown = await until_state(gw, pipe, state="retrying", attempts="1")
        assert shown["last_status"] == "503"
        assert shown["next_attempt"].endswith("Z")
        assert shown["failures"] == "1"
        assert shown["pending"] == "1"
    finally:
        await receiver.stop()


async def dead_letters(gw: Gateway) -> dict[str, Any]:
    reader = await new_pipe(gw)
    await join(gw, reader, "/restms/feed/dead-letter")
    return reader


async def test_max_attempts_dead_letters_and_moves_on(gw: Gateway, receiver: Receiver) -> None:
    async def reject_m1(delivery: Delivery) -> web.StreamResponse:
        return web.Response(status=500 if delivery.message["message_id"] == "m1" else 200)

    receiver.answer = reject_m1
    reader = await dead_letters(gw)
    pipe = await webhook(gw, receiver.url, secret=SECRET, max_attempts=3)
    await send(gw, pipe, "m1", "m2")
    shown = await until_state(gw, pipe, dead_lettered="1", delivered="1", state="active")
    assert shown["failures"] == "3"
    assert [(d.message["message_id"], d.attempt) for d in receiver.deliveries] == [
        ("m1", 1),
        ("m1", 2),
        ("m1", 3),
        ("m2", 1),
    ]
    dead = await first_message(gw, reader)
    assert dead["message_id"] == "m1"
    headers = {h["name"]: h["value"] for h in dead["header"]}
    assert headers["x-death-reason"] == "webhook-max-attempts"
    assert headers["x-delivery-count"] == "3"
    assert headers["x-webhook-status"] == "500"


async def first_message(gw: Gateway, reader: dict[str, Any]) -> dict[str, Any]:
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        status, reply = await get(gw, reader["uri"])
        assert status == 200
        held = [m for m in reply["restms"]["pipe"][0]["message"] if m.get("async") != "1"]
        if held:
            status, found = await get(gw, held[0]["href"])
            assert status == 200
            message: dict[str, Any] = found["restms"]["message"][0]
            return message
        await asyncio.sleep(0.02)
    raise AssertionError("no dead letter arrived")


async def test_max_age_dead_letters(gw: Gateway, receiver: Receiver) -> None:
    async def refuse(_: Delivery) -> web.StreamResponse:
        return web.Response(status=503)

    receiver.answer = refuse
    reader = await dead_letters(gw)
    # max_attempts at its limit: only the age can end it (10 quick retries could, under load)
    pipe = await webhook(gw, receiver.url, secret=SECRET, max_age="0.5", max_attempts=100)
    started = time.monotonic()
    await send(gw, pipe, "m1")
    shown = await until_state(gw, pipe, dead_lettered="1", pending="0")
    assert time.monotonic() - started >= 0.3  # given up when its age ran out
    assert int(shown["failures"]) >= 1
    dead = await first_message(gw, reader)
    assert {h["name"]: h["value"] for h in dead["header"]}["x-death-reason"] == "webhook-max-age"


async def test_410_ends_the_subscription_and_keeps_messages(
    gw: Gateway, receiver: Receiver
) -> None:
    async def gone(_: Delivery) -> web.StreamResponse:
        return web.Response(status=410)

    receiver.answer = gone
    pipe = await webhook(gw, receiver.url, secret=SECRET)
    await send(gw, pipe, "m1")
    shown = await until_state(gw, pipe, state="ended")
    assert shown["last_status"] == "410"
    await send(gw, pipe, "m2")
    await asyncio.sleep(0.3)
    assert receiver.ids() == ["m1"]  # one attempt, then nothing more
    shown = await state(gw, pipe)
    assert shown["pending"] == "2"  # still readable in the pipe
    held = [m for m in shown["message"] if m.get("async") != "1"]
    assert [m["message_id"] for m in held] == ["m1", "m2"]


async def test_410_while_other_lanes_deliver(
    gw: Gateway, receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    async def answer(delivery: Delivery) -> web.StreamResponse:
        if delivery.message["message_id"] == "m1":
            await asyncio.sleep(0.1)
            return web.Response(status=410)
        await asyncio.sleep(0.4)  # answered after the subscription ended
        return web.Response(status=200 if delivery.message["message_id"] == "m2" else 500)

    receiver.answer = answer
    pipe = await webhook(gw, receiver.url, secret=SECRET, concurrency=3)
    await until_state(gw, pipe, state="active")
    await send(gw, pipe, "m1", "m2", "m3")
    await until(lambda: receiver.in_flight == 0 and len(receiver.deliveries) == 3, "answers")
    await until(lambda: workers() == 0, "the worker to end")
    shown = await state(gw, pipe)
    assert shown["state"] == "ended"
    assert shown["delivered"] == "1"  # m2 was taken before its answer came
    held = [m["message_id"] for m in shown["message"] if m.get("async") != "1"]
    assert held == ["m1", "m3"]
    assert "stopped" not in caplog.text  # the worker ended cleanly


async def test_redirects_are_failures_and_never_followed(gw: Gateway, receiver: Receiver) -> None:
    async def moved(_: Delivery) -> web.StreamResponse:
        return web.Response(status=307, headers={"Location": "/elsewhere"})

    receiver.answer = moved
    pipe = await webhook(gw, receiver.url, secret=SECRET, max_attempts=2)
    await send(gw, pipe, "m1")
    shown = await until_state(gw, pipe, dead_lettered="1")
    assert shown["last_status"] == "307"
    assert receiver.elsewhere == 0
    assert len(receiver.deliveries) == 2


async def test_large_answers_are_read_only_up_to_the_limit(make_gateway: MakeGateway) -> None:
    receiver = await Receiver().start()
    written = 0
    size = 64 * 1024 * 1024

    async def huge(delivery: Delivery) -> web.StreamResponse:
        nonlocal written
        response = web.StreamResponse(status=200)
        response.content_length = size
        await response.prepare(delivery.request)
        chunk = b"x" * 65536
        try:
            while written < size:
                await response.write(chunk)
                written += len(chunk)
        except ConnectionError:
            pass
        return response

    try:
        gw = await make_gateway(**FAST, webhook_response_max=1024)
        receiver.answer = huge
        pipe = await webhook(gw, receiver.url, secret=SECRET)
        await send(gw, pipe, "m1")
        await until_state(gw, pipe, delivered="1")
        await asyncio.sleep(0.2)
        assert written < size  # the gateway stopped reading and dropped the connection
    finally:
        await receiver.stop()


async def test_deleting_the_pipe_stops_its_worker(gw: Gateway, receiver: Receiver) -> None:
    pipe = await webhook(gw, receiver.url, secret=SECRET)
    await until_state(gw, pipe, state="active")
    assert workers() == 1
    assert await delete(gw, pipe["uri"]) == 200
    await until(lambda: workers() == 0, "the worker to stop")
    assert not gw.engine.hooks


def workers() -> int:
    return sum(t.get_name().startswith("webhook ") and not t.done() for t in asyncio.all_tasks())


async def test_shutdown_cuts_a_hanging_delivery(make_gateway: MakeGateway) -> None:
    receiver = await Receiver().start()
    try:
        gw = await make_gateway(**FAST)

        async def hang(_: Delivery) -> web.StreamResponse:
            await asyncio.sleep(30)
            return web.Response(status=200)

        receiver.answer = hang
        pipe = await webhook(gw, receiver.url, secret=SECRET, timeout=50)
        await send(gw, pipe, "m1")
        await until(lambda: receiver.in_flight == 1, "the delivery to hang")
        started = time.monotonic()
        async with asyncio.timeout(5):
            await gw.stop()
        assert time.monotonic() - started < 5
        assert workers() == 0
    finally:
        await receiver.stop()


async def test_webhook_messages_are_not_leased_by_a_get(gw: Gateway, receiver: Receiver) -> None:
    """The owner may read a webhook pipe's messages; a GET starts no lease that would
    move the message to another position (and so give it another id)."""
    receiver.challenge = lambda c: web.Response(status=500)
    pipe = await webhook(gw, receiver.url, secret=SECRET)
    await until_state(gw, pipe, state="failed")
    await send(gw, pipe, "m1")
    held = [m for m in (await state(gw, pipe))["message"] if m.get("async") != "1"]
    status, _ = await get(gw, held[0]["href"])
    assert status == 200
    (message,) = [m for m in gw.engine.hooks[pipe["name"]].messages.values()]
    assert message.leased is None


async def test_json_numbers_are_accepted_and_shown_as_strings(
    gw: Gateway, receiver: Receiver
) -> None:
    async with gw.http.post(
        DOMAIN,
        data=json.dumps(
            {
                "restms": {
                    "pipe": [
                        {"type": "webhook", "callback": receiver.url, "timeout": 1.5, "max_age": 30}
                    ]
                }
            }
        ),
        headers=HJ,
    ) as r:
        assert r.status == 201
        shown = (await r.json(content_type=JSON))["restms"]["pipe"][0]
    assert (shown["timeout"], shown["max_age"]) == ("1.5", "30")
    async with gw.http.get(r.headers["Location"], headers=AJ) as again:
        assert again.status == 200


async def test_a_delivering_pipe_is_never_idle_but_an_ended_one_is_collected(
    make_gateway: MakeGateway,
) -> None:
    receiver = await Receiver().start()
    try:
        gw = await make_gateway(**FAST, pipe_idle_timeout=0.5, sweep_interval=0.1)
        kept = await webhook(gw, receiver.url, secret=SECRET)
        await until_state(gw, kept, state="active")

        async def gone(_: Delivery) -> web.StreamResponse:
            return web.Response(status=410)

        ended = await webhook(gw, receiver.url, secret=SECRET)
        await until_state(gw, ended, state="active")
        receiver.answer = gone
        await send(gw, ended, "m1")
        await until(lambda: ended["name"] not in gw.engine.hooks, "the ended pipe to go")
        await asyncio.sleep(1.0)  # well past the idle timeout, no request on either
        assert kept["name"] in gw.engine.hooks  # its worker holds it
        assert workers() == 1
    finally:
        await receiver.stop()
