"""Publish documents decoded straight to message specs (M5), skipping the Document tree.

Publishing is the hot path: a batch of 100 messages would otherwise be copied twice,
parser output -> :class:`~restms.document.Element` -> :class:`~restms.specs.MessageSpec`.
Here the common shape (a root holding ``<message>`` elements whose children are leaf
``<header>`` and ``<content>`` elements) goes straight to specs through the same
builders :mod:`restms.specs` uses. Anything else, including every error case, returns
None and the caller takes the generic path, which stays the one reference for what a
document means; the tests check that both paths agree.
"""

from __future__ import annotations

from typing import Any, TypeVar

import orjson

from . import decode, specs
from .document import NAMESPACE, ROOT
from .jsoncodec import NAMES, is_name, json_document, load, may_hold_controls, unique_keys
from .media import Format
from .specs import (
    MAX_TEXT,
    Content,
    ContentHead,
    Duplicate,
    Head,
    LinkedContent,
    MessageLimits,
    MessageSpec,
    build_message,
    checked_message,
    content,
    content_head,
    embedded,
    header,
    message_head,
    with_message_id,
)
from .xmlcodec import CodecLimits, local_tag, parse_root
from .xmlscan import SHARED_ATTRIBUTES, Scanned, Tag, scan

_T = TypeVar("_T")
# Format.JSON is read through the enum class's __getattr__ hook on Python 3.11, slow
# for something read on every publish; a module constant is a plain global.
_JSON = Format.JSON


def messages(
    body: bytes, fmt: Format, codec: CodecLimits, limits: MessageLimits
) -> tuple[MessageSpec, ...]:
    """Every message of a publish body (M5, M12): directly when it can, else generically."""
    if fmt is _JSON:  # parsed once for both paths: parsing is most of a large body's cost
        data = load(body)
        found = _from_json(data, body, codec, limits)
        if found is None:
            found = specs.messages(json_document(data, body, codec), limits)
        return found
    found = direct(body, fmt, codec, limits)
    if found is None:  # an unusual shape, or an error to word: the generic path decides
        found = specs.messages(decode(body, fmt, codec), limits)
    return found


def direct(
    body: bytes, fmt: Format, codec: CodecLimits, limits: MessageLimits
) -> tuple[MessageSpec, ...] | None:
    """The messages of a publish body, or None when the generic path must decide."""
    if fmt is _JSON:
        return _from_json(load(body), body, codec, limits)
    try:
        # Under a limit so low that a shared tag may pass it, what was remembered of
        # shared tags (under another limit) cannot be trusted: read the tree instead.
        fits = codec.max_attributes >= SHARED_ATTRIBUTES
        scanned = scan(body, limits.max_messages) if fits else None
        if scanned is not None:
            return _from_scan(scanned, codec, limits)
    except _Generic:
        return None
    return _from_tree(body, codec, limits)


class _Generic(Exception):
    """A tag the scanner read that the generic path must word the refusal of."""


def _attrs(tag: Tag, most: int) -> dict[str, str]:
    """The attributes of a tag not remembered yet (so perhaps not shared): within
    ``most``, or :class:`_Generic`."""
    if len(tag.attrs) > most:
        raise _Generic
    return tag.attrs


def _namespaced(attrs: Any) -> bool:
    return any(key[0] == "{" for key in attrs)


# What each shared tag (restms.xmlscan.Tag) said, once checked: a message's address and
# properties, a header, a content's link or type and encoding. Keyed by the tag itself
# (tags compare by identity and the scanner keeps at most 1024), so a publisher that
# repeats its tags has them checked once. A tag that was refused is not remembered.
_HEADS: dict[Tag, Head] = {}
_HEADERS: dict[Tag, tuple[str, str]] = {}
_CONTENTS: dict[Tag, ContentHead] = {}


