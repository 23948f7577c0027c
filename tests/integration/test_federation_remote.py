"""The federation links' remote client (gateway/federation/client.py) against a real
gateway process on 127.0.0.1 (``main.py serve``, a client made with ``main.py client
add``), and, for the answers a healthy gateway does not give on demand (503 with
Retry-After, a reply too large, a token about to expire), against a small aiohttp
server of the test's own on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import signal
import socket
import ssl
import time
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from email.utils import formatdate
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import trustme
from aiohttp import web
from blockbuster import BlockBuster

from bridges.federation.remote import Auth, PipeGone, Refused, Unavailable
from gateway.federation.client import HttpRemote as Remote
from gateway.federation.session import RemoteSession
from gateway.federation.wire import MAX_REASON
from restms.specs import EmbeddedContent, MessageSpec
from tests.app.process import listening_port, main_py, start

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

JSON = "application/restms+json"
HJ = {"Content-Type": JSON, "Accept": JSON}
SCOPES = "restms:read restms:publish restms:subscribe"
CONFIG = """
[[feeds]]
name = "orders"
type = "fanout"

[[feeds]]
name = "tagged"
type = "headers"
"""


# ---------------------------------------------------------------- the gateway process
@dataclass
class Gateway:
    """A gateway process, the client ``link`` it knows, and a session to poke it with."""

    url: str
    data: Path
    secret: str
    http: aiohttp.ClientSession
    proc: asyncio.subprocess.Process | None = None
    drain: asyncio.Task[None] | None = None
    log: list[str] = field(default_factory=list)

    def feed(self, name: str = "orders") -> str:
        return f"{self.url}/restms/feed/{name}"

    def auth(self, secret: str | None = None) -> Auth:
        return Auth(
            token_url=f"{self.url}/oauth/token",
            client_id="link",
            client_secret=self.secret if secret is None else secret,
        )

    async def token(self) -> str:
        form = {"grant_type": "client_credentials"}
        basic = {"Authorization": aiohttp.encode_basic_auth("link", self.secret)}
        async with self.http.post(f"{self.url}/oauth/token", data=form, headers=basic) as r:
            assert r.status == 200, await r.text()
            return str((await r.json())["access_token"])

    async def run(self, port: int, **env: str) -> None:
        config = str(self.data / "gateway.toml")
        self.proc = await start(
            "--port", str(port), "--data-dir", str(self.data), "--config", config, env=env
        )
        found = await listening_port(self.proc)
        assert found == port or port == 0
        self.url = f"http://127.0.0.1:{found}"
        assert self.proc.stderr is not None
        self.drain = asyncio.create_task(self._read(self.proc.stderr))

    async def _read(self, stream: asyncio.StreamReader) -> None:
        while line := await stream.readline():
            self.log.append(line.decode(errors="replace"))

    async def stop(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            async with asyncio.timeout(15):
                await self.proc.wait()
        if self.drain is not None:
            await self.drain


def free_port() -> int:
    """A port nothing listens on now (the gateway restarted on it in one test)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.asynccontextmanager
async def gateway(tmp_path: Path, port: int = 0, **env: str) -> AsyncIterator[Gateway]:
    data = tmp_path / "data"
    await asyncio.to_thread(data.mkdir)
    await asyncio.to_thread((data / "gateway.toml").write_text, CONFIG)
    code, out, err = await main_py(
        "client", "add", "link", "--scopes", SCOPES, "--data-dir", str(data)
    )
    assert code == 0, err
    secret = out.split("client_secret: ", 1)[1].split()[0]
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as http:
        gw = Gateway(url="", data=data, secret=secret, http=http)
        try:
            await gw.run(port, **env)
            yield gw
        finally:
            await gw.stop()


@contextlib.asynccontextmanager
async def remote(auth: Auth, timeout: float = 10.0, **more: Any) -> AsyncIterator[Remote]:
    client = Remote(RemoteSession(auth, timeout=timeout, **more))
    try:
        yield client
    finally:
        await client.close()


