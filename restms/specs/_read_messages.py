"""Reading the messages of a publish request (M5, M6, M12, §6.6).

Every decoder ends here: the XML tree and JSON readers through :func:`messages`, the
XML scanner and the bridges through :func:`message_head`, :func:`content_head`,
:func:`embedded` and :func:`checked_message`, so each message passes the same checks
and the same per-request limits (over them -> 413).
"""

from __future__ import annotations

import binascii
from collections.abc import Callable, Mapping
from itertools import chain

from ..document import Document, Element
from ..errors import BadRequest, PayloadTooLarge
from ..names import check_address
from ..uris import uri_path
from ._messages import (
    Content,
    ContentHead,
    EmbeddedContent,
    LinkedContent,
    MessageLimits,
    MessageSpec,
    head_size,
)
from ._vocabulary import DEFAULT_CONTENT_TYPE, ENCODINGS, MAX_TEXT, MESSAGE_PROPERTIES, check_text

_PROPERTY_ORDER = {name: index for index, name in enumerate(MESSAGE_PROPERTIES)}

# The slot descriptors of the two values built per published message, from parts
# already checked, by checked_message and embedded: setting the slots directly skips
# the frozen classes' ``object.__setattr__`` per field and ``__post_init__`` (half the
# cost), and doing it there rather than in a classmethod saves a call (a classmethod
# call costs twice a function's on Python 3.11).
_new = object.__new__
_SET_TYPE = EmbeddedContent.__dict__["type"].__set__
_SET_ENCODING = EmbeddedContent.__dict__["encoding"].__set__
_SET_VALUE = EmbeddedContent.__dict__["value"].__set__
_SET_ADDRESS = MessageSpec.__dict__["address"].__set__
_SET_PROPS = MessageSpec.__dict__["props"].__set__
_SET_HEADERS = MessageSpec.__dict__["headers"].__set__
_SET_CONTENTS = MessageSpec.__dict__["contents"].__set__
_SET_HEAD_SIZE = MessageSpec.__dict__["head_size"].__set__
_flat = chain.from_iterable


def messages(document: Document, limits: MessageLimits) -> tuple[MessageSpec, ...]:
    """Every ``<message>`` of a publish request, in order (M5, M12)."""
    found = [el for el in document.elements if el.tag == "message"]
    if not found:
        raise BadRequest("a publish needs at least one <message> element")
    if len(found) > limits.max_messages:
        raise PayloadTooLarge(f"more than {limits.max_messages} messages in one request")
    return tuple(message(el, limits) for el in found)


def message(element: Element, limits: MessageLimits) -> MessageSpec:
    contents: list[Content] = []
    headers: list[tuple[str, str]] = []
    for child in element.children:
        if child.tag == "content":
            contents.append(_content(child))
        elif child.tag == "header":
            headers.append(header(child.attrs))
    return build_message(element.attrs, headers, contents, limits)


def build_message(
    attrs: Mapping[str, str],
    headers: list[tuple[str, str]],
    contents: list[Content],
    limits: MessageLimits,
) -> MessageSpec:
    """A validated message from its properties, headers and contents (§6.6, M5, M6)."""
    return checked_message(message_head(attrs), headers, contents, limits)


# A message's address, its properties and their head_size (headers not counted yet).
Head = tuple[str, tuple[tuple[str, str], ...], int]


def message_head(attrs: Mapping[str, str]) -> Head:
    """The checked address and AMQP9 properties (in their order) of a ``<message>``,
    with their size: the decoders remember heads they have read, so a publisher that
    repeats one has it weighed once."""
    props = [(key, value) for key, value in attrs.items() if value and key in _PROPERTY_ORDER]
    if len(props) > 1:
        props.sort(key=lambda pair: _PROPERTY_ORDER[pair[0]])
    for key, value in props:
        if len(value) > MAX_TEXT:
            check_text(value, "message", key)
        check = _PROPERTY_CHECKS.get(key)
        if check is not None:
            check(value)
    address, checked = check_address(attrs.get("address", "")), tuple(props)
    return address, checked, head_size(address, checked, ())


