"""Gateway message <-> AMQP 1.0 message (``proton.Message``), with no I/O.

Theory of operation
-------------------
The AMQP 1.0 bridge moves messages between RestMS feeds and an AMQP 1.0 broker. This
module is the whole translation, both ways, as two pure functions: :func:`to_amqp`
(a gateway message and its delivered contents -> a proton message) and
:func:`from_amqp` (a received proton message -> a validated
:class:`~restms.specs.MessageSpec` with at most one embedded content). RestMS
message properties are AMQP 0-9-1's (4/AMQP9, §6.6); AMQP 1.0 (OASIS, part 3.2) has
a field for most of them, and the rest travel under reserved names so that a round
trip gives them back::

    gateway (RestMS)             AMQP 1.0
    address                      properties.subject (inbound: subject, to or an
                                 application property, as configured)
    message_id, correlation_id   properties.message-id, correlation-id (inbound
                                 ulong, uuid and binary ids become text)
    reply_to                     properties.reply-to
    user_id                      properties.user-id (UTF-8 bytes)
    delivery_mode "2" / "1"      header.durable true / false (false -> none)
    priority "0".."9"            header.priority (4, the default -> none; > 9 -> 9)
    expiration (ms)              header.ttl ("0" -> 1 ms: a ttl of 0 is no ttl)
    timestamp (seconds)          properties.creation-time when plain digits, else
                                 application property restms.timestamp
    type, app_id, sender_id      application properties restms.type, restms.app_id,
                                 restms.sender_id
    header amqp.content-encoding, amqp.to, amqp.subject, amqp.group-id,
           amqp.group-sequence, amqp.reply-to-group-id
                                 that AMQP field (amqp.subject: when the subject
                                 is not the address)
    header amqp.body             how the body section is written (below)
    any other header NAME        application property NAME, a string; inbound every
                                 application property becomes a header (text)
    one content                  one data section of its bytes, and content-type

Bodies: no content is written as one empty data section, one content as one data
section holding exactly its bytes (RabbitMQ hands those bytes to AMQP 0-9-1
consumers unchanged); more contents cannot be one AMQP body. Inbound, a string
amqp-value becomes UTF-8 text and any other value (map, list, number, uuid...) JSON,
marked by the ``amqp.body`` header so that the way back writes an amqp-value again.
Message and delivery annotations, footers, absolute-expiry-time, first-acquirer and
delivery-count are not carried. docs/AMQP.md has the full tables.

Every value the other side cannot carry raises :class:`Unmappable`, its foreign
cause (proton, codec, gateway validation) chained; configuration mistakes (a bad
``address_from`` or target template) are ``ValueError``::

    RestMSError
    └── Unmappable      422  this message cannot cross the bridge; str() says why
"""

from __future__ import annotations

import base64
import binascii
import math
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import cast
from uuid import UUID

import orjson
from proton import Array, Data, Message, ProtonException

from feeds.service import Blob, Part
from restms.document import NOT_XML
from restms.errors import RestMSError
from restms.specs import Content, EmbeddedContent, MessageLimits, MessageSpec, build_message

__all__ = [
    "Unmappable",
    "check_address_from",
    "check_target",
    "from_amqp",
    "render_target",
    "to_amqp",
]


class Unmappable(RestMSError):
    """A message that cannot cross between the gateway and AMQP 1.0; ``str()`` says why."""

    status = 422


# RestMS properties AMQP 1.0 has no field for: application properties of these names.
_RESERVED_PROPERTIES = {
    "type": "restms.type",
    "app_id": "restms.app_id",
    "sender_id": "restms.sender_id",
    "timestamp": "restms.timestamp",
}
_PROPERTY_OF = {key: name for name, key in _RESERVED_PROPERTIES.items()}