async def listed(gw: Gateway, pipe: str, token: str) -> list[int]:
    """The positions the pipe holds, as its document lists them."""
    headers = {**HJ, "Authorization": f"Bearer {token}"}
    async with gw.http.get(pipe, headers=headers) as r:
        assert r.status == 200, await r.text()
        doc = await r.json(content_type=None)
    items = doc["restms"]["pipe"][0].get("message", [])
    return [int(m["href"].rpartition(".")[2]) for m in items if "async" not in m]


def text(value: str, kind: str = "text/plain") -> EmbeddedContent:
    return EmbeddedContent(type=kind, encoding="plain", value=value)


BINARY = bytes(range(256)) * 3
MESSAGES = (
    MessageSpec(
        address="orders.eu",
        props=(
            ("message_id", "o-1"),
            ("reply_to", "replies"),
            ("correlation_id", "c-9"),
            ("delivery_mode", "2"),
            ("priority", "7"),
            ("expiration", "600000"),
            ("timestamp", "2026-05-09T07:35:25Z"),
            ("type", "order"),
            ("app_id", "shop"),
            ("sender_id", "s-1"),
        ),
        headers=(("lang", "en"), ("x-restms-trail", "a/orders"), ("empty", "")),
        contents=(text("two crates & a pallet <b>é</b>"),),
    ),
    MessageSpec(
        address="orders.us",
        props=(("message_id", "o-2"),),
        contents=(EmbeddedContent.of(BINARY, "application/octet-stream"),),
    ),
    MessageSpec(contents=(text("one"), text('{"a": 1}', "application/json"), text(""))),
)


def same(got: MessageSpec, sent: MessageSpec) -> None:
    assert got.address == sent.address
    assert got.props == sent.props
    assert got.headers == sent.headers
    assert [(c.type, c.data()) for c in got.contents if isinstance(c, EmbeddedContent)] == [
        (c.type, c.data()) for c in sent.contents if isinstance(c, EmbeddedContent)
    ]
    assert len(got.contents) == len(sent.contents)


# ---------------------------------------------------------------- against the gateway
async def test_publish_read_ack_round_trip(tmp_path: Path, blockbuster: BlockBuster) -> None:
    async with gateway(tmp_path) as gw, remote(gw.auth()) as client:
        feed = gw.feed()
        pipe = await client.create_pipe(feed, "federation in")
        assert pipe.startswith(f"{gw.url}/restms/resource/")
        token = await gw.token()
        bearer = {"Authorization": f"Bearer {token}"}
        async with gw.http.get(pipe, headers={**HJ, **bearer}) as r:
            made = (await r.json(content_type=None))["restms"]["pipe"][0]
        assert (made["title"], made["durable"], made["lease"]) == ("federation in", "1", "0")
        join = await client.create_join(pipe, feed, "", ())
        assert await client.create_join(pipe, feed, "", ()) == join  # the same join
        joins = await client.pipe_joins(pipe)
        assert joins is not None
        assert (feed, "", ()) in joins

        assert await client.publish(feed, MESSAGES) == [False, False, False]
        got = await client.read(pipe, 1, 10, 5.0)
        assert [p for p, _ in got] == [1, 2, 3]
        for (_, spec), sent in zip(got, MESSAGES, strict=True):
            same(spec, sent)
        assert got[1][1].contents[0] == EmbeddedContent.of(BINARY, "application/octet-stream")
        assert [p for p, _ in await client.read(pipe, 2, 1, 5.0)] == [2]  # limit

        # A content staged on the feed and linked from a message is fetched and embedded.
        staged_headers = {**bearer, "Content-Type": "image/png"}
        async with gw.http.post(feed, data=BINARY, headers=staged_headers) as r:
            assert r.status == 201, await r.text()
            staged = r.headers["Location"]
        document = {"restms": {"message": [{"address": "linked", "content": [{"href": staged}]}]}}
        async with gw.http.post(feed, data=json.dumps(document), headers={**HJ, **bearer}) as r:
            assert r.status == 200, await r.text()
        [(position, linked)] = await client.read(pipe, 4, 10, 5.0)
        assert position == 4
        assert linked.address == "linked"
        assert linked.contents == (EmbeddedContent.of(BINARY, "image/png"),)

        await client.ack(pipe, 3)  # and every older one
        assert await listed(gw, pipe, token) == [4]
        await client.ack(pipe, 3)  # again: nothing left there, still fine
        await client.ack(pipe, 4)
        assert await listed(gw, pipe, token) == []
        started = time.monotonic()
        assert await client.read(pipe, 5, 10, 0.0) == []
        assert time.monotonic() - started < 2