def _from_scan(
    scanned: list[Scanned], codec: CodecLimits, limits: MessageLimits
) -> tuple[MessageSpec, ...] | None:
    """The plain shape :func:`~restms.xmlscan.scan` recognised, under the same limits."""
    count = len(scanned)  # compared twice: min() is a dear call on Python 3.11
    if not 0 < count <= limits.max_messages or count > codec.max_elements:
        return None
    out: list[MessageSpec] = []
    elements = 0
    tally = _may_pass(count, codec, limits)
    heads, known_headers, known_contents = _HEADS, _HEADERS, _CONTENTS
    # Only tags not remembered yet have their attributes counted: shared tags have
    # fewer than SHARED_ATTRIBUTES, which direct() made sure is within the limit.
    most = codec.max_attributes
    for head_tag, header_tags, content_items in scanned:
        head = heads.get(head_tag)
        if head is None:
            attrs = _attrs(head_tag, most)
            head = _head(attrs)
            if "message_id" not in attrs:  # (a tag with an id is seldom seen again)
                _remember(heads, head_tag, head)
        headers = (
            [
                known_headers.get(tag) or _remember(known_headers, tag, header(_attrs(tag, most)))
                for tag in header_tags
            ]
            if header_tags
            else []
        )
        contents: list[Content] = []
        for tag, text in content_items:
            found = known_contents.get(tag)
            if found is None:
                attrs = _attrs(tag, most)
                found = _remember(
                    known_contents,
                    tag,
                    content_head(attrs.get("href"), attrs.get("type"), attrs.get("encoding")),
                )
            contents.append(found if isinstance(found, LinkedContent) else embedded(found, text))
        if tally:
            elements += 1 + len(headers) + len(contents)
        out.append(checked_message(head, headers, contents, limits))
    return tuple(out) if elements <= codec.max_elements else None


def _may_pass(count: int, codec: CodecLimits, limits: MessageLimits) -> bool:
    """Whether ``count`` messages could pass ``max_elements``: checked_message refuses a
    message of more than 1 + max_headers + max_contents elements, so when that many of
    each could not, the elements need no tally (most batches)."""
    return count * (1 + limits.max_headers + limits.max_contents) > codec.max_elements


def _remember(memo: dict[Tag, _T], tag: Tag, value: _T) -> _T:
    if tag.shared and len(memo) < 1024:
        memo[tag] = value
    return value


def _from_tree(
    body: bytes, codec: CodecLimits, limits: MessageLimits
) -> tuple[MessageSpec, ...] | None:
    root = parse_root(body)  # hardening and its errors are the generic path's own
    if not 0 < len(root) <= min(limits.max_messages, codec.max_elements):
        return None  # no message, or over a limit: the generic path words the error
    most = codec.max_attributes  # lxml's attribute maps count in one pass, in C
    if len(root.attrib) > most:
        return None
    # A namespaced attribute needs a declared prefix: without one, skip that check.
    prefixed = b"xmlns:" in body
    out: list[MessageSpec] = []
    elements = 0
    for node in root:
        tag = node.tag
        if not isinstance(tag, str) or local_tag(tag) != "message":
            return None
        headers: list[tuple[str, str]] = []
        contents: list[Content] = []
        for child in node:
            kind = child.tag
            if not isinstance(kind, str) or len(child):
                return None
            kind = local_tag(kind)
            attrs: Any = child.attrib
            if len(attrs) > most or (prefixed and _namespaced(attrs)):
                return None
            if kind == "content":
                contents.append(
                    content(attrs.get("href"), attrs.get("type"), attrs.get("encoding"), child.text)
                )
            elif kind == "header":
                headers.append(header(attrs))
            else:
                return None
        elements += 1 + len(headers) + len(contents)
        attrs = node.attrib
        if len(attrs) > most or (prefixed and _namespaced(attrs)):
            return None
        out.append(build_message(attrs, headers, contents, limits))
    return tuple(out) if elements <= codec.max_elements else None


def _strings(obj: dict[str, Any], most: int, skip: tuple[str, ...] = ()) -> dict[str, str] | None:
    """The properties of a JSON element when all are strings (J3) and its keys are at
    most ``most``, else None. With nothing to skip (a header or a content), the
    element itself: it is only read."""
    if len(obj) > most:
        return None
    attrs: dict[str, str] | None = {} if skip else None
    names = NAMES
    for key, value in obj.items():
        if key in skip:
            continue
        if type(value) is not str or (key not in names and not is_name(key)):
            return None
        if attrs is not None:
            attrs[key] = value
    return obj if attrs is None else attrs


_PARTS = ("header", "content")  # a message's child elements, not properties
_ABSENT: list[Any] = []  # what a message without headers or contents has (never changed)
# JSON elements are fresh objects, so what a message's properties say is remembered by
# their items, while they are few and short (clients choose them; the memo stays
# small), and a content's type and encoding by their values. A message_id is left out
# of what is remembered (each message has its own: the memo would fill with heads never
# seen again) and added to the rest's head.
_ATTR_HEADS: dict[tuple[tuple[str, str], ...], Head] = {}
_JSON_CONTENTS: dict[tuple[str | None, str | None, str | None], ContentHead] = {}


