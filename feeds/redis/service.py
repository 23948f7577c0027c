"""The Redis Cluster engine behind the engine service (:mod:`feeds.service`), issue 24.

Theory of operation
-------------------
Any number of engines (gateway nodes) share one namespace of a Redis Cluster; none
holds state another needs. The data model (docs/CLUSTER.md, "The engine's data
model"):

* The **catalogue** (:mod:`.catalogue`) is one hash in one slot, changed only by a
  compare-and-set function call that bumps its version and announces it on the
  catalogue's sharded channel; every engine caches it as its routing table, reads the
  news when announced, and looks again on a miss (a key another engine made a moment
  ago) and before each publish (a cheap version check), so a publish routes with every
  join committed before it (:mod:`.syncing`).
* A **pipe** is a stream whose entry ids are the RestMS positions, beside a small
  hash (the last position issued, bytes held, redeliveries, deleted contents), in the
  slot of its bucket; each operation on it is one function call of
  ``library.lua``, atomic with the wake-up it publishes on the bucket's channel.
* **Publishing** routes on this engine, then makes one call per bucket holding target
  pipes. A publish that holds a persistent message (or reaches a durable pipe) sends
  ``WAIT 1`` after each of those calls on the same connection (:mod:`.link`): it
  returns only once the master's AOF (``appendfsync always``) and a replica have it,
  else it takes back what it placed and raises NotCommitted.
* **Waiting** readers wait on a future per pipe; the engine listens on the channel of
  each bucket where it ever had a waiter (at most ``BUCKETS``) and wakes a pipe's
  waiters when a change of that pipe is announced; they then look again
  (:mod:`.waiting`).
* **Leases** are a sorted set per bucket, swept by one engine at a time (a lock taken
  inside the sweep function).

Where each part lives: the package's docstring (:mod:`feeds.redis`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

from restms.errors import ServiceUnavailable
from restms.specs import FeedSpec, JoinSpec, MessageSpec, PipeSpec, Update

from ..config import Counters, EngineConfig, Latency
from ..events import Events
from ..model import Feed
from ..service import (
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
from ..store import stamps
from . import (
    admin,
    announcing,
    claims,
    lookups,
    publishing,
    reading,
    resources,
    settling,
    streams,
    syncing,
    upkeep,
    webhooks,
)
from . import settings as kept  # (not the pipes' Settings)
from .announcing import SystemFeed
from .catalogue import Cache, Keys, PipeRec
from .cursor import RedisCursor
from .link import Link, Subscriber
from .owners import Owners
from .values import Settings

log = logging.getLogger(__name__)
CLOSE_WAIT = 5.0  # seconds each step of closing may take
URL = "redis://127.0.0.1:7101"  # the project's cluster (scripts/cluster)


class RedisEngine:
    """The engine service on a Redis Cluster: any engine serves any pipe."""

    def __init__(
        self,
        config: EngineConfig,
        url: str = URL,
        *,
        namespace: str = "restms",
        sweep_interval: float = 1.0,
        replicas: int = 1,
        seeds: Sequence[tuple[str, int]] = (),
    ) -> None:
        self.config = config
        self.keys = Keys(namespace)
        self.link = Link(url, replicas=replicas, seeds=seeds)
        self.cache = Cache(config)
        self.counters = Counters()
        self.latency = Latency()
        self.stamps = stamps()  # the origin stamps of the messages this node publishes
        self._sweep_interval = sweep_interval
        self._subscriber = Subscriber(
            self.link,
            lambda channel, data: syncing.heard(self, channel, data),
            lambda: syncing.lost(self),
        )
        self._waiters: dict[str, set[asyncio.Future[Any]]] = defaultdict(set)
        self._watching_catalogue: set[asyncio.Future[bool]] = set()
        self._listening: set[int] = set()
        self._leased_buckets: set[int] = set()
        self._syncing: asyncio.Lock = asyncio.Lock()
        self._tasks: list[asyncio.Task[None]] = []
        self._cursors: set[RedisCursor] = set()
        self._closing = False
        self._closed = False
        self._mirror: MirrorSink | None = None
        self._hook_listener: Callable[[str, Webhook | None], None] | None = None
        self.owners = Owners(self)
        self._dead_letter = config.dead_letter_feed or ""
        self._events: Events | None = None
        self._announcing: set[asyncio.Task[None]] = set()
        self._adopted: set[asyncio.Task[Any]] = set()  # failed publishes being settled
        self.holding = claims.Holding()  # the message-id claims held, renewed
        self.marks = settling.marks()
        if config.system_feed:
            system = cast("Feed", SystemFeed(self.cache, config.system_feed))
            route = functools.partial(announcing.announce, self)
            self._events = Events(system, route, interval=config.events_interval)

    @classmethod
    def open(
        cls,
        config: EngineConfig | None = None,
        url: str = URL,
        *,
        namespace: str = "restms",
        sweep_interval: float = 1.0,
        seeds: Sequence[tuple[str, int]] = (),
    ) -> RedisEngine:
        """An engine on the cluster that ``url`` reaches (a seed node: ``redis://`` or
        ``rediss://``, with ``user:password@`` when the cluster asks for one) or any of
        ``seeds`` (host, port), its keys under ``namespace``; call :meth:`start` before
        use."""
        return cls(
            config or EngineConfig(),
            url,
            namespace=namespace,
            sweep_interval=sweep_interval,
            seeds=seeds,
        )

    # ------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        await self.link.start()
        await self._subscriber.subscribe(self.keys.cat)
        await syncing.sync(self)
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(upkeep.sweeper(self), name="redis-engine-sweeper"))
        self._tasks.append(loop.create_task(self.owners.run(), name="redis-engine-owners"))
        self._tasks.append(loop.create_task(claims.renew(self), name="redis-engine-claims"))

    def shutdown(self) -> None:
        self._closing = True
        for futures in [*self._waiters.values(), self._watching_catalogue]:
            for future in list(futures):
                if not future.done():
                    future.set_result(False)
        for cursor in list(self._cursors):
            cursor.end("closing")

    async def close(self) -> None:
        self.shutdown()
        if self._closed:
            return
        self._closed = True
        if self._announcing:  # announcements on their way: a moment to land
            await asyncio.wait(list(self._announcing), timeout=1.0)
        if self._adopted:  # failed publishes being settled: as long as a step may take
            _done, left = await asyncio.wait(list(self._adopted), timeout=CLOSE_WAIT)
            if left:
                log.warning("closing the engine: %d failed publishes left unsettled", len(left))
        # Another node takes them at once; the others' shares grow at once.
        if self.owners.held or self.owners.solos or self.owners.counted:
            try:
                async with asyncio.timeout(CLOSE_WAIT):
                    await self.owners.release()
            except (TimeoutError, ServiceUnavailable):
                log.warning("freeing the webhook pipes' locks failed: they run out instead")
        await self._stop()

    async def _stop(self) -> None:
        """End the tasks and drop the connections, each step bounded: a close never
        hangs on a cluster that stopped answering."""
        tasks, self._tasks = [*self._tasks, *self._announcing, *self._adopted], []
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=CLOSE_WAIT)
        for step in (self._subscriber.close, self.link.close):
            done, _ = await asyncio.wait({asyncio.ensure_future(step())}, timeout=CLOSE_WAIT)
            if not done:
                log.warning("closing the engine: a step took over %s s, left behind", CLOSE_WAIT)

    async def crash(self) -> None:
        """Stop as a killed process would (tests): its tasks end where they are and its
        connections drop, as the system would drop a dead process's sockets; nothing
        is finished or said goodbye to."""
        self._closing = self._closed = True
        await self._stop()

    @property
    def events(self) -> SystemEvents | None:
        return self._events

    def adopt(self, task: asyncio.Task[Any]) -> None:
        """Keep ``task`` (work that outlives the call that started it) until it ends, or
        the engine closes; its failure is logged."""
        self._adopted.add(task)
        task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task[Any]) -> None:
        self._adopted.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("a background task of the engine failed", exc_info=task.exception())

    def _unavailable(self) -> ServiceUnavailable:
        return ServiceUnavailable("the gateway is shutting down", retry_after=1)

    def settings(self, pipe: PipeRec) -> Settings:
        return Settings(pipe.options, self.config)

    # ------------------------------------------------------------ look-ups
    async def domain(self, name: str) -> DomainInfo:
        return await lookups.domain(self, name)

    async def domains(self) -> tuple[DomainInfo, ...]:
        return await lookups.domains(self)

    async def feed(self, principal: str | None, key: str) -> FeedInfo:
        return await lookups.feed(self, principal, key)

    async def feeds(self, domain: str) -> tuple[FeedInfo, ...]:
        return await lookups.feeds(self, domain)

    async def pipe(self, principal: str | None, key: str) -> PipeInfo:
        return await lookups.pipe(self, principal, key)

    async def pipes(self, principal: str) -> tuple[PipeInfo, ...]:
        return await lookups.pipes(self, principal)

    async def join(self, principal: str | None, key: str) -> JoinInfo:
        return await lookups.join(self, principal, key)

    async def resolve(self, principal: str | None, key: str) -> Resource:
        return await reading.resolve(self, principal, key)

    async def exists(self, principal: str | None, at: Slot | ContentRef) -> bool:
        return await reading.exists(self, principal, at)

    async def changed(self, principal: str | None, value: Watched, wait: float) -> Watched | None:
        return await reading.changed(self, principal, value, wait)

    async def feed_at(self, principal: str | None, path: str) -> FeedInfo:
        return await lookups.feed_at(self, principal, path)

    async def listed_feeds(self, domain: str) -> tuple[FeedInfo, ...]:
        return await lookups.listed_feeds(self, domain)

    async def owned(self, principal: str) -> Owned:
        return await lookups.owned(self, principal)

    # ------------------------------------------------------------ changes

    async def create_feed(
        self, principal: str, domain: str, spec: FeedSpec
    ) -> tuple[FeedInfo, bool]:
        return await resources.create_feed(self, principal, domain, spec)

    async def update_feed(self, principal: str | None, key: str, update: Update) -> FeedInfo:
        return await resources.update_feed(self, principal, key, update)

    async def delete_feed(self, principal: str | None, key: str) -> None:
        await resources.delete_feed(self, principal, key)

    async def create_pipe(self, principal: str, domain: str, spec: PipeSpec) -> PipeInfo:
        return await resources.create_pipe(self, principal, domain, spec)

    async def update_pipe(self, principal: str | None, key: str, update: Update) -> PipeInfo:
        return await resources.update_pipe(self, principal, key, update)

    async def delete_pipe(self, principal: str | None, key: str) -> None:
        await resources.delete_pipe(self, principal, key)

    async def create_join(
        self, principal: str | None, pipe: str, spec: JoinSpec
    ) -> tuple[JoinInfo, bool]:
        return await resources.create_join(self, principal, pipe, spec)

    async def delete_join(self, principal: str | None, key: str) -> None:
        await resources.delete_join(self, principal, key)

    # ------------------------------------------------------------ staged contents
    async def stage(self, principal: str, feed: str, data: bytes, content_type: str) -> StagedInfo:
        return await resources.stage(self, principal, feed, data, content_type)

    async def staged(self, principal: str | None, key: str) -> tuple[StagedInfo, Blob]:
        return await resources.staged(self, principal, key)

    async def delete_staged(self, principal: str | None, key: str) -> None:
        await resources.delete_staged(self, principal, key)

    # ------------------------------------------------------------ publishing
    async def publish(
        self,
        principal: str,
        feed: str,
        messages: Sequence[MessageSpec],
        *,
        via: str | None = None,
    ) -> PublishResult:

        return await publishing.publish(self, principal, feed, messages, via)

    async def publish_counts(
        self, principal: str, feed: str, messages: Sequence[MessageSpec]
    ) -> tuple[int, ...]:
        return (await self.publish(principal, feed, messages)).counts

    async def room(
        self, principal: str, feed: str, messages: Sequence[MessageSpec], *, wait: float = 0.0
    ) -> int:

        return await publishing.room(self, principal, feed, messages, wait)

    # ------------------------------------------------------------ reading
    async def _range(self, pipe: str, first: int, count: int, use: bool = True) -> list[Any]:
        # Every range of a pipe is read through here (tests count a read's ranges).
        return await streams.read_range(self, pipe, first, count, use)

    async def listing(self, principal: str | None, pipe: str) -> Listing:
        return await streams.listing(self, principal, pipe)

    async def read(
        self,
        principal: str | None,
        pipe: str,
        position: int,
        *,
        wait: float = 0.0,
        lease: bool = False,
    ) -> Message | None:
        return await streams.read(self, principal, pipe, position, wait, lease)

    async def look(self, principal: str | None, pipe: str, position: int) -> Message | None:
        return await streams.look(self, principal, pipe, position)

    async def ack(self, principal: str | None, pipe: str, position: int) -> int:
        return await streams.ack(self, principal, pipe, position)

    async def content(self, principal: str | None, ref: ContentRef) -> Blob:
        return await reading.content(self, principal, ref)

    async def delete_content(self, principal: str | None, ref: ContentRef) -> None:
        await reading.delete_content(self, principal, ref)

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
        return await reading.dead_letter(
            self, principal, pipe, position, reason, feed=feed, headers=headers
        )

    def cursor(
        self,
        principal: str | None,
        pipe: str,
        after: int = 0,
        *,
        lease: bool = False,
        via: str | None = None,
    ) -> RedisCursor:
        return RedisCursor(self, principal, pipe, after, lease, via)

    # ------------------------------------------------------------ statistics and admin
    async def stats(self) -> Stats:
        return await admin.stats(self)

    async def readiness(self, timeout: float) -> Readiness:
        return await admin.readiness(self, timeout)

    def mirror_to(self, sink: MirrorSink | None) -> None:
        self._mirror = sink

    async def pipe_states(self) -> tuple[PipeState, ...]:
        return await admin.pipe_states(self)

    async def pipe_state(self, principal: str | None, key: str) -> PipeState:
        return await admin.pipe_state(self, principal, key)

    async def purge(self, principal: str | None, pipe: str) -> int:
        return await admin.purge(self, principal, pipe)

    async def inventory(self) -> Inventory:
        return await admin.inventory(self)

    # ------------------------------------------------------------ settings
    async def setting(self, name: str) -> str | None:
        return await kept.setting(self, name)

    async def keep_setting(self, name: str, value: str, *, only_new: bool = False) -> str:
        return await kept.keep(self, name, value, only_new)

    async def list_settings(self, prefix: str) -> tuple[tuple[str, str], ...]:
        return await kept.listed(self, prefix)

    async def drop_setting(self, name: str, *, only: str | None = None) -> bool:
        return await kept.drop(self, name, only)

    # ------------------------------------------------------------ webhooks
    def solo(self, name: str) -> Solo:
        return self.owners.solo(name)

    def watch_webhooks(self, listener: Callable[[str, Webhook | None], None] | None) -> None:
        self._hook_listener = listener
        self.owners.poke()

    async def webhooks(self) -> tuple[Webhook, ...]:
        return await webhooks.webhooks(self)

    async def webhook(self, pipe: str) -> Webhook:
        return await webhooks.webhook_value(self, pipe)

    async def webhook_attempts(self, pipe: str, position: int) -> WebhookAttempts | None:
        return await webhooks.attempts(self, pipe, position)

    async def webhook_verified(self, pipe: str, ok: bool, status: str, error: str) -> None:
        await webhooks.verified(self, pipe, ok, status, error)

    async def webhook_delivered(self, pipe: str, position: int, status: str) -> bool:
        return await webhooks.delivered(self, pipe, position, status)

    async def webhook_failed(
        self, pipe: str, position: int, attempt: int, status: str, error: str, retry_at: float
    ) -> bool:
        return await webhooks.failed(self, pipe, position, attempt, status, error, retry_at)

    async def webhook_give_up(self, pipe: str, position: int, reason: str) -> None:
        await webhooks.give_up(self, pipe, position, reason)

    async def webhook_gone(self, pipe: str, position: int, status: str) -> bool:
        return await webhooks.gone(self, pipe, position, status)


if TYPE_CHECKING:  # the type checker proves the Redis engine is the whole service
    _CONFORMS: EngineService = RedisEngine(EngineConfig())
