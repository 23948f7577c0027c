"""A publish whose commit fails leaves no trace, against a real gateway on 127.0.0.1.

The commit fails for real. Either another connection holds the store's write lock
(as another process could), so the writer's transaction gives up after the store's
busy timeout (``store_busy_timeout``, shortened here) with "database is locked"; or
the gateway runs in its own process whose file size limit (``RLIMIT_FSIZE``, lowered
from outside with ``prlimit``, as a full disk would) refuses the journal's growth: its
writes fail with ``EFBIG``.
"""

from __future__ import annotations

import asyncio
import contextlib
import resource
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from feeds.store import FILE_NAME
from tests.app.process import listening_port, start
from tests.app.test_guarantees import feed, join, pipe_with
from tests.app.test_readyz import Lock
from tests.app.xmlapi import XML, Reply, call, doc
from tests.conftest import Gateway, MakeGateway

pytestmark = pytest.mark.app


def persistent(message_id: str, text: str, mode: str = "2") -> str:
    return doc(
        f'<message message_id="{message_id}" delivery_mode="{mode}">'
        f'<content encoding="plain">{text}</content></message>'
    )


async def listing(gw: Gateway, pipe: str) -> tuple[list[tuple[str, str]], str]:
    """(href, message_id) of each message the pipe lists, and its asynclet's href."""
    shown = (await call(gw, "GET", pipe)).children("message")
    asynclet = [el.get("href") for el in shown if el.get("async") == "1"]
    assert len(asynclet) == 1
    held = [(el.get("href"), el.get("message_id")) for el in shown if el.get("async") != "1"]
    return held, asynclet[0]


def text_of(reply: Reply) -> tuple[str | None, str | None]:
    message = reply.top()
    contents = [child.text for child in message]
    assert len(contents) == 1
    return message.get("message_id"), contents[0]


async def fanout(make_gateway: MakeGateway, busy: float) -> tuple[Gateway, str, str]:
    """A gateway whose commits wait ``busy`` seconds for a write lock another holds."""
    gw = await make_gateway(max_wait=60, store_busy_timeout=busy)
    news = await feed(gw, "news")
    pipe, _ = await pipe_with(gw)
    await join(gw, pipe, news)
    return gw, news, pipe


async def test_a_refused_publish_is_never_read_and_a_retry_is_accepted(
    make_gateway: MakeGateway, tmp_path: Path
) -> None:
    gw, news, pipe = await fanout(make_gateway, 0.3)
    _, asynclet = await listing(gw, pipe)
    assert asynclet.endswith(".1")
    reader = asyncio.create_task(call(gw, "GET", asynclet, Accept=XML))
    await asyncio.sleep(0.2)  # the asynclet waits
    async with Lock(tmp_path / "var" / FILE_NAME):
        began = time.monotonic()
        refused = await call(gw, "POST", news, persistent("m-1", "refused"), Idempotency_Key="k")
        # It waited for the lock as long as the gateway's store_busy_timeout says, not
        # SQLite's default 5 s.
        assert 0.25 < time.monotonic() - began < 4
        refused.assert_text_error(503)
        assert refused.headers["Retry-After"] == "5"
        assert "nothing of this publish was kept" in refused.body.decode()
        await asyncio.sleep(0.2)
        assert not reader.done()  # never handed the refused message
        assert await listing(gw, pipe) == ([], asynclet)  # no trace
    later = await call(gw, "POST", news, persistent("m-2", "later"))
    assert (later.status, later.counts()) == (200, ["1"])
    got = await asyncio.wait_for(reader, 10)
    assert got.status == 200, got.body
    assert text_of(got) == ("m-2", "later")  # at the position the refused one had
    retry = await call(gw, "POST", news, persistent("m-1", "refused"), Idempotency_Key="k")
    assert retry.status == 200, retry.body
    assert "Idempotent-Replayed" not in retry.headers  # the 503 was not kept for its key
    assert [el.get("duplicate") for el in retry.elements()] == [None]  # routed, not a repeat
    held, _ = await listing(gw, pipe)
    assert [message_id for _, message_id in held] == ["m-2", "m-1"]
    assert held[0][0] == asynclet
    assert gw.engine.counters.withdrawn == 1


