"""The engine service's values as RestTL documents (digest §2.3): what each GET, PUT and POST shows.

Top-level elements carry no ``href`` of their own; children always do (G4). URIs
are absolute, built for the request's own host (U4).
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterable
from datetime import UTC, datetime

import orjson

from feeds.service import (
    Blob,
    DomainInfo,
    FeedInfo,
    Gap,
    JoinInfo,
    Listing,
    Message,
    Part,
    PipeInfo,
    Webhook,
    WebhookProgress,
)
from restms.document import NOT_XML, ROOT, Document, Element
from restms.specs import (
    AMQP9_PROFILE,
    DEFAULTS_PROFILE,
    EXTENSION_PROFILE,
    EmbeddedContent,
    MessageSpec,
)
from restms.uris import Base, split_path


def doc(*elements: Element) -> Document:
    return Document(elements=elements)


def feed_uri(base: Base, feed: FeedInfo) -> str:
    return base.feed(feed.key) if feed.name is not None else base.resource(feed.key)


def profiles(base: Base) -> list[Element]:
    extension_href = base.root.removesuffix("/restms/") + "/profile/x-gateway"
    return [
        Element("profile", {"name": name, "href": href})
        for name, href in (DEFAULTS_PROFILE, AMQP9_PROFILE, (EXTENSION_PROFILE, extension_href))
    ]


def domain(
    base: Base,
    d: DomainInfo,
    feeds: Iterable[FeedInfo],
    shown: Callable[[FeedInfo], bool] | None = None,
) -> Document:
    """G13, F1, F14: profiles and every public feed of ``feeds`` (the domain's, the
    default feed's in every domain) that ``shown`` lets the reader see."""
    listed = [f for f in feeds if shown is None or shown(f)]
    children = profiles(base) + [_feed_attrs(base, f, href=True) for f in listed]
    return doc(Element("domain", {"name": d.name, "title": d.title}, tuple(children)))


def _feed_attrs(base: Base, feed: FeedInfo, *, href: bool) -> Element:
    attrs = {}
    if feed.name is not None:
        attrs["name"] = feed.name
    attrs["type"] = feed.type
    attrs["title"] = feed.title or ""
    attrs["license"] = feed.license or ""
    if href:
        attrs["href"] = feed_uri(base, feed)
    return Element("feed", attrs)


def feed(base: Base, f: FeedInfo) -> Document:
    return doc(_feed_attrs(base, f, href=False))


def _join_attrs(base: Base, join: JoinInfo, *, href: bool) -> dict[str, str]:
    attrs = {"href": base.resource(join.key)} if href else {}
    attrs["type"] = join.type
    attrs["address"] = join.address
    attrs["feed"] = base.feed(join.feed) if join.feed_public else base.resource(join.feed)
    return attrs


def _headers(pairs: Iterable[tuple[str, str]]) -> tuple[Element, ...]:
    return tuple(Element("header", {"name": n, "value": v}) for n, v in pairs)


def join(base: Base, j: JoinInfo) -> Document:
    return doc(Element("join", _join_attrs(base, j, href=False), _headers(j.headers)))


def message_uri(base: Base, pipe: str, seq: int) -> str:
    return base.resource(f"{pipe}.{seq}")


def pipe(base: Base, p: PipeInfo, listing: Listing, *, secret: str | None = None) -> Document:
    """A1, A8: joins, listed messages, then the asynclet (unless the listing is capped).

    ``secret``: a webhook pipe's secret, shown in the reply to its create only."""
    children = [
        Element("join", _join_attrs(base, j, href=True), _headers(j.headers)) for j in p.joins
    ]
    for m in listing.messages:
        attrs = {"href": message_uri(base, p.key, m.position), "address": m.spec.address}
        message_id = m.spec.prop("message_id")
        if message_id:
            attrs["message_id"] = message_id
        children.append(Element("message", attrs))
    if listing.asynclet is not None:
        href = message_uri(base, p.key, listing.asynclet)
        children.append(Element("message", {"href": href, "async": "1"}))
    attrs = {"name": p.key, "type": p.type, "title": p.title or "", **settings(base, p)}
    if secret is not None:
        attrs["secret"] = secret
    return doc(Element("pipe", attrs, tuple(children)))


# The response header that names the oldest position a pipe holds now (the asynclet
# when it holds none): on every GET of a pipe, and on a GET of a message at a position
# before it (gone: acknowledged, or lost).
EARLIEST = "RestMS-Earliest-Position"


def gap(g: Gap) -> dict[str, int]:
    """What SSE's ``gap`` event and the WebSocket's ``gap`` frame say of lost messages."""
    return {"first": g.first, "last": g.last, "earliest": g.earliest}


def settings(base: Base, p: PipeInfo) -> dict[str, str]:
    """Our extension attributes: the pipe's delivery settings, defaults filled in."""
    where = split_path(p.dead_letter) if p.dead_letter else None
    if where is None:
        dead_letter = ""
    else:
        dead_letter = base.feed(where[1]) if where[0] == "feed" else base.resource(where[1])
    shown = {
        "durable": "1" if p.durable else "0",
        "lease": _seconds(p.lease),
        "max_deliveries": str(p.max_deliveries),
        "dead_letter": dead_letter,
        "max_messages": str(p.max_messages),
        "max_bytes": str(p.max_bytes),
        "overflow": p.overflow,
    }
    if p.webhook is None or p.progress is None:
        return shown
    return shown | _webhook(p, p.webhook, p.progress)


def _webhook(p: PipeInfo, hook: Webhook, progress: WebhookProgress) -> dict[str, str]:
    """A webhook pipe's options (never its secret) and delivery state (docs/WEBHOOKS.md)."""
    options = hook.options
    return {
        "callback": options.callback or "",
        "concurrency": str(options.concurrency),
        "timeout": _seconds(options.timeout or 0),
        "max_attempts": str(options.max_attempts),
        "max_age": _seconds(options.max_age or 0),
        "state": hook.state.state,
        "pending": str(p.held),
        "attempts": str(progress.attempts),
        "next_attempt": _when(progress.next_attempt),
        "last_attempt": _when(progress.last_attempt),
        "last_status": progress.last_status,
        "last_error": progress.last_error,
        "failures": str(hook.state.failures),
        "delivered": str(hook.state.delivered),
        "dead_lettered": str(hook.state.dead_lettered),
    }


def _seconds(value: float) -> str:
    return f"{value:.3f}".rstrip("0").rstrip(".")


def _when(wall: float | None) -> str:
    """A wall-clock time as RFC 3339 UTC, to the second ("" for none)."""
    if wall is None:
        return ""
    return datetime.fromtimestamp(wall, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def delivered_element(
    base: Base, m: Message, *, href: bool = False, embed: bool = False
) -> Element:
    """D1, D6, D7, D8: the message as posted, with a content URI per delivered copy.

    With ``embed``, staged contents are embedded instead of linked (D3): readers that
    cannot come back for a link (stream pipes) get the bytes in the document.
    """
    return _message(base, m.pipe, m.position, m.spec, m.redeliveries, m.feed, m.parts, href, embed)


def _message(
    base: Base,
    pipe: str,
    seq: int,
    spec: MessageSpec,
    redeliveries: int,
    feed: str | None,
    parts: Iterable[Part],
    href: bool,
    embed: bool,
) -> Element:
    attrs = {"href": base.resource(f"{pipe}.{seq}")} if href else {}
    attrs["address"] = spec.address
    attrs.update(spec.props)
    if redeliveries:
        attrs["delivery_count"] = str(redeliveries)  # leases that ran out before this one
    if feed is not None:
        attrs["feed"] = base.feed(feed)
    children = list(_headers(spec.headers))
    for index, part in enumerate(parts):
        if part is None:
            continue
        if isinstance(part, EmbeddedContent):
            children.append(
                Element("content", {"type": part.type, "encoding": part.encoding}, (), part.value)
            )
        elif embed:
            children.append(_embedded(part))
        else:
            children.append(
                Element(
                    "content",
                    {"href": base.resource(f"{pipe}.{seq}.{index}"), "type": part.content_type},
                )
            )
    return Element("message", attrs, tuple(children))


def delivered_json(base: Base, m: Message, *, href: bool = False) -> bytes:
    """The JSON document of :func:`delivered_element` (contents linked, not embedded),
    as :func:`restms.to_json` encodes it (J1-J5), built without the element tree: a
    reader sent each message as a document of its own (an SSE event) spends a third
    of the time on it this way."""
    spec = m.spec
    message: dict[str, object] = {"href": base.resource(f"{m.pipe}.{m.position}")} if href else {}
    message["address"] = spec.address
    message.update(spec.props)
    if m.redeliveries:
        message["delivery_count"] = str(m.redeliveries)
    if m.feed is not None:
        message["feed"] = base.feed(m.feed)
    if spec.headers:
        message["header"] = [{"name": n, "value": v} for n, v in spec.headers]
    contents: list[dict[str, str]] = []
    for index, part in enumerate(m.parts):
        if isinstance(part, EmbeddedContent):
            contents.append({"type": part.type, "encoding": part.encoding, "value": part.value})
        elif part is not None:
            link = base.resource(f"{m.pipe}.{m.position}.{index}")
            contents.append({"href": link, "type": part.content_type})
    if contents:
        message["content"] = contents
    return orjson.dumps({ROOT: {"message": [message]}})


def _embedded(blob: Blob) -> Element:
    """D3: plain text stays plain; anything else travels as base64."""
    if blob.content_type.lower().startswith("text/"):
        try:
            text = blob.data.decode("utf-8")
        except UnicodeDecodeError:
            pass
        else:
            if not NOT_XML.search(text):
                return Element(
                    "content", {"type": blob.content_type, "encoding": "plain"}, (), text
                )
    value = base64.b64encode(blob.data).decode("ascii")
    return Element("content", {"type": blob.content_type, "encoding": "base64"}, (), value)


def message(base: Base, m: Message) -> Document:
    return doc(delivered_element(base, m))
