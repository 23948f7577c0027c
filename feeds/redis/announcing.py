"""The system events (:mod:`feeds.events`) on the Redis engine: the system feed as
:class:`feeds.events.Events` sees it (the cached catalogue's record, as it is now),
and each event routed to that feed's joins in the background, as announcements
never wait."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from restms.errors import ServiceUnavailable
from restms.specs import EmbeddedContent, MessageSpec

from ..model import Feed
from . import mirror, placing
from .catalogue import Cache, FeedRec, JoinRec
from .values import encode_message

if TYPE_CHECKING:
    from .service import RedisEngine

log = logging.getLogger(__name__)


class SystemFeed:
    """What :class:`feeds.events.Events` looks at of its feed: its name and whether
    anyone is joined to it (the cache's record, as it is now)."""

    def __init__(self, cache: Cache, name: str) -> None:
        self.cache = cache
        self.key = name
        self.deleted = False

    @property
    def joins(self) -> dict[str, JoinRec]:
        feed = self.cache.feeds.get(self.key)
        return {} if feed is None else feed.joins


def announce(
    engine: RedisEngine,
    _feed: Feed,
    spec: MessageSpec,
    parts: tuple[EmbeddedContent, ...],
    now: float,
    _durable: bool,
    _size: int,
) -> int:
    """Route one system event (feeds.events): in the background, as announcements
    never wait."""

    system = engine.cache.feeds.get(engine.config.system_feed)
    if system is None or engine._closing:
        return 0
    task = asyncio.get_running_loop().create_task(route(engine, system, spec, parts, now))
    engine._announcing.add(task)
    task.add_done_callback(engine._announcing.discard)
    return 1


async def route(
    engine: RedisEngine,
    feed: FeedRec,
    spec: MessageSpec,
    parts: tuple[EmbeddedContent, ...],
    now: float,
) -> None:
    """Route one system event (non-persistent) to the system feed's joins."""
    record, size = encode_message(spec, parts, feed.name, now, next(engine.stamps))
    try:
        copies = (await placing.fanout(engine, feed, [(spec, record, size, False)], [0]))[3]
    except ServiceUnavailable as exc:
        log.warning("a system event was lost: %s", exc.reason)
        return
    if engine._mirror is not None:
        mirror.copied(engine, feed, spec, size, copies.get(0, []))
