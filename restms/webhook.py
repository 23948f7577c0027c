"""Webhook pipes without I/O: their options, the signature scheme and the retry schedule.

A webhook pipe (our extension, docs/WEBHOOKS.md) is a pipe whose messages the gateway
POSTs to a callback URL instead of waiting for a client to GET them. This module holds
the parts that need no socket and no clock of their own:

* :class:`WebhookOptions`: the ``callback``, ``secret`` and delivery options a
  ``<pipe type="webhook">`` is created or PUT with. Built from document attributes by
  :func:`restms.specs.pipe_options`; malformed values are 400.
* :class:`WebhookLimits`: the configured defaults and maximums; :meth:`WebhookLimits.fill`
  turns the options a client sent into the complete set a pipe runs with, or 400 when
  one is over its maximum.
* :func:`signature` and :func:`verify`: ``X-RestMS-Signature: t=<unix>,v1=<hex>``, the
  HMAC-SHA256 with the pipe's secret of ``"<unix>." + body``. The timestamp is signed
  with the body, so a receiver that refuses old timestamps refuses replays.
* :func:`backoff`: capped exponential backoff with full jitter, the wait before the
  next attempt at a message.
* :func:`delivery_id`: the ``X-RestMS-Message-Id`` a message keeps across attempts and
  restarts, so receivers can drop repeats.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import ipaddress
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from .errors import BadRequest

# Headers of every delivery, and the query parameters of the verification GET.
SIGNATURE = "X-RestMS-Signature"
MESSAGE_ID = "X-RestMS-Message-Id"
ATTEMPT = "X-RestMS-Attempt"
MODE, CHALLENGE, PIPE = "restms.mode", "restms.challenge", "restms.pipe"
SUBSCRIBE = "subscribe"

# The attributes of <pipe> that only a webhook pipe may carry.
ATTRIBUTES = ("callback", "secret", "concurrency", "timeout", "max_attempts", "max_age")
MAX_CALLBACK = 2048
SECRET_LENGTH = (16, 256)
_SECRET = re.compile(r"[\x21-\x7e]+")  # printable ASCII, no spaces
_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")


@dataclass(frozen=True, slots=True, kw_only=True)
class WebhookOptions:
    """What a client asked of a webhook pipe; None: not given (the default, or on a
    PUT the current value).

    ``origin`` (``scheme://host`` the pipe was created through) is not a document
    attribute: the gateway sets it, to build the URIs a receiver is shown (U4).
    """

    callback: str | None = None
    # Never in a repr: the options travel in the engine service's values, which a log
    # line or a traceback may show.
    secret: str | None = dataclasses.field(default=None, repr=False)
    concurrency: int | None = None
    timeout: float | None = None
    max_attempts: int | None = None
    max_age: float | None = None
    origin: str | None = None

    def __post_init__(self) -> None:
        if self.callback is not None:
            check_callback(self.callback)
        if self.secret is not None:
            low, high = SECRET_LENGTH
            if not low <= len(self.secret) <= high or not _SECRET.fullmatch(self.secret):
                raise BadRequest(
                    f"pipe secret must be {low} to {high} printable ASCII characters without spaces"
                )
        for name in ("timeout", "max_age"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise BadRequest(f"pipe {name} must be more than 0 seconds, not {value:g}")

    def given(self) -> dict[str, object]:
        """The options that are set, as plain values (the store keeps these)."""
        values = ((f.name, getattr(self, f.name)) for f in dataclasses.fields(self))
        return {name: value for name, value in values if value is not None}

    def merged(self, change: WebhookOptions) -> WebhookOptions:
        """These options with every value ``change`` gives replacing the current one."""
        given = {k: v for k, v in change.given().items() if k != "origin"}
        return dataclasses.replace(self, **given)  # type: ignore[arg-type]


def check_callback(url: str) -> str:
    """An absolute http(s) URL with a host, without credentials or a fragment (400)."""
    if len(url) > MAX_CALLBACK:
        raise BadRequest(f"pipe callback longer than {MAX_CALLBACK} characters")
    if any(c.isspace() or ord(c) < 0x20 or ord(c) == 0x7F for c in url) or not url.isascii():
        raise BadRequest("pipe callback may not contain spaces, controls or non-ASCII characters")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise BadRequest(f"pipe callback is not a URL: {exc}") from exc
    if parts.scheme.lower() not in ("http", "https"):
        raise BadRequest("pipe callback must be an absolute http:// or https:// URL")
    if "@" in parts.netloc:
        raise BadRequest("pipe callback may not carry a user name or password; use the secret")
    if parts.fragment or url.endswith("#"):
        raise BadRequest("pipe callback may not have a fragment (#...)")
    host = parts.hostname or ""
    if not host or port == 0 or not _host_ok(host):
        raise BadRequest(f"pipe callback has no valid host: {parts.netloc!r}")
    return url


def _host_ok(host: str) -> bool:
    """A DNS name of letters, digits and hyphens, or an IP address literal."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        pass
    else:
        return True
    name = host.removesuffix(".")
    return len(name) <= 253 and all(_LABEL.fullmatch(label) for label in name.split("."))


@dataclass(frozen=True, slots=True, kw_only=True)
class WebhookLimits:
    """Defaults and maximums of webhook options, and the retry schedule (configured)."""

    concurrency: int = 1
    concurrency_limit: int = 16
    timeout: float = 10.0
    timeout_limit: float = 60.0
    max_attempts: int = 10
    max_attempts_limit: int = 100
    max_age: float = 86_400.0
    max_age_limit: float = 7 * 86_400.0
    backoff_base: float = 1.0
    backoff_cap: float = 300.0

    def __post_init__(self) -> None:
        for name in ("concurrency", "timeout", "max_attempts", "max_age"):
            default, most = getattr(self, name), getattr(self, f"{name}_limit")
            if not 0 < default <= most:
                raise ValueError(f"webhook_{name} must be more than 0 and at most its limit")
        if not 0 < self.backoff_base <= self.backoff_cap:
            raise ValueError("webhook_backoff_base must be more than 0 and at most the cap")

    def fill(self, options: WebhookOptions, *, clamp: bool = False) -> WebhookOptions:
        """Every option set: the client's, or the default. Above a maximum: 400, or
        with ``clamp`` (a stored pipe, after the maximum was lowered) the maximum."""
        filled: dict[str, object] = {}
        for name in ("concurrency", "timeout", "max_attempts", "max_age"):
            asked, most = getattr(options, name), getattr(self, f"{name}_limit")
            if asked is not None and asked > most:
                if not clamp:
                    raise BadRequest(f"pipe {name} may be at most {most:g}, not {asked:g}")
                asked = most
            filled[name] = getattr(self, name) if asked is None else asked
        return dataclasses.replace(options, **filled)  # type: ignore[arg-type]


def signature(secret: str, timestamp: int, body: bytes) -> str:
    """The ``X-RestMS-Signature`` value for ``body`` sent at ``timestamp`` (Unix seconds)."""
    mac = hmac.new(secret.encode(), b"%d." % timestamp + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={mac}"


def verify(header: str, secret: str, body: bytes, now: float, tolerance: float = 300.0) -> bool:
    """Whether ``header`` signs ``body`` with ``secret`` at a time within ``tolerance``
    seconds of ``now`` (what a receiver checks; the gateway uses it in its tests)."""
    fields: dict[str, list[str]] = {}
    for item in header.split(","):
        key, _, value = item.strip().partition("=")
        fields.setdefault(key, []).append(value)
    stamps = fields.get("t", [])
    if len(stamps) != 1 or not stamps[0].isascii() or not stamps[0].isdigit():
        return False
    timestamp = int(stamps[0])
    if abs(now - timestamp) > tolerance:
        return False
    expected = signature(secret, timestamp, body).rpartition("v1=")[2]
    return any(hmac.compare_digest(expected, given) for given in fields.get("v1", []))


def backoff(
    failures: int, base: float, cap: float, rand: Callable[[], float] = random.random
) -> float:
    """Seconds to wait after the ``failures``-th failed attempt at a message: uniform in
    ``[0, min(cap, base * 2^(failures-1))]`` (full jitter)."""
    ceiling = min(cap, base * (1 << min(max(failures, 1) - 1, 62)))
    return rand() * ceiling


def delivery_id(pipe_key: str, seq: int) -> str:
    """A message's id towards receivers: stable for its position in its pipe, and
    without the pipe's name, which is the pipe's capability."""
    return f"{hashlib.sha256(pipe_key.encode()).hexdigest()[:16]}-{seq}"
