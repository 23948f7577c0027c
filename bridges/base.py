"""What every bridge is: a small interface, a link state machine, counters and status.

A bridge connects one gateway feed to something outside (an AMQP 1.0 broker, a
ZeroMQ fabric). The gateway only ever sees :class:`Bridge`: it starts bridges when
the app starts, stops them (in reverse order) when it stops, and shows their
:meth:`Bridge.status` on the admin resource. Bridges reach the engine only through
the engine service (:class:`feeds.service.EngineService`), which the gateway hands
them in a :class:`Host` with the little else they need of it (nothing here imports
``gateway``, nor anything of ``feeds`` but the service).

Link states (one table, STYLE 2)::

    stopped ──start──> connecting ──opened──> up
                          │  ^                 │
                   failed │  │ timer    failed │
                          v  │                 v
                        retrying <─────────────┘
    any state but stopped ──stop──> stopping ──> stopped

``retrying`` waits a capped exponential backoff with jitter, then tries the next
URL in the bridge's list (failover).

Each move and each error is also told to whoever watches (:attr:`LinkState.watch`,
:attr:`Health.watch_error`): the bridge turns them into ``bridge.<kind>.up``,
``.down`` and ``.error`` events on the system feed (docs/EVENTS.md).
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from opentelemetry.trace import Tracer

from feeds.service import EngineService

from .federation.remote import Connect

# state -> the states it may move to
TRANSITIONS: dict[str, frozenset[str]] = {
    "stopped": frozenset({"connecting"}),
    "connecting": frozenset({"up", "retrying", "stopping"}),
    "up": frozenset({"retrying", "stopping"}),
    "retrying": frozenset({"connecting", "stopping"}),
    "stopping": frozenset({"stopped"}),
}
STATES = tuple(TRANSITIONS)


class LinkState:
    """The current state of a bridge's link, moved only along :data:`TRANSITIONS`."""

    __slots__ = ("changed", "name", "watch")

    def __init__(self) -> None:
        self.name = "stopped"
        self.changed = time.time()
        self.watch: Callable[[str, str], None] | None = None  # told (old, new) on each move

    def move(self, new: str) -> bool:
        """Move to ``new``; False (and no change) when it is the current state. An
        illegal move is a bug in the bridge, so it raises."""
        if new == self.name:
            return False
        if new not in TRANSITIONS[self.name]:
            raise RuntimeError(f"bridge link cannot go from {self.name} to {new}")
        old, self.name = self.name, new
        self.changed = time.time()
        if self.watch is not None:
            self.watch(old, new)
        return True


def backoff(attempt: int, low: float, high: float) -> float:
    """Capped exponential backoff with full jitter: a delay in [low/2, min(high, low*2^n)]."""
    ceiling = min(high, low * (2 ** min(attempt, 30)))
    return random.uniform(min(low / 2, ceiling), ceiling)  # noqa: S311 (jitter, not secrets)


@dataclass(slots=True)
class CoreCounters:
    """What every bridge counts since it started; shown in its status."""

    connects: int = 0
    disconnects: int = 0
    # outbound (gateway -> far side)
    sent: int = 0
    dead_lettered: int = 0
    discarded: int = 0  # could not be sent, and no dead-letter feed would take it
    unmappable: int = 0
    # inbound (far side -> gateway)
    received: int = 0
    published: int = 0
    unroutable: int = 0  # published but no join took it
    duplicates: int = 0  # absorbed by the feed's message_id window
    refused: int = 0  # could not become a gateway message
    throttled: int = 0  # times the gateway stopped taking messages because a pipe was full


@dataclass(slots=True)
class Counters(CoreCounters):
    """An AMQP 1.0 bridge's counters: settlement outcomes and credit."""

    accepted: int = 0
    released: int = 0
    modified: int = 0
    rejected: int = 0
    retried: int = 0
    given_back: int = 0  # released to the far side (shutdown, error, stale link)


