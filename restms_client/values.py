"""The RestMS resources as typed immutable values (docs/PROTOCOL.md §1, §3).

Values are what the gateway's documents say, read once: a :class:`Pipe` is the pipe
as it was when it was fetched, not a live object. Every ``href`` is the absolute URI
the gateway wrote; the client follows those and builds none of its own where the
gateway gives one. What a value can *do* (publish, read, acknowledge) is on the
clients, which take values as arguments.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

AckT = TypeVar("AckT")

_EMPTY: Mapping[str, str] = types.MappingProxyType({})


def frozen_map(items: Mapping[str, str] | None) -> Mapping[str, str]:
    """A read-only copy of ``items`` (headers, settings) for a frozen value."""
    return types.MappingProxyType(dict(items)) if items else _EMPTY


@dataclass(frozen=True, slots=True, kw_only=True)
class Content:
    """One content of a message: bytes of a MIME type, embedded or linked (``href``).

    A linked content read from a pipe has ``body=None`` until fetched
    (``client.content(...)``, which keeps its ``href`` too).
    """

    type: str = "text/plain"
    body: bytes | None = None
    href: str | None = None

    def __post_init__(self) -> None:
        if self.body is None and self.href is None:
            raise ValueError("a content has a body, an href, or both")

    @property
    def text(self) -> str:
        """The body as UTF-8 text."""
        if self.body is None:
            raise ValueError(f"content {self.href} is linked: fetch it first")
        return self.body.decode()


PROPERTIES = (
    "message_id",
    "reply_to",
    "correlation_id",
    "priority",
    "expiration",
    "timestamp",
    "type",
    "user_id",
    "app_id",
    "sender_id",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Message:
    """A message to publish, or as delivered (then ``feed`` names where it came from).

    ``persistent`` maps to RestMS ``delivery_mode`` (2 persistent, 1 not, ``None``:
    the publish's default). ``expiration`` is in milliseconds, as on the wire.
    Build one with :meth:`of` for the usual single content.
    """

    address: str = ""
    contents: tuple[Content, ...] = ()
    headers: Mapping[str, str] = field(default_factory=dict)
    message_id: str | None = None
    reply_to: str | None = None
    correlation_id: str | None = None
    persistent: bool | None = None
    priority: int | None = None
    expiration: int | None = None
    timestamp: str | None = None
    type: str | None = None
    user_id: str | None = None
    app_id: str | None = None
    sender_id: str | None = None
    feed: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "headers", frozen_map(self.headers))
        object.__setattr__(self, "contents", tuple(self.contents))
        if self.priority is not None and not 0 <= self.priority <= 9:
            raise ValueError("priority is 0 to 9")

    @classmethod
    def of(
        cls, body: str | bytes = b"", *, content_type: str | None = None, **fields: object
    ) -> Message:
        """A message with one content: ``str`` as ``text/plain``, ``bytes`` as
        ``application/octet-stream`` unless ``content_type`` says otherwise."""
        if isinstance(body, str):
            content = Content(type=content_type or "text/plain", body=body.encode())
        else:
            content = Content(type=content_type or "application/octet-stream", body=body)
        return cls(contents=(content,), **fields)  # type: ignore[arg-type]

    @property
    def body(self) -> bytes:
        """The first content's bytes (empty when there is none)."""
        if not self.contents:
            return b""
        body = self.contents[0].body
        if body is None:
            raise ValueError("the first content is linked: fetch it first")
        return body

    @property
    def text(self) -> str:
        """The first content as UTF-8 text."""
        return self.body.decode()


@dataclass(frozen=True, slots=True, kw_only=True)
class Feed:
    """A feed: public ones have a ``name``; private ones only their ``href``."""

    href: str
    type: str = ""
    name: str | None = None
    title: str | None = None
    license: str | None = None
    # True when the request that returned it made it (201), False when it was there
    # already (200); None when it was fetched. Not part of the feed's identity.
    created: bool | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class Join:
    """A join of a pipe to a feed: messages whose address matches reach the pipe."""

    href: str
    feed: str
    address: str = ""
    type: str = ""
    headers: Mapping[str, str] = field(default_factory=dict)
    created: bool | None = field(default=None, compare=False)  # as Feed.created

    def __post_init__(self) -> None:
        object.__setattr__(self, "headers", frozen_map(self.headers))


@dataclass(frozen=True, slots=True, kw_only=True)
class Listed:
    """A message as a pipe document lists it: where it is, without its contents."""

    href: str
    position: int
    address: str = ""
    message_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Pipe:
    """A pipe as fetched: its joins, the messages it held, and its asynclet.

    ``settings`` holds the delivery settings the gateway reports (``durable``,
    ``lease``, ``max_deliveries``, ``dead_letter``, ``max_messages``, ``max_bytes``,
    ``overflow``). ``asynclet`` is ``None`` when the listing was capped.
    ``earliest`` is the oldest position the pipe held (``RestMS-Earliest-Position``).
    """

    href: str
    name: str
    type: str = ""
    title: str | None = None
    joins: tuple[Join, ...] = ()
    messages: tuple[Listed, ...] = ()
    asynclet: str | None = None
    settings: Mapping[str, str] = field(default_factory=dict)
    earliest: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "settings", frozen_map(self.settings))


@dataclass(frozen=True, slots=True, kw_only=True)
class Domain:
    """A domain: its profiles and the public feeds it lists."""

    href: str
    name: str
    title: str | None = None
    profiles: Mapping[str, str] = field(default_factory=dict)
    feeds: tuple[Feed, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "profiles", frozen_map(self.profiles))

    def feed(self, name: str) -> Feed:
        """The listed public feed called ``name`` (KeyError when it is not listed)."""
        for feed in self.feeds:
            if feed.name == name:
                return feed
        raise KeyError(name)


@dataclass(frozen=True, slots=True, kw_only=True)
class Published:
    """The reply to a publish: per message, in order, how many pipes it reached and
    whether the feed had already routed its ``message_id`` (a duplicate)."""

    counts: tuple[int, ...]
    duplicates: tuple[bool, ...]
    message_ids: tuple[str, ...]
    replayed: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class Gap:
    """Positions ``first``..``last`` left the pipe unacknowledged; ``earliest`` is the
    oldest position it holds now (docs/EXTENSIONS.md §3, *Gaps*)."""

    first: int
    last: int
    earliest: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Delivery(Generic[AckT]):
    """A message read from a pipe, at ``position`` (its ``href``).

    ``delivery_count`` is how many acknowledgement leases of it ran out before this
    delivery (0 on a first delivery). ``ack()`` acknowledges it and, as RestMS
    defines it, every older message of the pipe; on the asyncio client it is awaited.
    """

    message: Message
    href: str
    position: int
    delivery_count: int = 0
    _ack: Callable[[], AckT] = field(repr=False, compare=False)

    def ack(self) -> AckT:
        """Acknowledge this message and every older one of its pipe."""
        return self._ack()

    @property
    def address(self) -> str:
        return self.message.address

    @property
    def headers(self) -> Mapping[str, str]:
        return self.message.headers

    @property
    def message_id(self) -> str | None:
        return self.message.message_id

    @property
    def body(self) -> bytes:
        return self.message.body

    @property
    def text(self) -> str:
        return self.message.text
