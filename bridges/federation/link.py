"""Federation links: a gateway feed shared with a feed of another RestMS gateway.

Theory of operation
-------------------
**Push** (``direction = "out"``). The link owns a durable internal pipe joined to its
local feed (bridges/common.py, :class:`~bridges.common.PipeSide`), as an outbound AMQP
bridge does. It takes up to ``batch`` messages from it, drops those the loop rules
say must not travel (:mod:`.trail`: counted ``looped``), gives each a ``message_id``
when it has none, and publishes the rest to the remote feed in one request. Only when
the remote answered 2xx are they acknowledged here, so a crash of either side before
that sends them again, and the remote feed's ``message_id`` window absorbs the repeat
(at least once on the wire, once in the remote's pipes). While the remote is away
(network errors, 408, 429, 5xx) the same batch is sent again after a capped backoff
with jitter, honouring Retry-After, and new messages wait in the pipe, bounded by its
limits. So do a ``403`` and a ``404`` (the link may not publish there, or the remote
feed is not there), which would refuse every message alike. Any other 4xx is the
remote refusing a message for good: the batch is sent a message at a time to find
the ones refused, which go to the dead-letter feed with the remote's reason.

**Pull** (``direction = "in"``). The link keeps a pipe of its own on the remote
gateway, joined to the remote feed, and remembers its URL in the engine's settings
(``federation/<link>/pipe``), so a restart, or another node of a cluster, goes on
reading the same pipe. It reads the pipe in order from its event stream (one
long-lived request; from a remote without one, a long-poll on its asynclet and a GET
a message), publishes each batch of what came into the local feed in one engine call,
and acknowledges it on the remote only after the local publish committed: one
cumulative DELETE out at a time, beside the reading and publishing, up to
:data:`UNACKED_MAX` messages behind them. The loop rules apply as if the remote had
pushed.

Push suits a site that may only open connections outward (behind a firewall) and can
hold the remote's credentials; pull suits a remote that must not hold credentials for
this gateway, or that cannot reach it.

This module holds what both directions share (:class:`FederationLink`); each direction
is a subclass of its own, :class:`.push.PushLink` and :class:`.pull.PullLink`
(:func:`.links.federation_link` makes the one a definition asks for).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any

from ..base import CoreCounters, Host, backoff
from ..common import PipeSide, PublishSide
from .config import FederationConfig
from .remote import Auth, Remote, RemoteError, Unavailable

log = logging.getLogger(__name__)


@dataclass(slots=True)
class FederationCounters(CoreCounters):
    """A federation link's counters; ``sent`` and ``published`` count messages the far
    side took for the first time."""

    acked: int = 0  # messages acknowledged where they came from, once the other side had them
    retried: int = 0  # requests to the remote sent again after it failed
    looped: int = 0  # not sent on: their trail ended here (a loop, or max_hops)
    remote_duplicates: int = 0  # push: the remote had them already (a repeat)


class FederationLink(PipeSide, PublishSide[int]):
    """What a federation link of either direction is and does (module docstring); a
    direction's subclass runs its loop (:meth:`_run`)."""

    def __init__(
        self, config: FederationConfig, host: Host, *, configured: bool, gateway_id: str
    ) -> None:
        self.counters = FederationCounters()
        super().__init__(config.name, host, configured=configured, counters=self.counters)
        self.config = config
        self._gateway_id = gateway_id
        self._feed_name = config.feed
        self._backpressure = "wait"
        self._remote_feed = urllib.parse.unquote(config.remote.rstrip("/").rpartition("/")[2])
        self._remote_id: str | None = None  # learnt from the remote when it says
        self._remote: Remote | None = None
        self._task: asyncio.Task[None] | None = None
        self._oldest: float | None = None  # arrival of the oldest message not yet passed on
        self.health.url = config.display_urls[0]

    # ------------------------------------------------------------ Bridge interface
    @property
    def kind(self) -> str:
        return "federation"

    async def start(self) -> None:
        self._stopping = False
        self._stopped.clear()
        c = self.config
        connect = self._host.connect
        if connect is None:
            raise RuntimeError("federation links need the gateway's HTTP client (Host.connect)")
        self._remote = connect(
            self._auth(),
            timeout=c.timeout,
            tls_ca=c.tls_ca,
            tls_verify=c.tls_verify,
            guarded=not self.configured,  # a run-time link: public addresses only
        )
        self.health.state.move("connecting")
        await self._starting()
        self._task = asyncio.create_task(self._run(), name=f"bridge-{self.name}")

    async def _starting(self) -> None:
        """What the direction does before its loop starts."""

    async def _run(self) -> None:
        """The direction's loop, until the link stops."""
        raise NotImplementedError

    def _auth(self) -> Auth:
        c = self.config
        return Auth(
            bearer=c.bearer,
            token_url=c.token_url,
            client_id=c.client_id,
            client_secret=c.client_secret,
            scope=c.scope,
        )

    async def stop(self) -> None:
        """Stop the loop; what was not acknowledged stays where it is safe (the local
        pipe, or the remote one) and is sent again after a restart."""
        self._stopping = True
        self._stopped.set()
        self._wake.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self._winding_up()
        await self._close_pipe()
        remote, self._remote = self._remote, None
        if remote is not None:
            await remote.close()
        if self.health.state.name != "stopped":
            if self.health.state.name != "stopping":
                self.health.state.move("stopping")
            self.health.state.move("stopped")
        self._oldest = None

    async def _winding_up(self) -> None:
        """What the direction settles once its loop stopped, before its pipe closes."""

    def backlog(self) -> int:
        """Messages not yet passed on (the direction's count)."""
        raise NotImplementedError

    def lag(self) -> float:
        """Seconds the oldest message not yet passed on has waited here (0: none
        waits): in the pipe (push), or since it was read (pull)."""
        return max(0.0, time.time() - self._oldest) if self._oldest is not None else 0.0

    def status(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "direction": self.config.direction,
            "configured": self._configured,
            "backlog": self.backlog(),
            "lag_seconds": round(self.lag(), 3),
            "gateway_id": self._gateway_id,
            "remote_id": self._remote_id,
            **self.health.document(),
            "definition": self.config.document(),
        }

    # ------------------------------------------------------------ the link's state
    def _up(self) -> None:
        state = self.health.state
        if state.name == "retrying":
            state.move("connecting")
        if state.name == "connecting":
            state.move("up")
            self.counters.connects += 1

    async def _failed(self, exc: RemoteError, attempt: int) -> None:
        """Say why a request failed, then wait before the next try."""
        self.health.error(str(exc))
        if self.health.state.name == "up":
            self.counters.disconnects += 1
        if self.health.state.name in ("connecting", "up"):
            self.health.state.move("retrying")
        delay = backoff(attempt, self.config.retry_min, self.config.retry_max)
        if isinstance(exc, Unavailable) and exc.retry_after is not None:
            delay = max(delay, min(exc.retry_after, self.config.retry_max))
        await self._sleep(delay)

    async def _reach(self, up: bool) -> bool:
        """Ask the remote for its gateway id until it answers (False: stopping first).
        Knowing it, messages that came from there are not sent back; a RestMS server
        that does not say is left unnamed, and ``max_hops`` and this gateway's own id
        still end loops. With ``up`` the link is up from its answer (a push link; a pull
        link is up once its remote pipe is there too)."""
        attempt = 0
        while self._remote_id is None and not self._stopping:
            remote = self._remote
            assert remote is not None
            try:
                self._remote_id = await remote.gateway_id(self.config.remote) or ""
            except RemoteError as exc:
                attempt += 1
                self.counters.retried += 1
                await self._failed(exc, attempt)
                continue
            if up:
                self._up()
        return not self._stopping
