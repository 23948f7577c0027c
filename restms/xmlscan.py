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
# One start or end tag, whole: "<message a='v'>", "<content/>", "</content >".
_TAG = re.compile(rf"<(message|content|header){_ATTRS}(/?)>|</(message|content|header){_WS}*>")
_SPACE = re.compile(rf"{_WS}*")
_ROOT_END = re.compile(rf"</restms{_WS}*>{_WS}*\Z")
_ATTR = re.compile(rf"({_NAME}){_WS}*={_WS}*(?:\"([^\"]*)\"|'([^']*)')")

# What XML forbids in text or would rewrite: controls, CR, U+FFFE, U+FFFF, "]]>", and
# any '&' that does not start one of the five predefined entities. All are whole-body
# checks chosen for speed: bytes.translate finds controls at under 1 ns a byte (a
# character-class search costs 3 ns, str.isprintable 3), single-character searches run
# at memchr speed.
_CONTROLS = bytes([*range(0x09), 0x0B, 0x0C, *range(0x0D, 0x20)])
_BAD_ENTITY = re.compile(r"&(?!(?:amp|lt|gt|quot|apos);)")

Attrs = dict[str, str]
Scanned = tuple[Attrs, list[Attrs], list[tuple[Attrs, str | None]]]
# A tag: its name ("/message" for an end tag), its attributes, and whether it is empty.
Tag = tuple[str, Attrs, bool]


def _unescape(text: str) -> str:
    if "&" not in text:
        return text
    for ref, char in (("&lt;", "<"), ("&gt;", ">"), ("&quot;", '"'), ("&apos;", "'")):
        text = text.replace(ref, char)
    return text.replace("&amp;", "&")  # last, so "&amp;lt;" stays "&lt;"


def _read_tag(raw: str) -> Tag | None:
    found = _TAG.fullmatch(raw)
    if found is None:
        return None
    if found.group(4):
        return "/" + found.group(4), {}, False
    pairs = _ATTR.findall(found.group(2))
    attrs = {name: _unescape(double or single) for name, double, single in pairs}
    if len(attrs) != len(pairs) or "xmlns" in attrs:
        return None  # a duplicate (lxml refuses it) or a namespace declaration
    return found.group(1), attrs, bool(found.group(3))


_SEEN: dict[str, Tag | None] = {}  # publishers send the same few tags over and over


def _tag(raw: str) -> Tag | None:
    """One whole tag, read once and then shared: its attributes are read-only."""
    try:
        return _SEEN[raw]
    except KeyError:
        pass
    tag = _read_tag(raw)
    if len(raw) <= 256 and len(_SEEN) < 1024:  # client-chosen: keep the cache bounded
        _SEEN[raw] = tag
    return tag


def _plain(body: bytes, text: str) -> bool:
    return not (
        len(body.translate(None, _CONTROLS)) != len(body)
        or "\ufffe" in text
        or "\uffff" in text
        or ("]" in text and "]]>" in text)
        or ("&" in text and _BAD_ENTITY.search(text) is not None)
    )


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
    found = _PROLOG.match(text)
    if found is None or not _plain(body, text):
        return None
    pos = found.end()
    out: list[Scanned] = []
    headers: list[Attrs] = []
    contents: list[tuple[Attrs, str | None]] = []
    message: Attrs | None = None  # the open <message>, if any
    while True:
        if text[pos : pos + 1] != "<":
            pos = _SPACE.match(text, pos).end()  # type: ignore[union-attr]  # always matches
        end = text.find(">", pos) + 1
        if end == 0:
            return None
        tag = _tag(text[pos:end])
        if tag is None:
            if message is None and _ROOT_END.match(text, pos):
                return out
            return None  # anything else, even "<message a='>'>": lxml decides
        name, attrs, empty = tag
        pos = end
        if message is None:
            if name != "message":
                return None
            if empty:
                out.append((attrs, [], []))
            else:
                message, headers, contents = attrs, [], []
        elif name == "/message":
            out.append((message, headers, contents))
            message = None
        elif name in {"header", "content"}:
            value = None
            if not empty:  # text up to the next "<", which must be this element's end
                stop = text.find("<", pos)
                end = text.find(">", stop) + 1
                if stop < 0 or _tag(text[stop:end]) != ("/" + name, {}, False):
                    return None
                value, pos = text[pos:stop], end
            if name == "header":
                headers.append(attrs)  # a header's text means nothing
            else:
                contents.append((attrs, _unescape(value) if value else None))
        else:
            return None