async def test_what_is_published_meanwhile_waits_behind_and_is_not_lost(
    make_gateway: MakeGateway, tmp_path: Path
) -> None:
    # The held-back publish must still be waiting for the lock once the other one has
    # been answered and the pipe listed, well after the 0.3 s it is given to be routed.
    gw, news, pipe = await fanout(make_gateway, 2.0)
    async with Lock(tmp_path / "var" / FILE_NAME):
        refused = asyncio.create_task(call(gw, "POST", news, persistent("p", "stored")))
        await asyncio.sleep(0.3)  # routed, waiting for its commit
        plain = await call(gw, "POST", news, persistent("n", "in memory", mode="1"))
        assert plain.status == 200  # nothing of it to commit: answered at once
        assert not refused.done()
        shown, asynclet = await listing(gw, pipe)
        assert (shown, asynclet.rsplit(".", 1)[1]) == ([], "1")  # behind the held-back one
        (await refused).assert_text_error(503)
    shown, asynclet = await listing(gw, pipe)
    assert [message_id for _, message_id in shown] == ["n"]
    assert shown[0][0].endswith(".2")  # position 1 stays a gap: "n" came after it
    assert asynclet.endswith(".3")


@contextlib.asynccontextmanager
async def process(data: Path) -> AsyncIterator[tuple[int, aiohttp.ClientSession]]:
    """The gateway in its own process: its pid and a session to it."""
    proc = await start("--port", "0", "--data-dir", str(data), env={"RESTMS_MAX_WAIT": "60"})
    try:
        port = await listening_port(proc)
        async with aiohttp.ClientSession(f"http://127.0.0.1:{port}") as http:
            yield proc.pid, http
    finally:
        proc.kill()
        await proc.wait()


async def post(http: aiohttp.ClientSession, url: str, body: str) -> tuple[int, str, str]:
    """(status, Location, body) of a POST of an XML document."""
    async with http.post(url, data=body, headers={"Content-Type": XML}) as r:
        return r.status, r.headers.get("Location", ""), await r.text()


async def test_a_write_the_disk_refuses_withdraws_the_publish(tmp_path: Path) -> None:
    data = tmp_path / "var"
    async with process(data) as (pid, http):
        await post(http, "/restms/domain/default", doc('<feed name="news" type="fanout"/>'))
        status, pipe, _ = await post(http, "/restms/domain/default", doc("<pipe/>"))
        assert status == 201
        join = doc('<join feed="/restms/feed/news"/>')
        assert (await post(http, pipe, join))[0] == 201
        reader = asyncio.create_task(http.get(f"{pipe}.1", headers={"Accept": XML}))
        await asyncio.sleep(0.2)
        soft, hard = resource.prlimit(pid, resource.RLIMIT_FSIZE)
        full = max(f.stat().st_size for f in data.iterdir() if f.is_file())
        resource.prlimit(pid, resource.RLIMIT_FSIZE, (full, hard))  # no file may grow
        try:
            status, _, reason = await post(http, "/restms/feed/news", persistent("m", "refused"))
        finally:
            resource.prlimit(pid, resource.RLIMIT_FSIZE, (soft, hard))
        assert status == 503, reason
        assert "nothing of this publish was kept" in reason
        await asyncio.sleep(0.2)
        assert not reader.done()  # never handed the refused message
        status, _, _ = await post(http, "/restms/feed/news", persistent("m", "accepted"))
        assert status == 200
        async with await asyncio.wait_for(reader, 10) as got:
            assert got.status == 200
            shown = await got.text()
        assert ">accepted<" in shown  # at position 1, where the refused one never showed
        assert "refused" not in shown
