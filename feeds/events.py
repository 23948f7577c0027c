"""Management events on the system feed (docs/EVENTS.md).

In the broker-management tradition every object reports what happens to it as an
ordinary message: the gateway publishes events on one topic feed it owns (by default
``restms.system``), addressed ``<kind>.<what>`` (``pipe.created``, ``bridge.amqp.down``),
and monitoring is a pipe joined to it (``pipe.*``, ``bridge.#``).

The engine has one optional sink, ``engine.events`` (None: the system feed is off),
like the traffic mirror's. Each emission point is written as::

    if self.events is not None:
        self.events.pipe("created", pipe)

and the first thing every emission does is look whether anyone listens (the feed has
joins): with nobody listening an event costs that one test. Nothing is emitted on the
publish path itself: events are about objects (feeds, pipes, joins, bridges, webhook
subscriptions), and the few about messages (a pipe over its limit, a dead letter) or
requests (a failed authentication) are coalesced per object (:class:`Coalescer`).

Rules the events keep:

* **Nothing secret.** No tokens, secrets or callback URLs. A pipe, a join and a
  private feed are capabilities: they are named by the digest the mirror uses
  (:func:`feeds.mirroring.digest`), never by their keys. Public feeds and bridges by name.
* **No recursion.** Routing an event may fill a pipe joined to the system feed, which
  would be a ``pipe.full`` event, and so on: while an event is being routed, further
  events are dropped (counted), and messages that came from the system feed never
  make events of their own (dead letters of them, for instance).
* **Not stored.** Events are non-persistent messages (``delivery_mode`` 1): they are
  news, not records; the traffic mirror and the logs are the records. A durable pipe
  still keeps what it holds, as it does for any message.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from restms.specs import EmbeddedContent, MessageSpec

from .mirroring import digest
from .model import Clock, Feed, Join, Pipe

JSON = "application/json"
# route(feed, spec, parts, now, durable, size): the engine's own routing of one message
Route = Callable[[Feed, MessageSpec, tuple[EmbeddedContent, ...], float, bool, int], int]
Value = str | int | float | bool | None
# an event as emitted: address, object, principal, domain, details
Fields = tuple[str, str, str | None, str | None, dict[str, Value]]
MAX_KEYS = 10_000  # objects whose coalesced events are remembered at most
MAX_TEXT = 500  # characters of an error text carried at most


@dataclass(slots=True)
class Pending:
    """Occurrences of one coalesced event since the last one sent."""

    sent: float  # monotonic time of the last one sent
    count: int = 0  # occurrences since then, not yet reported
    fields: Fields | None = None


class Coalescer:
    """At most one event per key and ``interval`` seconds.

    The first occurrence goes out at once with ``count`` 1. Later ones within the
    interval are counted, and the last one's fields kept; :meth:`due` hands them out
    (with the count) once the interval has passed, so a burst becomes two events and a
    steady stream one per interval. At most :data:`MAX_KEYS` keys are remembered: past
    that, occurrences of new keys are dropped (and counted by the caller).
    """

    def __init__(self, interval: float, mono: Clock) -> None:
        self.interval = interval
        self._mono = mono
        self._keys: dict[tuple[str, str], Pending] = {}

    def offer(self, key: tuple[str, str], fields: Fields) -> int:
        """How many occurrences to report now (0: held back, or dropped)."""
        now = self._mono()
        pending = self._keys.get(key)
        if pending is None:
            if len(self._keys) >= MAX_KEYS:
                self._forget(now)
                if len(self._keys) >= MAX_KEYS:
                    return 0
            self._keys[key] = Pending(now)
            return 1
        if now - pending.sent >= self.interval:
            count = pending.count + 1
            pending.sent, pending.count, pending.fields = now, 0, None
            return count
        pending.count += 1
        pending.fields = fields
        return 0

    def due(self) -> list[tuple[Fields, int]]:
        """Held-back occurrences whose interval has passed: the last fields and a count."""
        now = self._mono()
        out = []
        for pending in self._keys.values():
            if pending.count and pending.fields is not None and now - pending.sent >= self.interval:
                out.append((pending.fields, pending.count))
                pending.sent, pending.count, pending.fields = now, 0, None
        self._forget(now)
        return out

    def _forget(self, now: float) -> None:
        """Keys with nothing pending and quiet for an interval."""
        quiet = [
            key
            for key, pending in self._keys.items()
            if not pending.count and now - pending.sent >= self.interval
        ]
        for key in quiet:
            del self._keys[key]


class Events:
    """The system feed's publisher: builds each event and routes it to the feed's joins."""

    def __init__(
        self,
        feed: Feed,
        route: Route,
        *,
        interval: float,
        wall: Clock = time.time,
        mono: Clock = time.monotonic,
    ) -> None:
        self.feed = feed
        self._route = route
        self._wall = wall
        self._ids = itertools.count(1)
        self._boot = f"{int(wall()):x}"  # message ids differ between runs
        self._busy = False
        self.coalescer = Coalescer(interval, mono)
        self.sent = 0  # events routed
        self.dropped = 0  # events not made because they were raised while routing one

    @property
    def name(self) -> str:
        return self.feed.key

    def listening(self) -> bool:
        """Whether anyone would get an event now (the feed has joins)."""
        return bool(self.feed.joins) and not self.feed.deleted

    # ------------------------------------------------------------ the one way out
    def emit(
        self,
        address: str,
        obj: str,
        principal: str | None = None,
        domain: str | None = None,
        details: Mapping[str, Value] | None = None,
        *,
        coalesce: bool = False,
    ) -> bool:
        """Publish one event; True when it was routed. With ``coalesce``, at most one
        per (address, object) and interval (:class:`Coalescer`), carrying ``count``."""
        if not self.feed.joins or self.feed.deleted:
            return False
        if self._busy:
            self.dropped += 1
            return False
        fields = dict(details or {})
        if coalesce:
            count = self.coalescer.offer((address, obj), (address, obj, principal, domain, fields))
            if not count:
                return False
            fields["count"] = count
        self._send((address, obj, principal, domain, fields))
        return True

    def flush(self) -> int:
        """Send the coalesced events whose interval has passed (the engine's sweep)."""
        due = self.coalescer.due()
        if not self.listening() or self._busy:
            return 0
        for (address, obj, principal, domain, fields), count in due:
            self._send((address, obj, principal, domain, {**fields, "count": count}))
        return len(due)

    def _send(self, event: Fields) -> None:
        address, obj, principal, domain, details = event
        now = self._wall()
        kind = address.partition(".")[0]
        document: dict[str, Any] = {
            "event": address,
            "kind": kind,
            "object": obj,
            "time": _utc(now),
        }
        headers = [("event", address), ("kind", kind), ("object", obj)]
        if principal is not None:
            document["principal"] = principal
            headers.append(("principal", principal))
        if domain is not None:
            document["domain"] = domain
            headers.append(("domain", domain))
        for key, value in details.items():
            if isinstance(value, str) and key in HEADER_FIELDS:
                headers.append((key, value))
        document["details"] = details
        raw = orjson.dumps(document)
        content = EmbeddedContent(type=JSON, value=raw.decode())
        spec = MessageSpec(
            address=address,
            props=(
                ("message_id", f"event-{self._boot}-{next(self._ids)}"),
                ("delivery_mode", "1"),
                ("type", address),
            ),
            headers=tuple(headers),
            contents=(content,),
        )
        self._busy = True
        try:
            self._route(self.feed, spec, (content,), now, False, len(raw))
        finally:
            self._busy = False
        self.sent += 1

    # ------------------------------------------------------------ events by object
    def feed_event(self, what: str, feed: Feed, reason: str | None = None) -> None:
        if feed is self.feed or not self.listening():
            return
        details: dict[str, Value] = {"type": feed.type, "private": feed.name is None}
        if reason is not None:
            details["reason"] = reason
        self.emit(f"feed.{what}", feed_label(feed), feed.owner or None, feed.domain.name, details)

    def pipe_event(self, what: str, pipe: Pipe, reason: str | None = None) -> None:
        if not self.listening():
            return
        details: dict[str, Value] = {"type": pipe.type, "webhook": pipe.hook is not None}
        if reason is not None:
            details["reason"] = reason
        self.emit(f"pipe.{what}", digest(pipe.key), pipe.owner, pipe.domain.name, details)

    def join_event(self, what: str, join: Join, reason: str | None = None) -> None:
        if join.is_default or not self.listening():
            return  # a default join comes and goes with its pipe
        details: dict[str, Value] = {
            "feed": feed_label(join.feed),
            "pipe": digest(join.pipe.key),
            "address": join.spec.address,
        }
        if reason is not None:
            details["reason"] = reason
        owner = join.pipe.owner
        self.emit(f"join.{what}", digest(join.key), owner, join.feed.domain.name, details)

    def pipe_full(self, pipe: Pipe, feed: Feed, size: int) -> None:
        """A message found the pipe over its limits (Q2); coalesced per pipe."""
        if feed is self.feed or not self.listening():
            return  # an event that does not fit makes no event of its own
        details: dict[str, Value] = {
            "policy": pipe.overflow,
            "feed": feed_label(feed),
            "messages": len(pipe.messages) + pipe.spilled,
            "max_messages": pipe.max_messages,
            "bytes": pipe.bytes + pipe.spilled_bytes,
            "max_bytes": pipe.max_bytes,
            "size": size,
        }
        obj = digest(pipe.key)
        self.emit("pipe.full", obj, pipe.owner, pipe.domain.name, details, coalesce=True)

    def dead_letter(
        self,
        pipe: Pipe,
        origin: str | None,
        address: str | None,
        message_id: str | None,
        reason: str,
        target: str | None,
    ) -> None:
        """A message left a pipe for a dead-letter feed (``target`` None: discarded,
        nowhere to go); coalesced per pipe."""
        if origin == self.feed.key or not self.listening():
            return  # a dead event makes no event
        details: dict[str, Value] = {
            "reason": reason,
            "feed": origin,
            "address": address,
            "message_id": message_id,
            "outcome": "dead-lettered" if target is not None else "discarded",
            "dead_letter_feed": target,
        }
        obj = digest(pipe.key)
        self.emit(
            "message.dead-lettered", obj, pipe.owner, pipe.domain.name, details, coalesce=True
        )

    def webhook_failing(self, pipe: Pipe, status: str, error: str, attempt: int) -> None:
        """A webhook pipe's receiver failed an attempt, or its verification; coalesced
        per pipe (the callback URL is never shown: it may carry a token)."""
        if not self.listening():
            return
        details: dict[str, Value] = {
            "status": status,
            "error": error[:MAX_TEXT],
            "attempt": attempt,
        }
        obj = digest(pipe.key)
        self.emit("webhook.failing", obj, pipe.owner, pipe.domain.name, details, coalesce=True)

    def bridge(self, kind: str, name: str, what: str, given: Mapping[str, str]) -> None:
        """A bridge's link came up, went down, or reported an error (errors coalesced
        per bridge). URLs come redacted, as the bridge's status shows them."""
        if not self.listening():
            return
        details: dict[str, Value] = {"bridge": name, **given}
        if "error" in details:
            details["error"] = given["error"][:MAX_TEXT] or None
        self.emit(f"bridge.{kind}.{what}", name, None, None, details, coalesce=what == "error")

    def auth_failed(self, scheme: str, peer: str | None, reason: str) -> None:
        """A request's credentials were refused (401); coalesced per scheme, so a
        guesser makes at most one event per scheme and interval, whatever it sends."""
        if not self.listening():
            return
        details: dict[str, Value] = {"scheme": scheme, "peer": peer, "reason": reason[:MAX_TEXT]}
        self.emit("auth.failed", scheme, None, None, details, coalesce=True)


# Detail fields that are also message headers, for headers-feed style selection.
HEADER_FIELDS = frozenset(
    ("type", "reason", "feed", "pipe", "bridge", "state", "policy", "outcome", "scheme", "status")
)


def feed_label(feed: Feed) -> str:
    """A public feed's name; a private feed's digest (its key is a capability)."""
    return feed.name if feed.name is not None else digest(feed.key)


def _utc(now: float) -> str:
    seconds = time.gmtime(now)
    millis = int((now % 1) * 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", seconds) + f".{millis:03d}Z"
