"""Held back until committed: a publish that waits for the store shows nothing to
readers before its commit, and leaves nothing behind when the commit fails.

Theory of operation
-------------------
A publish that wrote journal records (a persistent message, a copy in a durable pipe,
a copy that went to disk past the memory budget, a stored message dropped to make
room) is answered only once the store committed them, and ``503`` when that commit
fails (docs/DURABILITY.md). Before the commit nobody may read what it placed: an
asynclet, a stream, SSE, a WebSocket, a webhook or a bridge handed a copy would keep
a message whose publisher is then told it failed.

So such a publish becomes an :class:`Unsettled` when it ends:

* In every pipe it placed copies in, positions from its first one on are held back:
  ``pipe.hidden`` is that position, readers see only what is older, and it is the
  pipe's asynclet meanwhile. Whatever comes behind (another publish, a redelivery)
  waits behind it, so a pipe's order and its cumulative acknowledgement (D4) never
  pass over a held-back message.
* Entries it queued in a rotator or service feed are not handed out:
  ``feed.hidden`` is the first of them, and the queue hands out only what is before.

:meth:`Settling.commit_journal` hands the journal to the store and binds the
publishes held back since the last hand-over to that transaction. Once it commits,
their copies show (waiters woken). When it fails (every batch of a group commit fails
with it), each one is withdrawn: its copies leave their pipes and its entries the
queue, the ``message_id``s it put in the dedup window are forgotten (a retry is routed
again), the staged contents it used are there again, and the mirror records a ``drop``
with outcome ``uncommitted`` for each copy. Messages of others placed behind stay and
show.

Positions: a withdrawn copy's position was never shown to anyone. When nothing was
placed in the pipe after it, the pipe's next position goes back to it, so the next
message takes it (a reader waiting at the asynclet gets that message there);
otherwise it is a gap, as an expired message leaves one.

Publishes that write nothing (non-persistent messages kept in memory) are not held
back, and cost this layer only a note of each pipe's first position (the catalogue's
``moved``).
"""

from __future__ import annotations

import asyncio
import functools
import itertools
from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet

from restms.specs import MessageSpec

from .catalogue import Catalogue
from .config import OVERHEAD
from .model import Feed, Pipe, Queued, StagedContent
from .placement import Placement
from .publishing import Publishing, message_ids
from .staging import Staging
from .store import Op, dumps

Submit = Callable[[list[Op]], "asyncio.Future[None]"]


class Unsettled:
    """What one publish placed, held back until its commit."""

    __slots__ = ("entries", "feed", "ids", "on_disk", "pipes", "specs", "staged")

    def __init__(self, feed: Feed, specs: frozenset[int], ids: list[str]) -> None:
        self.feed = feed
        self.specs = specs  # id() of the publish's messages: its copies share them
        self.ids = ids  # message_ids it put in the feed's dedup window
        self.pipes: dict[Pipe, tuple[int, int]] = {}  # first and next position it placed
        self.entries: list[Queued] = []  # what it queued in the feed's memory
        self.on_disk = (0, 0)  # what it queued on disk past the budget: count, bytes
        self.staged: Sequence[StagedContent] = ()  # the staged contents its messages used


