"""What the embedded engine tells an operator: its figures (:meth:`stats`), whether it
can serve (:meth:`readiness`), its pipes' states, and its one admin change, a purge.

None of these counts as a principal's use of a pipe: an idle pipe an operator looks at
stays idle (Q1).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import TYPE_CHECKING

from restms.errors import NotFound

from ..config import LATENCY_BOUNDS
from ..model import Feed, Join, Pipe, StagedContent
from ..service import HIDDEN, Census, Histogram, Inventory, PipeState, Readiness, Stats, StoreStats
from .probe import Probe
from .values import pipe_state

if TYPE_CHECKING:
    from .service import EmbeddedEngine


class Admin:
    """The operator's calls of an :class:`~feeds.embedded.EmbeddedEngine`."""

    def __init__(self, service: EmbeddedEngine) -> None:
        self._service = service
        self.engine = service.engine
        self.store = service.store
        self.probe = Probe()  # the store's test transaction (readiness)

    async def stats(self) -> Stats:
        engine = self.engine
        counted = engine.census()
        census = Census(
            feeds=counted.feeds,
            pipes=tuple(sorted(counted.pipes.items())),
            joins=counted.joins,
            messages=counted.messages + counted.on_disk,
            on_disk=counted.on_disk,
            deepest=counted.deepest,
            queued=counted.queued,
            queued_bytes=counted.queued_bytes,
            queued_on_disk=counted.queued_on_disk,
            staged_bytes=counted.staged_bytes,
            held_bytes=counted.held_bytes,
            webhook_pipes=len(engine.hooks),
        )
        counters = tuple(
            (field.name, int(getattr(engine.counters, field.name)))
            for field in dataclasses.fields(engine.counters)
        )
        latency = Histogram(
            bounds=LATENCY_BOUNDS,
            counts=tuple(engine.latency.counts),
            total=engine.latency.total,
        )
        store = self.store
        kept = None
        if store is not None:
            kept = StoreStats(
                kind="sqlite",
                running=store.running,
                failing=bool(store.failing),
                commits=store.commits,
                batches=store.batches,
                failures=store.failures,
                commit_seconds=store.commit_seconds,
                waiting=store.waiting(),
            )
        return Stats(
            counters=counters,
            census=census,
            latency=latency,
            closing=engine.closing,
            store=kept,
        )

    async def readiness(self, timeout: float) -> Readiness:
        if self.engine.closing:
            return Readiness(problems=("shutting down",), checked=())
        if self.store is None:  # nothing kept: nothing to commit
            return Readiness(problems=(), checked=())
        problem = await self.probe.store(self.store, timeout)
        if problem:
            return Readiness(problems=(problem,), checked=())
        return Readiness(problems=(), checked=("store: committing",))

    def _peek_pipe(self, principal: str | None, key: str) -> Pipe:
        """As the service's look-up, but not counted as use: an idle pipe stays idle."""
        found = self.engine.peek(key)
        if not isinstance(found, Pipe) or (principal is not None and found.owner != principal):
            raise NotFound(HIDDEN)
        return found

    async def pipe_states(self) -> tuple[PipeState, ...]:
        found = self.engine.private_resources()
        dead_letter = self._service._dead_letter
        return tuple(pipe_state(pipe, dead_letter) for pipe in found if isinstance(pipe, Pipe))

    async def pipe_state(self, principal: str | None, key: str) -> PipeState:
        return pipe_state(self._peek_pipe(principal, key), self._service._dead_letter)

    async def purge(self, principal: str | None, pipe: str) -> int:
        found = self._peek_pipe(principal, pipe)
        return await self._service._ack(found, found.asynclet - 1)  # not what is held back

    async def inventory(self) -> Inventory:
        engine = self.engine
        kinds: Counter[type] = Counter(map(type, engine.private_resources()))
        return Inventory(
            domains=len(engine.domains),
            public_feeds=len(engine.public_feeds),
            private_feeds=kinds[Feed],
            pipes=kinds[Pipe],
            joins=kinds[Join],
            staged=kinds[StagedContent],
        )
