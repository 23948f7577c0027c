"""Changes to the embedded engine's resources: creating, changing and deleting feeds,
pipes and joins, and staging contents for a later publish.

Each change is made by the engine (:mod:`feeds.engine`) on the resource the service's
look-up found for the principal (another's private resource is a 404), and committed
before the call returns (``EmbeddedEngine._changed``); the value returned is the one
the change left, taken before the commit's wait. Who may change a feed is decided
here (Q7, F17).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from restms.errors import BadRequest, Conflict, Forbidden
from restms.specs import FeedSpec, JoinSpec, PipeSpec, Update

from ..model import Feed
from ..service import Blob, FeedInfo, JoinInfo, PipeInfo, StagedInfo
from .values import join_info, staged_info

if TYPE_CHECKING:
    from ..engine import Engine
    from .service import EmbeddedEngine


class Resources:
    """The resource changes of an :class:`~feeds.embedded.EmbeddedEngine`."""

    def __init__(self, service: EmbeddedEngine) -> None:
        self._service = service
        self.engine: Engine = service.engine

    async def create_feed(
        self, principal: str, domain: str, spec: FeedSpec
    ) -> tuple[FeedInfo, bool]:
        engine = self.engine
        where = engine.domain(domain)
        existing = engine.public_feeds.get(spec.name) if spec.name is not None else None
        if existing is not None and existing.domain is not where:
            raise Conflict(f"the feed name {spec.name!r} is taken in another domain")
        feed, created = engine.create_feed(where, spec, principal)
        made = self._service._feed_info(feed)  # as the change left it (see EmbeddedEngine._changed)
        await self._service._changed()
        return made, created

    async def update_feed(self, principal: str | None, key: str, update: Update) -> FeedInfo:
        feed = self._service._feed(principal, key)
        self._changeable(principal, feed)
        self.engine.update_feed(feed, update)
        made = self._service._feed_info(feed)
        await self._service._changed()
        return made

    async def delete_feed(self, principal: str | None, key: str) -> None:
        feed = self._service._feed(principal, key)
        self._changeable(principal, feed)
        self.engine.delete_feed(feed)
        self._service._feed_infos.pop(feed, None)
        await self._service._changed()

    def _changeable(self, principal: str | None, feed: Feed) -> None:
        """Q7, F17: a configured feed is nobody's to change, a public one its creator's."""
        if feed.configured:
            raise Forbidden("configured feeds cannot be changed")
        if principal is not None and feed.owner != principal:
            raise Forbidden("only the feed's creator or an admin may change or delete it")

    async def create_pipe(self, principal: str, domain: str, spec: PipeSpec) -> PipeInfo:
        engine = self.engine
        pipe = engine.create_pipe(engine.domain(domain), spec, principal)
        made = self._service._pipe_info(pipe)  # a webhook pipe verifies meanwhile: not yet
        await self._service._changed()
        return made

    async def update_pipe(self, principal: str | None, key: str, update: Update) -> PipeInfo:
        pipe = self._service._pipe(principal, key)
        self.engine.update_pipe(pipe, update)
        made = self._service._pipe_info(pipe)
        await self._service._changed()
        return made

    async def delete_pipe(self, principal: str | None, key: str) -> None:
        self.engine.delete_pipe(self._service._pipe(principal, key))
        await self._service._changed()

    async def create_join(
        self, principal: str | None, pipe: str, spec: JoinSpec
    ) -> tuple[JoinInfo, bool]:
        found = self._service._pipe(principal, pipe)
        target = self.engine.feed_at(spec.feed_path)  # 400 when there is none (G14)
        if not target.public and principal is not None and target.owner != principal:
            raise BadRequest(f"join names no existing feed: {spec.feed_path}")  # as if none
        join, created = self.engine.create_join(found, spec)
        made = join_info(join)
        await self._service._changed()
        return made, created

    async def delete_join(self, principal: str | None, key: str) -> None:
        self.engine.delete_join(self._service._join(principal, key))
        await self._service._changed()

    async def stage(self, principal: str, feed: str, data: bytes, content_type: str) -> StagedInfo:
        staged = self.engine.stage(
            self._service._feed(principal, feed), data, content_type, principal
        )
        return staged_info(staged)

    async def staged(self, principal: str | None, key: str) -> tuple[StagedInfo, Blob]:
        staged = self._service._staged(principal, key)
        blob = Blob(data=staged.blob.data, content_type=staged.blob.content_type)
        return staged_info(staged), blob

    async def delete_staged(self, principal: str | None, key: str) -> None:
        self.engine.delete_staged(self._service._staged(principal, key))
