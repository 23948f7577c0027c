"""A cursor on the Redis engine: one reader of one pipe (SSE, WebSocket, stream
pipes, webhooks, bridges), reading ranges of the pipe's stream after its position and
waiting on the pipe's wake-ups (:class:`feeds.service.Cursor`)."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from restms.errors import NotFound

from ..service import Message
from . import streams, syncing, waiting
from .catalogue import bucket

if TYPE_CHECKING:
    from .service import RedisEngine

BATCH = 100


class RedisCursor:
    def __init__(
        self,
        engine: RedisEngine,
        principal: str | None,
        pipe: str,
        after: int,
        lease: bool,
        via: str | None = None,
    ) -> None:
        self.engine = engine
        self.via = via  # the bridge this cursor reads for (its acknowledgements are mirrored)
        self.principal = principal
        self.pipe = pipe
        self._position = after
        self._lease = lease
        self._held = 0
        self._ended: str | None = None
        self._window = 0
        self._wake: asyncio.Future[bool] | None = None
        self._checked = False
        engine._cursors.add(self)

    def __aiter__(self) -> RedisCursor:
        return self

    async def __anext__(self) -> Message:
        while True:
            got = await self.take(1, wait=3600.0)
            if got:
                return got[0]
            if self._ended is not None:
                raise StopAsyncIteration

    @property
    def position(self) -> int:
        return self._position

    @property
    def held(self) -> int:
        return self._held

    @property
    def ended(self) -> str | None:
        return self._ended

    def end(self, why: str) -> None:
        if self._ended is None:
            self._ended = why
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(False)
        self.engine._cursors.discard(self)

    def window(self, size: int) -> None:
        self._window = size

    async def take(self, limit: int, *, wait: float = 0.0) -> tuple[Message, ...]:
        engine = self.engine
        if not self._checked:
            pipe = await syncing.pipe(engine, self.principal, self.pipe)
            self._checked = True
            del pipe
        deadline = time.monotonic() + wait
        if self._ended is None and engine._closing:
            self._ended = "closing"
        if wait > 0 and self._ended is None:
            await waiting.listen(engine, bucket(self.pipe))
        while self._ended is None:
            future = waiting.watch(engine, self.pipe)
            self._wake = future
            try:
                if self.pipe not in engine.cache.pipes:
                    self.end("deleted")
                    break
                got = await self._read(limit)
                if got:
                    return got
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return ()
                await asyncio.wait({future}, timeout=remaining)
                if engine._closing:
                    self.end("closing")
            finally:
                self._wake = None
                waiting.unwatch(engine, self.pipe, future)
        return ()

    async def _read(self, limit: int) -> tuple[Message, ...]:
        engine = self.engine
        if self._window:
            upto = await engine._range(self.pipe, 0, self._window)
            inflight = sum(1 for i in range(4, len(upto), 5) if int(upto[i]) <= self._position)
            limit = min(limit, self._window - inflight)
            if limit <= 0:
                self._held = upto[3]
                return ()
        reply = await engine._range(self.pipe, self._position + 1, limit)
        self._held = reply[3]
        got = tuple(streams.decoded(self.pipe, reply))
        if got:
            self._position = got[-1].position
            if self._lease:
                found = engine.cache.pipes.get(self.pipe)
                if found is not None:
                    for message in got:
                        await streams.delivered(engine, found, message)
        return got

    async def ack(self, position: int, *, wait: bool = True) -> int:
        removed = await streams.acknowledge(
            self.engine, self.pipe, position, durable=wait, via=self.via
        )
        reply = await self.engine._range(self.pipe, 0, 0)
        self._held = reply[3]
        return removed

    async def close(self) -> None:
        self.end("closed")

    async def sent(self, position: int) -> None:
        engine = self.engine
        found = engine.cache.pipes.get(self.pipe)
        if found is None:
            return
        message = await engine.look(None, self.pipe, position)
        if message is None:
            raise NotFound("no message at that position")
        await streams.delivered(engine, found, message)
