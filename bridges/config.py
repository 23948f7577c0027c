"""Bridge definitions: ``[[bridges]]`` tables in the TOML file, or JSON documents POSTed
to the admin resource. Both go through :func:`parse`, so both are checked the same way
and unknown keys are errors.
"""

from __future__ import annotations

import dataclasses
import re
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from restms.names import check_address

from .amqp_map import check_address_from, check_target

NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")
KINDS = frozenset({"amqp"})
DIRECTIONS = frozenset({"out", "in"})
SASL = frozenset({"", "PLAIN", "ANONYMOUS"})
BACKPRESSURE = frozenset({"wait", "skip"})
MAX_DELAY = 3600.0  # seconds: the longest delay, timeout or heartbeat a bridge may have


@dataclass(frozen=True, slots=True, kw_only=True)
class AmqpBridgeConfig:
    """One AMQP 1.0 bridge: a gateway feed and a broker address, one direction.

    ``out``: messages the ``feed`` routes to a join with ``address`` (and ``headers``)
    go to the broker ``target`` (``{address}`` is replaced by each message's address).
    ``in``: messages from the broker ``source`` are published to the ``feed``, with the
    address taken from ``address_from``.
    """

    name: str
    direction: str
    urls: tuple[str, ...]
    feed: str
    kind: str = "amqp"
    # outbound
    target: str = ""
    address: str = ""  # the internal join's address ("#": every message of a topic feed)
    headers: tuple[tuple[str, str], ...] = ()  # the internal join's headers (headers feeds)
    max_messages: int = 0  # the internal pipe's limits; 0: the gateway's defaults
    max_bytes: int = 0
    retry_min: float = 0.5  # seconds before a released message is sent again, doubling
    retry_max: float = 30.0
    dead_letter: str = ""  # feed for rejected messages; "": the gateway's dead-letter feed
    # inbound
    source: str = ""
    address_from: str = "subject"  # "subject", "to" or "header:NAME"
    backpressure: str = "wait"  # "wait": hold credit while a pipe is full; "skip": Q2
    max_message_size: int = 0  # bytes; 0: the gateway's max_body
    # both
    window: int = 256  # unsettled deliveries at most (outbound), credit (inbound)
    durable: bool = True  # terminus durability; RabbitMQ queues must match it
    max_links: int = 64  # outbound: sender links kept open (one per target address)
    # connection
    user: str = ""
    password: str = field(default="", repr=False)
    sasl: str = ""  # "": PLAIN with a user, ANONYMOUS without
    heartbeat: float = 30.0  # idle timeout in seconds (0: none)
    reconnect_min: float = 0.5
    reconnect_max: float = 30.0
    tls_ca: str = ""  # PEM file of CAs for amqps://; "": the system's
    tls_verify: bool = True  # check the broker's certificate and host name
    connect_timeout: float = 15.0

    def __post_init__(self) -> None:
        if not NAME.fullmatch(self.name):
            raise ValueError(f"bridge name {self.name!r} must be 1-64 of A-Z a-z 0-9 . _ -")
        where = f"bridge {self.name}"
        if self.kind not in KINDS:
            raise ValueError(f"{where}: unknown kind {self.kind!r} (amqp)")
        if self.direction not in DIRECTIONS:
            raise ValueError(f"{where}: direction must be out or in, not {self.direction!r}")
        if not self.urls:
            raise ValueError(f"{where}: urls must name at least one broker")
        for url in self.urls:
            try:
                parts = urllib.parse.urlsplit(url)
            except ValueError as exc:
                raise ValueError(f"{where}: {redact(url)} is not a URL: {exc}") from exc
            if parts.scheme not in ("amqp", "amqps") or not parts.hostname:
                raise ValueError(f"{where}: {redact(url)} is not an amqp:// or amqps:// URL")
            try:
                parts.port  # noqa: B018 (checks the port)
            except ValueError as exc:
                raise ValueError(f"{where}: {redact(url)} has a bad port") from exc
            if parts.query or parts.fragment:
                raise ValueError(f"{where}: {redact(url)} must have no query or fragment")
        if not self.feed:
            raise ValueError(f"{where}: feed must name a gateway feed")
        if self.direction == "out":
            if not self.target:
                raise ValueError(f"{where}: an outbound bridge needs a target")
            check_target(self.target)
            try:
                check_address(self.address, "join address")
            except Exception as exc:  # restms BadRequest
                raise ValueError(f"{where}: {exc}") from exc
        else:
            if not self.source:
                raise ValueError(f"{where}: an inbound bridge needs a source")
            check_address_from(self.address_from)
        if self.sasl not in SASL:
            raise ValueError(f"{where}: sasl must be PLAIN or ANONYMOUS")
        if self.backpressure not in BACKPRESSURE:
            raise ValueError(f"{where}: backpressure must be wait or skip")
        for key in ("window", "max_links"):
            if not 1 <= getattr(self, key) <= 100_000:
                raise ValueError(f"{where}: {key} must be 1 to 100000")
        for key in ("max_messages", "max_bytes", "max_message_size", "heartbeat"):
            if getattr(self, key) < 0:
                raise ValueError(f"{where}: {key} must not be negative")
        for key in ("retry_min", "retry_max", "reconnect_min", "reconnect_max", "connect_timeout"):
            if not 0 < getattr(self, key) <= MAX_DELAY:
                raise ValueError(f"{where}: {key} must be above 0 and at most {MAX_DELAY:g} s")
        if self.heartbeat > MAX_DELAY:
            raise ValueError(f"{where}: heartbeat must be at most {MAX_DELAY:g} s")
        for key in ("max_messages", "max_bytes", "max_message_size"):
            if getattr(self, key) > 2**53:
                raise ValueError(f"{where}: {key} is too large")
        if self.retry_min > self.retry_max or self.reconnect_min > self.reconnect_max:
            raise ValueError(f"{where}: a *_min delay is larger than its *_max")

    @property
    def display_urls(self) -> list[str]:
        return [redact(url) for url in self.urls]

    def document(self) -> dict[str, Any]:
        """The definition as the admin resource shows it: no secrets."""
        out = {}
        for item in dataclasses.fields(self):
            value = getattr(self, item.name)
            if item.name == "password":
                value = "***" if value else ""
            elif item.name == "urls":
                value = self.display_urls
            elif item.name == "headers":
                value = dict(value)
            out[item.name] = value
        return out

    def stored(self) -> dict[str, Any]:
        """The definition as the data directory keeps it (secrets included, file 0600)."""
        out = dataclasses.asdict(self)
        out["urls"] = list(self.urls)
        out["headers"] = dict(self.headers)
        return out


