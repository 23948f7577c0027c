"""The embedded engine behind the engine service (:mod:`feeds.service`).

:class:`EmbeddedEngine` implements :class:`~feeds.service.EngineService` over the
in-memory :class:`~feeds.engine.Engine` and, optionally, its SQLite
:class:`~feeds.store.Store`. It owns what the gateway does for the engine today:

* it looks resources up by key and answers 404 for another principal's private ones;
* it commits the journal before a call that changed something durable returns
  (:func:`feeds.paging.commit`), and hands over the rest every ``journal_interval``;
* it reads pages back from disk when the engine raises ``OnDisk`` or holds messages
  there (:mod:`feeds.paging`), in worker threads: the loop never blocks;
* it runs the engine's upkeep (leases, idle pipes, staged-content TTLs) every
  ``sweep_interval``;
* it turns the engine's live objects into frozen values (:mod:`feeds.embedded.values`)
  before anything leaves.

This class keeps the lifecycle and the calls every message takes (publishing,
reading, acknowledging), with the look-ups of its mixin :mod:`.lookups` (another's
resource is a 404); its other calls delegate in one line to a part, each a module of
this package about one thing: :mod:`.resources` (changes to feeds, pipes, joins,
staged contents), :mod:`.watching` (evented waits), :mod:`.reading` (contents, dead
letters), :mod:`.cursor` (cursors and the open ones of each pipe), :mod:`.room`
(waiting for room), :mod:`.admin` (figures, readiness, pipe states, purge),
:mod:`.webhooks` (the webhook workers' calls) and :mod:`.settings` (the gateway's
own values).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from restms.errors import BadRequest, NotFound
from restms.specs import Duplicate, FeedSpec, JoinSpec, MessageSpec, PipeSpec, Update

from .. import paging
from ..config import OVERHEAD, EngineConfig
from ..engine import Engine
from ..mirroring import emit_bridge_in
from ..model import Feed, Join, OnDisk, PartRef, Pipe, StagedContent
from ..model import Slot as PipeSlot
from ..service import (
    HIDDEN,
    Blob,
    ContentRef,
    DomainInfo,
    EngineService,
    FeedInfo,
    Inventory,
    JoinInfo,
    Listing,
    Message,
    MirrorSink,
    Owned,
    PipeInfo,
    PipeState,
    Placed,
    PublishResult,
    Readiness,
    Resource,
    Slot,
    Solo,
    StagedInfo,
    Stats,
    SystemEvents,
    Watched,
    Webhook,
    WebhookAttempts,
)
from ..store import Store, StoreError
from .admin import Admin
from .cursor import Cursors, EmbeddedCursor
from .lookups import Lookups
from .reading import Reading
from .resources import Resources
from .room import wait_for_room
from .settings import Settings
from .values import join_info, message, staged_info
from .watching import Watching
from .webhooks import Webhooks

log = logging.getLogger(__name__)
NOT_KEPT = "nothing of this publish was kept; retry it"


class EmbeddedEngine(Lookups):
    """The engine service in this process: state in memory, a journal in SQLite."""

    def __init__(
        self,
        engine: Engine,
        store: Store | None = None,
        *,
        journal_interval: float = 0.05,
        sweep_interval: float = 1.0,
    ) -> None:
        self.engine = engine
        self.store = store
        # The catalogue's index and clock, read directly by the look-ups every call
        # makes: the engine's own lookup would mark use and then be asked again.
        self._private = engine.state.private
        self._mono = engine.state.mono
        self._journal_interval = journal_interval
        self._sweep_interval = sweep_interval
        self._tasks: list[asyncio.Task[None]] = []
        self._pager: paging.QueuePager | None = None
        self._cursors = Cursors(engine)
        self._dead_letter = engine.config.dead_letter_feed or ""
        # Each feed's last value, and what it showed of the feed (see Lookups._feed_info).
        self._feed_infos: dict[Feed, tuple[tuple[int, int, int, int], FeedInfo]] = {}
        # The parts the calls off the hot paths delegate to (some use the look-ups).
        self._resources = Resources(self)
        self._watching = Watching(self)
        self._reading = Reading(self)
        self._admin = Admin(self)
        self._webhooks = Webhooks(engine, store)
        self._settings = Settings(store)

    @classmethod
    def open(
        cls,
        config: EngineConfig | None = None,
        data_dir: str | Path | None = None,
        *,
        synchronous: str = "FULL",
        busy_timeout: float = 5.0,
        journal_interval: float = 0.05,
        sweep_interval: float = 1.0,
    ) -> EmbeddedEngine:
        """An engine with a store in ``data_dir`` (None: memory only); call
        :meth:`start` before use. ``busy_timeout``: seconds a commit waits for the
        store's write lock while another connection holds it, before it fails."""
        store = (
            None
            if data_dir is None
            else Store(data_dir, synchronous=synchronous, busy_timeout=busy_timeout)
        )
        return cls(
            Engine(config),
            store,
            journal_interval=journal_interval,
            sweep_interval=sweep_interval,
        )

    # ------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        engine, store = self.engine, self.store
        loop = asyncio.get_running_loop()
        if store is not None:
            await asyncio.to_thread(store.path.parent.mkdir, parents=True, exist_ok=True)
            budget = engine.config.memory_budget
            snapshot = await asyncio.to_thread(store.load, budget, OVERHEAD)
            self._pager = paging.QueuePager(engine, store)
            engine.on_queue_page = self._pager.want
            engine.restore(snapshot)
            self._settings.restore(snapshot.settings)
            log.info(
                "store %s: %d feeds, %d pipes, %d messages restored",
                store.path,
                len(snapshot.feeds),
                len(snapshot.pipes),
                len(snapshot.messages)
                + len(snapshot.queued)
                + sum(s[3] for s in [*snapshot.spills, *snapshot.queue_spills]),
            )
            store.start(loop)
            flush = paging.flusher(engine, store, self._journal_interval)
            self._tasks.append(loop.create_task(flush, name="journal-flusher"))
        self._tasks.append(loop.create_task(self._sweeper(), name="engine-sweeper"))

    async def _sweeper(self) -> None:
        while True:
            await asyncio.sleep(self._sweep_interval)
            expired = self.engine.sweep()
            if expired:
                log.info("staged contents expired", extra={"count": expired})

    async def close(self) -> None:
        engine, store = self.engine, self.store
        engine.shutdown()
        await self._cursors.close()
        await self._admin.probe.stop()
        engine.on_queue_page = None
        if self._pager is not None:
            await self._pager.stop()
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if store is not None:
            engine.leaving()  # what a restart will not bring back is noted as lost
            last = engine.commit_journal(store.submit)
            if last is not None:
                with contextlib.suppress(StoreError):
                    await last
            await asyncio.to_thread(store.close)

    def shutdown(self) -> None:
        self.engine.shutdown()

    @property
    def events(self) -> SystemEvents | None:
        return self.engine.events

    async def __aenter__(self) -> EmbeddedEngine:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _changed(self) -> None:
        """Return once what the call changed is committed (503 when it cannot be). A
        call's value is taken before: what the change made, not what others (a webhook
        pipe's worker) did while the commit was under way."""
        if self.engine.journal:
            await paging.commit(self.engine, self.store)

    # ------------------------------------------------------------ values, and waits
    async def domain(self, name: str) -> DomainInfo:
        return self._domain_info(self.engine.domain(name))

    async def domains(self) -> tuple[DomainInfo, ...]:
        return tuple([await self.domain(name) for name in self.engine.domains])

    async def feed(self, principal: str | None, key: str) -> FeedInfo:
        return self._feed_info(self._feed(principal, key))

    async def feeds(self, domain: str) -> tuple[FeedInfo, ...]:
        return tuple(self._feed_info(feed) for feed in self.engine.domain(domain).feeds.values())

    async def pipe(self, principal: str | None, key: str) -> PipeInfo:
        pipe = self._pipe(principal, key)
        await paging.ensure(self.engine, self.store, pipe)
        return self._pipe_info(pipe)

    async def pipes(self, principal: str) -> tuple[PipeInfo, ...]:
        return tuple(self._pipe_info(pipe) for pipe in self.engine.pipes_of(principal))

    async def join(self, principal: str | None, key: str) -> JoinInfo:
        return join_info(self._join(principal, key))

    async def resolve(self, principal: str | None, key: str) -> Resource:
        engine = self.engine
        found = engine.resolve(key)
        if isinstance(found, Feed):
            if principal is not None and found.owner != principal:  # a private feed
                raise NotFound(HIDDEN)
            return self._feed_info(found)
        if isinstance(found, Pipe):
            return self._pipe_info(self._used(principal, found))
        if isinstance(found, Join):
            return join_info(self._join(principal, key))
        if isinstance(found, StagedContent):
            return staged_info(self._staged(principal, key))
        pipe = self._used(principal, found.pipe)
        domain = pipe.domain.name
        if isinstance(found, PartRef):
            return ContentRef(pipe=pipe.key, position=found.seq, index=found.index, domain=domain)
        return Slot(pipe=pipe.key, position=found.seq, domain=domain, pipe_type=pipe.type)

    async def feed_at(self, principal: str | None, path: str) -> FeedInfo:
        target = self.engine.feed_at(path)  # 400 when there is none (G14)
        if not target.public and principal is not None and target.owner != principal:
            raise BadRequest(f"join names no existing feed: {path}")  # as if none
        return self._feed_info(target)

    async def listed_feeds(self, domain: str) -> tuple[FeedInfo, ...]:
        engine = self.engine
        feeds = dict(engine.domain(domain).feeds)
        feeds.setdefault(engine.default_feed.key, engine.default_feed)
        return tuple(self._feed_info(feed) for feed in feeds.values())

    async def owned(self, principal: str) -> Owned:
        engine = self.engine
        return Owned(
            feeds=engine.owned_feeds(principal),
            pipes=engine.owned_pipes(principal),
            joins=engine.owned_joins(principal),
        )

    async def changed(self, principal: str | None, value: Watched, wait: float) -> Watched | None:
        return await self._watching.changed(principal, value, wait)

    # ------------------------------------------------------------ changes (Resources)
    async def create_feed(
        self, principal: str, domain: str, spec: FeedSpec
    ) -> tuple[FeedInfo, bool]:
        return await self._resources.create_feed(principal, domain, spec)

    async def update_feed(self, principal: str | None, key: str, update: Update) -> FeedInfo:
        return await self._resources.update_feed(principal, key, update)

    async def delete_feed(self, principal: str | None, key: str) -> None:
        await self._resources.delete_feed(principal, key)

    async def create_pipe(self, principal: str, domain: str, spec: PipeSpec) -> PipeInfo:
        return await self._resources.create_pipe(principal, domain, spec)

    async def update_pipe(self, principal: str | None, key: str, update: Update) -> PipeInfo:
        return await self._resources.update_pipe(principal, key, update)

    async def delete_pipe(self, principal: str | None, key: str) -> None:
        await self._resources.delete_pipe(principal, key)

    async def create_join(
        self, principal: str | None, pipe: str, spec: JoinSpec
    ) -> tuple[JoinInfo, bool]:
        return await self._resources.create_join(principal, pipe, spec)

    async def delete_join(self, principal: str | None, key: str) -> None:
        await self._resources.delete_join(principal, key)

    async def stage(self, principal: str, feed: str, data: bytes, content_type: str) -> StagedInfo:
        return await self._resources.stage(principal, feed, data, content_type)

    async def staged(self, principal: str | None, key: str) -> tuple[StagedInfo, Blob]:
        return await self._resources.staged(principal, key)

    async def delete_staged(self, principal: str | None, key: str) -> None:
        await self._resources.delete_staged(principal, key)

    # ------------------------------------------------------------ publishing
    async def publish(
        self,
        principal: str,
        feed: str,
        messages: Sequence[MessageSpec],
        *,
        via: str | None = None,
    ) -> PublishResult:
        engine = self.engine
        target = self._feed(principal, feed)
        # The pipes a copy may go to, and where each stood: the positions a publish
        # gave are read off them afterwards, with no state kept in the engine.
        before = {join.pipe: join.pipe.next_seq for join in target.joined}
        counts = engine.publish(target, messages, principal)
        placed = tuple(
            Placed(pipe=pipe.key, first=first, last=pipe.next_seq - 1)
            for pipe, first in before.items()
            if pipe.next_seq > first and not pipe.deleted
        )
        queued = 0
        if target.queueing:
            queued = sum(not count and type(count) is not Duplicate for count in counts)
        committed = await self._settle()
        if via is not None and engine.mirror is not None:
            emit_bridge_in(engine.mirror, time.time(), target, messages, counts, principal, via)
        return PublishResult(
            counts=tuple(counts),  # a duplicate's is a restms.specs.Duplicate
            placed=placed,
            queued=queued,
            committed=committed,
        )

    async def publish_counts(
        self, principal: str, feed: str, messages: Sequence[MessageSpec]
    ) -> tuple[int, ...]:
        engine = self.engine
        counts = engine.publish(self._feed(principal, feed), messages, principal)
        await self._settle()
        return tuple(counts)

    async def _settle(self) -> bool:
        """After a publish: wait for the commit of what it holds back, True (readers see
        it once committed; a failed commit withdraws it all, feeds.settling, a
        message_id included, so a retry is routed again); or, with nothing of it to
        wait for, hand others' changes over without waiting, False."""
        engine = self.engine
        if engine.unsettled:
            await paging.commit(engine, self.store, NOT_KEPT)
            return True
        if engine.journal:
            paging.hand_over(engine, self.store)
        return False

    async def room(
        self, principal: str, feed: str, messages: Sequence[MessageSpec], *, wait: float = 0.0
    ) -> int:
        return await wait_for_room(self._feed(principal, feed), messages, wait)

    # ------------------------------------------------------------ reading
    async def listing(self, principal: str | None, pipe: str) -> Listing:
        found = self._pipe(principal, pipe)
        await paging.ensure(self.engine, self.store, found)
        held, asynclet = self.engine.listing(found)
        return Listing(messages=tuple(message(found, m) for m in held), asynclet=asynclet)

    async def read(
        self,
        principal: str | None,
        pipe: str,
        position: int,
        *,
        wait: float = 0.0,
        lease: bool = False,
    ) -> Message | None:
        engine = self.engine
        found = self._pipe(principal, pipe)
        slot = PipeSlot(found, position)
        if found.spilled:  # the position may wait on disk: its page is read back first
            await paging.ensure(engine, self.store, found, position)
        deadline = time.monotonic() + wait if wait > 0 else 0.0
        while True:
            remaining = deadline - time.monotonic() if wait > 0 else 0.0
            try:
                if found.type == "ondemand" and remaining > 0:
                    # its wait asks the feeds it joins for work (P3)
                    got = await engine.wait_message(slot, remaining)
                    break
                got = engine.present(slot)
            except OnDisk:  # it arrived while we waited, and went to disk
                await paging.ensure(engine, self.store, found, position)
                continue
            if got is not None or remaining <= 0:
                break
            # The wait itself is here, not in a coroutine of the engine's, with the
            # engine's shared timer: each frame on a waiting read's chain is memory
            # every waiting asynclet holds (docs/ARCHITECTURE.md).
            future = engine.deadlines.watch(found, remaining)
            try:
                woken = await future
            finally:
                engine.deadlines.unwatch(found, future)
            if not woken:
                return None
        if got is None:
            return None
        if lease:
            engine.lease(found, got)  # at-least-once: redelivered unless acknowledged
        return message(found, got)

    async def look(self, principal: str | None, pipe: str, position: int) -> Message | None:
        found = self._pipe(principal, pipe)
        await paging.ensure(self.engine, self.store, found, position)
        held = self.engine.message(PipeSlot(found, position))
        return None if held is None else message(found, held)

    async def ack(self, principal: str | None, pipe: str, position: int) -> int:
        return await self._ack(self._pipe(principal, pipe), position)

    async def _ack(self, pipe: Pipe, position: int, wait: bool = True) -> int:
        removed = await paging.ack(self.engine, self.store, PipeSlot(pipe, position))
        if wait:
            await self._changed()
        return removed  # else the journal flusher commits it

    async def exists(self, principal: str | None, at: Slot | ContentRef) -> bool:
        return await self._reading.exists(principal, at)

    async def content(self, principal: str | None, ref: ContentRef) -> Blob:
        return await self._reading.content(principal, ref)

    async def delete_content(self, principal: str | None, ref: ContentRef) -> None:
        await self._reading.delete_content(principal, ref)

    async def dead_letter(
        self,
        principal: str | None,
        pipe: str,
        position: int,
        reason: str,
        *,
        feed: str | None = None,
        headers: tuple[tuple[str, str], ...] = (),
    ) -> bool:
        found = self._pipe(principal, pipe)
        return await self._reading.dead_letter(found, position, reason, feed, headers)

    def cursor(
        self,
        principal: str | None,
        pipe: str,
        after: int = 0,
        *,
        lease: bool = False,
        via: str | None = None,
    ) -> EmbeddedCursor:
        return EmbeddedCursor(self, principal, pipe, after, lease, via)

    def solo(self, name: str) -> Solo:
        return Alone()

    # ------------------------------------------------------------ settings
    async def setting(self, name: str) -> str | None:
        return await self._settings.setting(name)

    async def keep_setting(self, name: str, value: str, *, only_new: bool = False) -> str:
        return await self._settings.keep(name, value, only_new)

    async def list_settings(self, prefix: str) -> tuple[tuple[str, str], ...]:
        return await self._settings.listed(prefix)

    async def drop_setting(self, name: str, *, only: str | None = None) -> bool:
        return await self._settings.drop(name, only)

    # ------------------------------------------------------------ statistics and admin
    async def stats(self) -> Stats:
        return await self._admin.stats()

    async def readiness(self, timeout: float) -> Readiness:
        return await self._admin.readiness(timeout)

    def mirror_to(self, sink: MirrorSink | None) -> None:
        self.engine.mirror = sink

    async def pipe_states(self) -> tuple[PipeState, ...]:
        return await self._admin.pipe_states()

    async def pipe_state(self, principal: str | None, key: str) -> PipeState:
        return await self._admin.pipe_state(principal, key)

    async def purge(self, principal: str | None, pipe: str) -> int:
        return await self._admin.purge(principal, pipe)

    async def inventory(self) -> Inventory:
        return await self._admin.inventory()

    # ------------------------------------------------------------ webhooks
    def watch_webhooks(self, listener: Callable[[str, Webhook | None], None] | None) -> None:
        self._webhooks.watch(listener)

    async def webhooks(self) -> tuple[Webhook, ...]:
        return await self._webhooks.webhooks()

    async def webhook(self, pipe: str) -> Webhook:
        return await self._webhooks.webhook(pipe)

    async def webhook_attempts(self, pipe: str, position: int) -> WebhookAttempts | None:
        return await self._webhooks.attempts(pipe, position)

    async def webhook_verified(self, pipe: str, ok: bool, status: str, error: str) -> None:
        await self._webhooks.verified(pipe, ok, status, error)

    async def webhook_delivered(self, pipe: str, position: int, status: str) -> bool:
        return await self._webhooks.delivered(pipe, position, status)

    async def webhook_failed(
        self, pipe: str, position: int, attempt: int, status: str, error: str, retry_at: float
    ) -> bool:
        return await self._webhooks.failed(pipe, position, attempt, status, error, retry_at)

    async def webhook_give_up(self, pipe: str, position: int, reason: str) -> None:
        await self._webhooks.give_up(pipe, position, reason)

    async def webhook_gone(self, pipe: str, position: int, status: str) -> bool:
        return await self._webhooks.gone(pipe, position, status)


if TYPE_CHECKING:  # the type checker proves the embedded engine is the whole service
    _CONFORMS: EngineService = EmbeddedEngine(Engine())


class Alone:
    """The one process there is always runs what it claims (:class:`Solo`)."""

    async def take(self) -> bool:
        return True

    async def changed(self) -> bool:
        await asyncio.Event().wait()  # never: it is not taken away
        return True

    async def release(self) -> None:
        return None
