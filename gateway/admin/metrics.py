"""``GET /metrics``: the gateway's state in the Prometheus text format (docs/METRICS.md).

Theory of operation
-------------------
The hot path pays for almost nothing here. The engine, the store, bridges, the
mirror and webhooks already count what they do in plain integers; :class:`Gauges`, a
Prometheus collector, reads those counts when a scraper asks and turns them into
samples then. The engine's figures come as one value, the engine service's
:class:`~feeds.service.Stats`: a coroutine (another engine answers it over the
network), so the handler awaits it first and the collector, which Prometheus calls
synchronously, renders that value. The one thing counted per request is its reply: the middleware
(:mod:`gateway.server.middleware`) hands :meth:`Requests.record` the route, method, status
and duration, which go into plain dicts (a dict increment, a bisect and a list
increment: no lock, no Prometheus object, no label lookup).

Labels are bounded and never carry a capability: a request is labelled by its
route's *template* (``/restms/resource/{name}``), never by its path (a private
pipe's name is the capability to read it), a method aiohttp does not know becomes
``other``, and a status is one of a few hundred numbers. Bridges are labelled by
their names, which an administrator chose; pipes are counted by type, never named.

Each app has registries of its own (no global default registry), so several gateways
in one process (tests) do not collide. The process collectors (CPU, memory, file
descriptors, GC) read ``/proc``: they are collected in a worker thread, apart from
the gateway's own gauges, which read loop-owned state and are collected on the loop.

Who may scrape: ``metrics_access`` (docs/METRICS.md, "Access") is ``scope`` (an
unqualified ``restms:metrics`` or ``restms:admin``), ``loopback`` (any request from
this host that no proxy relayed, else the scope) or ``open`` (anyone).
"""

from __future__ import annotations

import asyncio
import bisect
from collections import defaultdict
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, TypeVar

from aiohttp import web
from prometheus_client import (
    CollectorRegistry,
    GCCollector,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
    SummaryMetricFamily,
)
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.registry import Collector

from bridges.base import STATES
from feeds.service import Census, Histogram, Stats
from gateway.admin.bridging import BRIDGES
from gateway.admin.mirroring import MIRROR
from gateway.auth.authn import AUTH, PRINCIPAL, WAIT_KINDS, authenticate, is_relayed
from gateway.restms.websocket import CLOSES
from gateway.server.keys import SERVICE
from gateway.server.shutdown import IN_FLIGHT
from gateway.server.state import STATE
from restms.errors import InsufficientScope, RestMSError, TooManyRequests, Unauthorized

if TYPE_CHECKING:
    from aiohttp.web_urldispatcher import AbstractRoute

