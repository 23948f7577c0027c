"""The engine service: the one surface of ``feeds/`` that the layers above may use.

Theory of operation
-------------------
The gateway, the bridges and the traffic mirror speak to an engine through
:class:`EngineService` alone, so that a second engine (a Redis Cluster, where any node
serves any pipe) can stand behind the same gateway. Two rules make that possible:

* **Values cross, objects stay home.** Every argument and every result is an
  immutable value: the request values of :mod:`restms.specs` (``FeedSpec``,
  ``PipeSpec``, ``JoinSpec``, ``Update``, ``MessageSpec``) going in, and the frozen
  dataclasses of :mod:`feeds.values` coming out (re-exported here). A value is a
  snapshot: it never changes after it was returned, and holding one keeps nothing
  alive in the engine. The settings an engine is opened with (``EngineConfig``,
  ``FeedConfig``, from :mod:`feeds.config`) are values too, re-exported here. Resources are named by
  their key (a public feed's name, or the hash of ``/restms/resource/{key}``), a
  message by its pipe's key and its position.
* **Anything may need I/O.** Calls that a distributed engine answers over the network
  are coroutines, including reads. Only :meth:`EngineService.cursor` is synchronous:
  it returns an object whose iteration does the I/O (a :class:`Cursor`; it and
  :class:`Solo`, the service's two objects, are in :mod:`feeds.handles`, re-exported
  here).

Ownership and visibility (digest Q7)
------------------------------------
Every call names the principal it acts for (``principal``, its name). ``None`` is the
gateway itself (admin, housekeeping): it sees and may change everything.

* Pipes, their joins, messages and contents, private feeds and staged contents belong
  to the principal that created them. To anyone else they do not exist: the same
  :class:`~restms.errors.NotFound` as a key never issued, so their names cannot be
  probed.
* Public feeds and domains are visible to every principal. A public feed may be
  changed or deleted only by its creator (:class:`~restms.errors.Forbidden` for
  anyone else); a configured feed by nobody (F17). Scopes, tenants and quotas are the
  gateway's policy (``auth/``), checked before the engine is called.

Positions (A3, D4, Q6)
----------------------
Each pipe numbers the messages it receives 1, 2, 3, ... and never reuses a number a
reader was shown; a position left by an expired, dropped or redelivered message is a
gap. (A publish whose commit failed was shown to nobody: when nothing came after it,
its positions are taken again.) ``asynclet`` is the position the next message will
take; reading it waits. Acknowledging position ``n`` removes ``n`` and everything
older; acknowledging the asynclet or a position beyond does nothing.

Gaps (what a resuming reader is told, docs/EXTENSIONS.md §3)
-------------------------------------------------------------
A pipe's :class:`PipeInfo` carries two marks that only grow: ``acked``, the highest
position acknowledged (a DELETE, a cursor's ack, a purge; 0 for none), and ``lost``,
the highest position whose message left the pipe unacknowledged never to be delivered
again: expired (Q30), dropped by the "drop-oldest" overflow (Q2), moved to a dead-letter
feed (max_deliveries, a bridge's or a webhook's refusal), or kept in memory only when
the engine stopped (0 for none). A message whose lease ran out and that is delivered
again at a new position, or handed to another pipe, is not lost. An engine that keeps
positions across a restart keeps both marks with them. :meth:`PipeInfo.gap` turns them
into what a reader resuming at a position lost (a :class:`Gap`, or None), and
:attr:`PipeInfo.earliest` is the oldest position a reader can be sent now.

Durability
----------
A publish that holds a persistent message (``delivery_mode`` 2, or any message into
a durable pipe) returns only once the engine committed it; until then no reader sees
it. When the commit fails the publish leaves nothing behind (its ``message_id`` may
be used again) and raises :class:`~restms.errors.ServiceUnavailable` with a
``retry_after``. Any other call that changed something the engine keeps (a resource,
an acknowledgement) returns once that change is committed too. Changes nobody waits
for (non-persistent messages, expiries, work handed out from a queue) are committed
within a short interval, and before :meth:`EngineService.close` returns. Paging
messages in from disk, and committing first so a page is complete, is the engine's
business: callers never see it.

Errors (:mod:`restms.errors`, each with its HTTP status hint)
-------------------------------------------------------------
::

    RestMSError
    ├── BadRequest            a bad value: unknown type, a join naming no feed (G14)
    ├── Forbidden             not allowed here: configured feed, default join (F16),
    │                         ondemand pipe on a non-queueing feed (P4), foreign
    │                         staged content (M9), another's public feed (Q7)
    ├── NotFound              no such resource, or not this principal's; a position
    │                         gone or never issued; a used staged content (M8)
    ├── PayloadTooLarge       a message larger than a "reject" pipe accepts
    ├── TooManyRequests       a principal's staged-content share is full
    └── ServiceUnavailable    a full queue or "reject" pipe, shutting down
        └── NotCommitted      a failed commit: the change (a whole publish) was not kept

Nothing else escapes an engine: store and network failures become
``ServiceUnavailable`` (``raise ... from exc``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from restms.specs import FeedSpec, JoinSpec, MessageSpec, PipeSpec, Update

from .config import DEFAULT_DOMAIN, EngineConfig, FeedConfig
from .handles import Cursor, Solo
from .values import (
    Blob,
    Census,
    ContentRef,
    DomainInfo,
    FeedInfo,
    Gap,
    Histogram,
    Inventory,
    JoinInfo,
    Listing,
    Message,
    Owned,
    Part,
    PipeInfo,
    PipeState,
    Placed,
    PublishResult,
    Readiness,
    Resource,
    Slot,
    StagedInfo,
    Stats,
    StoreStats,
    Webhook,
    WebhookAttempts,
    WebhookProgress,
    WebhookState,
)

__all__ = [
    "DEFAULT_DOMAIN",
    "Blob",
    "Census",
    "ContentRef",
    "Cursor",
    "DomainInfo",
    "EngineConfig",
    "EngineService",
    "FeedConfig",
    "FeedInfo",
    "Gap",
    "Histogram",
    "Inventory",
    "JoinInfo",
    "Listing",
    "Message",
    "MirrorSink",
    "Owned",
    "Part",
    "PipeInfo",
    "PipeState",
    "Placed",
    "PublishResult",
    "Readiness",
    "Resource",
    "Slot",
    "Solo",
    "StagedInfo",
    "Stats",
    "StoreStats",
    "SystemEvents",
    "Watched",
    "Webhook",
    "WebhookAttempts",
    "WebhookProgress",
    "WebhookState",
    "check_prefix",
    "check_setting",
]

# What an evented GET may wait on (H9-H11): a resource with a version of its own.
Watched = TypeVar("Watched", DomainInfo, FeedInfo, PipeInfo, JoinInfo)

# The reason of the 404 for a resource that is another principal's: the same as for one
# that does not exist (U4), whichever engine answers.
HIDDEN = "no such resource"

# Settings (EngineService.setting): names the gateway's parts choose ("gateway-id",
# "federation/<link>/pipe"), values small enough to read on every start.
SETTING_NAME = re.compile(r"[A-Za-z0-9._:/-]{1,200}")
SETTING_PREFIX = re.compile(r"[A-Za-z0-9._:/-]{0,200}")  # what EngineService.list_settings takes
SETTING_MAX = 4096  # characters of a setting's value


def check_setting(name: str, value: str | None = None) -> None:
    """ValueError unless ``name`` is 1-200 of ``A-Za-z0-9._:/-`` and ``value`` (when
    given) a string of at most :data:`SETTING_MAX` characters."""
    if not isinstance(name, str) or SETTING_NAME.fullmatch(name) is None:
        raise ValueError(f"a setting's name is 1-200 of A-Za-z0-9._:/-, not {name!r:.80}")
    if value is not None and (not isinstance(value, str) or len(value) > SETTING_MAX):
        raise ValueError(f"a setting's value is a string of at most {SETTING_MAX} characters")


def check_prefix(prefix: str) -> None:
    """ValueError unless ``prefix`` is 0-200 of ``A-Za-z0-9._:/-``."""
    if not isinstance(prefix, str) or SETTING_PREFIX.fullmatch(prefix) is None:
        raise ValueError(f"a settings prefix is 0-200 of A-Za-z0-9._:/-, not {prefix!r:.80}")


class MirrorSink(Protocol):
    """Where mirror events go: one event tuple (``rows`` 1) or one record standing for
    ``rows`` events, in the columns of :mod:`spark_sink.schema` (the tuple is the whole
    contract: the engine does not import it)."""

    def __call__(self, item: tuple[Any, ...], rows: int = 1, /) -> None: ...


class SystemEvents(Protocol):
    """What the layers above announce on the system feed (docs/EVENTS.md). Each call
    only queues: events are coalesced and published by the engine in the background,
    so an announcement never waits and never fails its caller."""

    @property
    def name(self) -> str:
        """The system feed's public name."""
        ...

    def auth_failed(self, scheme: str, peer: str | None, reason: str) -> None:
        """A request's credentials were refused (``scheme``: bearer, basic, client, ...);
        never the credentials themselves."""
        ...

    def bridge(self, kind: str, name: str, what: str, given: Mapping[str, str]) -> None:
        """A bridge's state changed (``what``: connected, failing, ...)."""
        ...


