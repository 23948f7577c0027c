"""What a client asks of feeds, pipes and joins: frozen values valid once built.

A feed or pipe to create (C1-C10), a join (G14, F9, F10) and a feed or pipe update (R2,
R3, L8). Anything a client can get wrong raises :class:`~restms.errors.BadRequest`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ..errors import BadRequest
from ..names import check_address, check_name
from ..webhook import ATTRIBUTES as WEBHOOK_ATTRIBUTES
from ..webhook import WebhookOptions
from ._vocabulary import FEED_TYPES, JOIN_TYPES, OVERFLOW_POLICIES, PIPE_TYPES, check_text


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
        check_text(self.title, "feed", "title")
        check_text(self.license, "feed", "license")


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
        check_text(self.title, "pipe", "title")
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
        for name, value in self.headers:
            check_text(name, "header", "name")
            check_text(value, "header", "value")

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
    tag: str = field(default="feed", compare=False)  # the element PUT: "feed" or "pipe"

    def __post_init__(self) -> None:
        # name and type are only compared with the resource's own, never kept
        check_text(self.title, self.tag, "title")
        check_text(self.license, self.tag, "license")
