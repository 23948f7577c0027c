"""Running the gateway: uvloop, one TCP (or TLS) site, graceful shutdown on SIGINT and SIGTERM.

:func:`make_runner` and :func:`start_site` build the server the same way for
production (:func:`serve`) and for the tests: connection caps, request-head limits
and read deadlines (:mod:`gateway.server.connections`), keep-alive, and TLS when
``tls_cert`` and ``tls_key`` are set. The steps of the shutdown and what clients see
are in :mod:`gateway.server.shutdown`.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import ssl
from collections.abc import Callable

import uvloop
from aiohttp import web

from auth import is_loopback
from auth.cluster import SharedStateError
from feeds.service import EngineService
from gateway.server import tracing
from gateway.server.app import begin_shutdown, build_app
from gateway.server.config import Config, ConfigError
from gateway.server.connections import ConnectionLimits, GatewayRunner
from gateway.server.datalock import lock_data_dir
from gateway.server.shutdown import CANCEL_WAIT, IN_FLIGHT
from gateway.server.workers import Supervisor
from restms.errors import ServiceUnavailable

log = logging.getLogger("gateway")


# The engine keeps many small, long-lived objects (messages waiting in pipes). Python's
# default collector thresholds rescan them over and over under load; collecting the
# youngest generation less often and freezing what start-up built keeps that cost down.
# Messages form no reference cycles, so little garbage waits for the collector.
GC_THRESHOLDS = (50_000, 20, 10)


def make_runner(app: web.Application, config: Config) -> GatewayRunner:
    """The runner for ``app``: its connections under ``config``'s caps and limits."""
    return GatewayRunner(
        app,
        limits=ConnectionLimits.from_config(config),
        handler_kwargs={
            "access_log": log if config.access_log else None,
            "keepalive_timeout": config.keepalive_timeout,
            "max_line_size": config.max_line_size,
            "max_field_size": config.max_field_size,
            "max_headers": config.max_headers,
            # Compressed request bodies are decoded by the gateway, which checks that
            # they end whole (gateway.server.compression.read_decoded).
            "auto_decompress": False,
        },
        handler_cancellation=True,  # a client that goes away ends its wait (A6)
        shutdown_timeout=CANCEL_WAIT,  # our drain has already waited for the handlers
    )


def tls_context(cert: str, key: str) -> ssl.SSLContext:
    """A server context for the PEM ``cert`` chain and ``key``: TLS 1.2 at least.

    Reads files: call it off the event loop. Raises :class:`ConfigError`.
    """
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    # Renegotiation buys a client nothing here and costs the server a handshake each.
    context.options |= ssl.OP_NO_RENEGOTIATION
    context.set_alpn_protocols(["http/1.1"])
    try:
        context.load_cert_chain(cert, key)
    except OSError as exc:  # ssl.SSLError too: a bad PEM, a key that does not match
        raise ConfigError(f"cannot load tls_cert {cert} with tls_key: {exc}") from exc
    return context


async def start_site(
    runner: web.AppRunner, config: Config, host: str, port: int, *, reuse_port: bool = False
) -> web.TCPSite:
    """Listen on ``host:port`` (HTTPS when ``config`` has a certificate) for ``runner``,
    beside other processes on the same port with ``reuse_port`` (``serve --workers``).

    Raises :class:`ConfigError` when the certificate cannot be loaded and
    :class:`OSError` when the address cannot be listened on.
    """
    context = None
    if config.tls_cert:
        context = await asyncio.to_thread(tls_context, config.tls_cert, config.tls_key)
    site = web.TCPSite(
        runner, host, port, ssl_context=context, backlog=4096, reuse_port=reuse_port or None
    )
    await site.start()
    return site


async def serve(
    config: Config, open_engine: Callable[[Config], EngineService], *, reuse_port: bool = False
) -> None:
    provider = tracing.start(config)  # the process's, before the app asks for a tracer
    try:
        await _serve(config, open_engine, reuse_port)
    finally:
        await asyncio.to_thread(tracing.stop, provider)  # what is left is exported


