"""The objects of the engine service that are not values: a :class:`Cursor`, one
reader of one pipe (:meth:`feeds.service.EngineService.cursor`), and a :class:`Solo`,
a claim on running one thing on one node (:meth:`feeds.service.EngineService.solo`).

Each is a live handle whose calls may do I/O; what else the service returns is a
frozen value (:mod:`feeds.values`). :mod:`feeds.service` re-exports both: the layers
above import them from there, and ``EngineService`` below is
:class:`feeds.service.EngineService`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol, runtime_checkable

from .values import Message

__all__ = ["Cursor", "Solo"]


@runtime_checkable
class Cursor(Protocol):
    """One reader of one pipe: SSE, WebSocket, stream pipes, webhooks and bridges all
    read through it. Iterating yields each message after the starting position once,
    oldest first, waiting for the next one (until the cursor is closed or the pipe
    deleted, then iteration ends). Messages stay in the pipe until acknowledged."""

    def __aiter__(self) -> AsyncIterator[Message]: ...

    async def __anext__(self) -> Message: ...

    @property
    def position(self) -> int:
        """The last position yielded (the starting one before any)."""
        ...

    async def take(self, limit: int, *, wait: float = 0.0) -> tuple[Message, ...]:
        """Up to ``limit`` messages after the position, oldest first, as iterating
        would yield them: those there now or, when there are none, the first to come
        within ``wait`` seconds (none when nothing came, or the cursor closed or its
        pipe went). A reader that batches its work (a bridge) takes this way;
        cancelling a take that waits loses nothing."""
        ...

    @property
    def held(self) -> int:
        """How many messages the pipe holds (in memory and on disk, acknowledged ones
        gone), as the cursor last knew: what a reader that is behind has waiting."""
        ...

    async def ack(self, position: int, *, wait: bool = True) -> int:
        """Acknowledge up to ``position`` (cumulative); how many messages went. With
        ``wait`` False it returns before the acknowledgement is committed (it is
        within the engine's short interval, and before :meth:`EngineService.close`
        returns): for a reader that delivers again what a crash un-acknowledges (a
        bridge, at least once) and need not wait for the disk at every batch."""
        ...

    async def close(self) -> None:
        """End the iteration; a waiting ``__anext__`` ends with StopAsyncIteration."""
        ...

    # continuous readers
    @property
    def ended(self) -> str | None:
        """Why the cursor yields nothing more: "deleted" (its pipe went), "closing" (the
        engine is shutting down) or "closed" (:meth:`close`); None while it reads on."""
        ...

    def window(self, size: int) -> None:
        """From now on at most ``size`` of the messages this cursor yielded wait in the
        pipe at once: past that, iterating and :meth:`take` wait until some leave it
        (acknowledged by anyone, or moved by a lease that ran out). Counted from the
        oldest of them still there. A reader that pushes (a WebSocket) keeps no more
        than its window in flight this way."""
        ...

    async def sent(self, position: int) -> None:
        """The reader passed on the message at ``position`` (wrote it to its client):
        it counts as delivered and is leased as :meth:`EngineService.read` leases. For
        a cursor opened without ``lease`` whose reader leases only what it could send:
        a message it could not send stays where it is."""
        ...


@runtime_checkable
class Solo(Protocol):
    """A claim on running one thing (a bridge) on one node at a time among the nodes
    that share the engine: an engine of one process always holds it; on a cluster,
    one node holds it, and another takes it when that node stops or dies."""

    async def take(self) -> bool:
        """Try to hold it now: whether this node holds it (it is renewed from then on
        while this node lives)."""
        ...

    async def changed(self) -> bool:
        """Wait until this node takes it or loses it: whether it holds it now."""
        ...

    async def release(self) -> None:
        """Stop claiming it; another node may take it at once."""
        ...