# AMQP 1.0 fields RestMS has no property for: headers of these names, in this order.
CONTENT_ENCODING = "amqp.content-encoding"
TO = "amqp.to"
SUBJECT = "amqp.subject"
GROUP_ID = "amqp.group-id"
GROUP_SEQUENCE = "amqp.group-sequence"
REPLY_TO_GROUP_ID = "amqp.reply-to-group-id"
BODY = "amqp.body"
_FIELD_HEADERS = (CONTENT_ENCODING, TO, SUBJECT, GROUP_ID, GROUP_SEQUENCE, REPLY_TO_GROUP_ID)
_RESERVED_HEADERS = frozenset((*_FIELD_HEADERS, BODY))

# amqp.body values: "value" restores an amqp-value chosen by the content type (text/*
# -> string, application/json -> the JSON value, else binary); "string" restores a
# string whatever the content type (a string value that came with a non-text type).
BODY_KINDS = frozenset({"value", "string"})

DEFAULT_PRIORITY = 4  # AMQP 1.0 §3.2.1: an absent priority means 4
MAX_TTL_MS = 2**32 - 1  # header.ttl is a uint (milliseconds)
MAX_GROUP_SEQUENCE = 2**32 - 1  # sequence-no
# proton hands times over as float seconds: keep milliseconds exact (below 2**53).
MAX_CREATION_SECONDS = 2**53 // 1000
BINARY_TYPE = "application/octet-stream"
STRING_TYPE = "text/plain; charset=utf-8"
JSON_TYPE = "application/json"
# proton reads an absent symbol field (content-type, content-encoding) as "None".
_ABSENT_SYMBOL = "None"

ADDRESS_FROM = ("subject", "to")
_HEADER_SOURCE = "header:"
_PLACEHOLDER = "{address}"
_DEFAULT_LIMITS = MessageLimits()

# Foreign failures inside a mapping; each becomes Unmappable with its cause chained.
_FOREIGN = (
    ProtonException,
    RestMSError,
    KeyError,
    TypeError,
    ValueError,  # UnicodeError, binascii.Error, orjson.JSONDecodeError too
    OverflowError,
    RecursionError,
)


@contextmanager
def _mapping(direction: str) -> Iterator[None]:
    try:
        yield
    except Unmappable:
        raise
    except _FOREIGN as exc:
        raise Unmappable(f"cannot map the message {direction}: {exc}") from exc


# ---------------------------------------------------------------- configuration
def check_address_from(value: str) -> str:
    """Return ``value`` if it names where inbound addresses come from, else ValueError.

    ``subject`` (properties.subject), ``to`` (properties.to) or ``header:NAME`` (the
    application property NAME).
    """
    if value in ADDRESS_FROM:
        return value
    if value.startswith(_HEADER_SOURCE) and value[len(_HEADER_SOURCE) :]:
        return value
    raise ValueError(f"address_from must be subject, to or header:NAME, not {value!r}")


def check_target(template: str) -> str:
    """Return ``template`` if its only braces are ``{address}`` placeholders, else ValueError."""
    rest = template.replace(_PLACEHOLDER, "")
    if "{" in rest or "}" in rest:
        raise ValueError(f"target {template!r} may hold {_PLACEHOLDER} and no other braces")
    return template


def render_target(template: str, address: str) -> str:
    """The AMQP node address for a gateway address: ``{address}`` replaced by it.

    The address is inserted as it is, not escaped: ``/`` is fine in an AMQP address
    path, and an address the broker cannot take fails at the broker (docs/AMQP.md).
    """
    return check_target(template).replace(_PLACEHOLDER, address)


