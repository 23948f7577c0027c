"""The costliest documents we know how to write for each decoder, at a chosen size.

Each builder takes a size in bytes and returns a body of about that size (never
more): the shape that made a decoder slow once (attributes on one element, read in
quadratic time) and the shapes that could (elements, nesting, long names, entities,
keys). The unit guard (tests/unit/test_decoder_cost.py) times every decoder on them
at doubling sizes; the app guard (tests/app/test_decoder_stall.py) posts them to a
gateway while another client reads.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from itertools import count, repeat

NS = "http://www.restms.org/schema/restms"
_XML_OPEN = f'<restms xmlns="{NS}">'.encode()
_XML_CLOSE = b"</restms>"

Builder = Callable[[int], bytes]
Parts = Callable[[], Iterator[bytes]]  # a fresh supply of parts for each body


def _fill(size: int, head: bytes, parts: Iterator[bytes], tail: bytes) -> bytes:
    """``head``, then parts while they fit in ``size`` bytes with ``tail``, then ``tail``."""
    out, room = [head], size - len(head) - len(tail)
    for part in parts:
        room -= len(part)
        if room < 0:
            break
        out.append(part)
    out.append(tail)
    return b"".join(out)


def _repeat(part: bytes) -> Parts:
    return lambda: repeat(part)


def _numbered(pattern: str) -> Parts:
    return lambda: (pattern.format(n).encode() for n in count())


def xml(head: str, parts: Parts, tail: str) -> Builder:
    return lambda size: _fill(size, _XML_OPEN + head.encode(), parts(), tail.encode() + _XML_CLOSE)


def _xml_entity_declarations(size: int) -> bytes:
    body = _fill(size - 128, b"<!DOCTYPE restms [", _numbered('<!ENTITY e{} "x">')(), b"]>")
    return body + _XML_OPEN + b'<message address="&e1;"/>' + _XML_CLOSE


def _xml_entity_expansion(size: int) -> bytes:
    """A billion laughs, as wide as ``size`` allows: each entity ten of the one before."""
    levels = [f'<!ENTITY e0 "{"x" * 10}">']
    for n in range(1, 10):
        levels.append(f'<!ENTITY e{n} "{f"&e{n - 1};" * 10}">')
    body = _fill(
        size - 128,
        ("<!DOCTYPE restms [" + "".join(levels)).encode(),
        _numbered('<!ENTITY f{} "&e9;">')(),
        b"]>",
    )
    return body + _XML_OPEN + b'<message address="&e9;"/>' + _XML_CLOSE


def _xml_deep(size: int) -> bytes:
    half = (size - len(_XML_OPEN) - len(_XML_CLOSE)) // 13
    return _XML_OPEN + b"<feed>" * half + b"</feed>" * half + _XML_CLOSE


def _json(head: bytes, parts: Parts, tail: bytes) -> Builder:
    def build(size: int) -> bytes:
        supply = parts()
        first = next(supply)  # JSON needs commas between the parts, not after the last
        rest = (b"," + part for part in supply)
        return _fill(size, b'{"restms":' + head + first, rest, tail + b"}")

    return build


def _json_deep(size: int) -> bytes:
    half = (size - 16) // 6
    return b'{"restms":' + b'{"a":' * half + b"{}" + b"}" * half + b"}"


def _json_long_name(size: int) -> bytes:
    return _fill(size, b'{"restms":{"message":[{"', repeat(b"a"), b'":""}]}}')


# name -> (builder, format); "xml" bodies go as application/restms+xml, "json" as
# application/restms+json. Within max_body, each must be refused or answered quickly.
WORST: dict[str, tuple[Builder, str]] = {
    "xml-attributes-on-message": (xml("<message", _numbered(' a{}=""'), "/>"), "xml"),
    "xml-attributes-on-feed": (xml("<feed", _numbered(' a{}=""'), "/>"), "xml"),
    "xml-attributes-on-header": (
        xml("<message><header", _numbered(' a{}=""'), "/></message>"),
        "xml",
    ),
    "xml-attributes-at-the-limit": (
        xml("", _repeat(b"<message " + b" ".join(b'a%d=""' % n for n in range(64)) + b"/>"), ""),
        "xml",
    ),
    "xml-messages": (xml("", _repeat(b"<message/>"), ""), "xml"),
    "xml-headers": (xml("<message>", _repeat(b'<header name="h"/>'), "</message>"), "xml"),
    "xml-tiny-elements": (xml("", _repeat(b"<a/>"), ""), "xml"),
    "xml-elements-in-feed": (xml("<feed>", _repeat(b"<a/>"), "</feed>"), "xml"),
    "xml-deep": (_xml_deep, "xml"),
    "xml-long-attribute-name": (xml("<message ", _repeat(b"a"), '=""/>'), "xml"),
    "xml-long-element-name": (xml("<m", _repeat(b"m"), "/>"), "xml"),
    "xml-entity-declarations": (_xml_entity_declarations, "xml"),
    "xml-entity-expansion": (_xml_entity_expansion, "xml"),
    "xml-undeclared-entities": (xml('<message address="', _repeat(b"&x;"), '"/>'), "xml"),
    "xml-character-references": (
        xml("<message><content>", _repeat(b"&#65;"), "</content></message>"),
        "xml",
    ),
    "json-keys-on-message": (_json(b'{"message":[{', _numbered('"a{}":""'), b"}]}"), "json"),
    "json-keys-on-feed": (_json(b'{"feed":[{', _numbered('"a{}":""'), b"}]}"), "json"),
    "json-keys-on-header": (
        _json(b'{"message":[{"header":[{', _numbered('"a{}":""'), b"}]}]}"),
        "json",
    ),
    "json-keys-on-root": (_json(b"{", _numbered('"a{}":""'), b"}"), "json"),
    "json-repeated-key": (_json(b'{"message":[{', _repeat(b'"a":""'), b"}]}"), "json"),
    "json-keys-at-the-limit": (
        _json(
            b'{"message":[',
            _repeat(b"{" + b",".join(b'"a%d":""' % n for n in range(64)) + b"}"),
            b"]}",
        ),
        "json",
    ),
    "json-messages": (_json(b'{"message":[', _repeat(b"{}"), b"]}"), "json"),
    "json-headers": (
        _json(b'{"message":[{"header":[', _repeat(b'{"name":"h"}'), b"]}]}"),
        "json",
    ),
    "json-tiny-elements": (_json(b'{"feed":[{"a":[', _repeat(b"{}"), b"]}]}"), "json"),
    "json-deep": (_json_deep, "json"),
    "json-long-key": (_json_long_name, "json"),
}
