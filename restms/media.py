"""Media types and content negotiation (digest §2.2, G8-G12; M1-M3).

Three structured representations exist: RestMS XML, RestMS JSON and ``text/xml``
(the same XML under the draft's legacy name, with its own ETag, H6). Anything else
POSTed to a feed is an opaque content to stage (M1).
"""

from __future__ import annotations

import enum
import re
from functools import lru_cache

from .errors import NotAcceptable


class Format(enum.Enum):
    """A structured representation: its ``Content-Type`` and its short ETag tag."""

    XML = ("application/restms+xml", "x")
    JSON = ("application/restms+json", "j")
    TEXT_XML = ("text/xml", "t")

    def __init__(self, media_type: str, tag: str) -> None:
        self.media_type = media_type
        self.tag = tag

    @property
    def is_json(self) -> bool:
        return self is Format.JSON


SSE = "text/event-stream"

# Media types we read as structured documents (G8, G10); parameters are stripped first.
_BODY_TYPES: dict[str, Format] = {
    "application/restms+xml": Format.XML,
    "application/restms+json": Format.JSON,
    "text/xml": Format.TEXT_XML,
    "application/xml": Format.XML,
    "application/json": Format.JSON,
}
# What Accept may name, and what it maps to; a wildcard means "whatever, so XML" (G9).
_ACCEPT_TYPES: dict[str, Format] = {
    **_BODY_TYPES,
    "*/*": Format.XML,
    "application/*": Format.XML,
    "text/*": Format.TEXT_XML,
}


def bare_type(content_type: str | None) -> str:
    """``Type/Sub; charset=x`` -> ``type/sub``; ``""`` when absent."""
    if not content_type:
        return ""
    return content_type.split(";", 1)[0].strip().lower()


# Remembered per header value: clients repeat theirs, and this runs on every publish.
@lru_cache(maxsize=256)
def body_format(content_type: str | None) -> Format | None:
    """The structured format of a body, or None when the type is not structured."""
    return _BODY_TYPES.get(bare_type(content_type))


def looks_structured(body: bytes) -> Format | None:
    """M3: sniff a body that came with no or an empty ``Content-Type``."""
    head = body[:256].lstrip()
    if head.startswith((b"<?xml", b"<restms")):
        return Format.XML
    if _JSON_DOC.match(head):
        return Format.JSON
    return None


_JSON_DOC = re.compile(rb'\{\s*"restms"\s*:')


@lru_cache(maxsize=512)
def _ranked(accept: str) -> tuple[tuple[str, float], ...]:
    ranked: list[tuple[float, int, str]] = []
    for index, part in enumerate(accept.split(",")):
        fields = part.split(";")
        media = fields[0].strip().lower()
        if not media:
            continue
        q = 1.0
        for param in fields[1:]:
            key, _, value = param.partition("=")
            if key.strip().lower() == "q":
                try:
                    q = float(value.strip())
                except ValueError:
                    q = 0.0
        if q > 0:
            ranked.append((-q, index, media))
    ranked.sort()
    return tuple((media, -negq) for negq, _, media in ranked)


def accepts_event_stream(accept: str | None) -> bool:
    """True when ``text/event-stream`` is the client's first choice."""
    if not accept or SSE not in accept:
        return False
    ranked = _ranked(accept)
    return bool(ranked) and ranked[0][0] == SSE


def negotiate(accept: str | None, fallback: Format | None = None) -> Format:
    """Pick the reply format (G9, G12).

    No ``Accept`` (or an empty one) gives ``fallback`` (the request body's format)
    or XML. Otherwise the highest-ranked type we can produce wins; wildcards and
    browser lists therefore give XML. Raises :class:`NotAcceptable` when ``Accept``
    names only types we cannot produce.
    """
    if not accept or not accept.strip():
        return fallback or Format.XML
    if accept == Format.XML.media_type:  # the common case, skip parsing
        return Format.XML
    for media, _q in _ranked(accept):
        fmt = _ACCEPT_TYPES.get(media)
        if fmt is not None:
            if media in ("*/*", "application/*") and fallback is not None:
                return fallback
            return fmt
    raise NotAcceptable(
        "none of the media types in Accept can be produced; use "
        "application/restms+xml, application/restms+json or text/xml"
    )
