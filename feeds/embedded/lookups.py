"""The look-ups of the embedded engine (:class:`~feeds.embedded.EmbeddedEngine`): a
key to the live feed, pipe, join or staged content it names for a principal (another's
private one is a 404, as a key never issued), and a live resource to its value.

A mixin rather than a part: the calls every message takes look up with ``self._pipe``
and the like, and the parts (:mod:`.resources`, :mod:`.watching`, :mod:`.reading`,
:mod:`.cursor`) with ``service._pipe``. The state it reads is the service's, set in
``EmbeddedEngine.__init__``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from restms.errors import NotFound

from ..model import Clock, Domain, Feed, Join, Pipe, StagedContent
from ..service import HIDDEN, DomainInfo, FeedInfo, PipeInfo
from .values import feed_info, pipe_info

if TYPE_CHECKING:
    from ..engine import Engine

MEMO = 1024  # feeds whose last value is kept


class Lookups:
    """Key to live resource, and live resource to value, for an
    :class:`~feeds.embedded.EmbeddedEngine`."""

    engine: Engine
    _private: dict[str, Feed | Pipe | Join | StagedContent]
    _mono: Clock
    _dead_letter: str
    _feed_infos: dict[Feed, tuple[tuple[int, int, int, int], FeedInfo]]

    def _pipe(self, principal: str | None, key: str) -> Pipe:
        found = self._private.get(key)
        if not isinstance(found, Pipe):
            raise NotFound(HIDDEN)
        return self._used(principal, found)

    def _used(self, principal: str | None, pipe: Pipe) -> Pipe:
        """``pipe``, used by ``principal``: not idle from now (Q1); 404 unless it is theirs."""
        if principal is not None and pipe.owner != principal:
            raise NotFound(HIDDEN)
        pipe.accessed = self._mono()
        return pipe

    def _feed(self, principal: str | None, key: str) -> Feed:
        engine = self.engine
        found = engine.public_feeds.get(key) or engine.peek(key)
        if not isinstance(found, Feed):
            raise NotFound(f"no feed named {key!r}")
        if found.name is None and principal is not None and found.owner != principal:
            raise NotFound(f"no feed named {key!r}")  # another's private feed
        return found

    def _join(self, principal: str | None, key: str) -> Join:
        found = self.engine.peek(key)
        if not isinstance(found, Join) or (principal is not None and found.pipe.owner != principal):
            raise NotFound(HIDDEN)
        return found

    def _staged(self, principal: str | None, key: str) -> StagedContent:
        found = self.engine.peek(key)
        if not isinstance(found, StagedContent) or (
            principal is not None and found.owner != principal
        ):
            raise NotFound(HIDDEN)
        return found

    def _feed_info(self, feed: Feed) -> FeedInfo:
        # Every request to a feed (every publish) looks it up: its value is made again
        # only when what it shows changed (a value never changes, so it can be shared).
        state = (feed.version, len(feed.joins), len(feed.queue), feed.qspilled)
        known = self._feed_infos.get(feed)
        if known is not None and known[0] == state:
            return known[1]
        engine = self.engine
        events = engine.events
        system = events is not None and feed is events.feed
        made = feed_info(feed, feed is engine.default_feed, system)
        if len(self._feed_infos) >= MEMO:
            self._feed_infos.clear()  # bounded: feeds deleted without us are let go too
        self._feed_infos[feed] = (state, made)
        return made

    def _pipe_info(self, pipe: Pipe) -> PipeInfo:
        return pipe_info(pipe, self._dead_letter)

    @staticmethod
    def _domain_info(found: Domain) -> DomainInfo:
        return DomainInfo(
            name=found.name,
            title=found.title,
            feeds=tuple(found.feeds),
            version=found.version,
            modified=found.modified,
        )
