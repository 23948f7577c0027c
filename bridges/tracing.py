"""W3C trace context in message headers: one trace follows a message across hops.

Theory of operation
-------------------
With tracing on (docs/TRACING.md), a message carries the context of the span that
published it in two of its own headers, ``traceparent`` and ``tracestate`` (W3C Trace
Context, the names its HTTP header binding uses, lowercase). Message headers travel
everywhere a message goes: AMQP application properties, the ZeroMQ envelope's ``"h"``,
the webhook document, a federation publish. So each hop that moves a message starts its
span as a child of the context the message carries, and writes its own span's context
into the headers before the message goes on: the consumer's side continues the
publisher's trace.

With tracing off nothing here runs: whoever would call it holds no tracer (None) and
checks that first, so messages are not touched and no span is made.

This module uses the OpenTelemetry API alone; the SDK (what records and exports spans)
is the gateway's business, configured once per process (:mod:`gateway.server.tracing`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, Span, SpanKind, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from restms.specs import MessageSpec

Headers = tuple[tuple[str, str], ...]
CARRIED = frozenset(("traceparent", "tracestate"))
W3C = TraceContextTextMapPropagator()  # W3C alone, whatever OTEL_PROPAGATORS says
SYSTEM = "restms"  # messaging.system of every span the gateway makes about messages


def carries(headers: Headers) -> bool:
    """Whether a message has a ``traceparent`` header (valid or not): a cheap first look."""
    return any(name.lower() == "traceparent" for name, _ in headers)


def carried(headers: Headers) -> Context | None:
    """The context a message carries in its headers, None when none valid."""
    if not headers:
        return None
    carrier = {name.lower(): value for name, value in headers if name.lower() in CARRIED}
    if "traceparent" not in carrier:
        return None
    context = W3C.extract(carrier)
    return context if trace.get_current_span(context).get_span_context().is_valid else None


def link_to(headers: Headers) -> Link | None:
    """A link to the context a message carries (what a batch's span points to)."""
    context = carried(headers)
    if context is None:
        return None
    return Link(trace.get_current_span(context).get_span_context())


def links(specs: Iterable[MessageSpec], limit: int = 128) -> list[Link]:
    """Links to the contexts the first ``limit`` messages carry."""
    found: list[Link] = []
    for spec in specs:
        if not spec.headers:  # most messages: nothing to look at
            continue
        link = link_to(spec.headers)
        if link is not None:
            found.append(link)
            if len(found) == limit:
                break
    return found


def context_headers(span: Span) -> Headers:
    """``span``'s context as message headers (none for an invalid span)."""
    carrier: dict[str, str] = {}
    W3C.inject(carrier, trace.set_span_in_context(span))
    return tuple(carrier.items())


def carrying(spec: MessageSpec, span: Span) -> MessageSpec:
    """``spec`` with ``span``'s context in its headers, instead of what it carried."""
    return with_headers(spec, context_headers(span))


def with_headers(spec: MessageSpec, context: Headers) -> MessageSpec:
    """``spec`` with the trace context headers ``context`` instead of its own."""
    if not context:  # an invalid span (none made) has no context to give
        return spec
    kept = tuple((name, value) for name, value in spec.headers if name.lower() not in CARRIED)
    return MessageSpec(
        address=spec.address, props=spec.props, headers=kept + context, contents=spec.contents
    )


def hop(
    tracer: Tracer,
    name: str,
    kind: SpanKind,
    spec: MessageSpec,
    attributes: Mapping[str, str | int] | None = None,
) -> MessageSpec:
    """One message moved by a bridge: a span (``kind`` PRODUCER going out, CONSUMER coming
    in), child of the context the message carries, ended at once (the hop hands the
    message on; acceptance comes later and is counted, not traced), and the message
    carrying that span's context onward."""
    span = tracer.start_span(
        name,
        context=carried(spec.headers),
        kind=kind,
        attributes={"messaging.system": SYSTEM, **(attributes or {})},
    )
    span.end()
    return carrying(spec, span)