async def _serve(
    config: Config, open_engine: Callable[[Config], EngineService], reuse_port: bool
) -> None:
    # Set before the engine starts: its start builds what it keeps (the messages of a
    # store, a cluster node's whole catalogue), which Python's default thresholds would
    # scan again and again as it grows.
    gc.set_threshold(*GC_THRESHOLDS)
    app = build_app(config, open_engine(config))
    runner = make_runner(app, config)
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
    try:
        if not await _started(runner, stop):
            log.info("stopped while starting")
            await runner.cleanup()
            return
    except BaseException as exc:  # what started before the failure (the analytics worker) ends
        await runner.cleanup()
        # A cluster not up, or one that cannot keep a write (no replica): say so, no
        # traceback.
        if isinstance(exc, SharedStateError | ServiceUnavailable):
            where = config.shared_at()
            raise SystemExit(f"cannot start: {exc}{' at ' + where if where else ''}") from exc
        raise
    gc.collect()
    gc.freeze()
    try:
        site = await start_site(runner, config, config.host, config.port, reuse_port=reuse_port)
    except ConfigError as exc:
        await runner.cleanup()
        raise SystemExit(str(exc)) from exc
    except OSError as exc:
        await runner.cleanup()
        raise SystemExit(f"cannot listen on {config.host}:{config.port}: {exc.strerror}") from exc
    scheme = "https" if config.tls_cert else "http"
    if not config.tls_cert and not is_loopback(config.host):
        log.warning(
            "listening on %s without TLS: bearer tokens and passwords cross the network "
            "in clear; set tls_cert and tls_key, or keep a TLS proxy in front",
            config.host,
        )
    for address in runner.addresses:
        host, port = address[:2]
        shown = f"[{host}]" if ":" in host else host
        log.info("listening on %s://%s:%d/restms/domain/default", scheme, shown, port)
    # A public listener with no names configured refuses every client that uses a name.
    public = not config.hosts.configured and not is_loopback(config.host)
    log.log(logging.WARNING if public else logging.INFO, "%s", config.hosts.describe())
    await stop.wait()
    grace = config.shutdown_grace
    log.info("shutting down: %d requests in flight, %g s to finish", len(in_flight), grace)
    await site.stop()  # a new connection is refused from here on
    begin_shutdown(app)  # new requests and waits answer 503 + Retry-After, streams end
    cancelled = await in_flight.drain(grace)
    if cancelled:
        log.warning("cancelled %d requests still in flight", cancelled)
    await runner.cleanup()  # last replies written, connections closed, journal committed
    log.info("stopped")


async def _started(runner: web.AppRunner, stop: asyncio.Event) -> bool:
    """Set ``runner`` up (the app's start: the engine, the shared state, which may be
    waited for), unless ``stop`` (a signal) comes first: then False, the start given up
    where it was."""
    setup = asyncio.ensure_future(runner.setup())
    stopping = asyncio.ensure_future(stop.wait())
    await asyncio.wait({setup, stopping}, return_when=asyncio.FIRST_COMPLETED)
    stopping.cancel()
    if setup.done():
        setup.result()  # its failure, if any
        return True
    setup.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await setup
    return False


def run(config: Config, open_engine: Callable[[Config], EngineService]) -> int:
    """Serve on the engine ``open_engine`` makes until stopped, holding the data
    directory's lock (before the loop runs and before anything in the directory is
    opened); DataDirError if another holds it. With ``workers`` above 1, that many
    gateway processes share the port (:mod:`gateway.server.workers`). The exit code."""
    lock = lock_data_dir(config.data_dir)
    try:
        if config.workers > 1:
            return Supervisor(config, open_engine, serve).run()
        uvloop.run(serve(config, open_engine))
        return 0
    finally:
        os.close(lock)
