"""OpenTelemetry tracing: the process's tracer provider, the request span, engine spans.

Theory of operation (docs/TRACING.md)
-------------------------------------
Off by default (``tracing = false``): then nothing here is called on the hot path. The
middleware makes no span, the engine is not wrapped, bridges and webhook workers hold
no tracer (None) and check that before anything else; the SDK is not even imported.

On (``tracing = true``), :func:`start` gives the process a tracer provider (the SDK's,
set as OpenTelemetry's global one, as logging is configured once per process) that
samples new traces at ``tracing_sample`` and follows the caller's decision for the
rest, and exports to ``otlp_endpoint`` over OTLP/HTTP when one is set (in the SDK's
batch processor thread: never on the event loop). Then:

- every request is a SERVER span (:func:`traced`), child of the request's W3C
  ``traceparent`` when it has a valid one, named after its route, with the status;
- the engine is wrapped (:class:`TracedEngine`): ``publish`` is a PRODUCER span whose
  context each message without one of its own takes into its headers
  (:mod:`bridges.tracing`), so whoever takes the message later continues this trace;
  ``read`` and a cursor's ``take`` are CONSUMER spans linked to the contexts the
  messages read carry;
- bridges, webhook attempts and federation hops make their spans from those headers
  (:mod:`bridges.tracing`, :mod:`gateway.webhooks.delivery`,
  :mod:`gateway.federation.client`).

Spans are made with the OpenTelemetry API; tests give the process a provider of their
own (an in-memory exporter) instead of :func:`start`'s.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, cast

from aiohttp import web
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, StatusCode, Tracer, format_trace_id

from bridges import tracing as messages
from feeds.service import Cursor, EngineService, Message, PublishResult
from gateway.server.config import Config
from gateway.server.requestid import given
from restms.specs import MessageSpec

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

Wrapped = Callable[[web.Request], Coroutine[Any, Any, web.StreamResponse]]
NAME = "restms.gateway"  # the instrumentation scope of every span the gateway makes

# The SDK warns with the whole value when a caller's ``traceparent`` is too long or its
# ``tracestate`` malformed (an HTTP header, or a message's own header): any client could
# write kilobytes to the log with each request. Such a value is ignored, as a bad
# ``X-Request-ID`` is, without a word (docs/TRACING.md); the SDK's errors still show.
for _quiet in ("opentelemetry.trace.span", "opentelemetry.trace.propagation.tracecontext"):
    logging.getLogger(_quiet).setLevel(logging.ERROR)


def tracer(config: Config) -> Tracer | None:
    """The tracer every part of the gateway makes its spans with; None when tracing is off."""
    return trace.get_tracer(NAME) if config.tracing else None


def start(config: Config) -> TracerProvider | None:
    """Give this process its tracer provider under ``config`` (None when tracing is off).
    Call once per process, before the app is built; :func:`stop` it last."""
    if not config.tracing:
        return None
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    provider = TracerProvider(
        resource=Resource.create({"service.name": config.tracing_service}),
        sampler=ParentBased(TraceIdRatioBased(config.tracing_sample)),
    )
    if config.otlp_endpoint:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        exporter = OTLPSpanExporter(endpoint=config.otlp_endpoint)
        provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return provider


def stop(provider: TracerProvider | None) -> None:
    """Export what is left and stop the exporter's thread (blocks: call off the loop)."""
    if provider is not None:
        provider.shutdown()


# ---------------------------------------------------------------- requests
def traced(handler: Wrapped, tracer: Tracer, route: str) -> Wrapped:
    """``handler`` (the middleware's concerns around a route) inside a SERVER span."""

    async def traced_request(request: web.Request) -> web.StreamResponse:
        parent = messages.W3C.extract(request.headers)
        name = f"{request.method} {route}"
        attributes = {"http.request.method": request.method, "http.route": route}
        with tracer.start_as_current_span(
            name, context=parent, kind=SpanKind.SERVER, attributes=attributes
        ) as span:
            response = await handler(request)
            span.set_attribute("http.response.status_code", response.status)
            if response.status >= 500:
                span.set_status(StatusCode.ERROR)
            return response

    return traced_request


def traced_id(request: web.Request) -> str:
    """The request's id with tracing on: a valid ``X-Request-ID``, else its span's trace
    id (:mod:`gateway.server.requestid`)."""
    found = given(request.headers)
    if found is not None:
        return found
    return format_trace_id(trace.get_current_span().get_span_context().trace_id)


