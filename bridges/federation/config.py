"""A federation link's definition (``kind = "federation"``), checked like every bridge's:
in a ``[[bridges]]`` table or a JSON document POSTed to the admin resource
(:func:`bridges.config.parse`). docs/FEDERATION.md lists the keys.
"""

from __future__ import annotations

import dataclasses
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

from restms.names import check_address

from ..checks import MAX_DELAY, NAME, redact

DIRECTIONS = frozenset({"out", "in"})  # out: push to the remote; in: pull from it
MAX_HOPS = 16
MAX_BATCH = 10_000
SECRETS = ("bearer", "client_secret")


@dataclass(frozen=True, slots=True, kw_only=True)
class FederationConfig:
    """One link between a local feed and a feed of a remote RestMS gateway.

    ``out``: what the local ``feed`` routes to a join with ``address`` (and ``headers``)
    is published to the ``remote`` feed. ``in``: the link keeps a pipe on the remote
    gateway, joined to the ``remote`` feed with ``address`` (and ``headers``), and
    publishes what it reads there into the local ``feed``.
    """

    name: str
    direction: str
    feed: str
    remote: str  # the remote feed's URL: http(s)://host[:port]/restms/feed/<name>
    kind: str = "federation"
    address: str = ""
    headers: tuple[tuple[str, str], ...] = ()
    # how the link proves itself to the remote: a fixed token, or client credentials
    bearer: str = field(default="", repr=False)
    token_url: str = ""
    client_id: str = ""
    client_secret: str = field(default="", repr=False)
    scope: str = ""
    max_hops: int = 1  # gateways a message may pass through after its origin
    batch: int = 100  # messages per publish to the remote (out) or per read (in)
    retry_min: float = 0.5  # seconds before the first retry of a failed request, doubling
    retry_max: float = 30.0
    timeout: float = 30.0  # seconds one request to the remote may take
    wait: float = 20.0  # in: seconds a read waits on the remote pipe's asynclet
    dead_letter: str = ""  # feed for messages the remote refuses; "": the gateway's
    # out: the local pipe's limits; in: those asked of the remote pipe; 0: the defaults
    max_messages: int = 0
    max_bytes: int = 0
    durable: bool = True  # out: the local pipe keeps every message on disk
    tls_ca: str = ""  # PEM file of CAs for https://; "": the system's
    tls_verify: bool = True

    def __post_init__(self) -> None:
        if not NAME.fullmatch(self.name):
            raise ValueError(f"bridge name {self.name!r} must be 1-64 of A-Z a-z 0-9 . _ -")
        where = f"bridge {self.name}"
        if self.kind != "federation":
            raise ValueError(f"{where}: kind must be federation here, not {self.kind!r}")
        if self.direction not in DIRECTIONS:
            raise ValueError(f"{where}: direction must be out or in, not {self.direction!r}")
        if not self.feed:
            raise ValueError(f"{where}: feed must name a gateway feed")
        check_url(self.remote, where, "remote", feed=True)
        try:
            check_address(self.address, "join address")
        except Exception as exc:  # restms BadRequest
            raise ValueError(f"{where}: {exc}") from exc
        if self.bearer and (self.token_url or self.client_id or self.client_secret):
            raise ValueError(f"{where}: give either bearer or client credentials, not both")
        if self.token_url or self.client_id or self.client_secret:
            if not (self.token_url and self.client_id and self.client_secret):
                raise ValueError(
                    f"{where}: client credentials need token_url, client_id and client_secret"
                )
            check_url(self.token_url, where, "token_url", feed=False)
        if not 1 <= self.max_hops <= MAX_HOPS:
            raise ValueError(f"{where}: max_hops must be 1 to {MAX_HOPS}")
        if not 1 <= self.batch <= MAX_BATCH:
            raise ValueError(f"{where}: batch must be 1 to {MAX_BATCH}")
        for key in ("retry_min", "retry_max", "timeout", "wait"):
            if not 0 < getattr(self, key) <= MAX_DELAY:
                raise ValueError(f"{where}: {key} must be above 0 and at most {MAX_DELAY:g} s")
        if self.retry_min > self.retry_max:
            raise ValueError(f"{where}: retry_min is larger than retry_max")
        for key in ("max_messages", "max_bytes"):
            if not 0 <= getattr(self, key) <= 2**53:
                raise ValueError(f"{where}: {key} must be 0 to 2^53")

    @property
    def display_urls(self) -> list[str]:
        return [redact(self.remote)]

    def document(self) -> dict[str, Any]:
        """The definition as the admin resource shows it: no secrets."""
        out = self.stored()
        for key in SECRETS:
            out[key] = "***" if out[key] else ""
        out["remote"] = redact(self.remote)
        return out

    def stored(self) -> dict[str, Any]:
        """The definition as the data directory keeps it (secrets included, file 0600)."""
        out = dataclasses.asdict(self)
        out["headers"] = dict(self.headers)
        return out


def check_url(url: str, where: str, key: str, *, feed: bool) -> None:
    """An http(s) URL with a host; with ``feed``, one naming a RestMS feed."""
    shown = redact(url)
    if any(c.isspace() or not c.isprintable() for c in url):
        raise ValueError(f"{where}: {key} must have no spaces or control characters")
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 (checks the port)
    except ValueError as exc:
        raise ValueError(f"{where}: {key} {shown} is not a URL: {exc}") from exc
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{where}: {key} {shown} is not an http:// or https:// URL")
    if "@" in parts.netloc:
        raise ValueError(f"{where}: {key} must not carry a user or password")
    if parts.query or parts.fragment:
        raise ValueError(f"{where}: {key} {shown} must have no query or fragment")
    if feed:
        head, _, name = parts.path.rpartition("/")
        if not head.endswith("/restms/feed") or not name:
            raise ValueError(f"{where}: {key} {shown} must be a feed's URL (.../restms/feed/NAME)")