# ---------------------------------------------------------------- gateway -> AMQP
def to_amqp(spec: MessageSpec, parts: Sequence[Part | None]) -> Message:
    """The AMQP 1.0 message for a gateway message and its delivered contents.

    ``parts`` are the message's contents in order; ``None`` (a content its reader
    deleted) is skipped. Raises :class:`Unmappable` when the message cannot be one
    AMQP message: more than one content, a reserved or repeated header name, a bad
    property value.
    """
    present = [part for part in parts if part is not None]
    if len(present) > 1:
        raise Unmappable(f"a message with {len(present)} contents cannot be one AMQP body")
    with _mapping("to AMQP 1.0"):
        message = Message()
        properties: dict[str, object] = {}
        fields: dict[str, str] = {}
        for name, value in spec.headers:
            if name in _PROPERTY_OF:
                raise Unmappable(
                    f"header name {name!r} is reserved for the {_PROPERTY_OF[name]} property"
                )
            if name in fields or name in properties:
                raise Unmappable(
                    f"header {name!r} appears twice; AMQP application properties are a map"
                )
            if name in _RESERVED_HEADERS:
                fields[name] = value
            else:
                properties[name] = value
        for name, value in spec.props:
            _put_property(message, properties, name, value)
        subject = spec.address or fields.get(SUBJECT, "")
        if subject:
            message.subject = subject
        _put_fields(message, fields)
        _put_body(message, present[0] if present else None, fields.get(BODY))
        if properties:
            _encodable(properties)
            message.properties = properties  # type: ignore[assignment]  # proton annotates None
    return message


def _put_property(message: Message, properties: dict[str, object], name: str, value: str) -> None:
    if name == "message_id":
        message.id = value
    elif name == "correlation_id":
        message.correlation_id = value
    elif name == "reply_to":
        message.reply_to = value
    elif name == "user_id":
        message.user_id = value.encode()
    elif name == "delivery_mode":
        if value not in ("1", "2"):
            raise Unmappable(f"message delivery_mode must be 1 or 2, not {value!r}")
        message.durable = value == "2"
    elif name == "priority":
        message.priority = _number("priority", value, 9)
    elif name == "expiration":
        ms = max(_number("expiration", value, MAX_TTL_MS), 1)  # a ttl of 0 means none
        # proton truncates seconds * 1000: half a millisecond more keeps it exact.
        message.ttl = (ms + 0.5) / 1000
    elif name == "timestamp" and _creation_seconds(value):
        message.creation_time = int(value)  # whole seconds: exact in milliseconds
    elif name in _RESERVED_PROPERTIES:
        properties[_RESERVED_PROPERTIES[name]] = value


def _number(name: str, value: str, high: int) -> int:
    if not (value.isascii() and value.isdigit()) or int(value) > high:
        raise Unmappable(f"message {name} must be 0 to {high}, not {value!r}")
    return int(value)


def _creation_seconds(value: str) -> bool:
    """Whether a timestamp travels as creation-time: digits that read back the same."""
    return (
        value.isascii()
        and value.isdigit()
        and not value.startswith("0")
        and int(value) <= MAX_CREATION_SECONDS
    )


def _put_fields(message: Message, fields: Mapping[str, str]) -> None:
    if CONTENT_ENCODING in fields:
        if fields[CONTENT_ENCODING] == _ABSENT_SYMBOL:  # would read back as no encoding
            raise Unmappable(
                f"header {CONTENT_ENCODING} {_ABSENT_SYMBOL!r} cannot travel: proton reads it"
                " as no content-encoding"
            )
        message.content_encoding = fields[CONTENT_ENCODING]
    if TO in fields:
        message.address = fields[TO]
    if GROUP_ID in fields:
        message.group_id = fields[GROUP_ID]
    if GROUP_SEQUENCE in fields:
        message.group_sequence = _number(
            "header amqp.group-sequence", fields[GROUP_SEQUENCE], MAX_GROUP_SEQUENCE
        )
    if REPLY_TO_GROUP_ID in fields:
        message.reply_to_group_id = fields[REPLY_TO_GROUP_ID]


def _put_body(message: Message, part: Part | None, kind: str | None) -> None:
    if kind is not None and kind not in BODY_KINDS:
        kinds = " or ".join(sorted(BODY_KINDS))
        raise Unmappable(f"header {BODY} must be {kinds}, not {kind!r}")
    if part is None:
        message.inferred = True
        message.body = b""  # a bare message needs a body section: one empty data section
        return
    if isinstance(part, Blob):
        data, content_type = part.data, part.content_type
    else:
        data, content_type = part.data(), part.type
    if content_type:
        message.content_type = content_type
    if kind is None:
        message.inferred = True  # bytes -> one data section
        message.body = data
        return
    message.inferred = False  # any body -> one amqp-value section
    value = _value(data, content_type, kind)
    if value is None:
        raise Unmappable("a JSON null cannot be an AMQP value body")
    _encodable(value)
    message.body = value  # type: ignore[assignment]  # proton encodes any AMQP value