def with_message_id(head: Head, message_id: str) -> Head:
    """``head``, of a message without a ``message_id``, with ``message_id`` added: what
    :func:`message_head` gives for the same attributes and that id, for the cost of
    checking the id alone. Publishers give each message an id of its own, so a head
    with an id is seldom seen twice, while the rest of it repeats."""
    if not message_id:  # an empty property is no property (message_head)
        return head
    if len(message_id) > MAX_TEXT:
        check_text(message_id, "message", "message_id")
    address, props, size = head
    place = _PROPERTY_ORDER["message_id"]
    at = 0
    while at < len(props) and _PROPERTY_ORDER[props[at][0]] < place:
        at += 1
    added = (*props[:at], ("message_id", message_id), *props[at:])
    return address, added, size + len("message_id") + len(message_id)


def checked_message(
    head: Head, headers: list[tuple[str, str]], contents: list[Content], limits: MessageLimits
) -> MessageSpec:
    """A message from its :func:`message_head` and its parts, within ``limits``."""
    if len(contents) > limits.max_contents:
        raise PayloadTooLarge(f"more than {limits.max_contents} contents in one message")
    spec = _new(MessageSpec)
    if headers:
        if len(headers) > limits.max_headers:
            raise PayloadTooLarge(f"more than {limits.max_headers} headers on one element")
        size = sum(map(len, _flat(headers)))
        # No header can pass the bound while all of them together do not.
        if size > limits.max_header_bytes:
            _check_header_sizes(headers, limits.max_header_bytes)
        _SET_HEAD_SIZE(spec, head[2] + size)
    else:
        _SET_HEAD_SIZE(spec, head[2])
    _SET_ADDRESS(spec, head[0])
    _SET_PROPS(spec, head[1])
    _SET_HEADERS(spec, tuple(headers))
    _SET_CONTENTS(spec, tuple(contents))
    return spec


def _check_header_sizes(headers: list[tuple[str, str]], limit: int) -> None:
    for name, value in headers:
        if len(name) + len(value) > limit:
            shown = name if len(name) <= 64 else name[:64] + "..."
            raise PayloadTooLarge(
                f"header {shown!r} has {len(name) + len(value)} characters of name and "
                f"value, more than the {limit} one header may have"
            )


def header(attrs: Mapping[str, str]) -> tuple[str, str]:
    name = attrs.get("name")
    if not name:
        raise BadRequest("every <header> needs a name")
    return name, attrs.get("value", "")


def _content(element: Element) -> Content:
    attrs = element.attrs
    return content(attrs.get("href"), attrs.get("type"), attrs.get("encoding"), element.text)


def content(href: str | None, type: str | None, encoding: str | None, text: str | None) -> Content:
    """One ``<content>``: linked when it has an ``href``, else embedded (M5, M6)."""
    head = content_head(href, type, encoding)
    return head if isinstance(head, LinkedContent) else embedded(head, text)


def content_head(href: str | None, type: str | None, encoding: str | None) -> ContentHead:
    """What a ``<content>``'s attributes say: the staged content it links, or the type
    and (checked) encoding of the text it embeds."""
    if href:
        return LinkedContent(path=uri_path(href))
    encoding = encoding or "plain"
    if encoding not in ENCODINGS:
        raise BadRequest(f"unknown content encoding {encoding!r}; use plain or base64")
    check_text(type, "content", "type")
    return type or DEFAULT_CONTENT_TYPE, encoding


def embedded(head: tuple[str, str], text: str | None) -> EmbeddedContent:
    """An embedded content from its :func:`content_head` and its text."""
    type, encoding = head
    value = text or ""
    if encoding == "base64":
        value = "".join(value.split())  # M6, L19: line breaks and indentation
        try:
            binascii.a2b_base64(value, strict_mode=True)
        except ValueError as exc:  # binascii.Error, or non-ASCII text
            raise BadRequest(f"invalid base64 content: {exc}") from exc
    content = _new(EmbeddedContent)
    _SET_TYPE(content, type)
    _SET_ENCODING(content, encoding)
    _SET_VALUE(content, value)
    return content


def _digits(name: str, low: int, high: int | None) -> Callable[[str], None]:
    def check(value: str) -> None:
        if (
            not value.isascii()
            or not value.isdigit()
            or (high is not None and not low <= int(value) <= high)
        ):
            span = f"{low} to {high}" if high is not None else "a non-negative integer"
            raise BadRequest(f"message {name} must be {span}, not {value!r}")

    return check


_PROPERTY_CHECKS = {
    "priority": _digits("priority", 0, 9),
    "delivery_mode": _digits("delivery_mode", 1, 2),
    # AMQP 1.0 carries a TTL as a uint32 of milliseconds.
    "expiration": _digits("expiration (milliseconds)", 0, 2**32 - 1),
}
