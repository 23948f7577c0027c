"""Gateway message <-> ZeroMQ multipart message (wire format version 1), with no I/O.

Theory of operation
-------------------
The ZeroMQ bridge moves messages between RestMS feeds and ZeroMQ peers. This module
is the whole translation, both ways, as pure functions over frames (``bytes`` in,
``bytes`` out): :func:`encode` (a gateway message and its delivered contents -> three
frames) and :func:`decode` (received frames -> a validated
:class:`~restms.specs.MessageSpec` with at most one embedded content). Sockets, polling
and zmq itself belong to the bridge, never here. A gateway message is three frames::

    frame 0  address   the RestMS message address (§6.6), UTF-8, maybe empty; first,
                       so that SUB peers filter on it as a topic
    frame 1  envelope  a compact JSON object:
               "v"  1, the format version (required)
               "p"  {property: text} for the RestMS message properties (4/AMQP9,
                    §6.6: message_id, reply_to, correlation_id...); unknown names
                    are ignored, for peers that speak a later version
               "h"  [[name, value], ...] the headers, in order, repeats allowed
                    (inbound an object {name: value} is taken too)
               "t"  the body's content type; present: the message has exactly one
                    content, the body (maybe empty); absent: an empty body is no
                    content and any other body one application/octet-stream content
               "e"  an error text, only in the replies of :func:`error_frames`
             "p", "h", "t" are left out when empty; unknown keys are ignored
    frame 2  body      the bytes of the one content

Peers that do not speak the format are taken too: one frame is a body for the
``default_address``, two frames an address and a body; either way the body is one
application/octet-stream content (even when empty) and there are no properties.

Inbound messages go through :func:`restms.specs.build_message`, the checks of an HTTP
publish (property values, header and content counts, address length), and text the
RestTL documents cannot carry (characters XML 1.0 cannot, as the JSON codec refuses)
is refused. Bodies become embedded contents (M6): plain text when they are UTF-8 that
XML can carry, base64 otherwise. This runs per message at 100k+ messages a second, so
the common case takes shortcuts, each noted where it is taken.

Errors: a multipart message the gateway cannot take is :class:`Malformed` (the
bridge counts and drops it, or answers a requester with :func:`error_frames`); a
gateway message ZeroMQ cannot carry is the AMQP bridge's
:class:`~bridges.amqp_map.Unmappable`, whose cause is chained::

    ValueError
    └── Malformed          inbound frames the gateway cannot take; str() says why
    RestMSError
    └── Unmappable    422  (bridges.amqp_map) this message cannot go out as frames
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import orjson

from feeds.service import Blob, Part
from restms.document import NOT_XML
from restms.errors import RestMSError
from restms.jsoncodec import may_hold_controls
from restms.names import check_address
from restms.specs import (
    MESSAGE_PROPERTIES,
    Content,
    EmbeddedContent,
    MessageLimits,
    MessageSpec,
    build_message,
)

from .amqp_map import Unmappable

__all__ = [
    "OCTET",
    "VERSION",
    "Malformed",
    "decode",
    "encode",
    "error_frames",
    "error_of",
]

VERSION = 1
OCTET = "application/octet-stream"

Frame = bytes | bytearray | memoryview  # zmq.Frame exposes the buffer protocol too

_PROPERTIES = frozenset(MESSAGE_PROPERTIES)
_DEFAULT_LIMITS = MessageLimits()


class Malformed(ValueError):
    """A multipart message the gateway cannot take; ``str()`` is the reason."""


# ---------------------------------------------------------------- gateway -> ZeroMQ
def encode(spec: MessageSpec, parts: Sequence[Part | None]) -> list[bytes]:
    """``[address, envelope, body]`` for a gateway message with its delivered contents.

    ``parts`` are the message's contents in order; ``None`` (a content its reader
    deleted) is skipped. More than one present content cannot be one body: raises
    :class:`~bridges.amqp_map.Unmappable`, as does text that is not Unicode.
    """
    body = b""
    envelope: dict[str, object] = {"v": VERSION}
    if spec.props:
        envelope["p"] = dict(spec.props)
    if spec.headers:
        envelope["h"] = spec.headers  # orjson writes tuples as arrays
    present = [part for part in parts if part is not None]
    if present:
        if len(present) > 1:
            raise Unmappable(f"a message with {len(present)} contents cannot be one ZeroMQ body")
        part = present[0]
        if isinstance(part, Blob):
            body, envelope["t"] = part.data, part.content_type
        else:
            body, envelope["t"] = part.data(), part.type
    try:
        return [spec.address.encode(), orjson.dumps(envelope), body]
    except (UnicodeEncodeError, orjson.JSONEncodeError) as exc:  # lone surrogates
        raise Unmappable(f"cannot write the message as ZeroMQ frames: {exc}") from exc


def error_frames(address: str, correlation_id: str, error: str) -> list[bytes]:
    """An error reply to a ZeroMQ requester: ``[address, envelope with "e", b""]``.

    The envelope carries the request's ``correlation_id`` (left out when empty) so
    the requester can match the reply, and ``error``, which :func:`error_of` reads.
    It never raises: text that is not Unicode (a lone surrogate) is replaced.
    """
    envelope: dict[str, object] = {"v": VERSION}
    if correlation_id:
        envelope["p"] = {"correlation_id": _unicode(correlation_id)}
    envelope["e"] = _unicode(error)
    return [address.encode(errors="replace"), orjson.dumps(envelope), b""]


def _unicode(text: str) -> str:
    """``text`` with any lone surrogate replaced: an error reply must always go out."""
    return text.encode(errors="replace").decode()


# ---------------------------------------------------------------- ZeroMQ -> gateway
def decode(
    frames: Sequence[Frame],
    *,
    default_address: str = "",
    max_size: int,
    limits: MessageLimits | None = None,
) -> MessageSpec:
    """The gateway message for a received multipart message of one to three frames.

    Three frames are the wire format (module docstring); one (``[body]``, for
    ``default_address``) or two (``[address, body]``) come from foreign peers. The
    spec's one content, if any, is an embedded content: plain text when the body is
    UTF-8 that XML can carry, base64 otherwise. Raises :class:`Malformed` when the
    frames cannot be a gateway message: a wrong frame count, an address or envelope
    that does not parse, an unsupported version, a body over ``max_size`` bytes, or a
    value the checks of an HTTP publish refuse (counts over ``limits`` too).
    """
    count = len(frames)
    attrs: dict[str, str]
    headers: list[tuple[str, str]] = []
    if count == 3:
        attrs = {"address": _address(frames[0])}
        data = _bytes(frames[1])
        envelope = _envelope(data)
        headers = _known(envelope, attrs)
        content_type = envelope.get("t")
        body = _body(frames[2], max_size)
        if content_type is None:
            content_type = OCTET if body else None
        elif type(content_type) is not str:
            raise Malformed(f"envelope t must be a content type string, not {content_type!r}")
        # JSON strings hold controls only escaped, U+FFFE/U+FFFF only raw: look closer
        # only when the envelope has a backslash or an 0xEF byte.
        if may_hold_controls(data):
            _check_text(attrs, headers, content_type)
    elif count in (1, 2):
        attrs = {"address": _address(frames[0]) if count == 2 else default_address}
        content_type = OCTET
        body = _body(frames[-1], max_size)
        if count == 1:
            _check_text(attrs, headers, None)
    else:
        raise Malformed(f"a message of {count} frames; the gateway takes 1 to 3")
    contents: list[Content] = []
    if content_type is not None:
        contents.append(EmbeddedContent.of(body, content_type))
    try:
        return build_message(attrs, headers, contents, limits or _DEFAULT_LIMITS)
    except RestMSError as exc:
        raise Malformed(exc.reason) from exc


def error_of(frames: Sequence[Frame]) -> str:
    """The ``"e"`` text of a three-frame gateway message's envelope.

    ``""`` when there is none, when the message is not three frames or when its
    envelope does not parse: this never raises.
    """
    if len(frames) != 3:
        return ""
    try:
        envelope = orjson.loads(_bytes(frames[1]))
    except orjson.JSONDecodeError:
        return ""
    if not isinstance(envelope, dict):
        return ""
    error = envelope.get("e")
    return error if type(error) is str else ""


def _bytes(frame: Frame) -> bytes:
    return frame if type(frame) is bytes else bytes(frame)


def _address(frame: Frame) -> str:
    try:
        address = str(frame, "utf-8")
    except UnicodeDecodeError as exc:
        raise Malformed(f"the address frame is not UTF-8: {exc}") from exc
    try:
        check_address(address)
    except RestMSError as exc:
        raise Malformed(exc.reason) from exc
    if NOT_XML.search(address):  # raw in the frame, unlike envelope strings
        raise Malformed("the address holds a character XML 1.0 cannot carry")
    return address


def _envelope(data: bytes) -> dict[str, object]:
    try:
        envelope = orjson.loads(data)  # refuses bad UTF-8 and lone surrogates too
    except orjson.JSONDecodeError as exc:
        raise Malformed(f"the envelope is not JSON: {exc}") from exc
    if not isinstance(envelope, dict):
        raise Malformed(f"the envelope is a JSON {type(envelope).__name__}, not an object")
    version = envelope.get("v")
    if version is None:
        raise Malformed("the envelope has no version (v)")
    if type(version) is not int or version != VERSION:  # bool is an int subclass: refused
        raise Malformed(f"envelope version {version!r} is not supported; this gateway reads 1")
    return cast(dict[str, object], envelope)


def _known(envelope: dict[str, object], attrs: dict[str, str]) -> list[tuple[str, str]]:
    """Put the envelope's known properties into ``attrs``; return its headers."""
    props = envelope.get("p")
    if props is not None:
        if not isinstance(props, dict):
            raise Malformed(f"envelope p must be an object of properties, not {props!r}")
        for name, value in props.items():
            if name in _PROPERTIES:  # unknown names: a later version's, ignored
                if type(value) is not str:
                    raise Malformed(f"message property {name} must be a string, not {value!r}")
                attrs[name] = value
    raw = envelope.get("h")
    if raw is None:
        return []
    if isinstance(raw, dict):
        pairs: list[object] = list(raw.items())
    elif isinstance(raw, list):
        pairs = raw
    else:
        raise Malformed(f"envelope h must be a list of [name, value] pairs, not {raw!r}")
    headers: list[tuple[str, str]] = []
    for pair in pairs:
        if type(pair) is tuple:
            name, value = cast(tuple[object, object], pair)
        elif type(pair) is list and len(pair) == 2:
            name, value = pair
        else:
            raise Malformed(f"header {pair!r} is not a [name, value] pair")
        if type(name) is not str or type(value) is not str:
            raise Malformed(f"header {pair!r} must be a pair of strings")
        if not name:
            raise Malformed("a header needs a name")
        headers.append((name, value))
    return headers


def _check_text(
    attrs: dict[str, str], headers: list[tuple[str, str]], content_type: str | None
) -> None:
    """Refuse text XML 1.0 cannot carry: RestTL documents could not show the message."""
    for name, value in attrs.items():
        if NOT_XML.search(value):
            raise Malformed(f"message {name} holds a character XML 1.0 cannot carry")
    for name, value in headers:
        if NOT_XML.search(name) or NOT_XML.search(value):
            raise Malformed(f"header {name!r} holds a character XML 1.0 cannot carry")
    if content_type is not None and NOT_XML.search(content_type):
        raise Malformed("the content type holds a character XML 1.0 cannot carry")


def _body(frame: Frame, max_size: int) -> bytes:
    data = _bytes(frame)
    if len(data) > max_size:
        raise Malformed(f"body of {len(data)} bytes is over the limit of {max_size} bytes")
    return data
