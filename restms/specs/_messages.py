"""Messages to publish and their contents: frozen values valid once built (M5, M6, §6.6).

Also the per-request limits a publish is read within (:class:`MessageLimits`; over them
-> 413) and the count a publish reply gives for a message already routed
(:class:`Duplicate`).
"""

from __future__ import annotations

import binascii
from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import chain

from ..errors import BadRequest
from ._vocabulary import DEFAULT_CONTENT_TYPE, ENCODINGS, check_text


@dataclass(frozen=True, slots=True, kw_only=True)
class MessageLimits:
    """Count and size limits on a publish request (M5 allows caps); over them -> 413."""

    max_messages: int = 10_000
    max_headers: int = 128
    max_contents: int = 16
    max_header_bytes: int = 8192  # one header's name and value, in characters


# Bytes that are, in valid UTF-8, the C0 controls XML 1.0 cannot carry (all but tab, LF
# and CR); with U+FFFE and U+FFFF (surrogates never survive a strict decode) they are
# exactly what document.NOT_XML finds in the decoded text. Turning them into spaces
# with bytes.translate and comparing with the data is several times faster than the
# regex (and than deleting them: see restms.xmlscan, which does the same).
_CONTROLS = bytes(c for c in range(0x20) if c not in b"\t\n\r")
_CONTROLS_TO_SPACES = bytes.maketrans(_CONTROLS, b" " * len(_CONTROLS))
_NONCHARACTERS = (b"\xef\xbf\xbe", b"\xef\xbf\xbf")  # U+FFFE, U+FFFF in UTF-8


@dataclass(frozen=True, slots=True, kw_only=True)
class EmbeddedContent:
    """Content carried inside the message document (M6)."""

    type: str = DEFAULT_CONTENT_TYPE
    encoding: str = "plain"
    value: str = ""  # plain text, or base64 with white space removed

    def __post_init__(self) -> None:
        if self.encoding not in ENCODINGS:
            raise BadRequest(f"unknown content encoding {self.encoding!r}; use plain or base64")
        check_text(self.type, "content", "type")

    def data(self) -> bytes:
        if self.encoding == "base64":
            return binascii.a2b_base64(self.value)
        return self.value.encode()

    @classmethod
    def of(cls, data: bytes, content_type: str) -> EmbeddedContent:
        """Bytes as a content: plain when they are UTF-8 text XML 1.0 can carry, else
        base64 (M6). Used for every message that comes from outside as raw bytes."""
        try:
            text = data.decode()  # fails fast on binary bodies
        except UnicodeDecodeError:
            pass
        else:
            if data.translate(_CONTROLS_TO_SPACES) == data and (
                0xEF not in data  # one memchr (an int is) is far cheaper than two 3-byte searches
                or not (_NONCHARACTERS[0] in data or _NONCHARACTERS[1] in data)
            ):
                return cls(type=content_type, encoding="plain", value=text)
        value = binascii.b2a_base64(data, newline=False).decode("ascii")
        return cls(type=content_type, encoding="base64", value=value)


@dataclass(frozen=True, slots=True, kw_only=True)
class LinkedContent:
    """A reference to a staged content (M1, M7-M10): ``<content href/>``."""

    path: str


Content = EmbeddedContent | LinkedContent
# A <content>'s attributes, read: the content it links, or its type and encoding.
ContentHead = LinkedContent | tuple[str, str]


@dataclass(frozen=True, slots=True, kw_only=True)
class MessageSpec:
    address: str = ""
    props: tuple[tuple[str, str], ...] = ()  # MESSAGE_PROPERTIES present, in that order
    headers: tuple[tuple[str, str], ...] = ()
    contents: tuple[Content, ...] = ()
    # The characters of its address, properties and headers (names and values): what
    # the message weighs besides its contents. Pipe and feed-queue byte limits, the
    # memory budget and the byte metrics count it with the contents (docs/DURABILITY.md).
    head_size: int = field(default=0, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "head_size", head_size(self.address, self.props, self.headers))

    def prop(self, name: str) -> str | None:
        for key, value in self.props:
            if key == name:
                return value
        return None

    @property
    def header_map(self) -> Mapping[str, str]:
        return dict(self.headers)


# The slot descriptors of the two values built per published message, from parts
# already checked, by checked_message and embedded: setting the slots directly skips
# the frozen classes' ``object.__setattr__`` per field and ``__post_init__`` (half the


_flat = chain.from_iterable


def head_size(
    address: str, props: tuple[tuple[str, str], ...], headers: tuple[tuple[str, str], ...]
) -> int:
    """:attr:`MessageSpec.head_size` (the lengths summed in C: no step a header)."""
    size = len(address)
    if props:
        size += sum(map(len, _flat(props)))
    if headers:
        size += sum(map(len, _flat(headers)))
    return size


class Duplicate(int):
    """A publish reply count for a message whose ``message_id`` the feed routed
    recently: it was not routed again, and the count is the first routing's."""

    __slots__ = ()
