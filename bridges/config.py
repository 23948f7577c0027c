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
from .checks import MAX_DELAY, NAME, redact
from .federation.config import FederationConfig

DIRECTIONS = frozenset({"out", "in"})
SASL = frozenset({"", "PLAIN", "ANONYMOUS"})
BACKPRESSURE = frozenset({"wait", "skip"})


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
        if self.kind != "amqp":
            raise ValueError(f"{where}: kind must be amqp here, not {self.kind!r}")
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


SOCKETS = {  # socket type -> direction (out: feed -> fabric; in: fabric -> feed)
    "pub": "out",
    "push": "out",
    "dealer": "out",
    "sub": "in",
    "pull": "in",
    "router": "in",
}
AT_HWM = frozenset({"block", "drop"})
ENDPOINT = re.compile(r"(tcp|ipc|inproc)://(.+)")
TCP_ADDRESS = re.compile(r"(\*|[A-Za-z0-9._-]+|\[[0-9A-Fa-f:.]+\]):(\*|[0-9]{1,5})")
Z85_KEY = re.compile(r"[0-9A-Za-z.:+=^!/*?&<>()\[\]{}@%$#-]{40}")


@dataclass(frozen=True, slots=True, kw_only=True)
class ZmqBridgeConfig:
    """One ZeroMQ bridge: a gateway feed and one ZeroMQ socket (docs/ZEROMQ.md).

    ``pub``/``push``: messages the ``feed`` routes to a join with ``address`` (and
    ``headers``) leave on the socket. ``sub``/``pull``: what arrives is published to
    the ``feed``. ``router``: requests from REQ/DEALER peers are published to the
    ``feed`` with a reply pipe; replies go back to the peer. ``dealer``: requests the
    ``feed`` routes to the bridge go to REP/DEALER workers; their replies are
    published to ``reply_feed`` at each request's ``reply_to``.
    """

    name: str
    socket: str
    endpoints: tuple[str, ...]
    feed: str
    kind: str = "zeromq"
    bind: bool = True  # bind the endpoints (else connect to them)
    # outbound: pub, push, dealer
    address: str = ""  # the internal join's address ("#": every message of a topic feed)
    headers: tuple[tuple[str, str], ...] = ()
    max_messages: int = 0  # the internal pipe's limits; 0: the gateway's defaults
    max_bytes: int = 0
    # True: the internal pipe keeps every message on disk; False: persistent ones only
    durable: bool = False
    dead_letter: str = ""  # feed for messages that cannot be sent; "": the gateway's
    at_hwm: str = "block"  # at the send high-water mark: "block" (wait) or "drop" (count)
    # inbound: sub, pull, router
    subscribe: tuple[str, ...] = ("",)  # sub: topic prefixes ("": everything)
    default_address: str = ""  # the address of foreign messages without one
    backpressure: str = "wait"  # "wait": stop reading while a pipe is full; "skip": Q2
    max_message_size: int = 0  # bytes; 0: the gateway's max_body
    # request/reply: router, dealer
    timeout: float = 30.0  # seconds a request waits for its reply
    reply_feed: str = "default"  # dealer: the feed replies are published to
    # socket
    window: int = 256  # messages per batch; requests waiting for replies at most
    sndhwm: int = 1000
    rcvhwm: int = 1000
    linger: float = 1.0  # seconds unsent messages may keep a closed socket alive
    curve_secret_key: str = field(default="", repr=False)  # Z85; set: CURVE on
    curve_server_key: str = ""  # Z85; set: the bridge is a CURVE client of that server
    curve_clients: tuple[str, ...] = ()  # CURVE server: the client keys let in (): any

    def __post_init__(self) -> None:
        if not NAME.fullmatch(self.name):
            raise ValueError(f"bridge name {self.name!r} must be 1-64 of A-Z a-z 0-9 . _ -")
        where = f"bridge {self.name}"
        if self.kind != "zeromq":
            raise ValueError(f"{where}: kind must be zeromq here, not {self.kind!r}")
        if self.socket not in SOCKETS:
            raise ValueError(f"{where}: socket must be one of {', '.join(SOCKETS)}")
        if not self.endpoints:
            raise ValueError(f"{where}: endpoints must name at least one endpoint")
        for endpoint in self.endpoints:
            check_endpoint(endpoint, bind=self.bind, where=where)
        if not self.feed:
            raise ValueError(f"{where}: feed must name a gateway feed")
        try:
            check_address(self.address, "join address")
            check_address(self.default_address, "default_address")
            for prefix in self.subscribe:
                check_address(prefix, "subscription prefix")
        except Exception as exc:  # restms BadRequest
            raise ValueError(f"{where}: {exc}") from exc
        if self.socket != "sub" and self.subscribe != ("",):
            raise ValueError(f"{where}: subscribe is for sub sockets only")
        if self.at_hwm not in AT_HWM:
            raise ValueError(f"{where}: at_hwm must be block or drop")
        if self.backpressure not in BACKPRESSURE:
            raise ValueError(f"{where}: backpressure must be wait or skip")
        for key in ("window", "sndhwm", "rcvhwm"):
            if not 1 <= getattr(self, key) <= 1_000_000:
                raise ValueError(f"{where}: {key} must be 1 to 1000000")
        for key in ("max_messages", "max_bytes", "max_message_size"):
            if not 0 <= getattr(self, key) <= 2**53:
                raise ValueError(f"{where}: {key} must be 0 to 2^53")
        if not 0 < self.timeout <= MAX_DELAY:
            raise ValueError(f"{where}: timeout must be above 0 and at most {MAX_DELAY:g} s")
        if not 0 <= self.linger <= MAX_DELAY:
            raise ValueError(f"{where}: linger must be 0 to {MAX_DELAY:g} s")
        for key in ("curve_secret_key", "curve_server_key"):
            value = getattr(self, key)
            if value and not Z85_KEY.fullmatch(value):
                raise ValueError(f"{where}: {key} must be a 40-character Z85 key")
        for key in self.curve_clients:
            if not Z85_KEY.fullmatch(key):
                raise ValueError(f"{where}: curve_clients must be 40-character Z85 keys")
        if (self.curve_server_key or self.curve_clients) and not self.curve_secret_key:
            raise ValueError(f"{where}: CURVE needs the bridge's curve_secret_key")
        if self.curve_server_key and self.curve_clients:
            raise ValueError(f"{where}: curve_clients is for a CURVE server, not a client")

    @property
    def direction(self) -> str:
        return SOCKETS[self.socket]

    @property
    def display_urls(self) -> list[str]:
        return list(self.endpoints)

    def document(self) -> dict[str, Any]:
        """The definition as the admin resource shows it: no secrets."""
        out = self.stored()
        out["curve_secret_key"] = "***" if self.curve_secret_key else ""
        return out

    def stored(self) -> dict[str, Any]:
        """The definition as the data directory keeps it (secrets included, file 0600)."""
        out = dataclasses.asdict(self)
        for key in ("endpoints", "subscribe", "curve_clients"):
            out[key] = list(getattr(self, key))
        out["headers"] = dict(self.headers)
        return out


