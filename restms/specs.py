"""Typed, validated resource specs read out of RestTL documents.

These are what clients send: a feed or pipe to create (C1-C10), a join (G14, F9,
F10), feed and pipe updates (R2, R3, L8) and messages to publish (M5, M6, §6.6).
Each is a frozen value that is valid once built; anything a client can get wrong
raises :class:`~restms.errors.BadRequest` (400) or, for counts over a configured
limit, :class:`~restms.errors.PayloadTooLarge` (413). Unknown elements and
properties are ignored (G6).
"""

from __future__ import annotations

import binascii
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from .document import Document, Element
from .errors import BadRequest, PayloadTooLarge
from .names import check_address, check_name
from .uris import uri_path
from .webhook import ATTRIBUTES as WEBHOOK_ATTRIBUTES
from .webhook import WebhookOptions

_N = TypeVar("_N", int, float)

# ---------------------------------------------------------------- types (§6)
DEFAULTS_PROFILE = ("3/Defaults", "http://www.restms.org/spec:3/Defaults")
AMQP9_PROFILE = ("4/AMQP9", "http://www.restms.org/spec:4/AMQP9")
EXTENSION_PROFILE = "x-gateway/Extensions"

# Feed types: "" (3/Defaults), the six of 4/AMQP9 (F13), regexp (our extension, F12).
FEED_TYPES = frozenset({"", "fanout", "direct", "topic", "headers", "rotator", "service", "regexp"})
QUEUEING_FEED_TYPES = frozenset({"rotator", "service"})
# Pipe types: "" (3/Defaults), ondemand (4/AMQP9, P3), stream (our extension, P6) and
# webhook (our extension: the gateway POSTs each message to a callback).
PIPE_TYPES = frozenset({"", "ondemand", "stream", "webhook"})
PIPE_TYPE_ALIASES = {"fifo": ""}  # draft/3 name (P2, L2)
JOIN_TYPES = frozenset({""})  # F9

# AMQP9 message properties besides address, in the order they are written out (§6.6).
MESSAGE_PROPERTIES = (
    "message_id",
    "reply_to",
    "correlation_id",
    "delivery_mode",
    "priority",
    "expiration",
    "timestamp",
    "type",
    "user_id",
    "app_id",
    "sender_id",
)
_PROPERTY_ORDER = {name: index for index, name in enumerate(MESSAGE_PROPERTIES)}
ENCODINGS = frozenset({"plain", "base64"})
DEFAULT_CONTENT_TYPE = "text/plain"


@dataclass(frozen=True, slots=True, kw_only=True)
class MessageLimits:
    """Count limits on a publish request (M5 allows caps); over them -> 413."""

    max_messages: int = 10_000
    max_headers: int = 128
    max_contents: int = 16


# ---------------------------------------------------------------- feeds and pipes
@dataclass(frozen=True, slots=True, kw_only=True)
class FeedSpec:
    name: str | None  # None: a private feed (C1, C8)
    type: str = ""
    title: str | None = None
    license: str | None = None

    def __post_init__(self) -> None:
        if self.type not in FEED_TYPES:
            raise BadRequest(f"unknown feed type {self.type!r}")
        if self.name is not None:
            check_name(self.name, "feed")


OVERFLOW_POLICIES = frozenset({"skip", "reject", "drop-oldest"})


@dataclass(frozen=True, slots=True, kw_only=True)
class PipeOptions:
    """Our extension attributes on ``<pipe>`` (docs/EXTENSIONS.md); None: the default.

    ``dead_letter`` is a feed URI path ("" for none); ``lease`` is in seconds (0: no
    lease); ``webhook`` only on webhook pipes. The engine checks them against its
    configured maximums.
    """

    durable: bool | None = None
    lease: float | None = None
    max_deliveries: int | None = None
    dead_letter: str | None = None
    max_messages: int | None = None
    max_bytes: int | None = None
    overflow: str | None = None
    webhook: WebhookOptions | None = None

    def __post_init__(self) -> None:
        if self.overflow is not None and self.overflow not in OVERFLOW_POLICIES:
            policies = ", ".join(sorted(OVERFLOW_POLICIES))
            raise BadRequest(f"unknown pipe overflow {self.overflow!r}; use one of {policies}")

    def given(self) -> dict[str, object]:
        """The options the client set, as plain values (the store keeps these)."""
        values = ((name, getattr(self, name)) for name in self.__slots__)
        return {
            name: value.given() if isinstance(value, WebhookOptions) else value
            for name, value in values
            if value is not None
        }

    @classmethod
    def stored(cls, given: Mapping[str, object]) -> PipeOptions:
        """The options :meth:`given` returned, back (from the store)."""
        values = dict(given)
        hook = values.pop("webhook", None)
        webhook = WebhookOptions(**hook) if isinstance(hook, dict) else None
        return cls(**values, webhook=webhook)  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True, kw_only=True)
