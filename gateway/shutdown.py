"""Graceful shutdown: refuse new work, let the work in flight finish, then close.

On SIGTERM or SIGINT, :func:`gateway.server.serve` goes through these steps in order
(docs/ARCHITECTURE.md, "Graceful shutdown"):

1. The listening socket closes: a new connection is refused.
2. ``Engine.shutdown()``: every waiting asynclet and evented GET answers a retriable
   503 (``Retry-After``), SSE and stream-pipe responses end, and no new wait starts.
3. :meth:`InFlight.drain`: the requests already being handled (publishes awaiting
   their commit among them) run to their reply, for at most ``shutdown_grace``
   seconds or until a second signal; whatever still runs then is cancelled. Meanwhile
   :func:`draining` answers a request that arrives on a connection opened earlier with
   the same 503 instead of handling it, and :func:`last_on_connection` marks every
   reply ``Connection: close``.
4. ``runner.cleanup()``: aiohttp writes out the last replies and closes the
   connections, then the cleanup contexts run in reverse order; the store commits
   what the journal still holds and closes.

Nothing here blocks the loop: the drain is one future, resolved by the last request
to leave or by the second signal.
"""

from __future__ import annotations

import asyncio
import contextlib

from aiohttp import hdrs, web
from aiohttp.typedefs import Handler

from .keys import ENGINE

CANCEL_WAIT = 1.0  # seconds cancelled requests get to unwind before the runner closes them


class InFlight:
    """The requests being handled, so that shutdown can wait for them.

    Each is known by the task aiohttp runs it in (``request.task``, one request at a
    time per connection), which is also what aiohttp cancels when a client goes away.
    """

    __slots__ = ("_hurried", "_idle", "_requests")

    def __init__(self) -> None:
        self._requests: set[asyncio.Task[None]] = set()
        self._idle: asyncio.Future[None] | None = None  # exists only while draining
        self._hurried = False

    def __len__(self) -> int:
        return len(self._requests)

    def add(self, task: asyncio.Task[None]) -> None:
        self._requests.add(task)

    def discard(self, task: asyncio.Task[None]) -> None:
        self._requests.discard(task)
        if not self._requests:
            self._settle()

    def hurry(self) -> None:
        """Stop waiting (a second signal): :meth:`drain` cancels what is left at once."""
        self._hurried = True
        self._settle()

    def _settle(self) -> None:
        if self._idle is not None and not self._idle.done():
            self._idle.set_result(None)

    async def drain(self, grace: float) -> int:
        """Wait up to ``grace`` seconds for the requests in flight; cancel the rest.

        Returns how many were cancelled. A cancelled publish still commits what it
        handed to the store (the commit is shielded); only its reply is lost.
        """
        if self._requests and not self._hurried:
            self._idle = asyncio.get_running_loop().create_future()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(grace):
                    await self._idle
        left = list(self._requests)
        for task in left:
            task.cancel()  # as aiohttp does when a client goes away
        if left:
            await asyncio.wait(left, timeout=CANCEL_WAIT)
        return len(left)


IN_FLIGHT = web.AppKey("in_flight", InFlight)


@web.middleware
async def draining(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Once shutdown has begun, answer 503 + ``Retry-After``; until then, count the request."""
    request.app[ENGINE].check_open()
    in_flight, task = request.app[IN_FLIGHT], request.task
    in_flight.add(task)
    try:
        return await handler(request)
    finally:
        in_flight.discard(task)


async def last_on_connection(request: web.Request, response: web.StreamResponse) -> None:
    """During shutdown every reply says ``Connection: close``: no request follows it."""
    if request.app[ENGINE].closing:
        response.force_close()  # aiohttp closes the connection after this reply
        response.headers[hdrs.CONNECTION] = "close"  # its headers are set by now: say so
