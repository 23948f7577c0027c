"""Running the gateway: uvloop, one TCP site, clean shutdown on SIGINT and SIGTERM."""

from __future__ import annotations

import asyncio
import gc
import logging
import signal

import uvloop
from aiohttp import web

from .app import build_app
from .config import Config

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
        shutdown_timeout=5.0,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
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
    log.info("shutting down")
    await runner.cleanup()
    log.info("stopped")


def run(config: Config) -> None:
    uvloop.run(serve(config))
