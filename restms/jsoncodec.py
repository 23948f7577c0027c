"""RestTL documents as JSON (digest §2.4, J1-J8).

``{"restms": {TYPE: [ {PROP: "string", ..., CHILDTYPE: [...]}, ... ]}}``: one key for
the schema (J1); every child type maps to an array (J2); every property is a string
(J3; numbers and booleans arriving on input are turned into strings); a ``<content>``
element's text travels under ``"value"`` (``"#text"`` is accepted on input, J5).

Every string must be representable in XML 1.0, so that any JSON document we accept
converts to XML without loss (J6); control characters are refused with 400.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import orjson

from .document import NOT_XML as _NOT_XML
from .document import ROOT, TEXT_ELEMENTS, Document, Element, grouped
from .errors import BadRequest
from .xmlcodec import DEFAULT_LIMITS, CodecLimits

Check = Callable[[str, str], None]
TEXT_KEY = "value"
_TEXT_KEYS = (TEXT_KEY, "#text")


def parse_json(body: bytes, limits: CodecLimits = DEFAULT_LIMITS) -> Document:
    """Decode a JSON RestTL document, or raise :class:`BadRequest` saying why."""
    if not body.strip():
        raise BadRequest('empty document: expected {"restms": {...}} JSON')
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"malformed JSON: {exc}") from exc
    if not isinstance(data, dict) or ROOT not in data:
        raise BadRequest(f'JSON document must be an object with a "{ROOT}" key')
    root = data[ROOT]
    if root is None:
        return Document()
    if not isinstance(root, dict):
        raise BadRequest(f'"{ROOT}" must hold an object')
    budget = [limits.max_elements]
    check = _check if may_hold_controls(body) else _no_check
    _, kids, _ = _object(ROOT, root, 1, limits.max_depth, budget, check)
    return Document(elements=kids)


def may_hold_controls(body: bytes) -> bool:
    """Whether any decoded string could hold a character XML cannot carry.

    JSON forbids raw control characters in strings, so they can only arrive escaped
    (after a backslash); U+FFFE and U+FFFF can also arrive as raw UTF-8, which starts
    with byte 0xEF. Two single-byte scans of the body spare a check of every string
    in the common case. The bytes are looked for as ints: CPython searches for an int
    with memchr, for a one-byte bytes object with its general substring search, some
    2 instructions a byte (7 times the cost on a 1 KiB body).
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
    tag: str, obj: dict[str, Any], depth: int, max_depth: int, budget: list[int], check: Check
) -> tuple[dict[str, str], tuple[Element, ...], str | None]:
    attrs: dict[str, str] = {}
    kids: list[Element] = []
    text: str | None = None
    for key, value in obj.items():
        if tag in TEXT_ELEMENTS and key in _TEXT_KEYS:
            text = _string(value, f'"{key}" of <{tag}>', check)
        elif isinstance(value, list):
            for item in value:
                kids.append(_element(key, item, depth, max_depth, budget, check))
        elif isinstance(value, dict):  # a lone element where an array was expected
            kids.append(_element(key, value, depth, max_depth, budget, check))
        elif key == "xmlns" or key.startswith("xmlns:"):
            continue  # namespace declarations are not properties (G3); never echo them
        else:
            s = _string(value, f'property "{key}" of <{tag}>', check)
            if s is not None:
                attrs[key] = s
    return attrs, tuple(kids), text


def _element(
    tag: str, item: Any, depth: int, max_depth: int, budget: list[int], check: Check
) -> Element:
    if not isinstance(item, dict):
        raise BadRequest(f'each "{tag}" element must be a JSON object')
    if not is_name(tag):
        raise BadRequest(f"{tag!r} is not a valid element name")
    budget[0] -= 1
    if budget[0] < 0:
        raise BadRequest("document has too many elements")
    if depth >= max_depth:
        raise BadRequest(f"document nested deeper than {max_depth} levels")
    attrs, kids, text = _object(tag, item, depth + 1, max_depth, budget, check)
    for name in attrs:
        if not is_name(name):
            raise BadRequest(f"{name!r} is not a valid property name")
    return Element(tag, attrs, kids, text)


_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*\Z")


# Names already found valid (bounded: names are client-chosen). Hot loops test
# ``name in NAMES`` before calling :func:`is_name`.
NAMES: set[str] = set()


def is_name(name: str) -> bool:
    if name in NAMES:
        return True
    if _NAME.match(name) is None:
        return False
    if len(NAMES) < 1024:
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
