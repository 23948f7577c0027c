"""What a federation link's HTTP client sends and reads: the publish document it
builds, the replies it parses, and what a reply's status means (the outcomes of
:mod:`bridges.federation.remote`). No I/O here: :mod:`.client` does the exchanges."""

from __future__ import annotations

import math
import sys
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from bridges.checks import redact
from bridges.federation.remote import Refused, Unavailable
from restms import specs
from restms.document import Document, Element
from restms.errors import RestMSError
from restms.httpdates import parse_http_date
from restms.jsoncodec import may_hold_controls, parse_json
from restms.specs import Content, EmbeddedContent, MessageLimits, MessageSpec

MAX_REASON = 500  # characters of a remote's refusal kept
MAX_RETRY_AFTER = 300.0  # seconds: a longer Retry-After is taken as this


# What a read accepts of a remote's messages: the local publish applies the local limits.
READ_LIMITS = MessageLimits(
    max_messages=1, max_headers=sys.maxsize, max_contents=sys.maxsize, max_header_bytes=sys.maxsize
)


@dataclass(frozen=True, slots=True)
class Reply:
    status: int
    headers: Mapping[str, str]
    body: bytes

    def text(self) -> str:
        return self.body.decode("utf-8", "replace")


def message_document(messages: Sequence[MessageSpec]) -> bytes:
    """The JSON publish document of ``messages``: address, properties, headers and
    embedded contents, as the gateway reads them (restms.specs; J1-J5: every property a
    string, every child an array, a content's text under ``value``)."""
    listed = []
    for spec in messages:
        message: dict[str, Any] = {"address": spec.address, **dict(spec.props)}
        if spec.headers:
            message["header"] = [{"name": n, "value": v} for n, v in spec.headers]
        if spec.contents:
            message["content"] = [content_object(content) for content in spec.contents]
        listed.append(message)
    return orjson.dumps({"restms": {"message": listed}})


def publish_reply(reply: Reply, where: str) -> list[dict[str, Any]]:
    """The ``message`` objects of a publish reply (J1-J5), read as plain JSON: a reply
    of thousands of counts is read several times faster than as a document."""
    try:
        listed = orjson.loads(reply.body)["restms"].get("message", [])
    except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
        raise Unavailable(f"{where}: the reply is not a RestMS JSON publish reply") from exc
    if not isinstance(listed, list) or not all(isinstance(m, dict) for m in listed):
        raise Unavailable(f"{where}: the reply is not a RestMS JSON publish reply")
    return listed


def content_object(content: Content) -> dict[str, str]:
    if not isinstance(content, EmbeddedContent):
        raise TypeError("only embedded contents can be published to a remote gateway")
    return {"type": content.type, "encoding": content.encoding, "value": content.value}


def header_elements(headers: tuple[tuple[str, str], ...]) -> tuple[Element, ...]:
    return tuple(Element("header", {"name": name, "value": value}) for name, value in headers)


def parse_reply(reply: Reply, where: str) -> Document:
    try:
        return parse_json(reply.body)
    except RestMSError as exc:
        raise Unavailable(f"{where}: the reply is not a RestMS JSON document: {exc}") from exc


def check(reply: Reply, where: str) -> None:
    """Nothing for a 2xx; else the exception its status calls for (module docstring)."""
    status = reply.status
    if 200 <= status < 300:
        return
    if status == 401:
        raise Unavailable(f"{where}: the remote refused the credentials: {reason(reply)}")
    if status in (408, 429) or status >= 500:
        raise Unavailable(f"{where}: {status} {reason(reply)}", retry_after(reply))
    if 400 <= status < 500:
        raise Refused(where, status, reason(reply))
    raise Unavailable(f"{where}: unexpected status {status}")


def reason(reply: Reply) -> str:
    """The remote's one-line reason (its text/plain body), cut at MAX_REASON."""
    text = " ".join(reply.text().split())
    return text if len(text) <= MAX_REASON else text[: MAX_REASON - 1] + "…"


