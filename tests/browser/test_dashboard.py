"""The analytics dashboard at ``/dashboard`` in headless Chromium, fed by a real
gateway's Spark worker on 127.0.0.1 (docs/ANALYTICS.md, "The dashboard").

Decided behaviour under test:

* The charting library (uPlot, vendored under ``gateway/admin/static/vendor/uplot``) is
  served by the gateway as released: the bytes whose sha256 its README lists, with the
  page's Content-Security-Policy, and without credentials.
* The page loads with no script error, no CSP violation, no console error but the
  guest's 403, and no request to any other origin (it works offline).
* The charts are drawn from real analytics answers: the traffic published here in two
  feeds is what the totals, the legends and the percentiles table show.
* Hover: pointing at the minutes of the traffic shows, in the legend, the messages
  published in each, adding up to what was published.
* Zoom: a drag narrows the range (both charts), a wheel step zooms in, Reset zoom and a
  double-click give back the whole range.
* Per-feed selection: unchecking a feed takes its series out of both charts, its counts
  out of the totals and its row out of the table; checking it brings them back.
* The worker's state is shown when ``GET /analytics`` reports one, hidden otherwise.
* A screenshot is kept, and is a non-empty PNG.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import Page, expect

from gateway.admin.analytics import ANALYTICS
from gateway.admin.mirroring import MIRROR
from gateway.admin.page import CONTENT_SECURITY_POLICY
from tests.app.jsonapi import DOMAIN, get, post, publish
from tests.app.oauth import clients, token
from tests.browser.conftest import OpenPage, shoot
from tests.conftest import Gateway, MakeGateway
from tests.spark.conftest import WORKER_SETTINGS, spark_conf  # noqa: F401 (the JVM settings)

VENDOR = Path(__file__).resolve().parents[2] / "gateway" / "admin" / "static" / "vendor" / "uplot"
WAIT = 10.0
# Per feed: messages published, and how many of them each of its pipes reads.
TRAFFIC = {"orders": (5, (5, 2)), "alerts": (2, (1,))}
ZOOMED = re.compile(r"Zoomed in: (\S+ \S+) to (\S+ \S+) \(of (\S+ \S+) to (\S+ \S+)\)")
# The legend's rows, [label, value], once the pointer's last move has been handled:
# Chromium hands mouse moves to the page with the next frames, so wait for two.
LEGEND = """async (id) => {
  await new Promise((done) => requestAnimationFrame(() => requestAnimationFrame(done)));
  return [...document.querySelectorAll(`#${id} .u-legend tr.u-series`)].map((tr) =>
    [tr.querySelector(".u-label").textContent, tr.querySelector(".u-value").textContent]);
}"""


def listed_digests() -> dict[str, str]:
    """The vendored files and their sha256, as the README's table lists them."""
    readme = (VENDOR / "README.md").read_text(encoding="utf-8")
    return dict(re.findall(r"^\| `([^`]+)` \| `[^`]+` \| `([0-9a-f]{64})` \|$", readme, re.M))


@pytest.mark.app
async def test_the_vendored_library_is_served_as_released(make_gateway: MakeGateway) -> None:
    gw = await make_gateway(anonymous=False, analytics=False, mirror=False)
    digests = await asyncio.to_thread(listed_digests)
    assert sorted(digests) == ["LICENSE", "uPlot.esm.js", "uPlot.min.css"]
    for name, digest in digests.items():
        async with gw.http.get(f"/static/vendor/uplot/{name}") as r:
            assert r.status == 200, name  # no credentials needed, as for the page
            body = await r.read()
            assert r.headers["Content-Security-Policy"] == CONTENT_SECURITY_POLICY
            assert r.headers["X-Content-Type-Options"] == "nosniff"
        assert hashlib.sha256(body).hexdigest() == digest, name
        assert body == await asyncio.to_thread((VENDOR / name).read_bytes)
    async with gw.http.get("/static/vendor/uplot/README.md") as r:
        assert r.status == 401  # not a page file: the usual rules apply