# ---------------------------------------------------------------- the engine
def traced_engine(engine: EngineService, tracer: Tracer) -> EngineService:
    """``engine`` with spans around publish and read (see the module docstring).

    :class:`TracedEngine` defines what it traces and passes every other attribute on
    (``__getattr__``); a checker cannot see those, hence the cast."""
    return cast(EngineService, TracedEngine(engine, tracer))


class TracedEngine:
    """An engine service whose publishes and reads are spans (:func:`traced_engine`)."""

    def __init__(self, engine: EngineService, tracer: Tracer) -> None:
        self._engine = engine
        self._tracer = tracer

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    async def publish(
        self, principal: str, feed: str, messages: Sequence[MessageSpec], *, via: str | None = None
    ) -> PublishResult:
        with self._publishing(feed, messages, via) as span:
            stamped = _stamped(messages, span)
            return await self._engine.publish(principal, feed, stamped, via=via)

    async def publish_counts(
        self, principal: str, feed: str, messages: Sequence[MessageSpec]
    ) -> tuple[int, ...]:
        with self._publishing(feed, messages, None) as span:
            stamped = _stamped(messages, span)
            return await self._engine.publish_counts(principal, feed, stamped)

    async def read(
        self,
        principal: str | None,
        pipe: str,
        position: int,
        *,
        wait: float = 0.0,
        lease: bool = False,
    ) -> Message | None:
        with self._tracer.start_as_current_span(
            "restms read",
            kind=SpanKind.CONSUMER,
            attributes={"messaging.system": messages.SYSTEM, "messaging.destination.name": pipe},
        ) as span:
            message = await self._engine.read(principal, pipe, position, wait=wait, lease=lease)
            if message is not None:
                link = messages.link_to(message.spec.headers)
                if link is not None:
                    span.add_link(link.context)
            return message

    def cursor(
        self,
        principal: str | None,
        pipe: str,
        after: int = 0,
        *,
        lease: bool = False,
        via: str | None = None,
    ) -> Cursor:
        cursor = self._engine.cursor(principal, pipe, after, lease=lease, via=via)
        return cast(Cursor, TracedCursor(cursor, self._tracer, pipe))

    @contextmanager
    def _publishing(
        self, feed: str, specs: Sequence[MessageSpec], via: str | None
    ) -> Iterator[Span]:
        attributes: dict[str, str | int] = {
            "messaging.system": messages.SYSTEM,
            "messaging.destination.name": feed,
            "messaging.batch.message_count": len(specs),
        }
        if via is not None:
            attributes["restms.bridge"] = via
        with self._tracer.start_as_current_span(
            "restms publish",
            kind=SpanKind.PRODUCER,
            attributes=attributes,
            links=messages.links(specs),
        ) as span:
            yield span


def _stamped(specs: Sequence[MessageSpec], span: Span) -> list[MessageSpec]:
    """The messages, each without a valid context of its own given ``span``'s (made once;
    an invalid ``traceparent`` is replaced)."""
    context = messages.context_headers(span)
    carries, carried, with_headers = messages.carries, messages.carried, messages.with_headers
    return [
        spec if carries(spec.headers) and carried(spec.headers) else with_headers(spec, context)
        for spec in specs
    ]


class TracedCursor:
    """A cursor whose takes that bring messages are CONSUMER spans, linked to the
    contexts those messages carry. A take that waits and brings nothing (an idle
    reader's) makes no span: it would only say that nothing happened."""

    def __init__(self, cursor: Cursor, tracer: Tracer, pipe: str) -> None:
        self._cursor = cursor
        self._tracer = tracer
        self._pipe = pipe

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cursor, name)

    def __aiter__(self) -> AsyncIterator[Message]:
        return self

    async def __anext__(self) -> Message:
        message = await self._cursor.__anext__()
        self._record(time.time_ns(), (message,))
        return message

    async def take(self, limit: int, *, wait: float = 0.0) -> tuple[Message, ...]:
        began = time.time_ns()
        taken = await self._cursor.take(limit, wait=wait)
        if taken:
            self._record(began, taken)
        return taken

    def _record(self, began: int, taken: tuple[Message, ...]) -> None:
        span = self._tracer.start_span(
            "restms take",
            kind=SpanKind.CONSUMER,
            start_time=began,
            attributes={
                "messaging.system": messages.SYSTEM,
                "messaging.destination.name": self._pipe,
                "messaging.batch.message_count": len(taken),
            },
            links=messages.links(message.spec for message in taken),
        )
        span.end()