def _head(attrs: dict[str, str]) -> Head:
    """:func:`~restms.specs.message_head` of ``attrs``, remembered without the id."""
    key = tuple(attrs.items())
    head = _ATTR_HEADS.get(key)
    if head is not None:
        return head
    message_id = attrs.get("message_id")
    if message_id is not None and len(message_id) <= MAX_TEXT:  # (a longer one: refused)
        rest = {name: value for name, value in attrs.items() if name != "message_id"}
        return with_message_id(_head(rest), message_id)
    head = message_head(attrs)
    size = sum(map(len, attrs.values())) + sum(map(len, attrs))  # names are clients' too
    if len(key) <= 4 and len(_ATTR_HEADS) < 1024 and size <= 256:
        _ATTR_HEADS[key] = head
    return head


def _from_json(
    data: Any, body: bytes, codec: CodecLimits, limits: MessageLimits
) -> tuple[MessageSpec, ...] | None:
    if may_hold_controls(body):
        return None  # strings need the XML character check of the generic path
    root = data.get("restms") if isinstance(data, dict) else None
    if not isinstance(root, dict) or len(root) != 1:
        return None
    items = root.get("message")
    if not isinstance(items, list) or not 0 < len(items) <= limits.max_messages:
        return None
    out: list[MessageSpec] = []
    elements = 0
    tally = _may_pass(len(items), codec, limits)
    most = codec.max_attributes
    keys = len(data) + 1  # the keys read (the root's one; the messages' at the end)
    for item in items:
        if type(item) is not dict:
            return None
        attrs = _strings(item, most, _PARTS)
        if attrs is None:
            return None
        header_items = item.get("header", _ABSENT)
        content_items = item.get("content", _ABSENT)
        if type(header_items) is not list or type(content_items) is not list:
            return None
        headers: list[tuple[str, str]] = []
        contents: list[Content] = []
        for entry in header_items:
            fields = _strings(entry, most) if isinstance(entry, dict) else None
            if fields is None:
                return None
            keys += len(fields)
            headers.append(header(fields))
        for entry in content_items:
            fields = _strings(entry, most) if type(entry) is dict else None
            if fields is None or ("value" in fields and "#text" in fields):
                return None
            keys += len(fields)
            key = (fields.get("href"), fields.get("type"), fields.get("encoding"))
            found = _JSON_CONTENTS.get(key)
            if found is None:
                found = content_head(*key)
                if len(_JSON_CONTENTS) < 1024 and sum(len(part or "") for part in key) <= 256:
                    _JSON_CONTENTS[key] = found
            text = fields.get("value", fields.get("#text"))
            contents.append(found if isinstance(found, LinkedContent) else embedded(found, text))
        if tally:
            elements += 1 + len(headers) + len(contents)
        out.append(checked_message(_head(attrs), headers, contents, limits))
    if elements > codec.max_elements or not unique_keys(body, keys + sum(map(len, items))):
        return None  # a repeated key too: the generic path words the refusal
    return tuple(out)


def counts(values: list[int], fmt: Format) -> bytes:
    """The publish reply, ``<message count="N"/>`` per message (F18), encoded directly.

    Equal to encoding the generic document (the tests check it), without building one.
    The reply to one message routed to one pipe, the most common, is a constant.
    """
    if len(values) == 1 and values[0] == 1 and type(values[0]) is int:
        return _ONE_JSON if fmt is _JSON else _ONE_XML
    if fmt is _JSON:
        return orjson.dumps({ROOT: {"message": [_count_attrs(n) for n in values]}})
    if Duplicate not in set(map(type, values)):  # most replies: formatted by C code alone
        return b"".join([_XML_HEAD, *map(_XML_COUNT.__mod__, values), _XML_TAIL])
    return b"".join(
        [
            _XML_HEAD,
            *(
                b'<message count="%d" duplicate="1"/>' % n
                if isinstance(n, Duplicate)
                else _XML_COUNT % n
                for n in values
            ),
            _XML_TAIL,
        ]
    )


def _count_attrs(n: int) -> dict[str, str]:
    return {"count": str(n), "duplicate": "1"} if isinstance(n, Duplicate) else {"count": str(n)}


_XML_HEAD = f"<?xml version='1.0' encoding='UTF-8'?>\n<{ROOT} xmlns=\"{NAMESPACE}\">".encode()
_XML_TAIL = f"</{ROOT}>".encode()
_XML_COUNT = b'<message count="%d"/>'
_ONE_XML = _XML_HEAD + b'<message count="1"/>' + _XML_TAIL
_ONE_JSON = orjson.dumps({ROOT: {"message": [{"count": "1"}]}})
