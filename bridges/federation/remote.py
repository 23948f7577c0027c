"""What a federation link needs of a remote RestMS gateway, and how asking can fail.

The link (:mod:`.link`) speaks to the remote through :class:`Remote` alone. The HTTP
client that implements it is the gateway's (gateway/federation/client.py), handed to
the bridges in their :class:`~bridges.base.Host` as a :class:`Connect`, so nothing in
``bridges`` imports an HTTP library.

Outcomes (one tree)::

    RemoteError       the remote could not do it; str(): what was asked and why
    ├── Unavailable   may work later: no connection, a timeout, 408, 429, 5xx, a
    │                 failing token endpoint, 401 with fresh credentials, a reply too
    │                 large or not understood; ``retry_after`` from Retry-After
    ├── Refused       any other 4xx: this request never succeeds as it is;
    │                 ``status`` and the remote's ``reason`` (500 characters at most)
    └── PipeGone      the remote pipe read from is gone (404): make a new one
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from restms.specs import MessageSpec


@dataclass(frozen=True, slots=True, kw_only=True)
class Auth:
    """How a link proves itself to the remote: a fixed ``bearer`` token, or client
    credentials at ``token_url`` (OAuth 2.0, RFC 6749 §4.4), or neither (a loopback
    guest)."""

    bearer: str = field(default="", repr=False)
    token_url: str = ""
    client_id: str = ""
    client_secret: str = field(default="", repr=False)
    scope: str = ""

    def __post_init__(self) -> None:
        if self.bearer and self.token_url:
            raise ValueError("give a bearer token or a token_url, not both")
        if self.token_url and not self.client_id:
            raise ValueError("a token_url needs a client_id")


class RemoteError(Exception):
    """The remote could not do what was asked. ``str()`` says what and why, with URLs
    redacted and no secret."""


class Unavailable(RemoteError):
    """Worth trying again later, after ``retry_after`` seconds when the remote said."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class Refused(RemoteError):
    """A 4xx (but 401, 408, 429): this request never succeeds as it is."""

    def __init__(self, where: str, status: int, reason: str) -> None:
        super().__init__(f"{where}: {status} {reason}")
        self.status = status
        self.reason = reason


class PipeGone(RemoteError):
    """The remote pipe is gone (deleted, collected, or lost by the remote)."""


Joins = list[tuple[str, str, tuple[tuple[str, str], ...]]]  # (feed URL, address, headers)


class Events(Protocol):
    """A remote pipe's messages as they come, in order (its event stream)."""

    @property
    def ended(self) -> bool:
        """The stream is over and everything it brought was taken: open another."""

    async def take(self, limit: int, wait: float) -> list[tuple[int, MessageSpec]]:
        """Up to ``limit`` messages with their positions, waiting up to ``wait``
        seconds for the first; [] when none came. Raises :class:`RemoteError` when
        the stream failed, once every message read before was taken."""

    async def close(self) -> None: ...


class Remote(Protocol):
    """One remote RestMS gateway, as one link sees it."""

    async def close(self) -> None: ...

    async def gateway_id(self, feed_url: str) -> str | None:
        """The id of the gateway serving ``feed_url``; None when it does not say."""

    def encode(self, messages: Sequence[MessageSpec]) -> bytes:
        """The body :meth:`publish` sends for ``messages`` (no I/O: a link encodes the
        next batch while the remote works on the last)."""

    async def publish(
        self,
        feed_url: str,
        messages: Sequence[MessageSpec],
        encoded: bytes | None = None,
        written: asyncio.Future[None] | None = None,
    ) -> list[bool]:
        """Publish ``messages`` (contents embedded) in one request, sending ``encoded``
        (:meth:`encode` of them) when given; for each, whether the remote had it
        already (a duplicate). ``written`` is done once the request's body is on its
        way to the remote, so that a caller may go on with work of its own meanwhile."""

    async def create_pipe(
        self, feed_url: str, title: str, max_messages: int = 0, max_bytes: int = 0
    ) -> str:
        """A new durable pipe without lease near the feed ``feed_url``, asked for these
        limits (0: the remote's defaults): its URL."""

    async def create_join(
        self, pipe_url: str, feed_url: str, address: str, headers: tuple[tuple[str, str], ...]
    ) -> str:
        """A join of the pipe to the feed (the same one again when it is there): its URL."""

    async def pipe_joins(self, pipe_url: str) -> Joins | None:
        """The pipe's joins; None when the pipe is gone."""

    async def read(
        self, pipe_url: str, position: int, limit: int, wait: float, *, streams: bool = True
    ) -> list[tuple[int, MessageSpec]]:
        """Up to ``limit`` messages at ``position`` and after, with their positions,
        waiting up to ``wait`` seconds for the first; [] when none came. ``streams``
        False: the remote offers no event stream, not to be asked."""

    async def stream(self, pipe_url: str, after: int, room: int, idle: float) -> Events | None:
        """The pipe's messages after position ``after``, as they come (holding at
        most ``room`` not taken; ended after ``idle`` seconds without a word from the
        remote); None when the remote offers no stream of the pipe (then
        :meth:`read` it)."""

    async def ack(self, pipe_url: str, position: int) -> None:
        """Acknowledge every message of the pipe up to ``position``."""

    async def delete_pipe(self, pipe_url: str) -> None:
        """Delete the pipe (nothing when it is gone already)."""


class Connect(Protocol):
    """Makes the :class:`Remote` of one link. ``guarded`` (a link made at run time):
    the remote may only be at an address the gateway's guard allows (public ones, and
    those its configuration names; docs/FEDERATION.md, "Security"); a link of the
    configuration file is the operator's and reaches any address."""

    def __call__(
        self,
        auth: Auth,
        *,
        timeout: float,
        tls_ca: str = "",
        tls_verify: bool = True,
        guarded: bool = True,
    ) -> Remote: ...