BridgeConfig = AmqpBridgeConfig
_FIELDS = {f.name: f for f in dataclasses.fields(AmqpBridgeConfig)}


def parse(entry: Mapping[str, Any]) -> BridgeConfig:
    """A bridge definition from a TOML table or a JSON object; ValueError says why not."""
    if not isinstance(entry, Mapping):
        raise ValueError("a bridge definition must be a table / JSON object")
    unknown = sorted(set(entry) - set(_FIELDS))
    if unknown:
        raise ValueError(f"unknown bridge keys: {', '.join(unknown)}")
    values: dict[str, Any] = {}
    for key, given in entry.items():
        kind, value = _FIELDS[key].type, given
        if key == "urls":
            if isinstance(value, str):
                value = [value]
            if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
                raise ValueError("urls must be a list of URLs")
            value = tuple(value)
        elif key == "headers":
            if not isinstance(value, Mapping) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in value.items()
            ):
                raise ValueError("headers must be a table of strings")
            value = tuple(value.items())
        elif kind == "bool":
            if not isinstance(value, bool):
                raise ValueError(f"{key} must be true or false")
        elif kind == "int":
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{key} must be an integer")
        elif kind == "float":
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"{key} must be a number")
            value = float(value)
        elif not isinstance(value, str):
            raise ValueError(f"{key} must be a string")
        values[key] = value
    missing = [k for k in ("name", "direction", "urls", "feed") if k not in values]
    if missing:
        raise ValueError(f"a bridge needs {', '.join(missing)}")
    try:
        return AmqpBridgeConfig(**values)
    except TypeError as exc:
        raise ValueError(str(exc)) from exc


def redact(url: str) -> str:
    """The URL without its password (for logs, status and errors), even when the URL
    is malformed."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    authority, slash, path = rest.partition("/")
    userinfo, at, host = authority.rpartition("@")
    if not at or ":" not in userinfo:
        return url
    user = userinfo.split(":", 1)[0]
    return f"{scheme}://{user}:***@{host}{slash}{path}"