async def test_a_pipe_is_made_with_the_limits_asked(
    tmp_path: Path, blockbuster: BlockBuster
) -> None:
    """A pull link asks its remote pipe for the definition's ``max_messages`` and
    ``max_bytes``; past them that pipe skips what comes, as any pipe does."""
    async with gateway(tmp_path) as gw, remote(gw.auth()) as client:
        feed = gw.feed()
        pipe = await client.create_pipe(feed, "bounded", max_messages=2, max_bytes=70_000)
        await client.create_join(pipe, feed, "", ())
        token = await gw.token()
        bearer = {"Authorization": f"Bearer {token}"}
        async with gw.http.get(pipe, headers={**HJ, **bearer}) as r:
            made = (await r.json(content_type=None))["restms"]["pipe"][0]
        assert (made["max_messages"], made["max_bytes"]) == ("2", "70000")
        assert await client.publish(feed, MESSAGES) == [False, False, False]
        assert await listed(gw, pipe, token) == [1, 2]  # the third did not fit
        unbounded = await client.create_pipe(feed, "defaults")
        async with gw.http.get(unbounded, headers={**HJ, **bearer}) as r:
            made = (await r.json(content_type=None))["restms"]["pipe"][0]
        assert made["max_messages"] != "2"


async def test_duplicates_are_flagged(tmp_path: Path, blockbuster: BlockBuster) -> None:
    async with gateway(tmp_path) as gw, remote(gw.auth()) as client:
        feed = gw.feed()
        pipe = await client.create_pipe(feed, "dups")
        await client.create_join(pipe, feed, "", ())
        first = MessageSpec(address="a", props=(("message_id", "m-1"),), contents=(text("x"),))
        other = MessageSpec(address="a", props=(("message_id", "m-2"),), contents=(text("y"),))
        anonymous = MessageSpec(address="a", contents=(text("z"),))
        assert await client.publish(feed, [first]) == [False]
        batch = [first, other, other, anonymous, anonymous]
        assert await client.publish(feed, batch) == [True, False, True, False, False]
        got = await client.read(pipe, 1, 100, 5.0)
        assert [spec.contents[0] for _, spec in got] == [text("x"), text("y"), text("z"), text("z")]


async def test_refusals_carry_the_gateways_reason(tmp_path: Path, blockbuster: BlockBuster) -> None:
    async with gateway(tmp_path, RESTMS_MAX_BODY="65536") as gw, remote(gw.auth()) as client:
        feed = gw.feed()
        bad = MessageSpec(address="a", props=(("priority", "12"),))
        with pytest.raises(Refused) as refused:
            await client.publish(feed, [bad])
        assert refused.value.status == 400
        assert "priority must be 0 to 9" in refused.value.reason
        assert "POST" in str(refused.value)

        long_address = MessageSpec(address="a" * 1025)
        with pytest.raises(Refused) as refused:
            await client.publish(feed, [long_address])
        assert (refused.value.status, refused.value.reason) == (
            400,
            "address longer than 1024 characters",
        )

        large = MessageSpec(contents=(text("x" * 70_000),))
        with pytest.raises(Refused) as refused:
            await client.publish(feed, [large])
        assert refused.value.status == 413
        assert "65536-byte limit" in refused.value.reason

        with pytest.raises(Refused) as refused:
            await client.publish(gw.feed("nowhere"), [MessageSpec()])
        assert refused.value.status == 404
        with pytest.raises(Refused) as refused:
            await client.create_pipe(gw.feed("nowhere"), "t")
        assert refused.value.status == 404

        pipe = await client.create_pipe(feed, "t")
        with pytest.raises(Refused) as refused:
            await client.create_join(pipe, gw.feed("nowhere"), "", ())
        assert refused.value.status == 400
        assert "nowhere" in refused.value.reason
        tagged = gw.feed("tagged")
        headers = (("region", "eu"), ("kind", "order"))
        await client.create_join(pipe, tagged, "", headers)
        joins = await client.pipe_joins(pipe)
        assert joins is not None
        assert (tagged, "", headers) in joins