class Settling:
    """Publishing with hold-back until commit (theory above); the engine hands the
    journal over with :meth:`commit_journal`."""

    def __init__(
        self, state: Catalogue, publishing: Publishing, placement: Placement, staging: Staging
    ) -> None:
        self.state = state
        self.publishing = publishing
        self.placement = placement
        self.staging = staging

    def publish(
        self, feed: Feed, messages: Sequence[MessageSpec], owner: str | None = None
    ) -> list[int]:
        """:meth:`Publishing.publish`; when it wrote journal records, what it placed is
        held back until the commit :meth:`commit_journal` starts next (check
        :attr:`Catalogue.unsettled` to know whether to wait for it)."""
        state = self.state
        journal = state.journal
        if journal is None:  # no store: nothing to commit, nothing to hold back
            return self.publishing.publish(feed, messages, owner)[0]
        # The pipes this publish places in (and their first positions), apart from
        # those moved before it: the catalogue's record is swapped for the publish's
        # own while it routes, and merged back after.
        moved = state.moved
        state.moved = {}
        mark, queued = len(journal), len(feed.queue)
        on_disk = (feed.qspilled, feed.qspilled_bytes)
        try:
            counts, repeats, staged = self.publishing.publish(feed, messages, owner)
        finally:
            placed, state.moved = state.moved, moved
            moved.update(placed)  # (take_journal reads only which pipes moved)
        if len(journal) > mark:
            self._hold_back(feed, messages, repeats, staged, placed, queued, on_disk)
        return counts

    def _hold_back(
        self,
        feed: Feed,
        messages: Sequence[MessageSpec],
        repeated: AbstractSet[int],
        staged: Sequence[StagedContent],
        placed: dict[Pipe, int],
        queued: int,
        on_disk: tuple[int, int],
    ) -> None:
        ids = message_ids(messages) if self.state.config.dedup_window else None
        # repeated: those it answered as duplicates, not its own
        fresh = [i for n, i in enumerate(ids) if i and n not in repeated] if ids else []
        held = Unsettled(feed, frozenset(map(id, messages)), fresh)
        held.staged = staged
        for pipe, first in placed.items():
            if pipe.deleted:
                continue
            held.pipes[pipe] = (first, pipe.next_seq)
            if not pipe.hidden or first < pipe.hidden:
                pipe.hidden = first
        if feed.queueing and len(feed.queue) > queued:
            held.entries = list(itertools.islice(feed.queue, queued, None))
            if feed.hidden is None:
                feed.hidden = held.entries[0]
        if feed.qspilled > on_disk[0]:  # (nobody reads these before the commit ends)
            held.on_disk = (feed.qspilled - on_disk[0], feed.qspilled_bytes - on_disk[1])
        self.state.unsettled.append(held)

    # ------------------------------------------------------------ commit
    def commit_journal(self, submit: Submit) -> asyncio.Future[None] | None:
        """Hand the journal to the store (``submit``: its future resolves once the
        transaction holding it committed). What publishes held back since the last
        hand-over shows when it commits and is withdrawn when it fails. None when
        there was nothing to hand over."""
        ops = take_journal(self.state)
        held = self.state.unsettled.copy()  # (the list itself is the engine's to show)
        self.state.unsettled.clear()
        if not ops and not held:
            return None
        future = submit(ops)
        if held:
            self.state.committing.extend(held)
            future.add_done_callback(functools.partial(self._settled, held))
        return future

    def _settled(self, held: list[Unsettled], future: asyncio.Future[None]) -> None:
        failed = future.cancelled() or future.exception() is not None
        for one in held:
            self.state.committing.remove(one)
            if failed:
                self._withdraw(one)
        # The other batches of the same transaction are settled by callbacks already
        # due: what shows, and which positions are free again, is decided after them.
        if self.state.settled is None:
            self.state.settled = (set(), set())
            future.get_loop().call_soon(self._show_settled)
        pipes, feeds = self.state.settled
        for one in held:
            pipes.update(one.pipes)
            if one.entries:
                feeds.add(one.feed)

    def _show_settled(self) -> None:
        if self.state.settled is None:
            return
        (pipes, feeds), self.state.settled = self.state.settled, None
        for pipe in pipes:
            self._show(pipe)
        for feed in feeds:
            self._show_queue(feed)

    def _still_held(self) -> list[Unsettled]:
        return [*self.state.committing, *self.state.unsettled]

    def _show(self, pipe: Pipe) -> None:
        """Hold back only what publishes still waiting for their commit placed."""
        if pipe.deleted:
            return
        firsts = [one.pipes[pipe][0] for one in self._still_held() if pipe in one.pipes]
        hidden, old = min(firsts, default=0), pipe.hidden
        if hidden == old:
            return
        if not hidden and next(reversed(pipe.messages), 0) < old and not _on_disk_from(pipe, old):
            pipe.next_seq = old  # nobody was shown a position from ``old`` on: taken again
        pipe.hidden = hidden
        pipe.touch(self.state.wall())  # waiters see what was held back

    def _show_queue(self, feed: Feed) -> None:
        held = {
            id(entry) for one in self._still_held() if one.feed is feed for entry in one.entries
        }
        feed.hidden = next((entry for entry in feed.queue if id(entry) in held), None)
        self.placement.drain(feed)

    def _withdraw(self, held: Unsettled) -> None:
        """A refused publish leaves nothing: its copies, its queue entries, its ids."""
        specs = held.specs
        for pipe, (first, end) in held.pipes.items():
            if pipe.deleted:
                continue
            gone: list[int] = []
            for seq in reversed(pipe.messages):
                if seq < first:
                    break
                if seq < end and id(pipe.messages[seq].spec) in specs:
                    gone.append(seq)
            for seq in gone:
                message = self.placement.unhold(pipe, seq)  # its record was rolled back
                pipe.expiring -= message.expires is not None
                self.state.counters.withdrawn += 1
                if self.state.mirror is not None:
                    self.state.mirrored("drop", pipe, message, "uncommitted")
            self.state.counters.withdrawn += _lost_on_disk(pipe, first, end)
        feed = held.feed
        if held.entries:
            # Those still queued: none once the feed was deleted meanwhile.
            drop = {id(entry) for entry in held.entries}
            dropped = [entry for entry in feed.queue if id(entry) in drop]
            if dropped:
                size = sum(entry[4] for entry in dropped)
                feed.queue_bytes -= size
                self.state.held -= size + OVERHEAD * len(dropped)
                self.state.counters.withdrawn += len(dropped)
                kept = [entry for entry in feed.queue if id(entry) not in drop]
                feed.queue.clear()
                feed.queue.extend(kept)
        count, size = held.on_disk
        if count:  # its rows were rolled back: the queue's bounds no longer count them
            feed.qspilled -= count
            feed.qspilled_bytes = max(0, feed.qspilled_bytes - size)
            if feed.qspilled <= 0:
                feed.qspilled = feed.qspilled_bytes = feed.qspill_lo = feed.qspill_hi = 0
            self.state.counters.withdrawn += count
        window = feed.seen
        if window is not None:
            for message_id in held.ids:
                window.discard(message_id)
        for staged in held.staged:  # a retry may use them again
            self.staging.unstage(staged)