PATH = "/metrics"
SCOPE = "restms:metrics"
# Request duration buckets (seconds, upper bounds): a publish takes well under a
# millisecond; asynclets, evented GETs and streams wait up to max_wait or stream_max.
BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
METHODS = frozenset(("GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "PATCH"))
UNMATCHED = "(unmatched)"  # a request no route serves (404, or 405 for a path served)
DURATION = "restms_http_request_duration_seconds"
_F = TypeVar("_F", CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily)


class _Route:
    """One route and method: replies by status, and the duration histogram."""

    __slots__ = ("buckets", "seconds", "statuses")

    def __init__(self) -> None:
        self.statuses: defaultdict[int, int] = defaultdict(int)
        self.buckets = [0] * (len(BUCKETS) + 1)  # the last: above every bound
        self.seconds = 0.0


class Requests:
    """Replies by route, method and status, their durations, and auth refusals.

    Keyed by the route *object* (its template is read at scrape time), so the per
    request cost is a tuple, a dict lookup, a bisect and three increments.
    """

    __slots__ = ("_routes", "refusals")

    def __init__(self) -> None:
        self._routes: dict[tuple[AbstractRoute | None, str], _Route] = {}
        self.refusals = dict.fromkeys(("unauthorized", "insufficient_scope", "rate_limited"), 0)

    def record(self, route: AbstractRoute | None, method: str, status: int, seconds: float) -> None:
        """Count a reply on ``route`` (None: a request no route serves)."""
        entry = self._routes.get((route, method))
        if entry is None:
            entry = self._entry(route, method)
        entry.statuses[status] += 1
        entry.buckets[bisect.bisect_left(BUCKETS, seconds)] += 1
        entry.seconds += seconds

    def _entry(self, route: AbstractRoute | None, method: str) -> _Route:
        """The counts of ``method`` on ``route``, made on its first reply. Any token is a
        method to aiohttp: the others than METHODS are counted as one, "other" (so they
        miss the lookup in :meth:`record` and come here each time, which only they pay)."""
        key = (route, method if method in METHODS else "other")
        entry = self._routes.get(key)
        if entry is None:
            entry = self._routes[key] = _Route()
        return entry

    def refused(self, exc: RestMSError | web.HTTPException) -> None:
        """Count an authentication or authorization refusal (called on errors only)."""
        if isinstance(exc, Unauthorized):
            self.refusals["unauthorized"] += 1
        elif isinstance(exc, InsufficientScope):
            self.refusals["insufficient_scope"] += 1
        elif isinstance(exc, TooManyRequests):
            self.refusals["rate_limited"] += 1

    def families(self) -> Iterator[Metric]:
        total = _labelled(CounterMetricFamily, "restms_http_requests", "route", "method", "status")
        duration = _labelled(HistogramMetricFamily, DURATION, "route", "method")
        for (route, method), entry in list(self._routes.items()):
            template = _template(route)
            for status, count in sorted(entry.statuses.items()):
                total.add_metric((template, method, str(status)), count)
            buckets = _cumulative(BUCKETS, entry.buckets)
            duration.add_metric((template, method), buckets, entry.seconds)
        refused = _labelled(CounterMetricFamily, "restms_auth_failures", "reason")
        for reason, count in self.refusals.items():
            refused.add_metric((reason,), count)
        yield from (total, duration, refused)


def _template(route: AbstractRoute | None) -> str:
    resource = route.resource if route is not None else None
    return UNMATCHED if resource is None else resource.canonical


def _bound(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(float(bound))


# Engine counters (feeds.config.Counters): field -> (metric name, help)
ENGINE_COUNTERS = {
    "published": ("restms_messages_published", "Messages accepted by feeds (duplicates not)"),
    "routed": ("restms_messages_routed", "Copies of messages placed in pipes"),
    "queued": ("restms_messages_queued", "Messages that waited in a rotator or service feed"),
    "delivered": (
        "restms_messages_delivered",
        "Copies handed to readers: GETs, SSE, stream pipes, WebSockets, webhooks",
    ),
    "acknowledged": ("restms_messages_acknowledged", "Messages removed from pipes by acks"),
    "redelivered": ("restms_messages_redelivered", "Leases that ran out (delivered again)"),
    "dead_lettered": ("restms_messages_dead_lettered", "Messages sent to a dead-letter feed"),
    "dead_discarded": ("restms_messages_dead_discarded", "Dead letters with nowhere to go"),
    "duplicates": ("restms_messages_duplicate", "Messages absorbed by a message_id window"),
    "skipped_full": ("restms_messages_skipped_full", "Copies not placed: the pipe was full"),
    "rejected_full": ("restms_publishes_rejected_full", "Publishes refused by a full pipe"),
    "dropped_oldest": ("restms_messages_dropped_oldest", "Messages dropped to make room"),
    "expired": ("restms_messages_expired", "Messages that expired in pipes"),
    "requeued": ("restms_messages_requeued", "Messages a deleted pipe gave back to its feed"),
    "discarded": ("restms_messages_discarded", "Queued messages lost with their feed"),
    "spilled": ("restms_messages_spilled", "Messages that went to disk past the memory budget"),
    "paged_in": ("restms_messages_paged_in", "Messages read back from disk"),
    "staged": ("restms_contents_staged", "Contents staged on feeds"),
    "staged_expired": ("restms_contents_staged_expired", "Staged contents that expired"),
    "collected": ("restms_pipes_collected", "Idle pipes collected"),
    "hook_delivered": ("restms_webhook_deliveries", "Webhook deliveries a receiver took (2xx)"),
    "hook_failed": ("restms_webhook_failures", "Webhook attempts that failed (tried again)"),
    "hook_dead": ("restms_webhook_given_up", "Webhook messages given up on"),
    "withdrawn": (
        "restms_messages_withdrawn",
        "Copies taken back unread: their publish's commit failed (503)",
    ),
}


class Gauges(Collector):
    """Everything but the process, read from the app at scrape time (the engine's
    figures from :attr:`stats`, the value the handler took just before)."""

    def __init__(self, app: web.Application) -> None:
        self._app = app
        self.stats: Stats | None = None  # the engine's, taken just before a collection

    def collect(self) -> Iterator[Metric]:
        app = self._app
        yield from app[REQUESTS].families()
        yield _gauge(
            "restms_http_requests_in_flight", "Requests being handled", len(app[IN_FLIGHT])
        )
        waiting = _labelled(GaugeMetricFamily, "restms_waiting_requests", "kind")
        held = app[AUTH].open_waits
        for kind in WAIT_KINDS:
            waiting.add_metric((kind,), held[kind])
        yield waiting
        closes = _labelled(CounterMetricFamily, "restms_websocket_closes", "code")
        for code, count in sorted(app[CLOSES].items()):
            closes.add_metric((str(code),), count)
        yield closes
        if self.stats is not None:
            yield from _engine(self.stats)
        yield from self._store()
        yield from self._bridges()
        yield from self._mirror()

    def _store(self) -> Iterator[Metric]:
        store = self.stats.store if self.stats is not None else None
        if store is None:  # an engine that keeps nothing
            return
        yield _gauge("restms_store_up", "1 while the store's writer runs", int(store.running))
        yield _gauge(
            "restms_store_failing", "1 while the last transaction failed", int(store.failing)
        )
        yield CounterMetricFamily(
            "restms_store_commits", "Transactions committed", value=store.commits
        )
        yield CounterMetricFamily(
            "restms_store_batches",
            "Batches of changes committed (batches/commits: the group-commit factor)",
            value=store.batches,
        )
        yield CounterMetricFamily(
            "restms_store_commit_failures", "Transactions rolled back", value=store.failures
        )
        commit = SummaryMetricFamily(
            "restms_store_commit_seconds",
            "Time in transactions, failed ones included",
            count_value=store.commits + store.failures,
            sum_value=store.commit_seconds,
        )
        yield commit
        yield _gauge("restms_store_queue", "Batches waiting for the writer thread", store.waiting)

    def _bridges(self) -> Iterator[Metric]:
        state = _labelled(GaugeMetricFamily, "restms_bridge_state", "bridge", "kind", "state")
        backlog = _labelled(GaugeMetricFamily, "restms_bridge_backlog", "bridge")
        lag = _labelled(GaugeMetricFamily, "restms_bridge_lag_seconds", "bridge")
        counted: dict[str, CounterMetricFamily] = {}
        for bridge in self._app[BRIDGES]:
            status = bridge.status()
            name, kind = bridge.name, str(status.get("kind", ""))
            for known in STATES:
                state.add_metric((name, kind, known), int(status["state"] == known))
            backlog.add_metric((name,), bridge.backlog())
            if "lag_seconds" in status:  # federation links
                lag.add_metric((name,), status["lag_seconds"])
            for field, value in status["counters"].items():
                family = counted.get(field)
                if family is None:
                    family = counted[field] = CounterMetricFamily(
                        f"restms_bridge_{field}",
                        f"A bridge's {field.replace('_', ' ')} count (docs/METRICS.md)",
                        labels=("bridge",),
                    )
                family.add_metric((name,), value)
        yield state
        yield backlog
        yield lag
        yield from counted.values()

    def _mirror(self) -> Iterator[Metric]:
        mirror = self._app.get(MIRROR)
        yield _gauge("restms_mirror_enabled", "1 when the traffic mirror is on", int(bool(mirror)))
        if mirror is None:
            return
        status = mirror.status()
        yield _gauge("restms_mirror_queued", "Events waiting for the writer", status["queued"])
        for field, text in (
            ("emitted", "Events the engine offered the mirror"),
            ("dropped", "Events dropped: the mirror's queue was full"),
            ("written", "Events written to the lake"),
            ("files", "Lake files closed"),
            ("bytes", "Bytes of lake files closed"),
            ("errors", "Writer errors (the writer process was replaced)"),
            ("lost", "Events lost with a failed writer"),
        ):
            yield CounterMetricFamily(f"restms_mirror_{field}", text, value=status[field])


def _engine(stats: Stats) -> Iterator[Metric]:
    yield _gauge("restms_shutting_down", "1 once shutdown has begun", int(stats.closing))
    for field, (name, text) in ENGINE_COUNTERS.items():
        yield CounterMetricFamily(name, text, value=stats.counter(field))
    yield _latency(stats.latency)
    yield from _census(stats.census)
    yield _gauge("restms_webhook_pipes", "Webhook pipes", stats.census.webhook_pipes)


# The help of the families with labels (see the tables in docs/METRICS.md).
HELP = {
    "restms_http_requests": "HTTP replies by route template, method and status",
    DURATION: (
        "Time from a request's arrival in the middleware to its reply (for asynclets, evented "
        "GETs, SSE, stream pipes and WebSockets: the whole wait or stream)"
    ),
    "restms_auth_failures": (
        "Requests refused for their credentials (401), a missing scope (403) or a rate or "
        "concurrency limit (429)"
    ),
    "restms_waiting_requests": (
        "Requests holding a wait slot now: asynclets, evented GETs, SSE and stream-pipe "
        "readers, WebSockets"
    ),
    "restms_websocket_closes": (
        "WebSockets the gateway closed, by close code (1011: a fault, logged with its trace)"
    ),
    "restms_bridge_state": "1 for the state a bridge's link is in",
    "restms_bridge_backlog": "Messages waiting on the gateway side of a bridge",
    "restms_bridge_lag_seconds": "Seconds the oldest message a federation link holds has waited",
    "restms_pipes": "Pipes by type",
}


def _labelled(kind: type[_F], name: str, *labels: str) -> _F:
    return kind(name, HELP[name], labels=labels)


def _latency(latency: Histogram) -> HistogramMetricFamily:
    return HistogramMetricFamily(
        "restms_delivery_latency_seconds",
        "From a message's arrival in its pipe to each copy handed to a reader (a "
        "redelivery counts again, from the same arrival)",
        buckets=_cumulative(latency.bounds, latency.counts),
        sum_value=latency.total,
    )


def _cumulative(bounds: tuple[float, ...], counts: Sequence[int]) -> list[tuple[str, float]]:
    """Per-bucket counts (the last above every bound) as Prometheus' cumulative ones."""
    running, buckets = 0, []
    for bound, count in zip((*bounds, float("inf")), counts, strict=True):
        running += count
        buckets.append((_bound(bound), float(running)))
    return buckets


def _gauge(name: str, text: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, text, value=value)


def _census(census: Census) -> Iterator[Metric]:
    pipes = _labelled(GaugeMetricFamily, "restms_pipes", "type")
    for kind, count in census.pipes:  # sorted by type
        pipes.add_metric((kind or "default",), count)  # the default type is ""
    yield pipes
    yield _gauge("restms_feeds", "Feeds, public and private", census.feeds)
    yield _gauge("restms_joins", "Joins, default joins included", census.joins)
    in_memory = census.messages - census.on_disk
    yield _gauge("restms_pipe_messages", "Messages pipes hold in memory", in_memory)
    yield _gauge("restms_pipe_messages_on_disk", "Messages pipes hold on disk", census.on_disk)
    yield _gauge("restms_pipe_depth_max", "The most messages one pipe holds", census.deepest)
    yield _gauge("restms_feed_queued_messages", "Messages waiting in feed queues", census.queued)
    yield _gauge(
        "restms_feed_queued_bytes", "Bytes of messages in feeds' queues", census.queued_bytes
    )
    yield _gauge(
        "restms_feed_queued_on_disk", "Queued messages waiting on disk", census.queued_on_disk
    )
    yield _gauge("restms_pipe_bytes", "Estimated bytes of messages in memory", census.held_bytes)
    yield _gauge("restms_staged_bytes", "Bytes of staged contents", census.staged_bytes)


class Metrics:
    """An app's registries: its own gauges (collected on the loop) and the process's
    (collected in a worker thread: they read ``/proc``)."""

    def __init__(self, app: web.Application) -> None:
        self.gateway = CollectorRegistry(auto_describe=False)
        self.gauges = Gauges(app)
        self.gateway.register(self.gauges)
        self.process = CollectorRegistry(auto_describe=False)
        ProcessCollector(registry=self.process)
        PlatformCollector(registry=self.process)
        GCCollector(registry=self.process)

    async def exposition(self, stats: Stats) -> bytes:
        """The text of a scrape, the engine's figures from ``stats``."""
        # No await between setting and collecting: no other scrape's value can slip in.
        self.gauges.stats = stats
        try:
            own = generate_latest(self.gateway)
        finally:
            self.gauges.stats = None
        return own + await asyncio.to_thread(generate_latest, self.process)


REQUESTS = web.AppKey("requests", Requests)
METRICS = web.AppKey("metrics", Metrics)


async def may_scrape(request: web.Request) -> None:
    """Raise 401/403 unless ``metrics_access`` lets this request scrape."""
    access = request[STATE].config.metrics_access
    if access == "open":
        return
    authenticator = request[STATE].auth
    if access == "loopback" and authenticator.guests.trusted(
        request.remote, is_relayed(request.headers)
    ):
        return
    pending = authenticate(request, authenticator, always=True)
    if pending is not None:  # credentials to check
        await pending
    if not request[PRINCIPAL].grants.unqualified("metrics"):
        raise InsufficientScope(
            "metrics need the restms:metrics (or restms:admin) scope, unqualified", SCOPE
        )


async def metrics(request: web.Request) -> web.Response:
    await may_scrape(request)
    stats = await request.app[SERVICE].stats()
    body = await request.app[METRICS].exposition(stats)
    return web.Response(
        body=body, headers={"Content-Type": CONTENT_TYPE_PLAIN_0_0_4, "Cache-Control": "no-store"}
    )


def add_routes(app: web.Application) -> None:
    app[REQUESTS] = Requests()
    app[METRICS] = Metrics(app)
    app.router.add_get(PATH, metrics)
