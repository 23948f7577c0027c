"""A strict recogniser for the one XML shape publishers send most: not a parser.

Profiling the single-message publish showed the lxml call itself (parser context set-up,
tree building, element proxies) to be the largest cost of the request. Nearly every
publish body has the same plain shape::

    <?xml version="1.0" encoding="UTF-8"?>
    <restms xmlns="..."><message a="v"><header name="n" value="v"/>
      <content type="t">text</content></message>...</restms>

This module recognises exactly that shape and nothing more. It answers None for
anything it is not sure of, and then the hardened lxml parser (:mod:`restms.xmlcodec`),
which stays the one XML parser of the gateway, decides, including every error. So it
never refuses a document and never says what a document means differently: the tests
check its results against lxml's on generated documents, including the hostile ones.

It gives up (None) on: any ``<!`` (DOCTYPE, comment, CDATA) or ``<?`` other than the
XML declaration, a declared encoding other than UTF-8, a byte-order mark, bytes that
are not UTF-8, prefixed or ``xmlns`` attributes on the elements, a duplicate attribute,
character references and any entity but the five predefined ones, characters XML
forbids, carriage returns and tabs or newlines in attribute values (XML normalises
those), ``]]>`` in text, text or elements other than whitespace between elements,
and bodies over lxml's own text limit. All patterns are linear: every repetition is
of a character class that excludes the character that ends it.
"""

from __future__ import annotations

import re

# lxml (without huge_tree) refuses a text node over 10,000,000 bytes; stay below it.
MAX_BODY = 10_000_000

_WS = r"[ \t\r\n]"
_NAME = r"[A-Za-z_][A-Za-z0-9_.-]*"
_VALUE = r"(?:\"[^\"<\x00-\x1f]*\"|'[^'<\x00-\x1f]*')"
# The root may declare the RestMS namespace and no other (lxml checks other URIs).
_NS_VALUE = r"([\"'])http://www\.restms\.org/schema/restms\4"
_ATTRS = rf"((?:{_WS}+{_NAME}{_WS}*={_WS}*{_VALUE})*){_WS}*"

_PROLOG = re.compile(
    rf"(?:<\?xml{_WS}+version{_WS}*={_WS}*([\"'])1\.0\1"
    rf"(?:{_WS}+encoding{_WS}*={_WS}*([\"'])(?i:utf-8)\2)?"
    rf"(?:{_WS}+standalone{_WS}*={_WS}*([\"'])(?:yes|no)\3)?{_WS}*\?>)?{_WS}*"
    rf"<restms(?:{_WS}+xmlns{_WS}*={_WS}*{_NS_VALUE})?{_WS}*>"
)
_MESSAGE = re.compile(rf"{_WS}*<message{_ATTRS}(/?)>")
_CHILD = re.compile(rf"{_WS}*<(content|header){_ATTRS}(/?)>")
_CHILD_END = re.compile(rf"</(content|header){_WS}*>")
_MESSAGE_END = re.compile(rf"{_WS}*</message{_WS}*>")
_ROOT_END = re.compile(rf"{_WS}*</restms{_WS}*>{_WS}*\Z")
_ATTR = re.compile(rf"({_NAME}){_WS}*={_WS}*(?:\"([^\"]*)\"|'([^']*)')")

# What XML forbids in text or would rewrite (controls, CR, U+FFFE, U+FFFF, "]]>"), and
# any '&' that does not start one of the five predefined entities, anywhere in the body.
# Byte-level checks: a regular expression would cost ten times as much per character.
_FORBIDDEN = bytes([*range(0x09), 0x0B, 0x0C, *range(0x0D, 0x20)])
_BAD_ENTITY = re.compile(r"&(?!(?:amp|lt|gt|quot|apos);)")


def _plain(body: bytes, text: str) -> bool:
    if len(body.translate(None, _FORBIDDEN)) != len(body):
        return False
    # Single-character searches first: they run at memchr speed.
    if "\ufffe" in text or "\uffff" in text or ("]" in text and "]]>" in text):
        return False
    return b"&" not in body or _BAD_ENTITY.search(text) is None


Attrs = dict[str, str]
Scanned = tuple[Attrs, list[Attrs], list[tuple[Attrs, str | None]]]


def _unescape(text: str) -> str:
    if "&" not in text:
        return text
    for ref, char in (("&lt;", "<"), ("&gt;", ">"), ("&quot;", '"'), ("&apos;", "'")):
        text = text.replace(ref, char)
    return text.replace("&amp;", "&")  # last, so "&amp;lt;" stays "&lt;"


_SEEN: dict[str, Attrs | None] = {}  # publishers repeat the same attribute lists


def _attrs(raw: str) -> Attrs | None:
    """The attributes of one start tag (shared and read-only when seen before)."""
    attrs = _SEEN.get(raw)
    if attrs is not None or raw in _SEEN:
        return attrs
    found = _ATTR.findall(raw)
    attrs = {name: _unescape(double or single) for name, double, single in found}
    if len(attrs) != len(found) or "xmlns" in attrs:
        attrs = None  # a duplicate (lxml refuses it) or a namespace declaration
    if len(raw) <= 256 and len(_SEEN) < 1024:  # client-chosen: keep the cache bounded
        _SEEN[raw] = attrs
    return attrs


def scan(body: bytes) -> list[Scanned] | None:
    """Each message's attributes, header attributes and contents, or None (ask lxml).

    A content is its attributes and its text (None when it has none, as lxml says).
    """
    if len(body) > MAX_BODY:
        return None
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if not _plain(body, text):
        return None
    found = _PROLOG.match(text)
    if found is None:
        return None
    pos = found.end()
    out: list[Scanned] = []
    while True:
        found = _MESSAGE.match(text, pos)
        if found is None:
            break
        pos = found.end()
        attrs = _attrs(found.group(1))
        if attrs is None:
            return None
        headers: list[Attrs] = []
        contents: list[tuple[Attrs, str | None]] = []
        if not found.group(2):  # not self-closing: children, then </message>
            while (child := _CHILD.match(text, pos)) is not None:
                pos = child.end()
                child_attrs = _attrs(child.group(2))
                if child_attrs is None:
                    return None
                value = None
                if not child.group(3):  # text (found with str.find: fast), then the end tag
                    stop = text.find("<", pos)
                    close = _CHILD_END.match(text, stop)
                    if stop < 0 or close is None or close.group(1) != child.group(1):
                        return None
                    value, pos = text[pos:stop], close.end()
                if child.group(1) == "header":
                    headers.append(child_attrs)  # a header's text means nothing
                    continue
                contents.append((child_attrs, _unescape(value) if value else None))
            end = _MESSAGE_END.match(text, pos)
            if end is None:
                return None
            pos = end.end()
        out.append((attrs, headers, contents))
    return out if _ROOT_END.match(text, pos) else None