def _lost_on_disk(pipe: Pipe, first: int, end: int) -> int:
    """Copies of positions ``first`` to ``end`` that went to disk past the memory budget
    were in the failed transaction too: the pipe no longer counts them there."""
    if not pipe.spilled:
        return 0
    low, high = max(first, pipe.spill_lo), min(end, pipe.spill_hi)
    if high <= low:
        return 0
    lost = min(high - low, pipe.spilled)
    pipe.spilled_bytes -= pipe.spilled_bytes * lost // pipe.spilled
    pipe.spilled -= lost
    if high == pipe.spill_hi:
        pipe.spill_hi = low
    if pipe.spilled <= 0 or pipe.spill_hi <= pipe.spill_lo:
        pipe.spilled = pipe.spilled_bytes = pipe.spill_lo = pipe.spill_hi = 0
    return lost


def _on_disk_from(pipe: Pipe, first: int) -> bool:
    """Whether positions from ``first`` on still wait on disk."""
    return pipe.spilled > 0 and pipe.spill_hi > first


def take_journal(state: Catalogue) -> list[Op]:
    """The catalogue's journal records since the last call, with each moved pipe's
    next position, each marked pipe's acknowledged and lost positions and each changed
    webhook pipe's delivery state."""
    ops, state.journal = state.journal or [], []
    if state.moved:
        ops.extend(("seq", pipe.next_seq, pipe.key) for pipe in state.moved)
        state.moved.clear()
    if state.marked:
        ops.extend(
            ("marks", pipe.acked, pipe.lost, pipe.key) for pipe in state.marked if not pipe.deleted
        )
        state.marked.clear()
    if state.hooks_moved:
        for pipe in state.hooks_moved:
            if pipe.hook is not None:
                ops.append(("hook", pipe.key, dumps(pipe.hook.record())))
        state.hooks_moved.clear()
    return ops
