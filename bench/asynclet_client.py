"""Hold many concurrent requests open against a server; runs as its own process.

Modes:

* ``wait``: GET every asynclet URI listed in ``--urls`` (one per line), all at
  once on separate connections (aiohttp, connector limit=0), and count the replies
  that are 200 and contain ``--expect``.
* ``idle``: POST a small body ``--count`` times to ``--url``, each on its own raw
  keep-alive connection, and keep every connection open and idle until told to
  stop; the bare server baseline for "10,000 connections held open".

Protocol on stdout, one JSON object per line: ``{"event": "sent", ...}`` once every
request's headers are written (``idle``: once every reply is read), then
``{"event": "done", ...}`` with counts and monotonic timestamps (CLOCK_MONOTONIC is
shared between processes, so the parent can subtract its own readings). ``idle``
waits for a line on stdin before it closes its connections.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import uvloop


def emit(**fields: Any) -> None:
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


def raise_nofile() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


async def wait_mode(urls: list[str], expect: str, opening: int, timeout: float) -> None:
    sent = 0
    all_sent = asyncio.Event()
    gate = asyncio.Semaphore(opening)  # connections being opened at once (listen backlog)
    trace = aiohttp.TraceConfig()

    async def on_headers_sent(_session: Any, ctx: Any, _params: Any) -> None:
        nonlocal sent
        sent += 1
        mine = ctx.trace_request_ctx
        if not mine["released"]:
            mine["released"] = True
            gate.release()
        if sent == len(urls):
            all_sent.set()

    trace.on_request_headers_sent.append(on_headers_sent)
    ok = bad = 0
    errors: dict[str, int] = {}
    first = last = None
    connector = aiohttp.TCPConnector(limit=0, limit_per_host=0)
    client_timeout = aiohttp.ClientTimeout(total=timeout)

    async def one(session: aiohttp.ClientSession, url: str) -> None:
        nonlocal ok, bad, first, last
        await gate.acquire()
        mine = {"released": False}
        try:
            async with session.get(
                url, headers={"Accept": "application/restms+xml"}, trace_request_ctx=mine
            ) as r:
                body = await r.read()
                now = time.monotonic()
                if r.status == 200 and expect.encode() in body:
                    ok += 1
                    first = now if first is None else first
                    last = now
                else:
                    bad += 1
                    key = f"status {r.status}"
                    errors[key] = errors.get(key, 0) + 1
        except Exception as exc:
            if not mine["released"]:
                mine["released"] = True
                gate.release()
            bad += 1
            key = type(exc).__name__
            errors[key] = errors.get(key, 0) + 1

    async with aiohttp.ClientSession(
        connector=connector, timeout=client_timeout, trace_configs=[trace]
    ) as session:
        t0 = time.monotonic()
        tasks = [asyncio.create_task(one(session, url)) for url in urls]
        done_all = asyncio.ensure_future(asyncio.gather(*tasks))
        sent_wait = asyncio.ensure_future(all_sent.wait())
        await asyncio.wait({done_all, sent_wait}, return_when=asyncio.FIRST_COMPLETED)
        emit(event="sent", sent=sent, seconds=time.monotonic() - t0, t=time.monotonic())
        await done_all
    emit(event="done", ok=ok, bad=bad, errors=errors, first_t=first, last_t=last)


async def idle_mode(url: str, count: int, opening: int) -> None:
    """Raw keep-alive connections: aiohttp's pool would reuse them once a reply is read."""
    parts = urlsplit(url)
    request = (
        f"POST {parts.path or '/'} HTTP/1.1\r\nHost: {parts.netloc}\r\n"
        "Content-Type: text/plain\r\nContent-Length: 64\r\n\r\n"
    ).encode() + b"x" * 64
    gate = asyncio.Semaphore(opening)
    ok = bad = 0
    writers: list[asyncio.StreamWriter] = []

    async def one() -> None:
        nonlocal ok, bad
        try:
            async with gate:
                reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
            writers.append(writer)
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            await reader.readexactly(length)
            if head.startswith(b"HTTP/1.1 200"):
                ok += 1
            else:
                bad += 1
        except (OSError, asyncio.IncompleteReadError):
            bad += 1

    t0 = time.monotonic()
    await asyncio.gather(*(one() for _ in range(count)))
    emit(event="sent", sent=ok, bad=bad, seconds=time.monotonic() - t0, t=time.monotonic())
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    for writer in writers:
        writer.close()
    emit(event="done", ok=ok, bad=bad)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("mode", choices=["wait", "idle"])
    parser.add_argument("--urls", help="wait: file with one asynclet URI per line")
    parser.add_argument("--expect", default="", help="wait: text every reply must contain")
    parser.add_argument("--url", help="idle: URL to POST to")
    parser.add_argument("--count", type=int, default=10_000)
    parser.add_argument("--opening", type=int, default=256, help="connections opened at once")
    parser.add_argument("--timeout", type=float, default=180.0)
    args = parser.parse_args()
    raise_nofile()
    if args.mode == "wait":
        urls = Path(args.urls).read_text().split()
        uvloop.run(wait_mode(urls, args.expect, args.opening, args.timeout))
    else:
        uvloop.run(idle_mode(args.url, args.count, args.opening))


if __name__ == "__main__":
    main()