async def traffic(gw: Gateway) -> dict[str, tuple[int, int]]:
    """TRAFFIC into two fanout feeds; per feed, (published, delivered)."""
    sent = {}
    for feed, (count, reads) in TRAFFIC.items():
        status, reply, _ = await post(gw, DOMAIN, feed=[{"name": feed, "type": "fanout"}])
        assert status in (200, 201), reply
        pipes = []
        for _ in reads:
            status, reply, pipe = await post(gw, DOMAIN, pipe=[{}])
            assert status == 201, reply
            status, reply, _ = await post(gw, pipe, join=[{"feed": gw.uri(f"/restms/feed/{feed}")}])
            assert status == 201, reply
            pipes.append(pipe)
        messages = [{"address": f"{feed}.{i}", "content": [{"value": "x"}]} for i in range(count)]
        assert await publish(gw, f"/restms/feed/{feed}", *messages) == [len(reads)] * count
        for pipe, read in zip(pipes, reads, strict=True):
            status, reply = await get(gw, pipe)
            assert status == 200, reply
            hrefs = [m["href"] for m in reply["restms"]["pipe"][0]["message"]]
            for href in hrefs[:read]:
                assert (await get(gw, href))[0] == 200
        sent[feed] = (count, sum(reads))
    return sent


async def legend(page: Page, chart: str) -> list[list[str]]:
    rows: list[list[str]] = await page.evaluate(LEGEND, chart)
    return rows


async def zoom_text(page: Page) -> str:
    return await page.locator("#zoom").inner_text()