async def test_credentials(tmp_path: Path, blockbuster: BlockBuster) -> None:
    async with gateway(tmp_path) as gw:
        wrong = "not-the-secret-Xy7"
        auth = gw.auth(wrong)
        assert wrong not in repr(auth)
        async with remote(auth) as client:
            assert wrong not in repr(client)
            for _ in range(2):  # no token is kept: asked again, refused again
                with pytest.raises(Unavailable) as failed:
                    await client.publish(gw.feed(), [MessageSpec()])
                said = str(failed.value)
                assert "invalid_client" in said
                assert "wrong secret" in said
                assert wrong not in said
                assert "/oauth/token" in said

        bogus = "bogus-bearer-token"
        async with remote(Auth(bearer=bogus)) as client:
            with pytest.raises(Unavailable) as failed:
                await client.publish(gw.feed(), [MessageSpec()])
            assert "refused the credentials" in str(failed.value)
            assert bogus not in str(failed.value)
        assert bogus not in repr(Auth(bearer=bogus))

        # A fixed bearer that the gateway accepts works like fetched ones.
        async with remote(Auth(bearer=await gw.token())) as client:
            assert await client.publish(gw.feed(), [MessageSpec()]) == [False]


async def test_restarted_gateway_new_key_and_lost_pipe(
    tmp_path: Path, blockbuster: BlockBuster
) -> None:
    """store = "memory": a restart makes a new signing key (every token refused: the
    client fetches one more and sends the request again) and loses every pipe."""
    port = free_port()
    async with gateway(tmp_path, port, RESTMS_STORE="memory") as gw, remote(gw.auth()) as client:
        feed = gw.feed()
        pipe = await client.create_pipe(feed, "in")
        await client.create_join(pipe, feed, "", ())
        assert await client.publish(feed, [MessageSpec(address="a")]) == [False]
        old = await gw.token()

        await gw.stop()
        with pytest.raises(Unavailable) as failed:
            await client.publish(feed, [MessageSpec()])
        assert "cannot connect" in str(failed.value)
        with pytest.raises(Unavailable):
            await client.read(pipe, 1, 10, 1.0)
        async with remote(gw.auth()) as fresh:  # the token endpoint is down too
            with pytest.raises(Unavailable) as failed:
                await fresh.publish(feed, [MessageSpec()])
            assert "/oauth/token" in str(failed.value)

        await gw.run(port, RESTMS_STORE="memory")
        async with gw.http.get(feed, headers={**HJ, "Authorization": f"Bearer {old}"}) as r:
            assert r.status == 401  # the token the client holds is refused now
        assert await client.publish(feed, [MessageSpec(address="b")]) == [False]

        with pytest.raises(PipeGone):
            await client.read(pipe, 2, 10, 1.0)
        assert await client.pipe_joins(pipe) is None
        with pytest.raises(PipeGone):
            await client.create_join(pipe, feed, "", ())