def _encodable(value: object) -> None:
    """Encode ``value`` now: proton encodes properties and bodies only when sending."""
    Data().put_object(value)


def _value(data: bytes, content_type: str, kind: str) -> object:
    media = _media(content_type)
    if kind == "string" or media.startswith("text/"):
        try:
            return data.decode()
        except UnicodeDecodeError as exc:
            raise Unmappable(
                f"a {content_type} content that is not UTF-8 cannot be an AMQP string"
            ) from exc
    if media == JSON_TYPE:
        try:
            return cast(object, orjson.loads(data))
        except orjson.JSONDecodeError as exc:
            raise Unmappable(f"an application/json content that is not JSON: {exc}") from exc
    return data


def _media(content_type: str) -> str:
    return content_type.split(";", 1)[0].strip().lower()


# ---------------------------------------------------------------- AMQP -> gateway
def from_amqp(
    message: Message,
    *,
    address_from: str = "subject",
    limits: MessageLimits = _DEFAULT_LIMITS,
    max_size: int | None = None,
) -> MessageSpec:
    """The gateway message for a received AMQP 1.0 message.

    ``address_from`` is ``subject``, ``to`` or ``header:NAME`` (see
    :func:`check_address_from`; a bad one raises ValueError); where it is missing the
    address is "". The spec's one content, if any, is an embedded content: plain text
    when the body is UTF-8 that XML can carry, base64 otherwise. Raises
    :class:`Unmappable` when the message cannot be a gateway message: a body over
    ``max_size`` bytes, more headers than ``limits`` allow, text XML cannot carry, a
    value the gateway's property checks refuse.
    """
    check_address_from(address_from)
    with _mapping("from AMQP 1.0"):
        app = _application_properties(message)
        attrs: dict[str, str] = {"address": _address(message, address_from, app)}
        attrs.update(_properties(message))
        headers: list[tuple[str, str]] = []
        for key, value in app.items():
            name = _text(key)
            if not name:
                raise Unmappable("an application property with an empty name cannot be a header")
            if name in _PROPERTY_OF:
                attrs[_PROPERTY_OF[name]] = _text(value)
            elif name in _RESERVED_HEADERS:
                raise Unmappable(f"application property {name!r} is reserved for the AMQP field")
            else:
                headers.append((name, _text(value)))
        headers.extend(_field_headers(message, address_from))
        content, kind = _content(message, max_size)
        if kind is not None:
            headers.append((BODY, kind))
        if len(headers) > limits.max_headers:
            raise Unmappable(f"{len(headers)} headers, over the limit of {limits.max_headers}")
        for where, text in (*attrs.items(), *((f"header {n!r}", v) for n, v in headers)):
            _check_text(where, text)
        for name, _ in headers:
            _check_text("a header name", name)
        contents: list[Content] = [] if content is None else [content]
        return build_message(attrs, headers, contents, limits)


def _application_properties(message: Message) -> Mapping[object, object]:
    properties = cast(object, message.properties)  # proton annotates it as None
    if properties is None:
        return {}
    if not isinstance(properties, Mapping):
        raise Unmappable(f"application properties are a {type(properties).__name__}, not a map")
    return cast(Mapping[object, object], properties)


def _address(message: Message, address_from: str, app: Mapping[object, object]) -> str:
    if address_from == "subject":
        return message.subject or ""
    if address_from == "to":
        return message.address or ""
    value = app.get(address_from[len(_HEADER_SOURCE) :])
    return "" if value is None else _text(value)


