"""Request ids (docs/TRACING.md, "Request ids"): every reply carries ``X-Request-ID``.

Decided behaviour under test:

* With no id given, each request gets a new one, 32 hex digits, different each time.
* A valid ``X-Request-ID`` is kept as it came; an invalid one (too long, characters
  outside letters, digits and ``-_.:+/=@``) is replaced, never refused.
* Without ``X-Request-ID``, a valid W3C ``traceparent`` gives its trace id; an invalid
  one (bad version, zero ids, wrong length) is ignored.
* Refusals (404, 405, 401) and replies their handler streams (SSE) carry it too, and
  every reply says ``Server: restms-gateway``, no versions.
* The access log line and the other log lines a request causes end with
  ``request_id=<id>``, in the log format ``main.py serve`` writes (a real process).
"""

from __future__ import annotations

import asyncio
import re
import signal

import aiohttp
import pytest

from tests.app import process
from tests.app.jsonapi import new_pipe
from tests.app.spans import TRACE, TRACEPARENT
from tests.conftest import Gateway, MakeGateway

HEX32 = re.compile(r"[0-9a-f]{32}")


@pytest.fixture
async def gw(make_gateway: MakeGateway) -> Gateway:
    return await make_gateway()


async def request_id(gw: Gateway, method: str, path: str, **headers: str) -> str:
    async with gw.http.request(method, path, headers=headers) as r:
        await r.read()
        return r.headers["X-Request-ID"]


async def test_replies_name_the_server_without_versions(gw: Gateway) -> None:
    for path in ("/restms/domain/default", "/healthz", "/openapi.json"):
        async with gw.http.get(path) as r:
            assert r.status == 200
            assert r.headers["Server"] == "restms-gateway", path


async def test_each_request_gets_a_new_id(gw: Gateway) -> None:
    first = await request_id(gw, "GET", "/restms/domain/default")
    second = await request_id(gw, "GET", "/restms/domain/default")
    assert HEX32.fullmatch(first), first
    assert HEX32.fullmatch(second), second
    assert first != second


@pytest.mark.parametrize(
    "given",
    ["abc", "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0", "A.b_c:d+e/f=g@h-1", "x" * 128],
)
async def test_a_valid_id_is_kept(gw: Gateway, given: str) -> None:
    assert await request_id(gw, "GET", "/healthz", **{"X-Request-ID": given}) == given


@pytest.mark.parametrize("given", ["", "x" * 129, "a b", "a;b", "<script>", "é"])
async def test_an_invalid_id_is_replaced(gw: Gateway, given: str) -> None:
    got = await request_id(gw, "GET", "/healthz", **{"X-Request-ID": given})
    assert HEX32.fullmatch(got), got


async def test_a_traceparent_gives_its_trace_id(gw: Gateway) -> None:
    assert await request_id(gw, "GET", "/healthz", traceparent=TRACEPARENT) == TRACE
    both = {"traceparent": TRACEPARENT, "X-Request-ID": "mine"}
    assert await request_id(gw, "GET", "/healthz", **both) == "mine"  # the id wins


@pytest.mark.parametrize(
    "bad",
    [
        f"ff-{TRACE}-00f067aa0ba902b7-01",  # version ff is invalid
        f"00-{'0' * 32}-00f067aa0ba902b7-01",  # zero trace id
        f"00-{TRACE}-{'0' * 16}-01",  # zero parent id
        f"00-{TRACE}-00f067aa0ba902b7-01-extra",  # version 00 has four fields
        f"00-{TRACE.upper()}-00f067aa0ba902b7-01",  # upper case
        f"00-{TRACE[:-1]}-00f067aa0ba902b7-01",
    ],
)
async def test_an_invalid_traceparent_is_ignored(gw: Gateway, bad: str) -> None:
    got = await request_id(gw, "GET", "/healthz", traceparent=bad)
    assert HEX32.fullmatch(got), got
    assert got != TRACE


async def test_a_later_version_of_traceparent_may_have_more_fields(gw: Gateway) -> None:
    later = f"01-{TRACE}-00f067aa0ba902b7-01-more"
    assert await request_id(gw, "GET", "/healthz", traceparent=later) == TRACE


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [("GET", "/nowhere", 404), ("PATCH", "/healthz", 405), ("GET", "/admin/pipes", 403)],
)
async def test_refusals_carry_the_id(gw: Gateway, method: str, path: str, status: int) -> None:
    async with gw.http.request(method, path, headers={"X-Request-ID": "refused-1"}) as r:
        assert r.status == status
        assert r.headers["X-Request-ID"] == "refused-1"
        assert r.headers["Server"] == "restms-gateway"  # no versions to look flaws up by


async def test_a_streamed_reply_carries_the_id(gw: Gateway) -> None:
    pipe = await new_pipe(gw)
    headers = {"Accept": "text/event-stream", "X-Request-ID": "sse-1"}
    async with gw.http.get(pipe["uri"], headers=headers) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/event-stream")
        assert r.headers["X-Request-ID"] == "sse-1"
        assert r.headers["Server"] == "restms-gateway"


async def test_log_lines_of_a_request_end_with_its_id(tmp_path: object) -> None:
    """A real ``main.py serve`` with the access log on: a refused token request logs
    why, and its access line, both naming the request's id; start-up lines name none."""
    env = {"RESTMS_ACCESS_LOG": "true", "RESTMS_DATA_DIR": f"{tmp_path}/var"}
    proc = await process.start("--port", "0", env=env)
    try:
        port = await process.listening_port(proc)
        url = f"http://127.0.0.1:{port}/oauth/token"
        form = {"grant_type": "client_credentials", "client_id": "nobody", "client_secret": "x"}
        async with (
            aiohttp.ClientSession() as http,
            http.post(url, data=form, headers={"X-Request-ID": "log-check-7"}) as r,
        ):
            assert r.status == 401
        proc.send_signal(signal.SIGTERM)
        assert proc.stderr is not None
        async with asyncio.timeout(30):
            rest = (await proc.stderr.read()).decode()
            await proc.wait()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    lines = rest.splitlines()
    refused = [line for line in lines if "gateway.auth.oauth: client refused" in line]
    access = [line for line in lines if '"POST /oauth/token' in line]
    assert len(refused) == 1, rest
    assert len(access) == 1, rest
    assert refused[0].endswith(" request_id=log-check-7"), refused[0]
    assert access[0].endswith(" request_id=log-check-7"), access[0]
    stopped = [line for line in lines if line.endswith("gateway: stopped")]
    assert len(stopped) == 1, rest  # outside a request: no id