async def test_long_poll(tmp_path: Path, blockbuster: BlockBuster) -> None:
    async with gateway(tmp_path, RESTMS_MAX_WAIT="4") as gw, remote(gw.auth()) as client:
        feed = gw.feed()
        pipe = await client.create_pipe(feed, "in")
        await client.create_join(pipe, feed, "", ())
        publisher = Remote(RemoteSession(gw.auth(), timeout=10))
        try:
            # A read waits on the asynclet until a message comes.
            started = time.monotonic()
            reading = asyncio.create_task(client.read(pipe, 1, 10, 10.0))
            await asyncio.sleep(0.5)
            assert not reading.done()
            await publisher.publish(feed, [MessageSpec(address="late", contents=(text("hi"),))])
            got = await asyncio.wait_for(reading, 5)
            elapsed = time.monotonic() - started
            assert [(p, s.address) for p, s in got] == [(1, "late")]
            assert 0.5 <= elapsed < 3.5, elapsed

            # Nothing comes: [] once the wait is over (ours, or the gateway's max_wait).
            started = time.monotonic()
            assert await client.read(pipe, 2, 10, 0.7) == []
            assert 0.6 <= time.monotonic() - started < 3  # ours: before the gateway's 4 s
            started = time.monotonic()
            assert await client.read(pipe, 2, 10, 9.0) == []
            assert 3.8 <= time.monotonic() - started < 7  # the gateway's 503 after 4 s

            # Messages acknowledged, or never issued: the read goes on where the pipe is.
            await publisher.publish(feed, [MessageSpec(address=f"m{i}") for i in (2, 3, 4)])
            await client.ack(pipe, 3)
            got = await client.read(pipe, 1, 10, 1.0)  # 1 to 3 are gone: a gap
            assert [(p, s.address) for p, s in got] == [(4, "m4")]
            await client.ack(pipe, 4)
            started = time.monotonic()
            assert await client.read(pipe, 100, 10, 0.5) == []  # 100 was never issued
            assert time.monotonic() - started < 3
            reading = asyncio.create_task(client.read(pipe, 100, 10, 10.0))
            await asyncio.sleep(0.3)
            await publisher.publish(feed, [MessageSpec(address="m5")])
            got = await asyncio.wait_for(reading, 5)
            assert [(p, s.address) for p, s in got] == [(5, "m5")]

            # The pipe deleted while a read waits on it.
            reading = asyncio.create_task(client.read(pipe, 6, 10, 10.0))
            await asyncio.sleep(0.3)
            headers = {"Authorization": f"Bearer {await gw.token()}"}
            async with gw.http.delete(pipe, headers=headers) as r:
                assert r.status == 200
            with pytest.raises(PipeGone):
                await asyncio.wait_for(reading, 5)
        finally:
            await publisher.close()


# ---------------------------------------------------------------- a server of our own
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class Fake:
    """An HTTP server on 127.0.0.1 whose answers each test sets (``answer``), with a
    token endpoint at /token that records what it is sent."""

    url: str = ""
    answer: Handler | None = None
    token_life: float = 600
    token_status: int = 200
    tokens: list[str] = field(default_factory=list)  # issued, in order
    basic: list[str] = field(default_factory=list)  # the id:secret pairs sent
    seen: list[tuple[str, str]] = field(default_factory=list)  # (path, Authorization)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.path == "/token":
            return await self.token(request)
        self.seen.append((request.path, request.headers.get("Authorization", "")))
        assert self.answer is not None
        return await self.answer(request)

    async def token(self, request: web.Request) -> web.StreamResponse:
        kind, _, value = request.headers.get("Authorization", "").partition(" ")
        assert kind == "Basic"
        user, _, password = base64.b64decode(value).decode().partition(":")
        self.basic.append(
            f"{urllib.parse.unquote_plus(user)}:{urllib.parse.unquote_plus(password)}"
        )
        form = await request.post()
        assert form["grant_type"] == "client_credentials"
        if self.token_status != 200:
            return web.json_response(
                {"error": "temporarily_unavailable"},
                status=self.token_status,
                headers={"Retry-After": "3"},
            )
        self.tokens.append(f"t{len(self.tokens) + 1}")
        reply = {
            "access_token": self.tokens[-1],
            "token_type": "Bearer",
            "expires_in": self.token_life,
        }
        return web.json_response(reply)


@pytest.fixture
async def fake() -> AsyncIterator[Fake]:
    server = Fake()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", server.handle)
    # A client that goes away ends its handler (a stream that was to stay open a while),
    # so the server stops at once after the test.
    runner = web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    server.url = f"http://127.0.0.1:{port}"
    try:
        yield server
    finally:
        await runner.cleanup()


