"""Graceful shutdown: refuse new work, let the work in flight finish, then close.

On SIGTERM or SIGINT, :func:`gateway.server.run.serve` goes through these steps in order
(docs/ARCHITECTURE.md, "Graceful shutdown"):

1. The listening socket closes: a new connection is refused.
2. :meth:`InFlight.close` and the engine service's ``shutdown()``: every waiting
   asynclet and evented GET answers a retriable 503 (``Retry-After``), SSE, stream-pipe
   and WebSocket responses end, and no new wait starts.
3. :meth:`InFlight.drain`: the requests already being handled (publishes awaiting
   their commit among them) run to their reply, for at most ``shutdown_grace``
   seconds or until a second signal; whatever still runs then is cancelled. Meanwhile
   :meth:`InFlight.admit` answers a request that arrives on a connection opened
   earlier with the same 503 instead of handling it, and the middleware
   (:mod:`gateway.server.middleware`) marks every reply ``Connection: close``.
4. ``runner.cleanup()``: aiohttp writes out the last replies and closes the
   connections, then the cleanup contexts run in reverse order; the store commits
   what the journal still holds and closes.

Nothing here blocks the loop: the drain is one future, resolved by the last request
to leave or by the second signal.
"""

from __future__ import annotations

import asyncio
import contextlib

from aiohttp import web

from restms.errors import ServiceUnavailable

CANCEL_WAIT = 1.0  # seconds cancelled requests get to unwind before the runner closes them


class InFlight:
    """The requests being handled, so that shutdown can wait for them.

    Each is known by the task aiohttp runs it in (``request.task``, one request at a
    time per connection), which is also what aiohttp cancels when a client goes away.
    """

    __slots__ = ("_hurried", "_idle", "_requests", "closing")

    def __init__(self) -> None:
        self._requests: set[asyncio.Task[None]] = set()
        self._idle: asyncio.Future[None] | None = None  # exists only while draining
        self._hurried = False
        self.closing = False  # shutdown has begun: no request is admitted

    def __len__(self) -> int:
        return len(self._requests)

    def add(self, task: asyncio.Task[None]) -> None:
        self._requests.add(task)

    def close(self) -> None:
        """Shutdown has begun: from now on :meth:`admit` refuses every request."""
        self.closing = True

    def admit(self, request: web.Request) -> asyncio.Task[None]:
        """Once shutdown has begun, refuse the request (503 + ``Retry-After``); until
        then, count it: the caller discards the task returned when its reply is made."""
        if self.closing:
            raise ServiceUnavailable("the gateway is shutting down; retry", 1)
        task = request.task
        self._requests.add(task)
        return task

    def discard(self, task: asyncio.Task[None]) -> None:
        self._requests.discard(task)
        if self._idle is not None and not self._requests:
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
