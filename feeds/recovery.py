"""Recovery: the catalogue rebuilt from the store's snapshot at start-up, and pages of
messages that waited on disk past the memory budget read back into pipes and feed
queues. Over the engine's :class:`~feeds.catalogue.Catalogue`; theory of operation
in :mod:`feeds.engine`.
"""

from __future__ import annotations

import logging
from typing import Any

from restms.errors import BadRequest
from restms.specs import JoinSpec, PipeOptions

from .catalogue import Catalogue
from .config import OVERHEAD
from .model import Feed, Message, Pipe, message_size
from .placement import Placement
from .publishing import Publishing
from .resources import Resources
from .store import (
    Snapshot,
    decode_parts,
    epoch_of,
    loads,
    message_spec,
    redeliveries,
    stamp_of,
)

log = logging.getLogger(__name__)


class Recovery:
    """What the store holds, back in memory."""

    def __init__(
        self,
        state: Catalogue,
        resources: Resources,
        placement: Placement,
        publishing: Publishing,
    ) -> None:
        self.state = state
        self.resources = resources
        self.placement = placement
        self.publishing = publishing

    def restore(self, snapshot: Snapshot) -> None:
        """Rebuild what the store holds, then keep a journal from here on.

        Feeds, pipes and joins come back under their keys (so their URIs), each pipe's
        messages at their positions, each feed's queue in order. Rows that no longer
        fit the configuration (a domain or feed it dropped) are skipped and logged.
        """
        now, mono = self.state.wall(), self.state.mono()
        for key, name, type_, title, license_, domain_name, owner in snapshot.feeds:
            domain = self.state.domains.get(domain_name)
            if domain is None or (name is not None and name in self.state.public_feeds):
                log.warning("stored feed %s no longer fits the configuration; skipped", key)
                continue
            feed = Feed(
                key=key,
                name=name,
                type=type_,
                title=title,
                license=license_,
                domain=domain,
                owner=owner,
                configured=False,
                now=now,
            )
            self.resources.register(feed, now)
        for key, type_, title, domain_name, owner, next_seq, options, acked, lost in snapshot.pipes:
            domain = self.state.domains.get(domain_name) or self.state.default_feed.domain
            settings = self.resources.settings(PipeOptions.stored(loads(options)), check=False)
            pipe = Pipe(key, type_, title, domain, owner, now, settings)
            pipe.next_seq = next_seq
            pipe.acked, pipe.lost = acked, lost
            pipe.accessed = mono
            self.state.private[key] = pipe
            self.state.pipes_of[owner] += 1
            self.state.rejecting += pipe.overflow == "reject"
            if pipe.hook is not None:
                self.state.hooks[key] = pipe
        for key, pipe_key, feed_key, type_, address, headers, is_default in snapshot.joins:
            owner_pipe, target = self.state.private.get(pipe_key), self.state.feed_by_key(feed_key)
            if not isinstance(owner_pipe, Pipe) or target is None:
                log.warning("stored join %s has lost its pipe or feed; skipped", key)
                continue
            pairs = tuple((k, v) for k, v in loads(headers))
            try:
                spec = JoinSpec(feed_path="", address=address, type=type_, headers=pairs)
            except BadRequest as exc:  # made before a bound it does not meet
                log.warning("stored join %s no longer fits (%s); skipped", key, exc.reason)
                continue
            self.resources.link(owner_pipe, target, spec, bool(is_default), now, key=key)
        self.state.epoch = snapshot.epoch
        self.state.journal = []  # stale rows found below are deleted
        seen: list[tuple[float, Feed, str]] = []  # message ids, to refill dedup windows
        for pipe_key, seq, source_key, data in snapshot.messages:
            holder = self.state.private.get(pipe_key)
            if not isinstance(holder, Pipe):
                continue
            message = self._revive(holder, seq, source_key, data, now, mono)
            holder.next_seq = max(holder.next_seq, seq + 1)
            if message is None:
                continue
            self.placement.hold(holder, message)
            origin = message.source or self.state.public_feeds.get(message.feed_name or "")
            message_id = message.spec.prop("message_id")
            if origin is not None and message_id:
                seen.append((message.arrived, origin, message_id))
        for pipe_key, low, high, count, size in snapshot.spills:
            holder = self.state.private.get(pipe_key)
            if isinstance(holder, Pipe):
                holder.spill_lo, holder.spill_hi = low, high
                holder.spilled, holder.spilled_bytes = count, size
                holder.next_seq = max(holder.next_seq, high)
        for feed_key, qid, data in snapshot.queued:
            queue_feed = self.state.feed_by_key(feed_key)
            if queue_feed is None:
                continue
            queue_feed.qfront = min(queue_feed.qfront, qid - 1)
            queue_feed.qback = max(queue_feed.qback, qid)
            self._queue_in(queue_feed, qid, data)
        for feed_key, low, high, count, size in snapshot.queue_spills:
            queue_feed = self.state.feed_by_key(feed_key)
            if queue_feed is not None:
                queue_feed.qspill_lo, queue_feed.qspill_hi = low, high
                queue_feed.qspilled, queue_feed.qspilled_bytes = count, size
                queue_feed.qfront = min(queue_feed.qfront, low - 1)
                queue_feed.qback = max(queue_feed.qback, high - 1)
        self._refill_windows(seen, now, mono)
        self._restore_hooks(snapshot.webhooks)
        for found in [*self.state.public_feeds.values(), *self.state.private.values()]:
            if isinstance(found, Feed) and (found.queue or found.qspilled):
                self.placement.drain(found)  # pipes that can take queued work get it now

    def _queue_in(self, feed: Feed, qid: int, data: bytes) -> int:
        """Hold a stored queued message at the back of its feed's queue in memory; its
        size, or -1 (and its row deleted) when it is a non-persistent message an earlier
        run put on disk. A non-persistent message of this run leaves the disk as it
        comes back: in memory it needs no row."""
        fields = loads(data)
        epoch = epoch_of(fields)
        if epoch is not None:
            assert self.state.journal is not None
            self.state.journal.append(("queue-", feed.key, qid))
            if epoch != self.state.epoch:
                return -1
        queued, parts = message_spec(fields), decode_parts(fields[6])
        size = message_size(queued, parts)
        stored = qid if epoch is None else None
        stamp = stamp_of(fields, f"q:{feed.key}", qid)
        feed.queue.append((queued, parts, stored, redeliveries(fields), size, stamp))
        feed.queue_bytes += size
        self.state.held += size + OVERHEAD
        return size

    def _restore_hooks(self, rows: list[tuple[Any, ...]]) -> None:
        """Webhook pipes' delivery state, without attempts at messages that are gone."""
        for key, data in rows:
            pipe = self.state.hooks.get(key)
            if pipe is None or pipe.hook is None:
                if self.state.journal is not None:
                    self.state.journal.append(("pipe-", key))  # what is left of a deleted pipe
                continue
            pipe.hook.restore(loads(data))
            pipe.hook.keep_only({seq for seq in pipe.hook.attempts if self._holds(pipe, seq)})

    @staticmethod
    def _holds(pipe: Pipe, seq: int) -> bool:
        return seq in pipe.messages or pipe.on_disk(seq)

    def _revive(
        self, pipe: Pipe, seq: int, source_key: str | None, data: bytes, now: float, mono: float
    ) -> Message | None:
        """A stored message as the engine holds it; None (and the row deleted) when it
        is a non-persistent message an earlier run put on disk."""
        fields = loads(data)
        epoch = epoch_of(fields)
        if epoch is not None and epoch != self.state.epoch:
            if self.state.journal is not None:
                self.state.journal.append(("drop", pipe.key, seq))
            self.state.lost(pipe, seq)  # a message kept for one run only, gone with it
            return None
        stored, parts = message_spec(fields), decode_parts(fields[6])
        source = self.state.feed_by_key(source_key) if source_key else None
        stamp = stamp_of(fields, pipe.key, seq)
        message = Message(seq, stored, parts, fields[3], source, fields[4], stamp)
        message.durable = epoch is None
        message.size = message_size(stored, parts)
        message.redeliveries = redeliveries(fields)
        if fields[5] is not None:
            message.expires = mono + (fields[5] - now)
        return message

    def leaving(self) -> None:
        """The engine stops: the messages it keeps in memory only go with it. Each pipe
        notes the newest of them as lost, so that a reader resuming after the restart
        is told (:class:`feeds.values.Gap`; those on disk are noted as they are found
        stale, by :meth:`_revive`)."""
        for found in self.state.private.values():
            if not isinstance(found, Pipe):
                continue
            for seq, message in reversed(found.messages.items()):
                if not message.durable and found.shown(seq):
                    self.state.lost(found, seq)
                    break

    def page_in(self, pipe: Pipe, low: int, rows: list[tuple[int, Any, bytes]]) -> int:
        """Hold the next page of a pipe's messages from disk (read from ``low`` on, the
        pipe's first position on disk when the read began); returns how many."""
        if pipe.deleted or not pipe.spilled or pipe.spill_lo != low:
            return 0  # the pipe changed meanwhile: the caller reads again
        now, mono = self.state.wall(), self.state.mono()
        taken = 0
        for seq, source_key, data in rows:
            if seq >= pipe.spill_hi:
                break
            message = self._revive(pipe, seq, source_key, data, now, mono)
            pipe.spill_lo = seq + 1
            pipe.spilled -= 1
            if message is None:
                continue
            pipe.spilled_bytes = max(0, pipe.spilled_bytes - message.size)
            self.placement.hold(pipe, message)
            taken += 1
        if not rows or pipe.spill_lo >= pipe.spill_hi or pipe.spilled <= 0:
            pipe.spilled = pipe.spilled_bytes = pipe.spill_lo = pipe.spill_hi = 0
        self.state.counters.paged_in += taken
        pipe.touch(now)
        return taken

    def queue_page_in(self, feed: Feed, low: int, rows: list[tuple[int, bytes]]) -> int:
        """Hold the next page of a feed's queued messages from disk (read from ``low``
        on, the feed's first queue id on disk when the read began), behind those in
        memory, and hand them out to pipes that can take them; returns how many."""
        if feed.deleted or not feed.qspilled or feed.qspill_lo != low:
            return 0  # the feed changed meanwhile: the caller reads again
        taken = 0
        for qid, data in rows:
            if qid >= feed.qspill_hi:
                break
            size = self._queue_in(feed, qid, data)
            feed.qspill_lo = qid + 1
            feed.qspilled -= 1
            if size < 0:
                continue
            feed.qspilled_bytes = max(0, feed.qspilled_bytes - size)
            taken += 1
        if not rows or feed.qspill_lo >= feed.qspill_hi or feed.qspilled <= 0:
            feed.qspilled = feed.qspilled_bytes = feed.qspill_lo = feed.qspill_hi = 0
        self.state.counters.paged_in += taken
        self.placement.drain(feed)
        return taken

    def _refill_windows(self, seen: list[tuple[float, Feed, str]], now: float, mono: float) -> None:
        """Dedup windows from the stored messages: a publish retried across a restart is
        still a duplicate while a copy of it is held (its count: the copies held)."""
        if not self.state.config.dedup_window:
            return
        copies: dict[tuple[Feed, str], int] = {}
        for _, feed, message_id in seen:
            copies[feed, message_id] = copies.get((feed, message_id), 0) + 1
        for arrived, feed, message_id in sorted(seen, key=lambda item: item[0]):
            age = max(0.0, now - arrived)
            window = self.publishing.window(feed)
            if window.get(message_id, mono) is None and age < window.window:
                window.add(message_id, copies[feed, message_id], mono - age)
