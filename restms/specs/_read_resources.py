"""Reading what a domain POST, a pipe POST and a PUT ask for out of their documents.

A feed or pipe to create with its extension attributes (C1, C7-C10, docs/EXTENSIONS.md),
a join (G14, F9) and an update (R2, R3, L8). Unknown elements and properties are
ignored (G6); what a client got wrong is 400, too many join headers 413.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

from ..document import Document, Element
from ..errors import BadRequest, PayloadTooLarge
from ..uris import uri_path
from ..webhook import ATTRIBUTES as WEBHOOK_ATTRIBUTES
from ..webhook import WebhookOptions
from ._read_messages import header
from ._resources import FeedSpec, JoinSpec, PipeOptions, PipeSpec, Update
from ._vocabulary import PIPE_TYPE_ALIASES

_N = TypeVar("_N", int, float)


def _single(document: Document, allowed: tuple[str, ...], where: str) -> Element:
    found = [el for el in document.elements if el.tag in _RESOURCE_TAGS]
    if len(found) != 1:
        names = " or ".join(f"<{tag}>" for tag in allowed)
        raise BadRequest(f"expected exactly one {names} element {where}, found {len(found)}")
    element = found[0]
    if element.tag not in allowed:
        names = " or ".join(f"<{tag}>" for tag in allowed)
        raise BadRequest(f"<{element.tag}> cannot be created {where}; expected {names}")
    return element


_RESOURCE_TAGS = frozenset({"domain", "profile", "feed", "pipe", "join", "message", "content"})


def creation(document: Document, slug: str | None = None) -> FeedSpec | PipeSpec:
    """The feed or pipe a domain POST asks for (C1, C7-C10)."""
    element = _single(document, ("feed", "pipe"), "in a domain")
    if element.tag == "pipe":
        # C9: pipes are always private; any name sent is ignored.
        kind = element.attrs.get("type", "")
        return PipeSpec(
            type=PIPE_TYPE_ALIASES.get(kind, kind),
            title=element.get("title"),
            options=pipe_options(element.attrs),
        )
    name = element.get("name") or (slug.strip() if slug and slug.strip() else None)
    return FeedSpec(
        name=name,
        type=element.attrs.get("type", ""),
        title=element.get("title"),
        license=element.get("license"),
    )


def pipe_options(attrs: Mapping[str, str]) -> PipeOptions:
    """The extension attributes of a ``<pipe>`` being created (400 when malformed)."""
    dead_letter = attrs.get("dead_letter")
    return PipeOptions(
        durable=_flag(attrs, "durable"),
        lease=_number(attrs, "lease", float, 0),
        max_deliveries=_number(attrs, "max_deliveries", int, 1),
        dead_letter=None if dead_letter is None else (dead_letter and uri_path(dead_letter)),
        max_messages=_number(attrs, "max_messages", int, 1),
        max_bytes=_number(attrs, "max_bytes", int, 1),
        overflow=attrs.get("overflow") or None,
        webhook=webhook_options(attrs),
    )


def webhook_options(attrs: Mapping[str, str]) -> WebhookOptions | None:
    """The webhook attributes of a ``<pipe>`` (None when it has none; 400 when malformed)."""
    if not any(attrs.get(name) for name in WEBHOOK_ATTRIBUTES):
        return None
    return WebhookOptions(
        callback=attrs.get("callback") or None,
        secret=attrs.get("secret") or None,
        concurrency=_number(attrs, "concurrency", int, 1),
        timeout=_number(attrs, "timeout", float, 0),
        max_attempts=_number(attrs, "max_attempts", int, 1),
        max_age=_number(attrs, "max_age", float, 0),
    )


def _flag(attrs: Mapping[str, str], name: str) -> bool | None:
    value = attrs.get(name)
    if not value:
        return None
    if value in ("1", "true"):
        return True
    if value in ("0", "false"):
        return False
    raise BadRequest(f"pipe {name} must be 1, 0, true or false, not {value!r}")


def _number(attrs: Mapping[str, str], name: str, kind: type[_N], low: int) -> _N | None:
    value = attrs.get(name)
    if not value:
        return None
    try:
        number = kind(value)
    except ValueError:
        number = None
    if number is None or not low <= number < 2**53:  # NaN fails the comparison too
        raise BadRequest(f"pipe {name} must be a number of at least {low}, not {value!r}")
    return number


def join(document: Document) -> JoinSpec:
    """The join a pipe POST asks for (G14, F9)."""
    element = _single(document, ("join",), "on a pipe")
    feed = element.get("feed")
    if feed is None:
        raise BadRequest("a join needs a feed attribute naming the feed URI")
    return JoinSpec(
        feed_path=uri_path(feed),
        address=element.attrs.get("address", ""),
        type=element.attrs.get("type", ""),
        headers=_headers(element, 1024),
    )


def update(document: Document, tag: str) -> Update:
    """The properties a PUT on a feed or pipe carries (R2, R3, L8)."""
    element = _single(document, (tag,), "in a PUT")
    attrs = element.attrs
    return Update(
        name=attrs.get("name"),
        type=attrs.get("type"),
        title=attrs.get("title"),
        license=attrs.get("license"),
        webhook=webhook_options(attrs) if tag == "pipe" else None,
        tag=tag,
    )


def _headers(element: Element, limit: int) -> tuple[tuple[str, str], ...]:
    headers = tuple(header(child.attrs) for child in element.iter("header"))
    if len(headers) > limit:
        raise PayloadTooLarge(f"more than {limit} headers on one element")
    return headers
