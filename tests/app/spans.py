"""The spans a traced gateway in this test process makes, kept in memory.

OpenTelemetry's tracer provider is set once per process (as ``main.py serve`` sets it
in :func:`gateway.server.tracing.start`); the tests that trace set this one, whose
processor hands every ended span to an in-memory exporter they read and clear.
"""

from __future__ import annotations

from collections.abc import Iterator

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

EXPORTER = InMemorySpanExporter()
PROVIDER = TracerProvider()
PROVIDER.add_span_processor(SimpleSpanProcessor(EXPORTER))

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE}-{PARENT}-01"


def recorded() -> Iterator[InMemorySpanExporter]:
    """For a ``spans`` fixture: the exporter the gateways of a test export to, emptied
    before and after it."""
    if trace.get_tracer_provider() is not PROVIDER:
        trace.set_tracer_provider(PROVIDER)  # once a process: a second would be refused
    assert trace.get_tracer_provider() is PROVIDER, "another tracer provider was set first"
    EXPORTER.clear()
    yield EXPORTER
    EXPORTER.clear()


def named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [span for span in exporter.get_finished_spans() if span.name == name]


def trace_id(span: ReadableSpan) -> str:
    return trace.format_trace_id(span.context.trace_id)


def span_id(span: ReadableSpan) -> str:
    return trace.format_span_id(span.context.span_id)


def parent_id(span: ReadableSpan) -> str | None:
    return None if span.parent is None else trace.format_span_id(span.parent.span_id)


def traceparent_of(headers: list[dict[str, str]]) -> str:
    """The ``traceparent`` among a message document's headers."""
    (found,) = [h["value"] for h in headers if h["name"] == "traceparent"]
    return found