def retry_after(reply: Reply) -> float | None:
    """Retry-After in seconds (delta-seconds or an HTTP date), at most MAX_RETRY_AFTER."""
    value = reply.headers.get("Retry-After", "").strip()
    if not value:
        return None
    seconds = number(value)
    if seconds is None:
        when = parse_http_date(value)
        if when is None:
            return None
        seconds = when - time.time()
    return min(max(seconds, 0.0), MAX_RETRY_AFTER)


def number(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def position(text: str | None) -> int | None:
    if text is None or not text.isascii() or not text.isdigit():
        return None
    return int(text)


def form(text: str) -> str:
    return urllib.parse.quote_plus(text)


def beside(base: str, href: str, where: str) -> str:
    """``href`` read against ``base``, which it must not leave for another origin: the
    link's credentials go with every request, and only to the remote it names."""
    url = urllib.parse.urljoin(base, href)
    there, here = urllib.parse.urlsplit(url), urllib.parse.urlsplit(base)
    if (there.scheme, there.netloc) != (here.scheme, here.netloc):
        raise Unavailable(f"{where}: the remote named another origin ({redact(url)})")
    return url


def token_reply(reply: Reply, where: str, client_id: str, unknown_life: float) -> tuple[str, float]:
    """The access token in a token endpoint's reply (RFC 6749 §5.1) and its life in
    seconds (``unknown_life`` when it does not say); else :class:`Unavailable`."""
    try:
        answer = orjson.loads(reply.body)
    except orjson.JSONDecodeError:
        answer = None
    if not isinstance(answer, dict):
        answer = {}
    if reply.status != 200:
        said = ": ".join(
            str(answer[key])[:MAX_REASON]
            for key in ("error", "error_description")
            if answer.get(key)
        )
        raise Unavailable(
            f"{where} did not grant a token to client {client_id!r}: "
            f"{reply.status} {said or reason(reply)}",
            retry_after(reply),
        )
    token = answer.get("access_token")
    if not isinstance(token, str) or not token:
        raise Unavailable(f"{where}: the reply holds no access_token")
    if str(answer.get("token_type", "")).lower() != "bearer":
        raise Unavailable(f"{where}: the token is not a bearer token")
    life = answer.get("expires_in", unknown_life)
    if isinstance(life, str):
        life = number(life)
    if not isinstance(life, int | float) or isinstance(life, bool) or not math.isfinite(life):
        life = unknown_life
    return token, max(float(life), 0.0)


@dataclass(slots=True)
class EventLines:
    """Server-Sent Events read a line at a time (the HTML standard's event stream
    format, as docs/EXTENSIONS.md §3 writes it): :meth:`line` returns an event, as
    (name, id, data), at the blank line that ends it."""

    name: str = ""
    id: str = ""
    data: list[str] = field(default_factory=list)

    def line(self, raw: bytes) -> tuple[str, str, str] | None:
        text = raw.decode("utf-8", "replace").rstrip("\r\n")
        if not text:
            event = (self.name or "message", self.id, "\n".join(self.data))
            had = bool(self.data)
            self.name, self.data = "", []  # (the id carries over, as the standard says)
            return event if had else None
        if text.startswith(":"):
            return None  # a comment: keep-alive
        name, _, value = text.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "event":
            self.name = value
        elif name == "data":
            self.data.append(value)
        elif name == "id":
            self.id = value
        return None


# ---------------------------------------------------------------- event streams
_PROPERTIES = frozenset(specs.MESSAGE_PROPERTIES)
# What a content's type and encoding say, by their values: a remote repeats a few.
_CONTENT_HEADS: dict[tuple[str | None, str | None], specs.ContentHead] = {}


def event_blocks(buffer: bytes) -> tuple[list[bytes], bytes]:
    """The whole events of an event stream's ``buffer`` (each its lines, joined by
    ``\n``, without the blank line that ends it) and what is left of it, the start
    of an event to come. Lines may end with CR LF, LF or CR, as the HTML standard
    allows; a CR at the very end stays in what is left (an LF may follow)."""
    if 13 in buffer:  # (an int: searched with memchr)
        keep = buffer.endswith(b"\r")
        body = buffer[:-1] if keep else buffer
        buffer = body.replace(b"\r\n", b"\n").replace(b"\r", b"\n") + (b"\r" if keep else b"")
    blocks = buffer.split(b"\n\n")
    rest = blocks.pop()
    return [block for block in blocks if block], rest


def event_fields(block: bytes) -> tuple[str, str, bytes] | None:
    """An event's name (``message`` when it has none), id and data (its ``data``
    lines joined by ``\\n``); comments and other fields are left out. None for a
    block without data (a keep-alive comment, a ``retry``): the HTML standard
    dispatches no event for it."""
    if block.startswith(b"id: "):  # the shape our gateways write, read without a loop
        end = block.find(b"\n")
        start = end + len(_MESSAGE_EVENT)
        if end > 0 and block.startswith(_MESSAGE_EVENT, end) and block.find(b"\n", start) < 0:
            return "message", block[4:end].decode("ascii", "replace"), block[start:]
    name, ident, data = b"message", b"", []
    for line in block.split(b"\n"):
        field_name, _, value = line.partition(b":")
        if value[:1] == b" ":
            value = value[1:]
        if field_name == b"data":
            data.append(value)
        elif field_name == b"id":
            ident = value
        elif field_name == b"event":
            name = value
    if not data:
        return None
    return name.decode("utf-8", "replace"), ident.decode("ascii", "replace"), b"\n".join(data)


_MESSAGE_EVENT = b"\nevent: message\ndata: "


def plain_message(data: bytes, limits: MessageLimits) -> MessageSpec | None:
    """The message of an event's document ``data`` when it has the plain shape (one
    message, every property a string, headers, contents embedded), checked as a
    publish checks its parts (:class:`RestMSError` when one is refused); None when
    the general reading must decide (:func:`parse_reply`: it fetches linked contents
    and words every refusal). What the remote adds of its own (``href``, ``feed``,
    ``delivery_count``) is not kept, as the general reading does not keep it."""
    if may_hold_controls(data):
        return None  # strings need the XML character check of the general reading
    try:
        document = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    root = document.get("restms") if type(document) is dict else None
    if type(root) is not dict or len(document) != 1 or len(root) != 1:
        return None
    items = root.get("message")
    if type(items) is not list or len(items) != 1 or type(items[0]) is not dict:
        return None
    attrs: dict[str, str] = {}
    headers: list[tuple[str, str]] = []
    contents: list[Content] = []
    # Every key read is followed by one colon outside any string: with the colons
    # inside strings (keys' and values'), the body's colons tell whether a key was
    # repeated (orjson keeps the last without a word). No escapes (above): each colon
    # in a string read is one in the body.
    colons = 2 + len(items[0])
    for key, value in items[0].items():
        if ":" in key:
            colons += key.count(":")
        if type(value) is str:
            if ":" in value:  # (found with memchr; count() looks at a character at a time)
                colons += value.count(":")
            if key in _PROPERTIES or key == "address":
                attrs[key] = value
        elif key == "header" and type(value) is list:
            for entry in value:
                if type(entry) is not dict:
                    return None
                colons += _colons_in(entry)
                headers.append(specs.header(entry))
        elif key == "content" and type(value) is list:
            for entry in value:
                if type(entry) is not dict or "href" in entry:
                    return None
                colons += _colons_in(entry)
                text = entry.get("value")
                if text is None or "#text" in entry:
                    return None
                kind = (entry.get("type"), entry.get("encoding"))
                found = _CONTENT_HEADS.get(kind)
                if found is None:
                    found = specs.content_head(None, *kind)
                    if len(_CONTENT_HEADS) < 256 and sum(len(part or "") for part in kind) <= 256:
                        _CONTENT_HEADS[kind] = found
                assert not isinstance(found, specs.LinkedContent)
                contents.append(specs.embedded(found, text))
        else:
            return None
    if len(data) - len(data.replace(b":", b"")) != colons:
        return None  # a repeated key (or not a string): the general reading decides
    return specs.checked_message(specs.message_head(attrs), headers, contents, limits)


def _colons_in(entry: dict[str, Any]) -> int:
    """The colons of an object of strings, one after each key and those in its
    strings; -(1 << 40) when a value is not a string (then no count matches)."""
    count = len(entry)
    for key, value in entry.items():
        if type(value) is not str:
            return -(1 << 40)
        if ":" in key:
            count += key.count(":")
        if ":" in value:
            count += value.count(":")
    return count