def _properties(message: Message) -> Iterator[tuple[str, str]]:
    if message.id is not None:
        yield "message_id", _id_text(message.id)
    if message.reply_to:
        yield "reply_to", message.reply_to
    if message.correlation_id is not None:
        yield "correlation_id", _id_text(message.correlation_id)
    if message.durable:
        yield "delivery_mode", "2"
    priority = message.priority
    if priority != DEFAULT_PRIORITY:
        yield "priority", str(min(priority, 9))
    ttl = round(message.ttl * 1000)
    if ttl:
        yield "expiration", str(ttl)
    created = round(message.creation_time * 1000)
    if created:
        yield "timestamp", str(created // 1000)
    user = _bytes(message.user_id)
    if user:
        try:
            yield "user_id", user.decode()
        except UnicodeDecodeError as exc:
            raise Unmappable("an AMQP user-id that is not UTF-8 cannot be a user_id") from exc


def _field_headers(message: Message, address_from: str) -> Iterator[tuple[str, str]]:
    encoding = str(message.content_encoding)
    if encoding != _ABSENT_SYMBOL:
        yield CONTENT_ENCODING, encoding
    if message.address and address_from != "to":
        yield TO, message.address
    if message.subject and address_from != "subject":
        yield SUBJECT, message.subject
    if message.group_id:
        yield GROUP_ID, message.group_id
    if message.group_sequence:
        yield GROUP_SEQUENCE, str(message.group_sequence)
    if message.reply_to_group_id:
        yield REPLY_TO_GROUP_ID, message.reply_to_group_id


def _content(message: Message, max_size: int | None) -> tuple[EmbeddedContent | None, str | None]:
    """The body as at most one content, and the ``amqp.body`` header it needs."""
    body: object = message.body
    given = str(message.content_type)
    content_type = "" if given == _ABSENT_SYMBOL else given
    kind: str | None = None
    if body is None:
        return None, None
    if isinstance(body, bytes | bytearray | memoryview):
        data = bytes(body)
        if not data and not content_type:
            return None, None  # what to_amqp writes for a message without contents
        content_type = content_type or BINARY_TYPE
    elif type(body) is str:
        data = body.encode()
        content_type = content_type or STRING_TYPE
        kind = "value" if _media(content_type).startswith("text/") else "string"
    else:
        data = orjson.dumps(_plain(body))
        content_type, kind = JSON_TYPE, "value"
    if max_size is not None and len(data) > max_size:
        raise Unmappable(f"a body of {len(data)} bytes is over the limit of {max_size} bytes")
    return EmbeddedContent.of(data, content_type), kind


# ---------------------------------------------------------------- AMQP values as text
def _text(value: object) -> str:
    """An application property value (or key) as header text."""
    if isinstance(value, str):
        return str(value)  # symbol and char are str subclasses
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return ""
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, int):
        return str(int(value))  # proton's ulong, timestamp... print as ulong(1)
    if isinstance(value, float):
        return str(float(value))
    return str(value)


def _id_text(value: object) -> str:
    """A message-id or correlation-id (string, ulong, uuid or binary) as text."""
    if isinstance(value, str):
        return str(value)
    if isinstance(value, int):
        return str(int(value))
    if isinstance(value, UUID):
        return str(value)
    if isinstance(value, bytes | bytearray | memoryview):
        data = bytes(value)
        try:
            text = data.decode()
        except UnicodeDecodeError:
            return binascii.hexlify(data).decode("ascii")
        return binascii.hexlify(data).decode("ascii") if NOT_XML.search(text) else text
    return str(value)


def _bytes(value: object) -> bytes:
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    if isinstance(value, str):
        return value.encode()
    return b"" if value is None else str(value).encode()


def _plain(value: object) -> object:
    """An AMQP value as JSON-ready data: non-JSON types become text (bytes: base64)."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        return str(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        number = float(value)
        return number if math.isfinite(number) else str(number)
    if isinstance(value, Mapping):
        return {_text(key): _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple | Array):
        return [_plain(item) for item in value]
    return _text(value)


def _check_text(where: str, text: str) -> None:
    if NOT_XML.search(text):
        raise Unmappable(f"{where} holds a character XML 1.0 cannot carry")
