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
import sys
from dataclasses import dataclass

# lxml (without huge_tree) refuses a text node over 10,000,000 bytes; stay below it.
MAX_BODY = 10_000_000

_WS = r"[ \t\r\n]"
# Names of at most 256 characters (libxml2 allows 50,000): longer ones go to lxml.
_NAME = r"[A-Za-z_][A-Za-z0-9_.-]{0,255}"
_VALUE = r"(?:\"[^\"<\x00-\x1f]*\"|'[^'<\x00-\x1f]*')"
# The root may declare the RestMS namespace and no other (lxml checks other URIs).
_NS_VALUE = r"([\"'])http://www\.restms\.org/schema/restms\4"
_ATTRS = rf"((?:{_WS}+{_NAME}{_WS}*={_WS}*{_VALUE})*){_WS}*"

_PROLOG = re.compile(
    rf"(?:<\?xml{_WS}+version{_WS}*={_WS}*([\"'])1\.0\1"
    rf"(?:{_WS}+encoding{_WS}*={_WS}*([\"'])(?i:utf-8)\2)?"
    rf"(?:{_WS}+standalone{_WS}*={_WS}*([\"'])(?:yes|no)\3)?{_WS}*\?>)?{_WS}*"
    rf"<restms(?:{_WS}+xmlns{_WS}*={_WS}*{_NS_VALUE})?{_WS}*>{_WS}*+"
)
# The opening most publishers send, tried as a literal first (the regex costs as much
# as reading a whole small message).
_ROOT = '<restms xmlns="http://www.restms.org/schema/restms">'
# One start or end tag, whole: "<message a='v'>", "<content/>", "</content >".
_TAG = re.compile(rf"<(message|content|header){_ATTRS}(/?)>|</(message|content|header){_WS}*>")
_SPACE = re.compile(rf"{_WS}*")
_ROOT_END = re.compile(rf"</restms{_WS}*>{_WS}*\Z")
_ATTR = re.compile(rf"({_NAME}){_WS}*={_WS}*(?:\"([^\"]*)\"|'([^']*)')")
# The most common message in two matches around its text: its start tag, then empty
# <header/> tags, then either its end or one <content> start tag; after the content's
# text (found with str.find, at memchr speed), the content's end and the message's.
# Both take the white space after the message too. The groups are raw tags, each read
# by _TAG as any other. Possessive repeats never backtrack.
_MESSAGE = re.compile(
    rf"(<message[^>]*+>)((?:{_WS}*+<header[^>]*+>)*+){_WS}*+"
    rf"(?:(<content[^>]*+>)|</message>{_WS}*+)"
)
_MESSAGE_TAIL = re.compile(rf"</content>{_WS}*+</message>{_WS}*+")
_RAW_TAGS = re.compile(r"<[^>]*+>")  # as _MESSAGE cuts them: each is checked by _TAG
# Most documents open with _ROOT and a message of the common shape: one match reads
# both, in place of a literal test, a slice and a match of _MESSAGE (each regex call
# has a fixed start-up cost that a small body feels). Most hold that message alone:
# then they end with _END, compared as a literal instead of matching _ROOT_END.
_FIRST = re.compile(re.escape(_ROOT) + _MESSAGE.pattern)
_END = "</restms>"

# What XML forbids in text or would rewrite: controls, CR, U+FFFE, U+FFFF, "]]>", and
# any '&' that does not start one of the five predefined entities. All are whole-body
# checks chosen for speed (the figures are in docs/BENCHMARKS.md, "Why the fast paths
# look as they do"). Controls: bytes.translate with a table that turns each of them
# into a space copies the body in C and gives back the body itself when nothing
# changed, so that the comparison is then an identity test; that beats a
# character-class search, str.isprintable, and deleting them and comparing lengths.
# Past a few KiB, one str.find per control character is faster still: each runs at
# memchr speed, after a fixed cost that small bodies do not repay.
_CONTROLS = bytes([*range(0x09), 0x0B, 0x0C, *range(0x0D, 0x20)])
_CONTROLS_TO_SPACES = bytes.maketrans(_CONTROLS, b" " * len(_CONTROLS))
_CONTROL_CHARS = tuple(map(chr, _CONTROLS))
_SEARCH_EACH = 4096  # bytes from which one search per control character wins
_BAD_ENTITY = re.compile(r"&(?!(?:amp|lt|gt|quot|apos);)")