@pytest.mark.browser
@pytest.mark.spark
@pytest.mark.timeout(300)
async def test_the_dashboard_charts_zoom_hover_and_feed_choice(
    make_gateway: MakeGateway, open_page: OpenPage
) -> None:
    configured, secrets = await clients(analyst="restms:analytics")
    gw = await make_gateway(clients=configured, **WORKER_SETTINGS)
    analyst = await token(gw, "analyst", secrets["analyst"])
    sent = await traffic(gw)
    assert await asyncio.to_thread(gw.app[MIRROR].flush, WAIT)
    await gw.app[ANALYTICS].sync()  # starts the worker; the streaming job has read it all
    async with gw.http.get("/analytics", headers={"Authorization": f"Bearer {analyst}"}) as r:
        index: dict[str, Any] = await r.json()
    worker = index.get("worker")

    # The page's tab: open_page loads the live page first, then the dashboard takes
    # its place (and shares its sessionStorage, as a user's tab does).
    live = await open_page(gw, width=1100, height=1400)
    page = live.page
    requests: list[str] = []
    page.on("request", lambda request: requests.append(request.url))
    reply = await page.goto(gw.url + "/dashboard")
    assert reply is not None
    assert reply.status == 200
    await expect(page.locator("body[data-ready]")).to_have_count(1)
    await expect(page.get_by_role("alert")).to_contain_text("403")  # the guest
    await page.get_by_label("Bearer token").fill(analyst)
    await page.get_by_role("button", name="Use token").click()

    # Drawn from the answers: totals, one series per feed and kind, the table.
    published = sum(p for p, _ in sent.values())
    delivered = sum(d for _, d in sent.values())
    total = page.locator("#throughput-total")
    await expect(total).to_have_text(f"{published} published, {delivered} delivered")
    await expect(page.get_by_role("alert")).to_be_hidden()
    await expect(page.locator("#feeds-about")).to_contain_text("2 of 2 feeds")
    await expect(page.locator("#throughput-chart canvas")).to_have_count(1)
    labels = [label for label, _ in await legend(page, "throughput-chart")]
    assert labels == [
        "UTC",
        "orders published",
        "orders delivered",
        "alerts published",
        "alerts delivered",
    ]
    labels = [label for label, _ in await legend(page, "latency-chart")]
    assert labels == ["UTC", "orders mean ms", "alerts mean ms"]
    rows = page.locator("#percentiles tbody tr")
    await expect(rows).to_have_count(2)
    orders_row = rows.filter(has=page.locator("td", has_text=re.compile("^orders$")))
    await expect(orders_row.locator("td").nth(1)).to_have_text(str(sent["orders"][1]))
    if worker is not None and "state" in worker:
        await expect(page.locator("#worker-state")).to_have_text(worker["state"])
    else:
        await expect(page.locator("#worker")).to_be_hidden()
    await expect(page.locator("#lost")).to_be_hidden()  # the mirror dropped nothing

    # Zoom by dragging over the right half (the traffic is in the last minutes).
    plot = page.locator("#throughput-chart .u-over")
    box = await plot.bounding_box()
    assert box is not None
    mid_y = box["y"] + box["height"] / 2
    assert (await zoom_text(page)).startswith("The whole range")
    await page.mouse.move(box["x"] + box["width"] * 0.5, mid_y)
    await page.mouse.down()
    await page.mouse.move(box["x"] + box["width"] * 0.75, mid_y, steps=5)
    # To the last pixel: its time is a little before the last minute, but the zoom
    # widens to whole minutes, so that minute (the traffic's, often) stays in view.
    await page.mouse.move(box["x"] + box["width"] - 1, mid_y, steps=5)
    await page.mouse.up()
    await expect(page.locator("#zoom")).to_contain_text("Zoomed in")
    found = ZOOMED.search(await zoom_text(page))
    assert found is not None
    low, high, first, last = found.groups()
    assert first < low < high <= last  # ISO-like stamps compare as times
    await expect(page.get_by_role("button", name="Reset zoom")).to_be_enabled()

    # Hover: read the legend at each step across the zoomed plot; the minutes with
    # orders' traffic add up to what was published there.
    values: dict[str, dict[str, str]] = {}
    busiest = (0, 0.0)  # orders published, at which x
    steps = 120
    for step in range(steps + 1):
        x = box["x"] + 1 + (box["width"] - 2) * step / steps
        await page.mouse.move(x, mid_y)
        row = dict(await legend(page, "throughput-chart"))
        if re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d", row["UTC"]):
            values[row["UTC"]] = row
            busiest = max(busiest, (int(row["orders published"]), x))
    counted = sum(int(v["orders published"]) for v in values.values())
    seen = {when: v["orders published"] for when, v in sorted(values.items())}
    assert counted == sent["orders"][0], (await zoom_text(page), seen)
    assert busiest[0] > 0

    # The screenshot: zoomed in, the pointer on the busiest minute, its values shown.
    await page.mouse.move(busiest[1], mid_y)
    shot = await shoot(live, "dashboard")
    data = await asyncio.to_thread(shot.read_bytes)
    assert data.startswith(b"\x89PNG\r\n\x1a\n")
    assert len(data) > 10_000  # a drawn page, not an empty image

    # Reset, then a wheel step in, then a double-click back out.
    await page.get_by_role("button", name="Reset zoom").click()
    await expect(page.locator("#zoom")).to_contain_text("The whole range")
    await page.mouse.move(box["x"] + box["width"] * 0.9, mid_y)
    await page.mouse.wheel(0, -200)
    await expect(page.locator("#zoom")).to_contain_text("Zoomed in")
    await page.locator("#latency-chart .u-over").dblclick()
    await expect(page.locator("#zoom")).to_contain_text("The whole range")

    # Per-feed selection: alerts out of the charts, the totals and the table.
    alerts = page.locator("#feeds").get_by_label("alerts")
    await alerts.uncheck()
    orders_only = f"{sent['orders'][0]} published, {sent['orders'][1]} delivered"
    await expect(total).to_have_text(orders_only)
    await expect(page.locator("#feeds-about")).to_contain_text("1 of 2 feeds")
    labels = [label for label, _ in await legend(page, "throughput-chart")]
    assert labels == ["UTC", "orders published", "orders delivered"]
    labels = [label for label, _ in await legend(page, "latency-chart")]
    assert labels == ["UTC", "orders mean ms"]
    await expect(rows).to_have_count(1)
    await expect(rows.nth(0).locator("td").nth(0)).to_have_text("orders")
    await alerts.check()
    await expect(total).to_have_text(f"{published} published, {delivered} delivered")
    await expect(rows).to_have_count(2)

    # In the dark theme too (the charts are drawn anew in its colours).
    await page.emulate_media(color_scheme="dark")
    dark = await asyncio.to_thread((await shoot(live, "dashboard-dark")).read_bytes)
    assert len(dark) > 10_000
    assert dark != data

    # A week: 10,080 minutes, answered and drawn.
    await page.get_by_label("Range").select_option("7d")
    await expect(page.get_by_role("status")).to_contain_text("Updated", timeout=60_000)
    await expect(page.get_by_role("alert")).to_be_hidden()
    await expect(total).to_have_text(f"{published} published, {delivered} delivered")

    await live.assert_clean("403")
    assert requests
    assert [url for url in requests if not url.startswith(gw.url + "/")] == []
