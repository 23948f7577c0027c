"""RestTL documents as JSON (digest §2.4, J1-J8).

``{"restms": {TYPE: [ {PROP: "string", ..., CHILDTYPE: [...]}, ... ]}}``: one key for
the schema (J1); every child type maps to an array (J2); every property is a string
(J3; numbers and booleans arriving on input are turned into strings, an object or array
under a property's name is refused, as is a repeated key); a ``<content>``
element's text travels under ``"value"`` (``"#text"`` is accepted on input, J5).

Every string must be representable in XML 1.0, so that any JSON document we accept
converts to XML without loss (J6); control characters are refused with 400.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import orjson

from .document import NOT_XML as _NOT_XML
from .document import ROOT, TEXT_ELEMENTS, Document, Element, grouped
from .errors import BadRequest
from .specs import PROPERTIES
from .xmlcodec import DEFAULT_LIMITS, CodecLimits, too_many_attributes

Check = Callable[[str, str], None]
TEXT_KEY = "value"
_TEXT_KEYS = (TEXT_KEY, "#text")


def parse_json(body: bytes, limits: CodecLimits = DEFAULT_LIMITS) -> Document:
    """Decode a JSON RestTL document, or raise :class:`BadRequest` saying why."""
    return json_document(load(body), body, limits)


def load(body: bytes) -> Any:
    """The JSON value a body holds, or :class:`BadRequest` saying why there is none."""
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        if not body.strip():
            raise BadRequest('empty document: expected {"restms": {...}} JSON') from exc
        raise BadRequest(f"malformed JSON: {exc}") from exc


def json_document(data: Any, body: bytes, limits: CodecLimits = DEFAULT_LIMITS) -> Document:
    """The document ``data`` (:func:`load` of ``body``) holds, or :class:`BadRequest`."""
    if not isinstance(data, dict) or ROOT not in data:
        raise BadRequest(f'JSON document must be an object with a "{ROOT}" key')
    root = data[ROOT]
    if root is None:
        if not unique_keys(body, len(data)):
            refuse_duplicates(body, limits)
        return Document()
    if not isinstance(root, dict):
        raise BadRequest(f'"{ROOT}" must hold an object')
    if len(root) > limits.max_attributes:
        raise too_many_attributes(ROOT, limits.max_attributes)
    budget = [limits.max_elements, len(data)]  # elements left, keys read
    check = _check if may_hold_controls(body) else _no_check
    _, kids, _ = _object(ROOT, root, 1, limits, budget, check)
    if not unique_keys(body, budget[1]):
        refuse_duplicates(body, limits)
    return Document(elements=kids)


def unique_keys(body: bytes, keys: int) -> bool:
    """Whether ``body`` (valid JSON) holds no more keys than the ``keys`` its parsed
    objects have, that is no object repeats a key (orjson keeps a repeated key's last
    value without a word). Every key is followed by a colon outside any string, so
    when the body has no more colons than keys, that is the answer. Else the colons
    outside strings are counted: once escapes (a backslash and the character after
    it) are taken out, every quote opens or closes a string, so they are the colons
    between every other quote.
    """
    if _colons(body) <= keys:
        return True
    if _BACKSLASH in body:
        body = _ESCAPE.sub(b"", body)
    return _colons(b"".join(body.split(b'"')[::2])) <= keys


def _colons(text: bytes) -> int:
    # Counted by what removing them takes away: bytes.count looks at a byte at a
    # time, replace() finds them with memchr, 4 times faster on a 100 KiB body.
    return len(text) - len(text.replace(b":", b""))


_ESCAPE = re.compile(rb"\\.", re.DOTALL)


def refuse_duplicates(body: bytes, limits: CodecLimits) -> None:
    """:class:`BadRequest` naming a key an object of ``body`` repeats, if one does.

    Called when :func:`unique_keys` found more keys than were read: a repeated key, or
    objects outside ``"restms"`` that were not read. The standard parser reports every
    object it makes to a hook, one Python call each, so those beyond ``max_elements``
    are refused as elements under ``"restms"`` are.
    """
    made = [0]

    def unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        made[0] += 1
        if made[0] > limits.max_elements + 2:  # and the document and "restms" objects
            raise BadRequest("document has too many elements")
        obj = dict(pairs)
        if len(obj) != len(pairs):
            seen: set[str] = set()
            for key, _ in pairs:
                if key in seen:
                    raise BadRequest(f"JSON object repeats the key {_shown(key)}")
                seen.add(key)
        return obj

    try:
        json.loads(body, object_pairs_hook=unique)
    except RecursionError as exc:  # orjson reads 1024 levels, this parser fewer
        raise BadRequest(f"document nested deeper than {limits.max_depth} levels") from exc
    except ValueError as exc:  # orjson read it: not expected, but never a 500
        raise BadRequest(f"malformed JSON: {exc}") from exc


def may_hold_controls(body: bytes) -> bool:
    """Whether any decoded string could hold a character XML cannot carry.

    JSON forbids raw control characters in strings, so they can only arrive escaped
    (after a backslash); U+FFFE and U+FFFF can also arrive as raw UTF-8, which starts
    with byte 0xEF. Two single-byte scans of the body spare a check of every string
    in the common case. The bytes are looked for as ints: CPython searches for an int
    with memchr, for a one-byte bytes object with its slower general substring search.
    """
    return _BACKSLASH in body or _EF in body


_BACKSLASH, _EF = ord("\\"), 0xEF  # ints, for may_hold_controls


def _check(text: str, where: str) -> None:
    if _NOT_XML.search(text):
        raise BadRequest(f"{where} holds a control character XML cannot carry")


def _no_check(text: str, where: str) -> None:
    return None


def _string(value: Any, where: str, check: Check) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        text = value
    elif isinstance(value, bool):
        text = "1" if value else "0"
    elif isinstance(value, int | float):
        text = str(value)
    else:
        raise BadRequest(f"{where} must be a string")
    check(text, where)
    return text


def _object(
    tag: str, obj: dict[str, Any], depth: int, limits: CodecLimits, budget: list[int], check: Check
) -> tuple[dict[str, str], tuple[Element, ...], str | None]:
    attrs: dict[str, str] = {}
    kids: list[Element] = []
    text: str | None = None
    properties = PROPERTIES.get(tag, _NONE)
    budget[1] += len(obj)
    for key, value in obj.items():
        if tag in TEXT_ELEMENTS and key in _TEXT_KEYS:
            text = _string(value, f'"{key}" of <{tag}>', check)
        elif key in properties and isinstance(value, list | dict):
            kind = "an array" if isinstance(value, list) else "an object"
            raise BadRequest(f'property "{key}" of <{tag}> must be a string, not {kind}')
        elif isinstance(value, list):
            if len(value) > budget[0]:  # each item is an element: refused before any is made
                raise BadRequest("document has too many elements")
            for item in value:
                kids.append(_element(key, item, depth, limits, budget, check))
        elif isinstance(value, dict):  # a lone element where an array was expected
            kids.append(_element(key, value, depth, limits, budget, check))
        elif key == "xmlns" or key.startswith("xmlns:"):
            continue  # namespace declarations are not properties (G3); never echo them
        else:
            s = _string(value, f'property "{key}" of <{tag}>', check)
            if s is not None:
                attrs[key] = s
    return attrs, tuple(kids), text


_NONE: frozenset[str] = frozenset()


def _element(
    tag: str, item: Any, depth: int, limits: CodecLimits, budget: list[int], check: Check
) -> Element:
    if not isinstance(item, dict):
        raise BadRequest(f'each "{tag}" element must be a JSON object')
    if not is_name(tag):
        raise BadRequest(f"{_shown(tag)} is not a valid element name")
    budget[0] -= 1
    if budget[0] < 0:
        raise BadRequest("document has too many elements")
    if depth >= limits.max_depth:
        raise BadRequest(f"document nested deeper than {limits.max_depth} levels")
    if len(item) > limits.max_attributes:
        raise too_many_attributes(tag, limits.max_attributes)
    attrs, kids, text = _object(tag, item, depth + 1, limits, budget, check)
    for name in attrs:
        if not is_name(name):
            raise BadRequest(f"{_shown(name)} is not a valid property name")
    return Element(tag, attrs, kids, text)


def _shown(name: str) -> str:
    """A client's name as a refusal quotes it: its start only, when it is long."""
    return repr(name) if len(name) <= 64 else f"{name[:64]!r}... ({len(name)} characters)"


# At most 50,000 characters, as libxml2 allows in an XML name: a name accepted here
# must convert to XML (J6).
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]{0,49999}\Z")


# Names already found valid (bounded: names are client-chosen). Hot loops test
# ``name in NAMES`` before calling :func:`is_name`.
NAMES: set[str] = set()


def is_name(name: str) -> bool:
    if name in NAMES:
        return True
    if _NAME.match(name) is None:
        return False
    if len(NAMES) < 1024 and len(name) <= 256:  # client-chosen: keep the cache small
        NAMES.add(name)
    return True


def to_json(document: Document) -> bytes:
    """Encode a document as JSON, following J1-J5 and J8."""
    body: dict[str, Any] = {}
    for tag, items in grouped(document.elements).items():
        body[tag] = [_to_obj(el) for el in items]
    return orjson.dumps({ROOT: body})


def _to_obj(element: Element) -> dict[str, Any]:
    obj: dict[str, Any] = dict(element.attrs)
    for tag, items in grouped(element.children).items():
        obj[tag] = [_to_obj(el) for el in items]
    if element.text is not None:
        obj[TEXT_KEY] = element.text
    return obj