class PipeSpec:
    type: str = ""
    title: str | None = None
    options: PipeOptions = PipeOptions()

    def __post_init__(self) -> None:
        if self.type not in PIPE_TYPES:
            raise BadRequest(f"unknown pipe type {self.type!r}")
        hook = self.options.webhook
        if self.type == "webhook" and (hook is None or hook.callback is None):
            raise BadRequest("a webhook pipe needs a callback attribute: the URL to POST to")
        if self.type != "webhook" and hook is not None:
            raise BadRequest(f"{', '.join(WEBHOOK_ATTRIBUTES)} are for webhook pipes only")


@dataclass(frozen=True, slots=True, kw_only=True)
class JoinSpec:
    feed_path: str  # the decoded path of the feed URI (U5)
    address: str = ""
    type: str = ""
    headers: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if self.type not in JOIN_TYPES:
            raise BadRequest(f"unknown join type {self.type!r}")
        check_address(self.address, "join address")

    @property
    def identity(self) -> tuple[str, str, str, tuple[tuple[str, str], ...]]:
        """What makes two joins on one pipe the same join (F10)."""
        return (self.feed_path, self.type, self.address, tuple(sorted(self.headers)))


@dataclass(frozen=True, slots=True, kw_only=True)
class Update:
    """A PUT on a feed or pipe: the properties it carries (None = not sent, R3)."""

    name: str | None = None
    type: str | None = None
    title: str | None = None
    license: str | None = None
    webhook: WebhookOptions | None = None  # a webhook pipe's options that change


# ---------------------------------------------------------------- messages
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


class Duplicate(int):
    """A publish reply count for a message whose ``message_id`` the feed routed
    recently: it was not routed again, and the count is the first routing's."""

    __slots__ = ()


# ---------------------------------------------------------------- reading documents
def _single(document: Document, allowed: tuple[str, ...], where: str) -> Element:
    found = [el for el in document.elements if el.tag in _RESOURCE_TAGS]
    if len(found) != 1:
        names = " or ".join(f"<{tag}>" for tag in allowed)
        raise BadRequest(f"expected exactly one {names} element {where}, found {len(found)}")
    element = found[0]
    if element.tag not in allowed:
        names = " or ".join(f"<{tag}>" for tag in allowed)
        raise BadRequest(f"<{element.tag}> cannot be created {where}; expected {names}")
    return element


_RESOURCE_TAGS = frozenset({"domain", "profile", "feed", "pipe", "join", "message", "content"})


def creation(document: Document, slug: str | None = None) -> FeedSpec | PipeSpec:
    """The feed or pipe a domain POST asks for (C1, C7-C10)."""
    element = _single(document, ("feed", "pipe"), "in a domain")
    if element.tag == "pipe":
        # C9: pipes are always private; any name sent is ignored.
        kind = element.attrs.get("type", "")
        return PipeSpec(
            type=PIPE_TYPE_ALIASES.get(kind, kind),
            title=element.get("title"),
            options=pipe_options(element.attrs),
        )
    name = element.get("name") or (slug.strip() if slug and slug.strip() else None)
    return FeedSpec(
        name=name,
        type=element.attrs.get("type", ""),
        title=element.get("title"),
        license=element.get("license"),
    )


def pipe_options(attrs: Mapping[str, str]) -> PipeOptions:
    """The extension attributes of a ``<pipe>`` being created (400 when malformed)."""
    dead_letter = attrs.get("dead_letter")
    return PipeOptions(
        durable=_flag(attrs, "durable"),
        lease=_number(attrs, "lease", float, 0),
        max_deliveries=_number(attrs, "max_deliveries", int, 1),
        dead_letter=None if dead_letter is None else (dead_letter and uri_path(dead_letter)),
        max_messages=_number(attrs, "max_messages", int, 1),
        max_bytes=_number(attrs, "max_bytes", int, 1),
        overflow=attrs.get("overflow") or None,
        webhook=webhook_options(attrs),
    )


