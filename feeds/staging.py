"""Staged contents (RestMS M1-M4): opaque bodies POSTed to a feed, kept until a message
references them or their time to live ends (a base of :class:`feeds.core.Core`, which
sets up the state below; theory of operation in :mod:`feeds.engine`).
"""

from __future__ import annotations

from restms import names
from restms.errors import ServiceUnavailable

from .config import Counters, EngineConfig
from .model import Blob, Clock, Feed, Join, Pipe, StagedContent, alive


class Staging:
    """Staged contents; the state it uses is set up by :class:`feeds.core.Core`."""

    config: EngineConfig
    counters: Counters
    _private: dict[str, Feed | Pipe | Join | StagedContent]
    _staged_bytes: int
    _wall: Clock
    _mono: Clock

    def stage(self, feed: Feed, data: bytes, content_type: str, owner: str) -> StagedContent:
        """M1: keep an opaque body until a message references it, or its TTL ends (M4)."""
        alive(feed)
        if self._staged_bytes + len(data) > self.config.max_staged_bytes:
            raise ServiceUnavailable("too many staged contents are waiting; retry later", 5)
        key = names.new_hash()
        staged = StagedContent(
            key,
            feed,
            Blob(data, content_type),
            owner,
            self._wall(),
            self._mono() + self.config.staged_ttl,
        )
        feed.staged[key] = staged
        self._private[key] = staged
        self._staged_bytes += len(data)
        self.counters.staged += 1
        return staged

    def expire_staged(self) -> int:
        """M4: drop staged contents past their TTL; returns how many went."""
        now = self._mono()
        expired = [
            s for s in self._private.values() if isinstance(s, StagedContent) and s.expires <= now
        ]
        for staged in expired:
            self.delete_staged(staged)
        self.counters.staged_expired += len(expired)
        return len(expired)

    def delete_staged(self, staged: StagedContent) -> None:
        if staged.deleted:
            return
        staged.deleted = True
        staged.feed.staged.pop(staged.key, None)
        self._private.pop(staged.key, None)
        self._staged_bytes -= len(staged.blob.data)
        staged.wake()