def check_endpoint(endpoint: str, *, bind: bool, where: str) -> None:
    """A tcp://, ipc:// or inproc:// endpoint; ``*`` (any port) only to bind."""
    matched = ENDPOINT.fullmatch(endpoint)
    if matched is None:
        raise ValueError(f"{where}: {endpoint!r} is not a tcp://, ipc:// or inproc:// endpoint")
    scheme, rest = matched.groups()
    if scheme != "tcp":
        return
    address = TCP_ADDRESS.fullmatch(rest)
    if address is None:
        raise ValueError(f"{where}: {endpoint!r} must be tcp://HOST:PORT")
    host, port = address.groups()
    if not bind and "*" in (host, port):
        raise ValueError(f"{where}: {endpoint!r}: a connect endpoint needs a host and a port")
    if port != "*" and not 1 <= int(port) <= 65535:
        raise ValueError(f"{where}: {endpoint!r} has a bad port")


BridgeConfig = AmqpBridgeConfig | ZmqBridgeConfig | FederationConfig
_CLASSES: dict[str, type[BridgeConfig]] = {
    "amqp": AmqpBridgeConfig,
    "zeromq": ZmqBridgeConfig,
    "federation": FederationConfig,
}
_REQUIRED = {
    "amqp": ("name", "direction", "urls", "feed"),
    "zeromq": ("name", "socket", "endpoints", "feed"),
    "federation": ("name", "direction", "feed", "remote"),
}


def parse(entry: Mapping[str, Any]) -> BridgeConfig:
    """A bridge definition from a TOML table or a JSON object; ValueError says why not."""
    if not isinstance(entry, Mapping):
        raise ValueError("a bridge definition must be a table / JSON object")
    kind = entry.get("kind", "amqp")
    if not isinstance(kind, str) or kind not in _CLASSES:
        raise ValueError(f"unknown bridge kind {kind!r} ({', '.join(_CLASSES)})")
    cls = _CLASSES[kind]
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(entry) - set(fields))
    if unknown:
        raise ValueError(f"unknown {kind} bridge keys: {', '.join(unknown)}")
    values = {key: _value(key, str(fields[key].type), given) for key, given in entry.items()}
    missing = [k for k in _REQUIRED[kind] if k not in values]
    if missing:
        raise ValueError(
            f"a{'n' if kind == 'amqp' else ''} {kind} bridge needs {', '.join(missing)}"
        )
    try:
        return cls(**values)
    except TypeError as exc:
        raise ValueError(str(exc)) from exc


def _value(key: str, kind: str, value: Any) -> Any:
    """A definition's value checked (and converted) against its field's type."""
    if kind == "tuple[str, ...]":
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
            raise ValueError(f"{key} must be a list of strings")
        return tuple(value)
    if key == "headers":
        if not isinstance(value, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()
        ):
            raise ValueError("headers must be a table of strings")
        return tuple(value.items())
    if kind == "bool":
        if not isinstance(value, bool):
            raise ValueError(f"{key} must be true or false")
    elif kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{key} must be an integer")
    elif kind == "float":
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"{key} must be a number")
        return float(value)
    elif not isinstance(value, str):
        raise ValueError(f"{key} must be a string")
    return value
