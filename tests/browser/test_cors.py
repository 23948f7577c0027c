"""A page on another origin calls the gateway, in headless Chromium (docs/BROWSER.md,
"Pages on other origins"): the browser itself enforces what the gateway answers.

Two small page servers on 127.0.0.1 (each port its own origin) serve an empty page;
the gateway allows the first one's origin only. From the allowed page, ``fetch()``
creates a pipe (a preflighted JSON POST, reading the exposed ``Location``), publishes
a message, reads it back over HTTP, over Server-Sent Events (``EventSource``) and over
a WebSocket. From the other page the browser refuses every reply, the preflighted
publish is never sent (the message is not in the pipe), and the WebSocket is refused.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web
from playwright.async_api import Browser, Page

from tests.app.jsonapi import get
from tests.conftest import MakeGateway

pytestmark = [pytest.mark.browser, pytest.mark.timeout(60)]

PAGE = b"<!doctype html><meta charset=utf-8><title>another origin</title><p>app</p>"

# Runs in the page: everything a client of another origin does, through the browser.
ALLOWED_SCRIPT = """
async (gw) => {
  const json = "application/restms+json";
  const made = await fetch(gw + "/restms/domain/default", {
    method: "POST",
    headers: {"Content-Type": json, "Accept": json},
    body: JSON.stringify({restms: {pipe: [{title: "from another origin"}]}}),
  });
  const pipe = made.headers.get("Location");
  const name = (await made.json()).restms.pipe[0].name;
  const events = new Promise((resolve, reject) => {
    const source = new EventSource(pipe);
    source.addEventListener("message", (e) => { source.close(); resolve(JSON.parse(e.data)); });
    source.onerror = () => { source.close(); reject(new Error("EventSource failed")); };
  });
  const socket = new Promise((resolve, reject) => {
    const ws = new WebSocket(pipe.replace(/^http/, "ws"), ["restms.v1"]);
    ws.onmessage = (e) => { ws.close(); resolve(JSON.parse(e.data)); };
    ws.onerror = () => reject(new Error("WebSocket failed"));
  });
  const published = await fetch(gw + "/restms/feed/default", {
    method: "POST",
    headers: {"Content-Type": json, "Accept": json},
    body: JSON.stringify({restms: {message: [
      {address: name, content: [{type: "text/plain", value: "hello from afar"}]}]}}),
  });
  const count = (await published.json()).restms.message[0].count;
  const listing = await (await fetch(pipe, {headers: {"Accept": json}})).json();
  const href = listing.restms.pipe[0].message[0].href;
  const message = await (await fetch(href, {headers: {"Accept": json}})).json();
  const earliest = (await fetch(pipe)).headers.get("RestMS-Earliest-Position");
  return {
    status: made.status, pipe, name, count, earliest,
    value: message.restms.message[0].content[0].value,
    sse: (await events).restms.message[0].content[0].value,
    ws: (await socket).restms.message[0].content[0].value,
  };
}
"""

REFUSED_SCRIPT = """
async ([gw, pipe, name]) => {
  const outcome = async (call) => {
    try { const r = await call(); return "read " + r.status; }
    catch (e) { return "refused"; }
  };
  const json = "application/restms+json";
  const read = await outcome(() => fetch(gw + "/restms/domain/default"));
  const publish = await outcome(() => fetch(gw + "/restms/feed/default", {
    method: "POST",
    headers: {"Content-Type": json},
    body: JSON.stringify({restms: {message: [
      {address: name, content: [{type: "text/plain", value: "must not arrive"}]}]}}),
  }));
  const socket = await new Promise((resolve) => {
    const ws = new WebSocket(pipe.replace(/^http/, "ws"), ["restms.v1"]);
    ws.onopen = () => { ws.close(); resolve("open"); };
    ws.onerror = () => resolve("refused");
  });
  return {read, publish, socket};
}
"""


@pytest.fixture
async def page_origins() -> AsyncIterator[list[str]]:
    """Two page servers on 127.0.0.1: their origins."""
    runners = []

    async def page(request: web.Request) -> web.Response:
        return web.Response(body=PAGE, content_type="text/html")

    origins = []
    for _ in range(2):
        app = web.Application()
        app.router.add_get("/", page)
        runner = web.AppRunner(app)
        await runner.setup()
        runners.append(runner)
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        host, port = runner.addresses[0][:2]
        origins.append(f"http://{host}:{port}")
    yield origins
    for runner in runners:
        await runner.cleanup()


@pytest.fixture
async def open_origin(browser: Browser) -> AsyncIterator[Callable[[str], Awaitable[Page]]]:
    contexts = []

    async def open_(origin: str) -> Page:
        context = await browser.new_context()
        contexts.append(context)
        page = await context.new_page()
        reply = await page.goto(origin + "/")
        assert reply is not None
        assert reply.status == 200
        return page

    yield open_
    for context in contexts:
        await context.close()


async def test_a_page_on_an_allowed_origin_publishes_and_reads(
    make_gateway: MakeGateway,
    page_origins: list[str],
    open_origin: Callable[[str], Awaitable[Page]],
) -> None:
    allowed, other = page_origins
    gw = await make_gateway(cors_origins=allowed)
    page = await open_origin(allowed)
    done: dict[str, Any] = await page.evaluate(ALLOWED_SCRIPT, gw.url)
    assert done["status"] == 201
    assert done["pipe"].startswith(gw.url + "/restms/resource/")
    assert done["count"] == "1"
    assert done["value"] == "hello from afar"
    assert done["sse"] == "hello from afar"
    assert done["ws"] == "hello from afar"
    assert done["earliest"] is not None  # an exposed header

    refused_page = await open_origin(other)
    refused: dict[str, str] = await refused_page.evaluate(
        REFUSED_SCRIPT, [gw.url, done["pipe"], done["name"]]
    )
    assert refused == {"read": "refused", "publish": "refused", "socket": "refused"}
    status, listing = await get(gw, done["pipe"])
    assert status == 200
    held = [m for m in listing["restms"]["pipe"][0]["message"] if "async" not in m]
    assert len(held) == 1  # the refused page's publish never reached the gateway