@dataclass(frozen=True)
class Pki:
    ca: Path  # the test CA's certificate (PEM)
    server: ssl.SSLContext  # the server's context, with a certificate for 127.0.0.1


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    authority = trustme.CA()
    leaf = authority.issue_cert("127.0.0.1")
    ca = tmp_path / "ca.pem"
    authority.cert_pem.write_to_path(ca)
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    leaf.configure_cert(server)
    return Pki(ca=ca, server=server)


@pytest.fixture
async def tls_fake(pki: Pki) -> AsyncIterator[Fake]:
    server = Fake(answer=fixed(200, counts(1)))
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", server.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0, ssl_context=pki.server).start()
    server.url = f"https://127.0.0.1:{runner.addresses[0][1]}"
    try:
        yield server
    finally:
        await runner.cleanup()


async def test_tls(tls_fake: Fake, pki: Pki, tmp_path: Path, blockbuster: BlockBuster) -> None:
    feed = f"{tls_fake.url}/restms/feed/x"
    async with remote(Auth(), tls_ca=str(pki.ca)) as client:
        assert await client.publish(feed, [MessageSpec()]) == [False]
    async with remote(Auth(), tls_verify=False) as client:
        assert await client.publish(feed, [MessageSpec()]) == [False]
    async with remote(Auth()) as client:  # the system's CAs do not know the test CA
        with pytest.raises(Unavailable) as failed:
            await client.publish(feed, [MessageSpec()])
        assert "certificate verify failed" in str(failed.value)
    async with remote(Auth(), tls_ca=str(tmp_path / "missing.pem")) as client:
        with pytest.raises(Unavailable) as failed:
            await client.publish(feed, [MessageSpec()])
        assert "cannot load tls_ca" in str(failed.value)


def fixed(status: int, body: str | bytes = "", **headers: str) -> Handler:
    async def answer(request: web.Request) -> web.StreamResponse:
        data = body.encode() if isinstance(body, str) else body
        kind = "text/plain" if status >= 300 else JSON
        return web.Response(status=status, body=data, headers={"Content-Type": kind, **headers})

    return answer


def counts(n: int) -> str:
    return json.dumps({"restms": {"message": [{"count": "1"}] * n}})


async def test_a_publish_says_when_its_body_is_written(
    fake: Fake, blockbuster: BlockBuster
) -> None:
    """``written`` is done once the body is on its way, while the remote still holds
    its reply: a link prepares its next batch then, not before (docs/FEDERATION.md,
    "Throughput"); a publish that cannot connect leaves it for its caller to end."""
    body_in = asyncio.Event()
    release = asyncio.Event()

    async def slow(request: web.Request) -> web.StreamResponse:
        await request.read()
        body_in.set()
        await release.wait()
        return await fixed(200, counts(1))(request)

    fake.answer = slow
    feed = f"{fake.url}/restms/feed/x"
    async with remote(Auth(bearer="b")) as client:
        written: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        publishing = asyncio.create_task(
            client.publish(feed, [MessageSpec(address="a" * 50_000)], None, written)
        )
        await asyncio.wait_for(written, 5)
        await asyncio.wait_for(body_in.wait(), 5)
        assert not publishing.done()  # the reply is still held
        release.set()
        assert await asyncio.wait_for(publishing, 5) == [False]

    with socket.socket() as unused:  # a port with nothing listening
        unused.bind(("127.0.0.1", 0))
        nowhere = f"http://127.0.0.1:{unused.getsockname()[1]}/restms/feed/x"
    async with remote(Auth(bearer="b"), timeout=1.0) as client:
        written = asyncio.get_running_loop().create_future()
        with pytest.raises(Unavailable):
            await client.publish(nowhere, [MessageSpec()], None, written)
        assert not written.done()