Attrs = dict[str, str]


@dataclass(frozen=True, slots=True, eq=False)
class Tag:
    """One tag as read: its element name ("/message" for an end tag), its attributes
    and whether it is empty (``<content/>``).

    Publishers send the same few tags over and over, so a tag's text is read once and
    the same object comes back for the same text (``shared``): its attributes are
    read-only. Tags compare by identity, so a builder may remember, per shared tag,
    what it made of one.
    """

    name: str
    attrs: Attrs
    empty: bool
    shared: bool = False


# A message: its start tag, its header tags, its contents (start tag and text).
Scanned = tuple[Tag, list[Tag], list[tuple[Tag, str | None]]]


def _unescape(text: str) -> str:
    if "&" not in text:
        return text
    for ref, char in (("&lt;", "<"), ("&gt;", ">"), ("&quot;", '"'), ("&apos;", "'")):
        text = text.replace(ref, char)
    return text.replace("&amp;", "&")  # last, so "&amp;lt;" stays "&lt;"


def _read_tag(raw: str, shared: bool) -> Tag | None:
    found = _TAG.fullmatch(raw)
    if found is None:
        return None
    if found.group(4):
        return Tag("/" + found.group(4), {}, False, shared)
    pairs = _ATTR.findall(found.group(2))
    attrs = {name: _unescape(double or single) for name, double, single in pairs}
    if len(attrs) != len(pairs) or "xmlns" in attrs:
        return None  # a duplicate (lxml refuses it) or a namespace declaration
    return Tag(found.group(1), attrs, bool(found.group(3)), shared)


_SEEN: dict[str, Tag | None] = {}
_SHARED_LENGTH = 256  # characters of a tag's text, at most, for it to be shared
# Each attribute takes five characters at least (' a=""'), so a shared tag has fewer
# attributes than this; a builder that remembers what it made of shared tags need only
# count the attributes of the others, while its limit is not below this.
SHARED_ATTRIBUTES = _SHARED_LENGTH // 5


def _tag(raw: str) -> Tag | None:
    """One whole tag, read once and then shared while the cache has room."""
    try:
        return _SEEN[raw]
    except KeyError:
        pass
    shared = len(raw) <= _SHARED_LENGTH and len(_SEEN) < 1024  # client-chosen: keep it small
    tag = _read_tag(raw, shared)
    if shared:
        _SEEN[raw] = tag
    return tag


# The shared tags already read as the start tag of a <message> or of a <content> that is
# not empty, by their text: the common message's tags found by one lookup each, without
# testing the name and emptiness of each again. Never more than _SEEN holds.
_MESSAGE_STARTS: dict[str, Tag] = {}
_CONTENT_STARTS: dict[str, Tag] = {}


def _start(raw: str, name: str, starts: dict[str, Tag]) -> Tag | None:
    """The tag ``raw`` when it is a start tag of element ``name`` that is not empty,
    remembered in ``starts`` when it is shared; else None."""
    tag = _tag(raw)
    if tag is None or tag.name != name or tag.empty:
        return None
    if tag.shared:
        starts[raw] = tag
    return tag


def _plain(body: bytes, text: str) -> bool:
    if len(body) < _SEARCH_EACH:
        controls = body.translate(_CONTROLS_TO_SPACES) != body
    else:
        controls = any(map(text.__contains__, _CONTROL_CHARS))
    return not (
        controls
        or "\ufffe" in text
        or "\uffff" in text
        or ("]" in text and "]]>" in text)
        or ("&" in text and _BAD_ENTITY.search(text) is not None)
    )


