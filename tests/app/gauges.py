"""What the HTTP tests read from ``GET /metrics``, and bounded polls on it: a test
waits for the state it needs (a GET waiting, a socket let go) rather than sleeping."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import Gateway

WAIT = 10.0  # seconds a bounded poll waits at most

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


async def scrape(gw: Gateway, **headers: str) -> tuple[Samples, str]:
    """Every sample of a /metrics answer, by name and labels; and the text itself."""
    async with gw.http.get("/metrics", headers=headers) as r:
        text = await r.text()
        assert r.status == 200, text
        assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[sample.name, frozenset(sample.labels.items())] = sample.value
    return samples, text


def value(samples: Samples, name: str, **labels: str) -> float:
    """One sample's value; 0 for a labelled sample not there yet (a counter not started)."""
    return samples.get((name, frozenset(labels.items())), 0.0)


async def until(check: Callable[[], Awaitable[bool]], what: str) -> None:
    deadline = asyncio.get_running_loop().time() + WAIT
    while not await check():
        assert asyncio.get_running_loop().time() < deadline, f"gave up waiting for {what}"
        await asyncio.sleep(0.02)


async def waiting(gw: Gateway, kind: str, count: int) -> bool:
    """Whether ``count`` requests of this kind (asynclet, sse, websocket...) hold a wait
    slot now, as ``restms_waiting_requests`` says (needs ``metrics_access`` loopback)."""
    samples, _ = await scrape(gw)
    return value(samples, "restms_waiting_requests", kind=kind) == count


async def until_waiting(gw: Gateway, kind: str, count: int) -> None:
    await until(lambda: waiting(gw, kind, count), f"{count} waiting ({kind})")