async def test_classification(fake: Fake, blockbuster: BlockBuster) -> None:
    feed = f"{fake.url}/restms/feed/x"
    one = [MessageSpec()]
    async with remote(Auth(bearer="b"), timeout=1.0, max_body=4096) as client:

        async def unavailable(handler: Handler) -> Unavailable:
            fake.answer = handler
            with pytest.raises(Unavailable) as failed:
                await client.publish(feed, one)
            return failed.value

        assert (await unavailable(fixed(503, "busy", **{"Retry-After": "7"}))).retry_after == 7
        assert (
            await unavailable(fixed(503, "busy", **{"Retry-After": "99999"}))
        ).retry_after == 300
        assert (await unavailable(fixed(429, "slow", **{"Retry-After": "-4"}))).retry_after == 0
        date = formatdate(time.time() + 60, usegmt=True)
        later = (await unavailable(fixed(429, "slow down", **{"Retry-After": date}))).retry_after
        assert later is not None
        assert 55 <= later <= 61
        assert (await unavailable(fixed(408, "timeout"))).retry_after is None
        assert (await unavailable(fixed(503, "x", **{"Retry-After": "soon"}))).retry_after is None
        failed = await unavailable(fixed(500, "it broke"))
        assert "500 it broke" in str(failed)
        assert "302" in str(await unavailable(fixed(302, "", Location="/elsewhere")))
        assert "2 messages for 1" in str(await unavailable(fixed(200, counts(2))))
        assert "not a RestMS JSON" in str(await unavailable(fixed(200, "<restms/>")))
        assert "too large" in str(await unavailable(fixed(200, "x" * 5000)))
        assert "refused the credentials: no" in str(await unavailable(fixed(401, "no")))

        async def chunked(request: web.Request) -> web.StreamResponse:
            reply = web.StreamResponse(headers={"Content-Type": JSON})
            reply.enable_chunked_encoding()
            await reply.prepare(request)
            for _ in range(10):
                await reply.write(b" " * 1000)
            await reply.write_eof()
            return reply

        assert "larger than 4096 bytes" in str(await unavailable(chunked))

        release = asyncio.Event()

        async def hang(request: web.Request) -> web.StreamResponse:
            await asyncio.wait_for(release.wait(), 10)
            return web.Response()

        started = time.monotonic()
        assert "no answer within 1 s" in str(await unavailable(hang))
        assert time.monotonic() - started < 3
        release.set()

        for status in (400, 403, 404, 409, 413, 422):
            fake.answer = fixed(status, f"refused with {status}")
            with pytest.raises(Refused) as refused:
                await client.publish(feed, one)
            assert (refused.value.status, refused.value.reason) == (
                status,
                f"refused with {status}",
            )
        fake.answer = fixed(400, "why " * 1000)
        with pytest.raises(Refused) as refused:
            await client.publish(feed, one)
        assert len(refused.value.reason) == MAX_REASON
        assert refused.value.reason.startswith("why why")

        fake.answer = fixed(200, counts(1))
        assert await client.publish(feed, one) == [False]
        assert fake.seen[-1][1] == "Bearer b"

    # Nothing listens: Unavailable at once.
    async with remote(Auth(), timeout=2.0) as client:
        with pytest.raises(Unavailable) as failed:
            await client.publish(f"http://127.0.0.1:{free_port()}/restms/feed/x", one)
        assert "cannot connect" in str(failed.value)


