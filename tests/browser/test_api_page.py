"""The API page at ``/api`` in headless Chromium, against a real gateway on 127.0.0.1.

Decided behaviour under test (docs/API.md): the page lists every operation of
``/openapi.json`` (one entry per path and method), grouped by tag, filters them by
the words typed, and does so under the strict Content-Security-Policy with no script
error.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import yaml
from playwright.async_api import expect

from tests.browser.conftest import OpenPage, shoot
from tests.conftest import Gateway

pytestmark = [pytest.mark.browser, pytest.mark.timeout(60)]

SPEC = Path(__file__).resolve().parents[2] / "openapi" / "openapi.yaml"
VERBS = ("get", "put", "post", "delete", "head", "options", "patch", "trace")


async def test_the_api_page_lists_every_operation_and_filters(
    gw: Gateway, open_page: OpenPage
) -> None:
    spec = yaml.safe_load(await asyncio.to_thread(SPEC.read_text, encoding="utf-8"))
    count = sum(1 for item in spec["paths"].values() for verb in VERBS if verb in item)
    live = await open_page(gw)
    page = live.page
    reply = await page.goto(gw.url + "/api")
    assert reply is not None
    assert reply.status == 200
    await expect(page.locator("body[data-ready]")).to_have_count(1)
    await expect(page.locator("details.op")).to_have_count(count)
    await expect(page.get_by_role("status")).to_have_text(f"{count} operations")
    await page.get_by_label("Filter").fill("post /oauth/token")
    await expect(page.locator("details.op:visible")).to_have_count(1)
    token = page.locator("details.op:visible")
    await token.locator("summary").click()
    await expect(token.locator("td.status").first).to_have_text("200")
    await page.get_by_label("Filter").fill("")
    await expect(page.locator("details.op:visible")).to_have_count(count)
    await shoot(live, "api")
    await live.assert_clean()