def webhook_options(attrs: Mapping[str, str]) -> WebhookOptions | None:
    """The webhook attributes of a ``<pipe>`` (None when it has none; 400 when malformed)."""
    if not any(attrs.get(name) for name in WEBHOOK_ATTRIBUTES):
        return None
    return WebhookOptions(
        callback=attrs.get("callback") or None,
        secret=attrs.get("secret") or None,
        concurrency=_number(attrs, "concurrency", int, 1),
        timeout=_number(attrs, "timeout", float, 0),
        max_attempts=_number(attrs, "max_attempts", int, 1),
        max_age=_number(attrs, "max_age", float, 0),
    )


def _flag(attrs: Mapping[str, str], name: str) -> bool | None:
    value = attrs.get(name)
    if not value:
        return None
    if value in ("1", "true"):
        return True
    if value in ("0", "false"):
        return False
    raise BadRequest(f"pipe {name} must be 1, 0, true or false, not {value!r}")


def _number(attrs: Mapping[str, str], name: str, kind: type[_N], low: int) -> _N | None:
    value = attrs.get(name)
    if not value:
        return None
    try:
        number = kind(value)
    except ValueError:
        number = None
    if number is None or not low <= number < 2**53:  # NaN fails the comparison too
        raise BadRequest(f"pipe {name} must be a number of at least {low}, not {value!r}")
    return number


def join(document: Document) -> JoinSpec:
    """The join a pipe POST asks for (G14, F9)."""
    element = _single(document, ("join",), "on a pipe")
    feed = element.get("feed")
    if feed is None:
        raise BadRequest("a join needs a feed attribute naming the feed URI")
    return JoinSpec(
        feed_path=uri_path(feed),
        address=element.attrs.get("address", ""),
        type=element.attrs.get("type", ""),
        headers=_headers(element, 1024),
    )


def update(document: Document, tag: str) -> Update:
    """The properties a PUT on a feed or pipe carries (R2, R3, L8)."""
    element = _single(document, (tag,), "in a PUT")
    attrs = element.attrs
    return Update(
        name=attrs.get("name"),
        type=attrs.get("type"),
        title=attrs.get("title"),
        license=attrs.get("license"),
        webhook=webhook_options(attrs) if tag == "pipe" else None,
    )


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


Head = tuple[str, tuple[tuple[str, str], ...]]  # a message's address and properties


def message_head(attrs: Mapping[str, str]) -> Head:
    """The checked address and AMQP9 properties (in their order) of a ``<message>``."""
    props = [(key, value) for key, value in attrs.items() if value and key in _PROPERTY_ORDER]
    if len(props) > 1:
        props.sort(key=lambda pair: _PROPERTY_ORDER[pair[0]])
    for key, value in props:
        check = _PROPERTY_CHECKS.get(key)
        if check is not None:
            check(value)
    return check_address(attrs.get("address", "")), tuple(props)


def checked_message(
    head: Head, headers: list[tuple[str, str]], contents: list[Content], limits: MessageLimits
) -> MessageSpec:
    """A message from its :func:`message_head` and its parts, within ``limits``."""
    if len(contents) > limits.max_contents:
        raise PayloadTooLarge(f"more than {limits.max_contents} contents in one message")
    if len(headers) > limits.max_headers:
        raise PayloadTooLarge(f"more than {limits.max_headers} headers on one element")
    spec = _new(MessageSpec)
    _SET_ADDRESS(spec, head[0])
    _SET_PROPS(spec, head[1])
    _SET_HEADERS(spec, tuple(headers))
    _SET_CONTENTS(spec, tuple(contents))
    return spec


def header(attrs: Mapping[str, str]) -> tuple[str, str]:
    name = attrs.get("name")
    if not name:
        raise BadRequest("every <header> needs a name")
    return name, attrs.get("value", "")


def _headers(element: Element, limit: int) -> tuple[tuple[str, str], ...]:
    headers = tuple(header(child.attrs) for child in element.iter("header"))
    if len(headers) > limit:
        raise PayloadTooLarge(f"more than {limit} headers on one element")
    return headers


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