async def test_tokens_are_kept_refreshed_and_retried(fake: Fake, blockbuster: BlockBuster) -> None:
    feed = f"{fake.url}/restms/feed/x"
    one = [MessageSpec()]
    secret = "s3cret:with+odd chars/%"
    auth = Auth(token_url=f"{fake.url}/token", client_id="link", client_secret=secret)
    fake.answer = fixed(200, counts(1))
    fake.token_life = 1.0
    async with remote(auth) as client:
        await asyncio.gather(*(client.publish(feed, one) for _ in range(5)))
        assert fake.tokens == ["t1"]  # one fetch for the five
        assert fake.basic == [f"link:{secret}"]  # form-encoded, then Basic (RFC 6749 2.3.1)
        assert {seen for seen in fake.seen} == {("/restms/feed/x", "Bearer t1")}
        await asyncio.sleep(0.9)  # past 80 % of its life
        await client.publish(feed, one)
        assert fake.tokens == ["t1", "t2"]
        assert fake.seen[-1][1] == "Bearer t2"

        # A 401 with a kept token: one new token, the request sent again.
        fake.token_life = 600
        await asyncio.sleep(0.9)
        await client.publish(feed, one)  # t3, kept now
        refused: list[str] = []

        async def refuse_once(request: web.Request) -> web.StreamResponse:
            if not refused:
                refused.append(request.headers["Authorization"])
                return web.Response(status=401, text="token expired")
            return await fixed(200, counts(1))(request)

        fake.answer = refuse_once
        await client.publish(feed, one)
        assert fake.tokens == ["t1", "t2", "t3", "t4"]
        assert [a for _, a in fake.seen[-2:]] == ["Bearer t3", "Bearer t4"]

        # Refused with a token just fetched: no more fetches, Unavailable.
        fake.answer = fixed(401, "not you")
        before = len(fake.seen)
        with pytest.raises(Unavailable) as failed:
            await client.publish(feed, one)
        assert "refused the credentials: not you" in str(failed.value)
        assert fake.tokens == ["t1", "t2", "t3", "t4", "t5"]  # t4 refused: one more, refused
        assert len(fake.seen) == before + 2
        with pytest.raises(Unavailable):
            await client.publish(feed, one)
        assert len(fake.tokens) == 6  # t5 was refused: a new one, and it is fresh: no third

        # The token endpoint fails: Unavailable with its Retry-After.
        fake.token_status = 503
        fake.answer = fixed(401, "expired")
        with pytest.raises(Unavailable) as failed:
            await client.publish(feed, one)
        assert failed.value.retry_after == 3
        assert "temporarily_unavailable" in str(failed.value)
        assert secret not in str(failed.value)


def pipe_server(pipe: str, streams: bool) -> Handler:
    """A RestMS pipe holding messages at positions 1 to 3 (``m1``..``m3``), with its
    event stream when ``streams`` (docs/EXTENSIONS.md §3), else without it, as a
    server without that extension, which answers a stream request with the pipe."""

    def message(n: int) -> dict[str, Any]:
        return {"address": f"a{n}", "content": [{"type": "text/plain", "value": f"m{n}"}]}

    async def answer(request: web.Request) -> web.StreamResponse:
        url = str(request.url)
        if url.startswith(f"{pipe}."):
            n = int(url.rpartition(".")[2])
            return web.json_response({"restms": {"message": [message(n)]}})
        if request.headers.get("Accept") == "text/event-stream" and streams:
            after = int(request.headers["Last-Event-ID"])
            reply = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await reply.prepare(request)
            await reply.write(b"retry: 2000\n\n: keep-alive\n\n")
            for n in range(after + 1, 4):
                data = json.dumps({"restms": {"message": [message(n)]}}).encode()
                await reply.write(b"id: %d\nevent: message\ndata: %s\n\n" % (n, data))
            await asyncio.sleep(5)  # the stream stays open: the reader leaves it
            return reply
        listed = [{"href": f"{pipe}.{n}"} for n in (1, 2, 3)] + [
            {"href": f"{pipe}.4", "async": "1"}
        ]
        return web.json_response({"restms": {"pipe": [{"message": listed}]}})

    return answer


@pytest.mark.parametrize("streams", [True, False])
async def test_a_read_takes_the_event_stream_when_the_remote_has_one(
    fake: Fake, streams: bool, blockbuster: BlockBuster
) -> None:
    """After its first message, a read takes the rest from the pipe's event stream in
    one request; from a server without one, it GETs each message."""
    pipe = f"{fake.url}/restms/resource/p"
    fake.answer = pipe_server(pipe, streams)
    async with remote(Auth(bearer="b"), timeout=10.0) as client:
        started = time.monotonic()
        got = await client.read(pipe, 1, 10, 1.0)
        assert time.monotonic() - started < 4  # left once its last message came
    assert [(p, spec.address, spec.contents[0].value) for p, spec in got] == [
        (n, f"a{n}", f"m{n}") for n in (1, 2, 3)
    ]
    fetched = [path for path, _ in fake.seen if path.startswith("/restms/resource/p.")]
    assert fetched == (
        ["/restms/resource/p.1"] if streams else [f"/restms/resource/p.{n}" for n in (1, 2, 3)]
    )
