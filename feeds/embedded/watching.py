"""Evented waits of the embedded engine (:meth:`feeds.service.EngineService.changed`):
a domain, feed, pipe or join's next version, for the evented GETs.

A value carries the version of the resource it was taken from. The wait looks the
resource up again as the principal (another's is a 404 as ever), and returns its new
value as soon as the version differs, None when ``wait`` ends first. A deleted
resource is a 404, and shutdown wakes every wait as a retriable 503, never a hang.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, cast

from restms.errors import NotFound

from ..model import Domain, Feed, Join, Pipe
from ..service import DomainInfo, FeedInfo, JoinInfo, PipeInfo, Watched
from .values import join_info

if TYPE_CHECKING:
    from .service import EmbeddedEngine


class Watching:
    """The evented waits of an :class:`~feeds.embedded.EmbeddedEngine`."""

    def __init__(self, service: EmbeddedEngine) -> None:
        self._service = service

    async def changed(self, principal: str | None, value: Watched, wait: float) -> Watched | None:
        engine = self._service.engine
        watched = self._watched(principal, value)
        deadline = time.monotonic() + wait
        while True:
            if watched.deleted:
                raise NotFound("the resource was deleted")
            if watched.version != value.version:
                return cast(Watched, self._value_of(watched))
            engine.check_open()  # shutdown wakes every wait: a retriable 503, not a hang
            if not await watched.changed(deadline - time.monotonic(), value.version):
                return None

    def _watched(
        self, principal: str | None, value: DomainInfo | FeedInfo | PipeInfo | JoinInfo
    ) -> Domain | Feed | Pipe | Join:
        service = self._service
        if isinstance(value, DomainInfo):
            return service.engine.domain(value.name)
        if isinstance(value, FeedInfo):
            return service._feed(principal, value.key)
        if isinstance(value, PipeInfo):
            return service._pipe(principal, value.key)
        if isinstance(value, JoinInfo):
            return service._join(principal, value.key)
        raise TypeError(f"no changes are watched of a {type(value).__name__}")

    def _value_of(
        self, watched: Domain | Feed | Pipe | Join
    ) -> DomainInfo | FeedInfo | PipeInfo | JoinInfo:
        service = self._service
        if isinstance(watched, Domain):
            return service._domain_info(watched)
        if isinstance(watched, Feed):
            return service._feed_info(watched)
        if isinstance(watched, Pipe):
            return service._pipe_info(watched)
        return join_info(watched)
