"""Fixtures for the live page in headless Chromium (``gateway/admin/page.py``, docs/BROWSER.md).

The browser is Debian's ``chromium`` at :data:`CHROMIUM` (``scripts/services``
installs it), driven by Playwright's async API on the test's own event loop, next
to the real gateway that ``make_gateway`` starts on 127.0.0.1: the tests talk to
the same server through the page and over HTTP. Playwright's own browser
downloads are never used. A test that needs the browser fails, never skips, when
Chromium is missing.

``open_page`` loads the page and records what must never happen there: uncaught
exceptions, console errors and Content-Security-Policy violations (seen by a
``securitypolicyviolation`` listener installed before the page's own script runs).
``shoot`` keeps a screenshot under :data:`ARTIFACTS` (``RESTMS_TEST_ARTIFACTS``,
default ``tests/artifacts``, git-ignored); where they went is printed at the end of
the run.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from blockbuster import BlockBuster
from playwright.async_api import Browser, ConsoleMessage, Page, async_playwright, expect

from tests.conftest import Gateway

CHROMIUM = Path("/usr/bin/chromium")
TESTS = Path(__file__).resolve().parents[1]
ARTIFACTS = Path(os.environ.get("RESTMS_TEST_ARTIFACTS", TESTS / "artifacts")) / "browser"
STEP = 5_000  # ms any one page action or expectation may take
LAUNCH = 30_000  # ms for Chromium to start
SHOTS: list[Path] = []

VIOLATIONS_SCRIPT = """
window.__violations = [];
document.addEventListener("securitypolicyviolation", (e) => {
  window.__violations.push(`${e.effectiveDirective} blocked ${e.blockedURI || "inline"}`);
});
"""

expect.set_options(timeout=STEP)


@dataclasses.dataclass
class LivePage:
    """The page in a tab, with what went wrong in it so far."""

    page: Page
    gw: Gateway
    errors: list[str] = dataclasses.field(default_factory=list)  # uncaught exceptions
    console: list[str] = dataclasses.field(default_factory=list)  # console errors

    async def violations(self) -> list[str]:
        found: list[str] = await self.page.evaluate("window.__violations")
        return found

    async def assert_clean(self, *expected_console: str) -> None:
        """No exception, no CSP violation, and no console error but the expected ones
        (each given as a piece of its text, e.g. a failed request's status)."""
        assert self.errors == []
        assert await self.violations() == []
        unexpected = [m for m in self.console if not any(e in m for e in expected_console)]
        assert unexpected == []


OpenPage = Callable[..., Awaitable[LivePage]]


@pytest.fixture
async def browser(blockbuster: BlockBuster) -> AsyncIterator[Browser]:
    # Playwright looks for its driver program once, with a stat, as it starts.
    blockbuster.functions["os.stat"].can_block_in(
        "playwright/_impl/_driver.py", "compute_driver_executable"
    )
    if not await asyncio.to_thread(CHROMIUM.exists):
        pytest.fail(
            f"{CHROMIUM} is missing: the browser tests need Debian's chromium package. "
            "Run scripts/services (as root it installs it with apt-get).",
            pytrace=False,
        )
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, timeout=LAUNCH
        )
        try:
            yield browser
        finally:
            await browser.close()


@pytest.fixture
async def open_page(browser: Browser) -> AsyncIterator[OpenPage]:
    """Open the live page of a gateway in a fresh browser context (its own storage)."""
    contexts = []

    async def open_(gw: Gateway, width: int = 1200, height: int = 900) -> LivePage:
        context = await browser.new_context(viewport={"width": width, "height": height})
        contexts.append(context)
        context.set_default_timeout(STEP)
        page = await context.new_page()
        live = LivePage(page=page, gw=gw)
        page.on("pageerror", lambda error: live.errors.append(str(error)))

        def console(message: ConsoleMessage) -> None:
            if message.type == "error":
                live.console.append(message.text)

        page.on("console", console)
        await page.add_init_script(VIOLATIONS_SCRIPT)
        reply = await page.goto(gw.url + "/")
        assert reply is not None
        assert reply.status == 200
        await expect(page.locator("body[data-ready]")).to_have_count(1)
        return live

    yield open_
    for context in contexts:
        await context.close()


@pytest.fixture
async def live(gw: Gateway, open_page: OpenPage) -> LivePage:
    """The live page of the default gateway, open in a tab."""
    return await open_page(gw)


async def shoot(live: LivePage, name: str) -> Path:
    """Keep a full-page screenshot as a test artifact; its path is printed at the end."""
    data = await live.page.screenshot(full_page=True)

    def write() -> Path:
        path = ARTIFACTS.resolve() / f"{name}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        return path

    path = await asyncio.to_thread(write)
    SHOTS.append(path)
    return path


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if SHOTS:
        terminalreporter.section("live page screenshots")
        for path in SHOTS:
            terminalreporter.write_line(str(path))
