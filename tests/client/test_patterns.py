"""The pattern helpers against a real gateway: Housecat request and reply, a Wolfpack
of workers, Parrot subscribers; and webhook receivers for WSGI and aiohttp taking a
real webhook pipe's signed deliveries (ASGI driven directly, with a signed body)."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import threading
import time
from collections import Counter
from collections.abc import Iterator
from wsgiref.simple_server import WSGIRequestHandler, make_server

import pytest
from aiohttp import web

from restms_client import (
    AsyncClient,
    Client,
    Message,
    Receiver,
    Refuse,
    Webhook,
    aiohttp_handler,
    asgi_app,
    signature_ok,
    wsgi_app,
)
from tests.client.conftest import MakeProcess, unique
from tests.client.gateway import GatewayProcess

SECRET = "a-webhook-secret-of-32-characters"


async def test_housecat_request_and_reply(gateway: GatewayProcess) -> None:
    async with AsyncClient(gateway.url) as server, AsyncClient(gateway.url) as caller:
        adder = unique("adder")
        pipe = await server.worker(adder)

        async def serve(requests: int) -> None:
            async with server.messages(pipe, auto_ack=True) as incoming:
                async for request in incoming:
                    a, b = (int(x) for x in request.text.split("+"))
                    await server.reply(request, Message.of(str(a + b)))
                    requests -= 1
                    if requests == 0:
                        return

        serving = asyncio.create_task(serve(2))
        feed = await caller.feed(adder)
        answer = await caller.request(feed, Message.of("2+2", message_id="q-1"), timeout=10)
        assert (answer.text, answer.correlation_id) == ("4", "q-1")
        assert (await caller.request(feed, Message.of("40+2"), timeout=10)).text == "42"
        await asyncio.wait_for(serving, 10)


async def test_wolfpack_every_job_reaches_one_worker_once(gateway: GatewayProcess) -> None:
    name = unique("jobs")
    done: Counter[str] = Counter()
    by_worker: Counter[int] = Counter()
    async with AsyncClient(gateway.url) as client:
        pipes = [await client.worker(name) for _ in range(3)]
        feed = await client.feed(name)
        jobs = [f"job-{i}" for i in range(30)]
        for job in jobs:
            await client.publish(feed, Message.of(job, message_id=job))

        async def work(number: int) -> None:
            async with client.messages(pipes[number], auto_ack=True) as incoming:
                async for job in incoming:
                    done[job.text] += 1
                    by_worker[number] += 1
                    if sum(done.values()) == len(jobs):
                        return

        workers = [asyncio.create_task(work(n)) for n in range(3)]
        await asyncio.wait_for(asyncio.wait(workers, return_when=asyncio.FIRST_COMPLETED), 20)
        for task in workers:
            task.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
    assert done == Counter(jobs)  # each job once
    assert len(by_worker) == 3  # and the feed shared them out


def test_parrot_subscribers_get_what_their_pattern_matches(gateway: GatewayProcess) -> None:
    name = unique("weather")
    with Client(gateway.url) as client:
        europe = client.subscribe(name, "weather.eu.#")
        everything = client.subscribe(name)
        feed = client.feed(name)
        client.publish(
            feed,
            [
                Message.of("rain", address="weather.eu.paris"),
                Message.of("sun", address="weather.us"),
            ],
        )
        assert [m.address for m in client.pipe(europe).messages] == ["weather.eu.paris"]
        assert [m.address for m in client.pipe(everything).messages] == [
            "weather.eu.paris",
            "weather.us",
        ]


def signed(body: bytes, secret: str = SECRET, at: float | None = None) -> str:
    stamp = str(int(time.time() if at is None else at))
    mac = hmac.new(secret.encode(), stamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    return f"t={stamp},v1={mac}"


def test_signatures() -> None:
    body = b'{"restms":{"message":[{"address":"a"}]}}'
    assert signature_ok(signed(body), SECRET, body)
    assert not signature_ok(signed(body), "another-secret-of-enough-length", body)
    assert not signature_ok(signed(body), SECRET, body + b" ")
    assert not signature_ok(signed(body, at=time.time() - 600), SECRET, body)  # stale
    assert not signature_ok(signed(body) + ",t=1", SECRET, body)  # two stamps
    assert signature_ok(f"v1=00,{signed(body)}", SECRET, body)  # any v1 may match


class Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def receiver_gateway(make_process: MakeProcess) -> GatewayProcess:
    return make_process({"RESTMS_WEBHOOK_ALLOW": "127.0.0.1"})


@pytest.fixture
def wsgi_receiver() -> Iterator[tuple[str, list[Webhook]]]:
    got: list[Webhook] = []

    def handle(webhook: Webhook) -> None:
        if webhook.message.text == "refuse me" and webhook.attempt == 1:
            raise Refuse(503, "not now")
        got.append(webhook)

    server = make_server("127.0.0.1", 0, wsgi_app(Receiver(SECRET, handle)), handler_class=Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/hook", got
    server.shutdown()
    thread.join(10)
    server.server_close()


def test_a_wsgi_receiver_takes_signed_deliveries(
    receiver_gateway: GatewayProcess, wsgi_receiver: tuple[str, list[Webhook]]
) -> None:
    callback, got = wsgi_receiver
    with Client(receiver_gateway.url) as client:
        hook = client.create_pipe(type="webhook", callback=callback, secret=SECRET, timeout=5)
        default = client.domain().feed("default")
        texts = ["one", "refuse me", "three"]
        client.publish(
            default, [Message.of(t, address=hook.name, headers={"k": "v"}) for t in texts]
        )
        deadline = time.monotonic() + 30
        while len(got) < len(texts) and time.monotonic() < deadline:
            time.sleep(0.05)
    assert [w.message.text for w in got] == texts  # in order, the refused one retried
    assert got[1].attempt == 2
    assert got[0].attempt == 1
    assert got[0].message.headers == {"k": "v"}
    assert len({w.delivery_id for w in got}) == 3


async def test_an_aiohttp_receiver_takes_signed_deliveries(
    receiver_gateway: GatewayProcess,
) -> None:
    got: asyncio.Queue[Webhook] = asyncio.Queue()

    async def handle(webhook: Webhook) -> None:
        await got.put(webhook)

    app = web.Application()
    app.router.add_route("*", "/hook", aiohttp_handler(Receiver(SECRET, handle)))
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        async with AsyncClient(receiver_gateway.url) as client:
            hook = await client.create_pipe(
                type="webhook", callback=f"http://127.0.0.1:{port}/hook", secret=SECRET
            )
            default = (await client.domain()).feed("default")
            await client.publish(default, Message.of("hello", address=hook.name))
            webhook = await asyncio.wait_for(got.get(), 30)
        assert webhook.message.text == "hello"
    finally:
        await runner.cleanup()


async def test_the_asgi_app_checks_and_drops_repeats() -> None:
    handled: list[str] = []
    app = asgi_app(Receiver(SECRET, lambda webhook: handled.append(webhook.delivery_id)))
    body = b'{"restms":{"message":[{"address":"a","content":[{"value":"x"}]}]}}'

    async def call(signature: str, method: str = "POST", query: bytes = b"") -> tuple[int, bytes]:
        sent: list[dict[str, object]] = []

        async def receive() -> dict[str, object]:
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(event: dict[str, object]) -> None:
            sent.append(event)

        headers = [
            (b"content-type", b"application/restms+json"),
            (b"x-restms-signature", signature.encode()),
            (b"x-restms-message-id", b"d-1"),
        ]
        scope = {"type": "http", "method": method, "headers": headers, "query_string": query}
        await app(scope, receive, send)
        return int(sent[0]["status"]), bytes(sent[1]["body"])  # type: ignore[call-overload]

    assert (await call(signed(body)))[0] == 204
    assert (await call(signed(body)))[0] == 204  # a repeat: answered, not handled again
    assert handled == ["d-1"]
    assert (await call(signed(body, "a-wrong-secret-of-some-length")))[0] == 401
    challenge = await call("", "GET", b"restms.mode=subscribe&restms.challenge=abc")
    assert challenge == (200, b"abc")