# ---------------------------------------------------------------- the service
class EngineService(Protocol):
    """Feeds, pipes, joins, messages and contents (RestMS 2/RestMS, 3/Defaults, 4/AMQP9)."""

    # lifecycle
    async def start(self) -> None:
        """Recover what the engine keeps and begin background upkeep."""
        ...

    def shutdown(self) -> None:
        """Begin closing, before the work in flight drains: every wait ends now (a read
        at the asynclet, an evented wait: retriable 503; a cursor's iteration ends),
        and none starts from here on. :meth:`close` follows."""
        ...

    async def close(self) -> None:
        """End every wait (503 / iteration ends), commit what is left, release."""
        ...

    @property
    def events(self) -> SystemEvents | None:
        """The system feed's announcer (docs/EVENTS.md), None when it is off."""
        ...

    # domains (configured: clients never create or delete them, U3)
    async def domain(self, name: str) -> DomainInfo: ...

    async def domains(self) -> tuple[DomainInfo, ...]: ...

    # feeds
    async def create_feed(
        self, principal: str, domain: str, spec: FeedSpec
    ) -> tuple[FeedInfo, bool]:
        """C1-C5: True when created; a public feed that exists comes back unchanged."""
        ...

    async def feed(self, principal: str | None, key: str) -> FeedInfo: ...

    async def feeds(self, domain: str) -> tuple[FeedInfo, ...]:
        """The public feeds of a domain (G13)."""
        ...

    async def update_feed(self, principal: str | None, key: str, update: Update) -> FeedInfo: ...

    async def delete_feed(self, principal: str | None, key: str) -> None:
        """404 when it is not there, or not this principal's (the gateway answers R4's
        200 for both alike)."""
        ...

    # pipes and joins
    async def create_pipe(self, principal: str, domain: str, spec: PipeSpec) -> PipeInfo: ...

    async def pipe(self, principal: str | None, key: str) -> PipeInfo: ...

    async def pipes(self, principal: str) -> tuple[PipeInfo, ...]:
        """The pipes a principal has."""
        ...

    async def update_pipe(self, principal: str | None, key: str, update: Update) -> PipeInfo: ...

    async def delete_pipe(self, principal: str | None, key: str) -> None: ...

    async def create_join(
        self, principal: str | None, pipe: str, spec: JoinSpec
    ) -> tuple[JoinInfo, bool]:
        """F10: True when created; an identical join comes back with False."""
        ...

    async def join(self, principal: str | None, key: str) -> JoinInfo: ...

    async def delete_join(self, principal: str | None, key: str) -> None: ...

    async def resolve(self, principal: str | None, key: str) -> Resource:
        """What ``/restms/resource/{key}`` names, or 404. A message's position and a
        content are named by shape: whether one is there, :meth:`exists` says."""
        ...

    async def exists(self, principal: str | None, at: Slot | ContentRef) -> bool:
        """Whether a message is at the position (held, or the asynclet: U12) or the
        content is there."""
        ...

    async def feed_at(self, principal: str | None, path: str) -> FeedInfo:
        """The feed a join's ``feed`` path names (U5): 400 when there is none, or it is
        another principal's private feed (G14)."""
        ...

    async def listed_feeds(self, domain: str) -> tuple[FeedInfo, ...]:
        """What a domain's document lists (G13, F14): its public feeds, and the default
        feed, which is in every domain."""
        ...

    async def owned(self, principal: str) -> Owned:
        """How many feeds, pipes and joins ``principal`` has (the gateway's quotas)."""
        ...

    async def changed(self, principal: str | None, value: Watched, wait: float) -> Watched | None:
        """H9-H11: ``value``'s resource as it is once its version is not ``value``'s any
        more (at once when it is not now), or None when ``wait`` seconds passed first.
        404 once it is deleted, 503 once the engine is shutting down."""
        ...

    # staged contents (M1-M4)
    async def stage(
        self, principal: str, feed: str, data: bytes, content_type: str
    ) -> StagedInfo: ...

    async def staged(self, principal: str | None, key: str) -> tuple[StagedInfo, Blob]: ...

    async def delete_staged(self, principal: str | None, key: str) -> None: ...

    # publishing
    async def publish(
        self,
        principal: str,
        feed: str,
        messages: Sequence[MessageSpec],
        *,
        via: str | None = None,
    ) -> PublishResult:
        """Route in order, all or nothing (M10); returns once persistent ones commit.
        ``via`` names the bridge the messages came in by, for the traffic mirror."""
        ...

    async def publish_counts(
        self, principal: str, feed: str, messages: Sequence[MessageSpec]
    ) -> tuple[int, ...]:
        """:meth:`publish`, answering only what a client's reply says, the counts (F18;
        a duplicate's a :class:`restms.specs.Duplicate`): a publisher that needs no
        more (the RestMS POST, every publish of it) is not made to wait for the rest
        to be built."""
        ...

    async def room(
        self,
        principal: str,
        feed: str,
        messages: Sequence[MessageSpec],
        *,
        wait: float = 0.0,
    ) -> int:
        """How many leading ``messages`` every pipe they would reach that skips when
        full (Q2 "skip") can hold together: a publisher that must lose nothing to a
        full pipe publishes only those (a bridge's ``backpressure = "wait"``). All of
        them for a rotator or service feed, whose full queue refuses a publish itself.
        When it is none, first waits up to ``wait`` seconds for such a pipe to
        change, then answers again."""
        ...

    # reading
    async def listing(self, principal: str | None, pipe: str) -> Listing: ...

    async def read(
        self,
        principal: str | None,
        pipe: str,
        position: int,
        *,
        wait: float = 0.0,
        lease: bool = False,
    ) -> Message | None:
        """The message at ``position``; at the asynclet, waits up to ``wait`` seconds
        (None when none came, A9). 404 for a position gone or never issued (A5).
        With ``lease``, the read is a delivery: unless acknowledged within the pipe's
        lease, the message is delivered again, or dead-lettered past max_deliveries."""
        ...

    async def look(self, principal: str | None, pipe: str, position: int) -> Message | None:
        """The message at ``position`` as it is now, None when there is none (U11: a
        HEAD): never waits, leases nothing, takes no work from a feed's queue."""
        ...

    async def ack(self, principal: str | None, pipe: str, position: int) -> int:
        """D4, A7: remove ``position`` and everything older; how many went."""
        ...

    async def content(self, principal: str | None, ref: ContentRef) -> Blob: ...

    async def delete_content(self, principal: str | None, ref: ContentRef) -> None: ...

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
        """Move one message to a dead-letter feed (a bridge's far side refused it):
        ``feed`` by name, else its pipe's, else the configured one; the copy carries
        ``x-death-reason`` (``reason``), then ``headers``, then ``x-original-feed``.
        False when that feed is missing or full (the message is dropped all the same)."""
        ...

    def cursor(
        self,
        principal: str | None,
        pipe: str,
        after: int = 0,
        *,
        lease: bool = False,
        via: str | None = None,
    ) -> Cursor:
        """A reader of the pipe's messages at positions after ``after`` (with ``lease``,
        each message yielded is leased as :meth:`read` leases). The first iteration
        raises 404 when the pipe is not there for the principal. ``via`` names the
        bridge that reads it: the traffic mirror records each message it acknowledges."""
        ...

    def solo(self, name: str) -> Solo:
        """A claim on running ``name`` (``bridge:<name>``) on this node alone among the
        nodes that share the engine; call its :meth:`Solo.take` first."""
        ...

    # settings: a few durable values of the gateway's own, shared by every node
    async def setting(self, name: str) -> str | None:
        """The value kept under ``name`` (:func:`check_setting`), None when there is none."""
        ...

    async def keep_setting(self, name: str, value: str, *, only_new: bool = False) -> str:
        """Keep ``value`` under ``name`` and return it, once committed (503 when it cannot
        be). With ``only_new`` it is kept only when ``name`` holds nothing, and what
        ``name`` holds is returned: the first writer wins, so every node of a cluster
        that offers a value of its own (a gateway id made at random) agrees on one.
        ValueError for a name or value :func:`check_setting` refuses."""
        ...

    async def list_settings(self, prefix: str) -> tuple[tuple[str, str], ...]:
        """Every setting whose name begins with ``prefix`` (:func:`check_prefix`), as
        (name, value) pairs in the order of their names. Settings are few (a gateway's
        run-time bridges at most): all of them are read."""
        ...

    async def drop_setting(self, name: str, *, only: str | None = None) -> bool:
        """Forget what ``name`` holds, once committed (503 when it cannot be): whether
        it held something that is now gone. With ``only``, it is forgotten only while it
        holds exactly ``only`` (compare and delete, in one step on the engine): of two
        nodes that each read a value and then drop or replace it, one wins, and the
        other is answered False and can read again."""
        ...

    # statistics
    async def stats(self) -> Stats: ...

    async def readiness(self, timeout: float) -> Readiness:
        """Not ready once shutting down, or while a test commit of what the engine keeps
        durable fails or takes over ``timeout`` seconds (an engine that keeps nothing is
        ready). Concurrent asks share one test; the test committing is also how an
        engine whose last commit failed shows it commits again."""
        ...

    # the traffic mirror (docs/ANALYTICS.md): what this process's calls do, as events
    def mirror_to(self, sink: MirrorSink | None) -> None:
        """Offer ``sink`` one event (or one record of a publish's events) for what is
        done from now on; None stops offering. The sink only queues or drops: it is
        called on the event loop and never waits."""
        ...

    # admin: what the gateway's administrators see and do (docs/ADMIN.md), for the
    # gateway itself; a look here does not count as use, so an idle pipe stays idle (Q1)
    async def pipe_states(self) -> tuple[PipeState, ...]:
        """Every pipe, whoever owns it."""
        ...

    async def pipe_state(self, principal: str | None, key: str) -> PipeState:
        """One pipe, or 404 as :meth:`pipe` answers."""
        ...

    async def purge(self, principal: str | None, pipe: str) -> int:
        """Acknowledge every message the pipe holds, in memory and on disk (D4: positions
        go on from the asynclet); how many went."""
        ...

    async def inventory(self) -> Inventory:
        """How many resources of each kind there are (a scan)."""
        ...

    # webhooks: what the gateway's delivery worker of each webhook pipe needs
    # (docs/WEBHOOKS.md), for the gateway itself. Its messages come through a cursor;
    # the outcome of each attempt goes back through these calls, which keep the state
    # machine of :mod:`feeds.webhook`. An outcome for a message that left the pipe
    # meanwhile (a DELETE acknowledged it) only forgets it and answers False.
    def watch_webhooks(self, listener: Callable[[str, Webhook | None], None] | None) -> None:
        """Tell ``listener`` of each webhook pipe made or changed by a PUT (with its key
        and value), or deleted (its key and None), from now on; None stops telling."""
        ...

    async def webhooks(self) -> tuple[Webhook, ...]:
        """Every webhook pipe."""
        ...

    async def webhook(self, pipe: str) -> Webhook:
        """A webhook pipe's options and state: 404 when it is gone (or not a webhook
        pipe), 503 once the engine is closing."""
        ...

    async def webhook_attempts(self, pipe: str, position: int) -> WebhookAttempts | None:
        """The attempts made at the message at ``position`` and when the next is due;
        None when it left the pipe (its attempts are forgotten)."""
        ...

    async def webhook_verified(self, pipe: str, ok: bool, status: str, error: str) -> None:
        """The receiver answered the verification with its challenge, or did not;
        returns once committed."""
        ...

    async def webhook_delivered(self, pipe: str, position: int, status: str) -> bool:
        """The receiver took the message (2xx): it leaves the pipe."""
        ...

    async def webhook_failed(
        self,
        pipe: str,
        position: int,
        attempt: int,
        status: str,
        error: str,
        retry_at: float,
    ) -> bool:
        """Attempt ``attempt`` failed; the next is due at ``retry_at`` (wall-clock
        seconds). Returns once committed, so that a restart carries on from there;
        False, recording nothing, once the subscription no longer delivers."""
        ...

    async def webhook_give_up(self, pipe: str, position: int, reason: str) -> None:
        """Past ``max_attempts`` or ``max_age``: the message goes to the pipe's
        dead-letter feed and leaves the pipe."""
        ...

    async def webhook_gone(self, pipe: str, position: int, status: str) -> bool:
        """The receiver answered 410: the subscription ends (messages stay); returns
        once committed. False, recording nothing, once it no longer delivers."""
        ...
