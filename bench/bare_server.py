"""The baseline: a bare aiohttp app on uvloop with one POST handler.

It reads the whole request body and answers a small 200, and does nothing else, so
the gateway's figures can be read against the cost of aiohttp + uvloop alone on the
same machine with the same load generator. Run like the gateway:
``.venv/bin/python bench/bare_server.py --port 0`` (logs the port it bound).
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys

import uvloop
from aiohttp import web

REPLY = b'<restms xmlns="http://www.restms.org/schema/restms"><message count="1"/></restms>'


async def post(request: web.Request) -> web.Response:
    await request.read()
    return web.Response(body=REPLY, content_type="application/restms+xml")


async def serve(host: str, port: int) -> None:
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/{tail:.*}", post)
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=5.0)
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=4096)
    await site.start()
    for address in runner.addresses:
        print(f"listening on http://{address[0]}:{address[1]}/", file=sys.stderr, flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await runner.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    uvloop.run(serve(args.host, args.port))


if __name__ == "__main__":
    main()