def scan(body: bytes, most: int = sys.maxsize) -> list[Scanned] | None:
    """Each message's start tag, header tags and contents, or None (ask lxml).

    A content is its start tag and its text (None when it has none, as lxml says).
    More than ``most`` messages is None too: the caller would refuse them, and reading
    on through a body of tiny messages would be work for nothing.
    """
    if len(body) > MAX_BODY:
        return None
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if not _plain(body, text):
        return None
    first = _FIRST.match(text)
    message, pos = _whole(first, text, _SEEN) if first is not None else (None, 0)
    if message is not None:
        if text[pos:] == _END:
            return [message]
        out = [message]
    else:  # the general way, from the start
        opened = _opening(text)
        if opened is None:
            return None
        pos, out = opened, []
    # From here, and after each message: at a "<" or at the end.
    match, seen = _MESSAGE.match, _SEEN
    while True:
        # Tried before the end test: it fails at once on "</restms>", and the end test
        # (str.startswith, a dear call on Python 3.11) then runs once, not per message.
        whole = match(text, pos)
        if whole is not None:  # the common shape: its tags read without a loop
            message, end = _whole(whole, text, seen)
            if message is not None:
                out.append(message)
                if len(out) > most:
                    return None
                pos = end
                continue
        if text.startswith("</", pos):
            return out if _ROOT_END.match(text, pos) else None
        step = _message(text, pos)
        if step is None:
            return None  # anything else, even "<message a='>'>": lxml decides
        out.append(step[0])
        if len(out) > most:
            return None
        pos = _SPACE.match(text, step[1]).end()  # type: ignore[union-attr]  # always matches


def _opening(text: str) -> int | None:
    """Where the first message may start, after the declaration and the root's start."""
    if text.startswith(_ROOT):
        pos = len(_ROOT)
        if text[pos : pos + 1] != "<":
            pos = _SPACE.match(text, pos).end()  # type: ignore[union-attr]  # always matches
        return pos
    found = _PROLOG.match(text)
    return None if found is None else found.end()


def _whole(
    found: re.Match[str], text: str, seen: dict[str, Tag | None]
) -> tuple[Scanned | None, int]:
    """A message :data:`_MESSAGE` (or :data:`_FIRST`) matched, and the position after
    it, when its tags are what they seem; else None (and the tag-by-tag reading decides)."""
    raw_head, raw_headers, raw_content = found.groups()
    head = _MESSAGE_STARTS.get(raw_head) or _start(raw_head, "message", _MESSAGE_STARTS)
    if head is None:
        return None, 0
    headers = []
    if raw_headers:
        for raw in _RAW_TAGS.findall(raw_headers):
            tag = seen.get(raw) or _tag(raw)
            if tag is None or tag.name != "header" or not tag.empty:
                return None, 0
            headers.append(tag)
    end = found.end()
    if raw_content is None:
        return (head, headers, []), end
    content = _CONTENT_STARTS.get(raw_content) or _start(raw_content, "content", _CONTENT_STARTS)
    stop = text.find("<", end)
    tail = _MESSAGE_TAIL.match(text, stop) if stop >= 0 else None
    if tail is None or content is None:
        return None, 0
    value = text[end:stop]
    # (_unescape's own first test, inline: most texts hold no reference, and no call)
    unescaped = (_unescape(value) if "&" in value else value) if value else None
    return (head, headers, [(content, unescaped)]), tail.end()


def _message(text: str, pos: int) -> tuple[Scanned, int] | None:
    """Any other message of the plain shape, tag by tag, from ``pos`` (a ``<``); the
    message and the position after it, or None."""
    end = text.find(">", pos) + 1
    head = _tag(text[pos:end]) if end else None
    if head is None or head.name != "message":
        return None
    if head.empty:
        return (head, [], []), end
    pos = end
    headers: list[Tag] = []
    contents: list[tuple[Tag, str | None]] = []
    while True:
        if text[pos : pos + 1] != "<":
            pos = _SPACE.match(text, pos).end()  # type: ignore[union-attr]  # always matches
        end = text.find(">", pos) + 1
        tag = _tag(text[pos:end]) if end else None
        if tag is None:
            return None
        pos = end
        if tag.name == "/message":
            return (head, headers, contents), pos
        if tag.name not in ("header", "content"):
            return None
        value = None
        if not tag.empty:  # text up to the next "<", which must be this element's end
            stop = text.find("<", pos)
            end = text.find(">", stop) + 1
            closing = _tag(text[stop:end]) if stop >= 0 and end else None
            if closing is None or closing.name != "/" + tag.name:
                return None
            value, pos = text[pos:stop], end
        if tag.name == "header":
            headers.append(tag)  # a header's text means nothing
        else:
            contents.append((tag, _unescape(value) if value else None))
