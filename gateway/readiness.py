"""``GET /readyz``: may a load balancer send this gateway traffic? (docs/METRICS.md)

``/healthz`` answers whenever the process does (liveness). ``/readyz`` answers 200
``ready`` or 503 ``not ready``, ``text/plain``, with one line per reason and one per
thing it looked at. Not ready when:

* shutdown has begun (new requests would be refused anyway; the middleware answers
  503 before this handler once it has, this check covers the moment in between);
* the store (``store = "sqlite"``) has no writer thread, or a test transaction (an
  empty one: no page is written) fails or is not committed within
  ``ready_commit_timeout`` seconds: publishes of persistent messages would fail or
  hang. The probe is also how a store whose last transaction failed shows that it
  commits again;
* with ``ready_needs_bridges``, a bridge whose link is not ``up``.

Bridges do not decide by default: a broker or peer that is away does not stop the
gateway serving HTTP (outbound messages wait in the bridge's pipe, bounded, and are
sent when the link is back), and taking every gateway out of a load balancer because
one broker is down would turn a partial outage into a full one. Their states are
listed either way. Concurrent probes share one test transaction.
"""

from __future__ import annotations

import asyncio
import contextlib

from aiohttp import web

from feeds.store import Store, StoreError

from .bridging import BRIDGES
from .keys import CONFIG, ENGINE, STORE

PATH = "/readyz"


class Probe:
    """The test transaction in progress, shared by the requests that ask meanwhile."""

    __slots__ = ("_running",)

    def __init__(self) -> None:
        self._running: asyncio.Task[str] | None = None

    async def store(self, store: Store, timeout: float) -> str:
        """ "" when the store commits within ``timeout`` seconds, else why not.

        A store whose last transaction failed is probed too: the probe committing is
        what clears the failure (a gateway taken out of traffic would otherwise never
        commit again to show it has recovered).
        """
        if not store.running:
            return "store: not open"
        if self._running is None or self._running.done():
            self._running = asyncio.create_task(_commit(store, timeout), name="readyz-probe")
        return await asyncio.shield(self._running)

    async def stop(self) -> None:
        running = self._running
        if running is not None and not running.done():
            running.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await running


async def _commit(store: Store, timeout: float) -> str:
    future = store.submit([])
    try:
        async with asyncio.timeout(timeout):
            await asyncio.shield(future)
    except TimeoutError:
        future.add_done_callback(_seen)  # it may still fail: retrieve that, quietly
        failed = f" (the last transaction failed: {store.failing})" if store.failing else ""
        return f"store: no commit within {timeout:g} s{failed}"
    except StoreError as exc:
        return f"store: {exc}"
    return ""


def _seen(future: asyncio.Future[None]) -> None:
    if not future.cancelled():
        future.exception()


PROBE = web.AppKey("readyz_probe", Probe)


async def readyz(request: web.Request) -> web.Response:
    app = request.app
    config, engine = app[CONFIG], app[ENGINE]
    reasons: list[str] = []
    seen: list[str] = []
    if engine.closing:
        reasons.append("shutting down")
    store = app.get(STORE)
    if store is not None and not engine.closing:
        problem = await app[PROBE].store(store, config.ready_commit_timeout)
        (reasons if problem else seen).append(problem or "store: committing")
    for bridge in app[BRIDGES]:
        state = bridge.status()["state"]
        line = f"bridge {bridge.name}: {state}"
        (reasons if state != "up" and config.ready_needs_bridges else seen).append(line)
    lines = ["not ready" if reasons else "ready", *reasons, *seen]
    return web.Response(
        status=503 if reasons else 200,
        text="\n".join(lines) + "\n",
        headers={"Cache-Control": "no-store"},
    )


def add_routes(app: web.Application) -> None:
    app[PROBE] = Probe()
    app.router.add_get(PATH, readyz)
    app.on_cleanup.append(_stop)


async def _stop(app: web.Application) -> None:
    await app[PROBE].stop()
