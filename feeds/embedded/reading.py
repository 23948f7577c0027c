"""Reading a pipe beyond the hot paths of :class:`~feeds.embedded.EmbeddedEngine`
(``listing``, ``read``, ``look``, ``ack``): whether a message or a content is there,
a content's bytes, deleting a content, and dead-lettering a message.

As the hot paths do, each call looks the pipe up as the principal (another's is a
404) and reads back from disk what the engine holds there first (:mod:`feeds.paging`),
in worker threads; a change is committed before the call returns.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from restms.errors import NotFound

from .. import paging
from ..model import PartRef, Pipe
from ..model import Slot as PipeSlot
from ..service import Blob, ContentRef, Slot

if TYPE_CHECKING:
    from ..engine import Engine
    from .service import EmbeddedEngine

Headers = tuple[tuple[str, str], ...]  # what a dead letter's copy carries besides


class Reading:
    """The other reads of an :class:`~feeds.embedded.EmbeddedEngine`."""

    def __init__(self, service: EmbeddedEngine) -> None:
        self._service = service
        self.engine: Engine = service.engine

    async def exists(self, principal: str | None, at: Slot | ContentRef) -> bool:
        engine = self.engine
        pipe = self._service._pipe(principal, at.pipe)
        if isinstance(at, ContentRef):
            await paging.ensure(engine, self._service.store, pipe, at.position)
            try:
                engine.part(PartRef(pipe, at.position, at.index))
            except NotFound:
                return False
            return True
        slot = PipeSlot(pipe, at.position)
        found = engine.message(slot) is not None or pipe.on_disk(at.position)
        return found or engine.pending(slot)

    async def content(self, principal: str | None, ref: ContentRef) -> Blob:
        found = self._service._pipe(principal, ref.pipe)
        await paging.ensure(self.engine, self._service.store, found, ref.position)
        blob = self.engine.part(PartRef(found, ref.position, ref.index))
        return Blob(data=blob.data, content_type=blob.content_type)

    async def delete_content(self, principal: str | None, ref: ContentRef) -> None:
        found = self._service._pipe(principal, ref.pipe)
        await paging.ensure(self.engine, self._service.store, found, ref.position)
        self.engine.delete_part(PartRef(found, ref.position, ref.index))
        await self._service._changed()

    async def dead_letter(
        self, found: Pipe, position: int, reason: str, feed: str | None, headers: Headers
    ) -> bool:
        """:meth:`feeds.service.EngineService.dead_letter` in ``found``, the principal's
        pipe."""
        engine = self.engine
        await paging.ensure(engine, self._service.store, found, position)
        held = engine.message(PipeSlot(found, position))
        if held is None:
            raise NotFound("no message at this position")
        moved = engine.dead_letter(found, held, reason, headers, feed=feed)
        cursors = self._service._cursors
        via = cursors.via(found)
        if via is not None:  # a bridge is done with it: the mirror records it as passed on
            cursors.mirror_out(found, position - 1, position, via)
        engine.settle(found, held)  # this one message leaves, as a rejected one does
        await self._service._changed()
        return moved
