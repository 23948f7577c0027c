"""Running the gateway: uvloop, one TCP site, graceful shutdown on SIGINT and SIGTERM.

The steps of the shutdown and what clients see are in :mod:`gateway.shutdown`.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal

import uvloop
from aiohttp import web

from .app import build_app
from .config import Config
from .keys import ENGINE
from .shutdown import CANCEL_WAIT, IN_FLIGHT

log = logging.getLogger("gateway")


# The engine keeps many small, long-lived objects (messages waiting in pipes). Python's
# default collector thresholds rescan them over and over under load; collecting the
# youngest generation less often and freezing what start-up built keeps that cost down.
# Messages form no reference cycles, so little garbage waits for the collector.
GC_THRESHOLDS = (50_000, 20, 10)


async def serve(config: Config) -> None:
    app = build_app(config)
    runner = web.AppRunner(
        app,
        handler_cancellation=True,  # a client that goes away ends its wait (A6)
        access_log=log if config.access_log else None,
        shutdown_timeout=CANCEL_WAIT,  # our drain has already waited for the handlers
    )
    in_flight = app[IN_FLIGHT]
    stop = asyncio.Event()

    def on_signal() -> None:
        if stop.is_set():  # the second signal: stop waiting for requests in flight
            log.info("second signal: requests still in flight are cancelled now")
            in_flight.hurry()
        stop.set()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal)
    await runner.setup()
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    site = web.TCPSite(runner, config.host, config.port, backlog=4096)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        raise SystemExit(f"cannot listen on {config.host}:{config.port}: {exc.strerror}") from exc
    for address in runner.addresses:
        host, port = address[:2]
        shown = f"[{host}]" if ":" in host else host
        log.info("listening on http://%s:%d/restms/domain/default", shown, port)
    await stop.wait()
    grace = config.shutdown_grace
    log.info("shutting down: %d requests in flight, %g s to finish", len(in_flight), grace)
    await site.stop()  # a new connection is refused from here on
    app[ENGINE].shutdown()  # waits answer 503 + Retry-After, streams end, new requests too
    cancelled = await in_flight.drain(grace)
    if cancelled:
        log.warning("cancelled %d requests still in flight", cancelled)
    await runner.cleanup()  # last replies written, connections closed, journal committed
    log.info("stopped")


def run(config: Config) -> None:
    uvloop.run(serve(config))
