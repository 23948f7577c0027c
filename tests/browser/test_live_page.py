"""The live page at ``/`` in headless Chromium, against a real gateway on 127.0.0.1.

Decided behaviour under test (docs/BROWSER.md, "Live page"):

* The page loads with no uncaught exception, no console error and no
  Content-Security-Policy violation, and lists the domain's feeds.
* The policy is enforced: inline script and ``eval`` are refused, and such a
  refusal is seen by the tests' detector.
* A feed and a pipe made through the page exist over HTTP as the page asked; a
  message published over HTTP appears on the page as text, never as HTML.
* A message published through the page reaches a pipe read over HTTP.
* Acknowledging on the page deletes the message and every older one (checked over
  HTTP) and the depth shown follows.
* When the stream ends, the page opens it again with ``Last-Event-ID``: a message
  published meanwhile is shown once, nothing twice; a reload keeps the pipe.
* A refused request shows the gateway's status and its text/plain reason.
* Without the loopback guest, the page works with a pasted bearer token, sent on
  every request, the event stream included.
* On a phone-sized screen nothing is wider than the screen.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from playwright.async_api import expect

from tests.app.jsonapi import AJ, HJ, JSON, get, join, new_pipe, publish
from tests.app.oauth import clients, token
from tests.browser.conftest import STEP, LivePage, OpenPage, shoot
from tests.conftest import Gateway, MakeGateway

pytestmark = [pytest.mark.browser, pytest.mark.timeout(60)]


# ---------------------------------------------------------------- helpers


async def create_feed(live: LivePage, name: str, kind: str = "topic") -> None:
    page = live.page
    await page.get_by_label("Name", exact=True).fill(name)
    await page.get_by_label("Type").select_option(kind)
    await page.get_by_role("button", name="Create feed").click()
    await expect(page.get_by_role("status")).to_have_text(f"Feed {name} created.")
    await expect(page.get_by_label("Feed on domain")).to_have_value(name)


async def create_pipe(live: LivePage, pattern: str) -> str:
    """Create a pipe through the page, joined to the chosen feed; its URI path."""
    page = live.page
    await page.get_by_label("Address pattern").fill(pattern)
    await page.get_by_role("button", name="Create pipe and join").click()
    await expect(page.locator("#stream-state")).to_have_text("open")
    await expect(page.locator("#join-list li")).to_have_count(1)
    name = await page.locator("#pipe-name").text_content()
    assert name
    return f"/restms/resource/{name}"


def text(value: str, address: str) -> dict[str, Any]:
    return {"address": address, "content": [{"type": "text/plain", "value": value}]}


async def held(gw: Gateway, pipe: str) -> list[str]:
    """The hrefs of the messages a pipe holds (read over HTTP)."""
    status, reply = await get(gw, pipe)
    assert status == 200, reply
    return [m["href"] for m in reply["restms"]["pipe"][0]["message"] if m.get("async") != "1"]


# ---------------------------------------------------------------- loading


async def test_page_loads_clean_and_lists_feeds(live: LivePage) -> None:
    options = live.page.get_by_label("Feed on domain").locator("option")
    await expect(options).to_have_text(
        ["default (default)", "dead-letter (rotator)", "restms.system (topic)"]
    )
    await expect(live.page.locator("#notice")).to_be_hidden()
    await expect(live.page.locator("#stream-state")).to_have_text("closed")
    await live.assert_clean()


async def test_the_policy_is_enforced_and_violations_are_seen(live: LivePage) -> None:
    outcome = await live.page.evaluate(
        """async () => {
          const inline = document.createElement("script");
          inline.textContent = "window.__ran = true";
          document.body.append(inline);
          const foreign = document.createElement("script");
          foreign.src = "http://127.0.0.2:9/x.js";
          document.body.append(foreign);
          const style = document.createElement("style");
          style.textContent = "body { display: none }";
          document.head.append(style);
          let fetched = true;
          try { await fetch("http://127.0.0.2:9/"); } catch (e) { fetched = false; }
          return { ran: window.__ran === true, fetched,
                   shown: getComputedStyle(document.body).display !== "none" };
        }"""
    )
    assert outcome == {"ran": False, "fetched": False, "shown": True}
    await live.page.wait_for_function("window.__violations.length >= 4", timeout=STEP)
    assert sorted(await live.violations()) == [
        "connect-src blocked http://127.0.0.2:9/",
        "script-src-elem blocked http://127.0.0.2:9/x.js",
        "script-src-elem blocked inline",
        "style-src-elem blocked inline",
    ]


# ---------------------------------------------------------------- the flows


async def test_feed_and_pipe_made_on_the_page_receive_a_message_published_over_http(
    gw: Gateway, live: LivePage
) -> None:
    page = live.page
    await create_feed(live, "weather", "topic")
    async with gw.http.get("/restms/feed/weather", headers=AJ) as r:
        assert r.status == 200
        assert (await r.json(content_type=JSON))["restms"]["feed"][0]["type"] == "topic"

    pipe = await create_pipe(live, "weather.*.rain")
    status, reply = await get(gw, pipe)
    assert status == 200, reply
    joins = reply["restms"]["pipe"][0]["join"]
    assert [(j["feed"].removeprefix(gw.url), j["address"]) for j in joins][1:] == [
        ("/restms/feed/weather", "weather.*.rain")
    ]

    markup = 'Rain <b id="injected">later</b> & <img src=x onerror="window.__xss=1">'
    assert await publish(gw, "/restms/feed/weather", text("no match", "weather.eu.snow")) == [0]
    assert await publish(gw, "/restms/feed/weather", text(markup, "weather.eu.rain")) == [1]

    items = page.locator("#messages li")
    await expect(items).to_have_count(1)
    await expect(items.locator(".address")).to_have_text("weather.eu.rain")
    await expect(items.locator(".from")).to_have_text("from weather")
    await expect(items.locator(".content")).to_have_text(markup)  # shown as text
    assert await page.locator("#injected, #messages img").count() == 0
    assert await page.evaluate("window.__xss") is None
    await expect(page.locator("#pipe-depth")).to_have_text("1 held")
    await live.assert_clean()
    print("screenshot:", await shoot(live, "live-page-desktop"))


async def test_a_message_published_on_the_page_reaches_a_pipe_read_over_http(
    gw: Gateway, open_page: OpenPage
) -> None:
    async with gw.http.post(
        "/restms/domain/default",
        data=json.dumps({"restms": {"feed": [{"name": "orders", "type": "topic"}]}}),
        headers=HJ,
    ) as r:
        assert r.status == 201
    pipe = await new_pipe(gw)
    await join(gw, pipe, "/restms/feed/orders", "orders.#")

    live = await open_page(gw)
    page = live.page
    await page.get_by_label("Feed on domain").select_option("orders")
    await expect(page.locator("#feed-about")).to_have_text("type topic")
    await page.get_by_label("Address", exact=True).fill("orders.eu.new")
    await page.get_by_label("Text").fill("two crates & a pallet — ünïcode ✓")
    await page.get_by_role("button", name="Publish to orders").click()
    await expect(page.locator("#publish-result")).to_have_text(
        "Published to orders: taken by 1 pipe."
    )

    (href,) = await held(gw, pipe["uri"])
    status, reply = await get(gw, href)
    assert status == 200, reply
    message = reply["restms"]["message"][0]
    assert message["address"] == "orders.eu.new"
    assert message["content"][0]["value"] == "two crates & a pallet — ünïcode ✓"
    await live.assert_clean()


async def test_acknowledging_on_the_page_deletes_older_messages_and_the_depth_follows(
    gw: Gateway, live: LivePage
) -> None:
    page = live.page
    await create_feed(live, "jobs", "fanout")
    pipe = await create_pipe(live, "")
    await publish(gw, "/restms/feed/jobs", *(text(f"job {n}", f"job.{n}") for n in (1, 2, 3)))

    items = page.locator("#messages li")
    await expect(items.locator(".content")).to_have_text(["job 1", "job 2", "job 3"])
    await expect(page.locator("#pipe-depth")).to_have_text("3 held")

    await page.get_by_role("button", name="Acknowledge message 2 and older").click()
    await expect(items.locator(".content")).to_have_text(["job 3"])
    await expect(page.locator("#messages-heading")).to_be_focused()  # not lost with the button
    await expect(page.locator("#pipe-depth")).to_have_text("1 held")
    assert [h.rsplit(".", 1)[1] for h in await held(gw, pipe)] == ["3"]

    await page.get_by_role("button", name="Acknowledge all").click()
    await expect(items).to_have_count(0)
    await expect(page.locator("#pipe-depth")).to_have_text("0 held")
    await expect(page.locator("#messages-empty")).to_be_visible()
    assert await held(gw, pipe) == []
    await live.assert_clean()


async def test_the_stream_resumes_after_it_ends_and_a_reload_keeps_the_pipe(
    make_gateway: MakeGateway, open_page: OpenPage
) -> None:
    gw = await make_gateway(stream_max=1.0)  # every stream ends after a second
    live = await open_page(gw)
    page = live.page
    await create_feed(live, "ticks", "fanout")
    pipe = await create_pipe(live, "")
    await publish(gw, "/restms/feed/ticks", text("before", "t"))
    contents = page.locator("#messages li .content")
    await expect(contents).to_have_text(["before"])

    state = page.locator("#stream-state")
    await expect(state).to_have_attribute("data-state", "reconnecting")
    await publish(gw, "/restms/feed/ticks", text("while away", "t"))  # no stream open now
    await expect(state).to_have_attribute("data-state", "open")
    await expect(contents).to_have_text(["before", "while away"])  # each once

    await page.reload()
    await expect(page.locator("body[data-ready]")).to_have_count(1)
    await expect(page.locator("#pipe-name")).to_have_text(pipe.rsplit("/", 1)[1])
    await expect(contents).to_have_text(["before", "while away"])  # what the pipe still holds
    await expect(page.locator("#pipe-depth")).to_have_text("2 held")
    await live.assert_clean()


# ---------------------------------------------------------------- errors and credentials


async def test_a_refused_request_shows_the_status_and_the_gateways_reason(
    gw: Gateway, live: LivePage
) -> None:
    page = live.page
    await page.get_by_label("Name", exact=True).fill("bad name")
    await page.get_by_role("button", name="Create feed").click()
    alert = page.get_by_role("alert")
    await expect(alert).to_have_text(
        "Creating the feed failed: 400 "
        "feed name 'bad name' may not contain '/', '@', spaces or controls"
    )
    async with gw.http.get("/restms/feed/bad%20name") as r:
        assert r.status == 404

    await page.get_by_label("Name", exact=True).fill("fine")
    await page.get_by_role("button", name="Create feed").click()
    await expect(alert).to_be_hidden()  # a success clears it
    await live.assert_clean("status of 400")


async def test_with_a_pasted_token_every_request_is_made_as_its_principal(
    make_gateway: MakeGateway, open_page: OpenPage
) -> None:
    configured, secrets = await clients(pager="restms:read restms:publish restms:subscribe")
    gw = await make_gateway(anonymous=False, clients=configured)
    live = await open_page(gw)
    page = live.page
    alert = page.get_by_role("alert")
    await expect(alert).to_have_text("Loading the feeds failed: 401 authentication required")

    await page.get_by_label("Bearer token").fill("not-a-token")
    await page.get_by_role("button", name="Use token").click()
    await expect(alert).to_contain_text("Loading the feeds failed: 401 bearer token refused")

    await page.get_by_label("Bearer token").fill(await token(gw, "pager", secrets["pager"]))
    await page.get_by_role("button", name="Use token").click()
    await expect(alert).to_be_hidden()
    await expect(page.get_by_label("Bearer token")).to_have_value("")  # not left in the page
    await expect(page.locator("#auth-state")).to_have_text(
        "A bearer token is in use (kept for this tab only)."
    )
    await create_feed(live, "private-news", "fanout")
    pipe = await create_pipe(live, "")
    async with gw.http.get(pipe, headers=AJ) as r:
        assert r.status == 401  # nobody but the token's principal gets at it
    await page.get_by_label("Address", exact=True).fill("a")
    await page.get_by_label("Text").fill("through the stream, with the token")
    await page.get_by_role("button", name="Publish to private-news").click()
    await expect(page.locator("#messages li .content")).to_have_text(
        "through the stream, with the token"
    )
    await live.assert_clean("status of 401")


async def test_on_a_phone_screen_nothing_is_wider_than_the_screen(
    gw: Gateway, open_page: OpenPage
) -> None:
    live = await open_page(gw, width=390, height=844)
    page = live.page
    await create_feed(live, "a-rather-long-feed-name-for-a-small-screen", "topic")
    await create_pipe(live, "#")
    long_word = "x" * 300
    await publish(
        gw, "/restms/feed/a-rather-long-feed-name-for-a-small-screen", text(long_word, long_word)
    )
    await expect(page.locator("#messages li")).to_have_count(1)
    await expect(page.locator("#pipe-depth")).to_have_text("1 held")
    widths = await page.evaluate(
        "[document.documentElement.scrollWidth, document.documentElement.clientWidth]"
    )
    assert widths[0] <= widths[1] == 390
    await live.assert_clean()
    print("screenshot:", await shoot(live, "live-page-phone"))