@dataclass(slots=True)
class ZmqCounters(CoreCounters):
    """A ZeroMQ bridge's counters: high-water marks, bad frames, requests."""

    dropped: int = 0  # at the send high-water mark with at_hwm = "drop"
    blocked: int = 0  # times a send waited at the high-water mark (at_hwm = "block")
    malformed: int = 0  # multipart messages that were not messages (dropped, logged)
    requests: int = 0  # request/reply: requests taken
    replies: int = 0  # request/reply: replies delivered to their requester
    timeouts: int = 0  # requests answered with a timeout error
    late: int = 0  # replies that came after their request timed out (dropped)
    uncorrelated: int = 0  # replies that matched no request (dropped)
    lost_peers: int = 0  # replies whose requester had gone (dropped)
    handshake_failures: int = 0  # peers refused by CURVE


@dataclass(slots=True)
class Health:
    """The changing part of a bridge's status."""

    state: LinkState = field(default_factory=LinkState)
    url: str = ""  # the URL in use (redacted)
    last_error: str = ""
    last_error_at: float = 0.0
    counters: CoreCounters = field(default_factory=Counters)
    watch_error: Callable[[str], None] | None = None  # told each error's text

    def error(self, text: str) -> None:
        self.last_error = text
        self.last_error_at = time.time()
        if self.watch_error is not None:
            self.watch_error(text)

    def document(self) -> dict[str, Any]:
        return {
            "state": self.state.name,
            "since": round(self.state.changed, 3),
            "url": self.url,
            "last_error": self.last_error,
            "last_error_at": round(self.last_error_at, 3) if self.last_error_at else None,
            "counters": dataclasses.asdict(self.counters),
        }


# Told a bridge's link events for the system feed: (kind, bridge, what, details), with
# ``what`` one of "up", "down", "error" (docs/EVENTS.md).
Notify = Callable[[str, str, str, dict[str, str]], None]


class Reach(Protocol):
    """The guard of the AMQP and ZeroMQ bridges made at run time (the gateway's; its
    policy: gateway/admin/bridge_guard.py), asked before each connection. Bridges of
    the configuration file are not guarded."""

    def endpoint(self, endpoint: str, *, bind: bool) -> str | None:
        """Why a ZeroMQ endpoint may not be bound or connected to (None: it may, or it
        connects to a host name: :meth:`addresses` checks that)."""

    def addresses(self, host: str, port: int, family: int) -> list[str]:
        """The addresses a connection to ``host`` may go to now, in order; an
        ``OSError`` saying why there is none. Blocking: call it from a thread."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Host:
    """What the gateway gives its bridges: the engine service (committing and paging
    are its business), where link events go, the limits a bridge's pipe must keep, the
    HTTP client federation links reach other gateways with, and the guard of the
    bridges made at run time."""

    engine: EngineService
    notify: Notify | None = None  # None: management events are off
    system_feed: str | None = None  # the feed events go to: bridges only out of it
    max_pipe_messages: int
    max_pipe_bytes: int
    connect: Connect | None = None  # federation links' remote gateways; None: no links
    dead_letter_feed: str = ""  # the gateway's, for what a pull link may not publish
    tracer: Tracer | None = None  # spans of messages sent and received; None: tracing off
    reach: Reach | None = None  # the guard of run-time AMQP and ZeroMQ bridges; None: none


class Bridge(Protocol):
    """A running bridge, as the gateway sees it."""

    @property
    def name(self) -> str: ...

    @property
    def configured(self) -> bool:
        """Declared in the configuration file (cannot be deleted at run time)."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def forget(self) -> None:
        """The bridge is deleted (after :meth:`stop`): let go of what it keeps outside
        its own pipe (a federation pull link's pipe on its remote)."""

    def backlog(self) -> int:
        """Messages waiting on the gateway side of the bridge."""

    def status(self) -> dict[str, Any]: ...
