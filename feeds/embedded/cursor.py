"""One reader of one pipe of the embedded engine (:class:`feeds.service.Cursor`), and
the open readers of each pipe (:class:`Cursors`)."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator
from itertools import islice, takewhile
from operator import attrgetter
from typing import TYPE_CHECKING

from .. import paging
from ..model import Pipe
from ..service import Message
from .values import messages

if TYPE_CHECKING:
    from ..engine import Engine
    from .service import EmbeddedEngine

_POSITION = attrgetter("position")
LONG = 3600.0  # seconds a cursor waits for news before looking again


class EmbeddedCursor:
    """:class:`feeds.service.Cursor` over one pipe of an :class:`EmbeddedEngine`.

    While it is open the pipe is pinned: a reader that makes no requests of its own
    (a bridge, a webhook worker) keeps it from being collected as idle (Q1).
    """

    def __init__(
        self,
        service: EmbeddedEngine,
        principal: str | None,
        key: str,
        after: int,
        lease: bool,
        via: str | None = None,
    ) -> None:
        self._service = service
        self._principal = principal
        self._key = key
        self._after = after
        self._acked = after  # the highest position acknowledged through this cursor
        self._lease = lease
        self._via = via
        self._pipe: Pipe | None = None  # found at the first iteration
        self._batch: deque[Message] = deque()
        self._closed = asyncio.Event()
        self._window = 0  # 0: no window
        # The pipe's version at a look that found all there was (-1: none): until the
        # version moves, there is nothing new to look for.
        self._quiet = -1
        self._waiting: asyncio.Future[bool] | None = None  # the pipe's future it waits on
        self._flight: deque[int] = deque()  # positions yielded, oldest first (with a window)

    def __aiter__(self) -> AsyncIterator[Message]:
        return self

    @property
    def position(self) -> int:
        return self._after

    @property
    def via(self) -> str | None:
        """The bridge this cursor reads for (its acknowledgements are mirrored)."""
        return self._via

    @property
    def held(self) -> int:
        pipe = self._pipe
        if pipe is None:
            found = self._service.engine.peek(self._key)
            pipe = found if isinstance(found, Pipe) else None
        if pipe is None or pipe.deleted:
            return 0
        return len(pipe.messages) + pipe.spilled

    def _open(self) -> Pipe | None:
        """The pipe, found (404 when it is not the principal's) and pinned at first use."""
        pipe = self._pipe
        if pipe is None and not self._closed.is_set():
            pipe = self._pipe = self._service._pipe(self._principal, self._key)
            self._service._cursors.opened(self, pipe)
        return pipe

    def _ended(self, pipe: Pipe | None) -> bool:
        return pipe is None or self._closed.is_set() or pipe.deleted or self._service.engine.closing

    async def _page(self, pipe: Pipe) -> None:
        """Read back from disk until memory holds a message after ours (if any waits there)."""
        await paging.ahead(self._service.engine, self._service.store, pipe, self._after)

    def _look(self, pipe: Pipe, limit: int | None) -> tuple[list[Message], int]:
        """Up to ``limit`` (None: all) of the messages after ours that are in memory
        (the caller pages in first), and the pipe's version before the look. Not a
        coroutine: a pushing reader looks twice a message (once more after its
        client's acknowledgement), and most looks find nothing."""
        engine = self._service.engine
        seen = pipe.version
        if self._window:
            room = self._window - self._in_flight(pipe)
            if room <= 0:
                return [], seen
            limit = room if limit is None else min(limit, room)
        held = list(islice(engine.stream(pipe, self._after), limit))
        exhausted = (limit is None or len(held) < limit) and not pipe.spilled
        self._quiet = seen if exhausted else -1
        if not held:
            return [], seen
        if self._lease:
            for one in held:
                engine.lease(pipe, one)
        return messages(pipe, held), seen

    async def __anext__(self) -> Message:
        pipe = self._open()
        while not self._batch:
            if self._ended(pipe):
                await self.close()
                raise StopAsyncIteration
            assert pipe is not None
            if pipe.spilled:
                await self._page(pipe)
            found, seen = self._look(pipe, None)
            self._batch.extend(found)
            if not found:  # nothing after ours, or only what waits for a commit
                await self._news(pipe, seen, LONG)
        got = self._batch.popleft()
        self._after = got.position
        if self._window:
            self._flight.append(got.position)
        return got

    async def take(self, limit: int, *, wait: float = 0.0) -> tuple[Message, ...]:
        pipe = self._open()
        batch = self._batch
        if batch:  # left over from iterating
            taken = [batch.popleft() for _ in range(min(limit, len(batch)))]
        else:
            taken = []
            deadline = 0.0  # read from the clock only once there is something to wait for
            engine = self._service.engine
            closed = self._closed
            while limit > 0 and not (
                pipe is None or pipe.deleted or engine.closing or closed.is_set()
            ):
                seen = self._quiet
                if seen != pipe.version:  # else nothing came since a look that took all
                    if pipe.spilled:
                        await self._page(pipe)
                    taken, seen = self._look(pipe, limit)
                if taken or wait <= 0:
                    break
                if not deadline:
                    deadline = time.monotonic() + wait
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                if seen == pipe.version:  # else the look changed it (dropped expired ones)
                    await self._news(pipe, seen, left)
        # Nothing was awaited since the look: a take cancelled while it waited lost nothing.
        if taken:
            self._after = taken[-1].position
            if self._window:
                self._flight.extend(map(_POSITION, taken))
        return tuple(taken)

    async def _news(self, pipe: Pipe, seen: int, timeout: float) -> None:
        """Wait until the pipe changes after version ``seen``, the cursor closes, or
        ``timeout`` seconds pass.

        The wait is on a future of the pipe's own, in this frame, which :meth:`close`
        resolves: a pushing reader waits once for every message (each WebSocket of a
        fan-out), and racing tasks against the close cost more than all the rest of a
        delivery (docs/BENCHMARKS.md, benchmark 12)."""
        if pipe.version != seen or timeout <= 0 or self._closed.is_set():
            return
        future = pipe.watch()
        timer = future.get_loop().call_later(timeout, _expire, future)
        self._waiting = future
        try:
            await future
        finally:
            self._waiting = None
            timer.cancel()
            pipe.unwatch(future)

    async def ack(self, position: int, *, wait: bool = True) -> int:
        pipe, service = self._pipe, self._service
        if pipe is None or pipe.deleted:  # not looked up yet, or gone: the service says
            return await service.ack(self._principal, self._key, position)
        if self._via is not None and position > self._acked:
            service._cursors.mirror_out(pipe, self._acked, position, self._via)
        removed = await service._ack(pipe, position, wait)  # the principal's pipe: seen
        self._acked = max(self._acked, position)
        return removed

    async def close(self) -> None:
        self._closed.set()
        waiting = self._waiting
        if waiting is not None and not waiting.done():
            waiting.set_result(False)  # its wait ends
        if self._pipe is not None:
            self._service._cursors.closed(self, self._pipe)

    # continuous readers
    @property
    def ended(self) -> str | None:
        pipe = self._pipe
        if pipe is not None and pipe.deleted:
            return "deleted"
        if self._service.engine.closing:
            return "closing"
        return "closed" if self._closed.is_set() else None

    def window(self, size: int) -> None:
        self._window = size

    def _in_flight(self, pipe: Pipe) -> int:
        """Yielded messages still in the pipe: positions leave once acknowledged (or
        moved by a lease that ran out), oldest first."""
        flight, held = self._flight, pipe.messages
        while flight and flight[0] not in held:
            flight.popleft()
        return len(flight)

    async def sent(self, position: int) -> None:
        pipe = self._pipe
        if pipe is None:
            return
        held = pipe.messages.get(position)
        if held is not None:
            self._service.engine.lease(pipe, held)  # delivered, and leased


def _expire(future: asyncio.Future[bool]) -> None:
    """The timer of a wait: its time is up, unless the pipe changed first."""
    if not future.done():
        future.set_result(False)


class Cursors:
    """The open cursors of each pipe: a pipe is pinned while one reads it, and what a
    bridge's cursor acknowledges is offered to the mirror as passed on."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._readers: dict[Pipe, set[EmbeddedCursor]] = {}

    def opened(self, cursor: EmbeddedCursor, pipe: Pipe) -> None:
        readers = self._readers.setdefault(pipe, set())
        if not readers:
            self.engine.pin(pipe, True)
        readers.add(cursor)

    def closed(self, cursor: EmbeddedCursor, pipe: Pipe) -> None:
        readers = self._readers.get(pipe)
        if readers is None or cursor not in readers:
            return
        readers.discard(cursor)
        if not readers:
            del self._readers[pipe]
            self.engine.pin(pipe, False)

    def via(self, pipe: Pipe) -> str | None:
        """The bridge reading ``pipe``, if one is."""
        return next((c.via for c in self._readers.get(pipe, ()) if c.via is not None), None)

    def mirror_out(self, pipe: Pipe, after: int, upto: int, via: str) -> None:
        """Offer the mirror a bridge_out event per message a bridge is acknowledging."""
        engine = self.engine
        if engine.mirror is None:
            return
        # A copy of the acknowledged messages only, not of the whole pipe: a bridge
        # catching up acknowledges a batch at a time from a pipe that may hold millions.
        acked = list(takewhile(lambda item: item[0] <= upto, pipe.messages.items()))
        for seq, held in acked:
            if seq > after:
                engine.mirrored("bridge_out", pipe, held, bridge=via)

    async def close(self) -> None:
        for readers in list(self._readers.values()):
            for cursor in list(readers):
                await cursor.close()
