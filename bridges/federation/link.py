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
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import sys
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, TypeGuard

from feeds.service import Blob, Cursor, Message, Part
from restms.errors import RestMSError
from restms.specs import (
    EmbeddedContent,
    MessageLimits,
    MessageSpec,
    PipeSpec,
    checked_message,
    head_size,
)

from ..base import CoreCounters, Host, backoff
from ..common import PipeSide, PublishSide, bridge_pipe_spec
from .config import FederationConfig
from .remote import Auth, Events, PipeGone, Refused, Remote, RemoteError, Unavailable
from .trail import onward, with_origin_id

log = logging.getLogger(__name__)


PIPE_SETTING = "federation/{name}/pipe"  # the remote pipe a pull link reads
# A pull link waits for its acknowledgements once this many messages published here
# (or a batch, when larger) wait for them: after a crash they are read and published
# again, and the feed's deduplication window (dedup_max, 10,000 by default) must hold
# their ids to route them once.
UNACKED_MAX = 5000
PLAIN_FOR = 300.0  # seconds a pull link reads a message at a time before asking again
# for the remote pipe's event stream (the remote offered none)
# Refusals that say nothing of the message: the remote feed is not there, or the link
# may not publish to it. Messages wait for the remote (or its operator) to change.
NOT_THE_MESSAGE = frozenset({403, 404})
# A message that was published here is within this gateway's limits already.
_UNBOUNDED = MessageLimits(
    max_messages=1, max_headers=sys.maxsize, max_contents=sys.maxsize, max_header_bytes=sys.maxsize
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Prepared:
    """A batch taken from a push link's pipe, ready to send."""

    taken: list[Message]  # in the pipe's order
    outgoing: list[tuple[Message, MessageSpec]]  # those that travel, as the remote gets them
    encoded: bytes  # the publish document of ``outgoing``


@dataclass(slots=True)
class FederationCounters(CoreCounters):
    """A federation link's counters; ``sent`` and ``published`` count messages the far
    side took for the first time."""

    acked: int = 0  # messages acknowledged where they came from, once the other side had them
    retried: int = 0  # requests to the remote sent again after it failed
    looped: int = 0  # not sent on: their trail ended here (a loop, or max_hops)
    remote_duplicates: int = 0  # push: the remote had them already (a repeat)


class FederationLink(PipeSide, PublishSide[int]):
    """One federation link (either direction); see the module docstring."""

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
        self._oldest: float | None = None  # arrival of the oldest message not yet sent
        self._holding = 0  # pull: messages read from the remote, not yet acknowledged there
        # pull: (last position, messages, when read) of each batch not yet acknowledged
        self._read_at: collections.deque[tuple[int, int, float]] = collections.deque()
        self._published = 0  # pull: the last remote position published here
        self._acked_upto = 0  # pull: the last remote position acknowledged there
        self._next = 1  # pull: the next position of the remote pipe to read
        self._plain_until = 0.0  # pull: reading a message at a time until then
        self._unacked = 0  # push: messages the remote took, not yet acknowledged here
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
        if c.direction == "out":
            await self._open()  # joined from now, whether the remote answers or not
        body = self._push() if c.direction == "out" else self._pull()
        self._task = asyncio.create_task(body, name=f"bridge-{self.name}")

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
        with contextlib.suppress(RestMSError):  # else they are sent again after a restart
            await self._settle()
        await self._close_pipe()
        remote, self._remote = self._remote, None
        if remote is not None:
            await remote.close()
        if self.health.state.name != "stopped":
            if self.health.state.name != "stopping":
                self.health.state.move("stopping")
            self.health.state.move("stopped")
        self._holding = self._unacked = 0
        self._read_at.clear()
        self._oldest = None

    async def forget(self) -> None:
        """The link is deleted: its pipe on the remote goes too, when the remote
        answers (else the remote collects it once idle), and so does its address."""
        if self.config.direction != "in":
            return
        key = PIPE_SETTING.format(name=self.name)
        pipe = await self._engine.setting(key)
        if pipe and self._host.connect is not None:
            remote = self._host.connect(
                self._auth(), timeout=min(self.config.timeout, 5.0), guarded=not self.configured
            )
            try:
                await remote.delete_pipe(pipe)
            except RemoteError as exc:
                log.warning("federation link %s: its remote pipe stays: %s", self.name, exc)
            finally:
                await remote.close()
        if pipe:
            await self._forget_remote_pipe()

    def backlog(self) -> int:
        if self.config.direction == "out":
            return self._pipe_backlog()
        return self._holding

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

    # ------------------------------------------------------------ PipeSide
    def _pipe_spec(self) -> PipeSpec:
        c = self.config
        return bridge_pipe_spec(
            self.name, durable=c.durable, max_messages=c.max_messages, max_bytes=c.max_bytes
        )

    def _pipe_join(self) -> tuple[str, str, tuple[tuple[str, str], ...]]:
        return (self.config.feed, self.config.address, self.config.headers)

    def _pipe_changed(self) -> None:
        self._unacked = 0  # what the remote took went with the old pipe

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

    async def _reach(self) -> bool:
        """Ask the remote for its gateway id until it answers (False: stopping first).
        Knowing it, messages that came from there are not sent back; a RestMS server
        that does not say is left unnamed, and ``max_hops`` and this gateway's own id
        still end loops. A push link is up from then; a pull link once its remote pipe
        is there too."""
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
            if self.config.direction == "out":
                self._up()
        return not self._stopping

    # ------------------------------------------------------------ push
    async def _push(self) -> None:
        """Send the pipe's batches one request at a time, in order. While the remote
        works on one, the next is taken, converted and encoded and the one before is
        acknowledged here: this gateway's share of the work overlaps the remote's, and
        the remote finds the next request ready when it answers. That work starts once
        the request is written (or its first attempt failed): begun before, it would
        hold the request back, the remote idle."""
        if not await self._reach():
            return
        ready: Prepared | None = None  # the next batch, taken while the last was out
        while not self._stopping:
            cursor = await self._ready_pipe()
            if cursor is None:
                ready = None
                continue
            current = ready or await self._prepare(cursor)
            ready = None
            if current is None:
                await self._settle()
                self._oldest = None
                await self._idle(cursor, self.config.batch)
                continue
            self._oldest = current.taken[0].arrived
            written: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            sending = asyncio.ensure_future(self._deliver(current, written))
            try:
                await written
                await self._settle()
                if not self._look:  # (a pipe to look at again: its cursor may change)
                    ready = await self._prepare(cursor)
                delivered = await sending
            finally:
                if not sending.done():
                    sending.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await sending
            if not delivered:
                return  # stopping: what was taken is taken again after a restart
            self._after = current.taken[-1].position
            self._unacked += len(current.taken)

    async def _settle(self) -> None:
        """Acknowledge here what the remote has taken (:meth:`_push` does it while the
        next batch is out, or before the link waits for more)."""
        done, self._unacked = self._unacked, 0
        if done:
            await self._ack_upto(self._after)
            self.counters.acked += done

    async def _prepare(self, cursor: Cursor) -> Prepared | None:
        """The next messages of the pipe (None: none now), with what the remote is to
        be sent of each (those that must not travel are counted and left out), encoded."""
        try:
            batch = await self._batch(cursor, self.config.batch)
        except RestMSError as exc:  # the pipe went, or the engine cannot answer now
            self.health.error(f"cannot read the link's pipe: {exc}")
            self._look = True
            return None
        if not batch:
            return None
        outgoing = []
        for message in batch:
            spec = self._outgoing(message)
            if spec is None:
                self.counters.looped += 1
            else:
                outgoing.append((message, spec))
        remote = self._remote
        assert remote is not None
        encoded = remote.encode([spec for _, spec in outgoing]) if outgoing else b""
        return Prepared(taken=batch, outgoing=outgoing, encoded=encoded)

    async def _deliver(self, batch: Prepared, written: asyncio.Future[None]) -> bool:
        """Send the batch until the remote has all of it; False when stopping first.
        ``written`` is done once the first request is written, or failed, or none was
        needed."""
        attempt = 0
        outgoing = batch.outgoing
        encoded: bytes | None = batch.encoded
        try:
            while outgoing and not self._stopping:
                try:
                    left = await self._send(outgoing, encoded, written)
                except RemoteError as exc:
                    _done(written)
                    attempt += 1
                    self.counters.retried += 1
                    await self._failed(exc, attempt)
                    continue
                if left is not outgoing:
                    outgoing, encoded = left, None  # (a part left: encoded anew)
        finally:
            _done(written)
        return not self._stopping

    def _outgoing(self, message: Message) -> MessageSpec | None:
        """The message as the remote is sent it, or None when it must not travel."""
        return outgoing(
            message, own=self._gateway_id, feed=self.config.feed,
            remote=self._remote_id or None, max_hops=self.config.max_hops,
        )  # fmt: skip

    async def _send(
        self,
        outgoing: list[tuple[Message, MessageSpec]],
        encoded: bytes | None = None,
        written: asyncio.Future[None] | None = None,
    ) -> list[tuple[Message, MessageSpec]]:
        """Publish ``outgoing`` to the remote (``encoded``: its document, when made
        already; ``written``: done as it is written); what is left to send (nothing,
        unless it raises :class:`RemoteError` for the link to retry)."""
        remote = self._remote
        assert remote is not None
        specs = [spec for _, spec in outgoing]
        try:
            duplicates = await remote.publish(self.config.remote, specs, encoded, written)
        except Refused as exc:
            if exc.status in NOT_THE_MESSAGE:
                raise  # every message would be refused alike: the link waits, retrying
            if len(outgoing) > 1:  # which one? each alone; the others go on
                for index, item in enumerate(outgoing):
                    rest = await self._send([item])
                    if rest:
                        return rest + outgoing[index + 1 :]
                return []
            self.counters.refused += 1
            reason = f"the remote refused it: {exc}"
            self.health.error(reason)
            await self._dead_letter(outgoing[0][0], reason, self.config.dead_letter)
            return []
        self._up()
        repeats = sum(duplicates)
        self.counters.sent += len(outgoing) - repeats
        self.counters.remote_duplicates += repeats
        return []

    # ------------------------------------------------------------ pull
    async def _pull(self) -> None:
        """Read the remote pipe until the link stops: from its event stream while the
        remote offers one (:meth:`_stream_in`), else a read at a time, each batch
        published here and then acknowledged there."""
        attempt = 0
        pipe: str | None = None
        self._next = 1  # the next position to read (1: the oldest the pipe holds)
        if not await self._reach():
            return
        c = self.config
        while not self._stopping:
            remote = self._remote
            assert remote is not None
            try:
                if pipe is None:
                    pipe = await self._remote_pipe(remote)
                    self._up()
                if time.monotonic() >= self._plain_until:
                    room, idle = 2 * c.batch, c.wait + c.timeout
                    events = await remote.stream(pipe, self._next - 1, room, idle)
                    if events is not None:
                        attempt = 0
                        self._up()
                        await self._stream_in(remote, pipe, events)
                        continue
                    self._plain_until = time.monotonic() + PLAIN_FOR
                    log.info(
                        "federation link %s: the remote offers no event stream of its pipe; "
                        "reading a message at a time (asked again in %g s)", self.name, PLAIN_FOR,
                    )  # fmt: skip
                read = await remote.read(pipe, self._next, c.batch, c.wait, streams=False)
            except PipeGone as exc:
                self.health.error(f"the remote pipe is gone, making another: {exc}")
                pipe, self._next = None, 1
                await self._forget_remote_pipe()
                continue
            except RemoteError as exc:
                attempt += 1
                self.counters.retried += 1
                await self._failed(exc, attempt)
                continue
            except RestMSError as exc:  # this gateway's engine
                self.health.error(f"cannot keep the remote pipe's address here: {exc}")
                attempt += 1
                await self._sleep(backoff(attempt, c.retry_min, c.retry_max))
                continue
            attempt = 0
            self._up()
            if not read:
                continue
            self._holding = len(read)
            self._oldest = time.time()
            self.counters.received += len(read)
            await self._take_in(pipe, read)
            if self._stopping:
                return
            last = read[-1][0]
            if await self._ack_remote(remote, pipe, last):
                self.counters.acked += len(read)
                self._next = last + 1
            self._holding = 0
            self._oldest = None

    async def _stream_in(self, remote: Remote, pipe: str, events: Events) -> None:
        """Take the stream's messages a batch at a time (what came, up to ``batch``)
        until it ends, each batch published here in one engine call. Acknowledging
        on the remote runs beside it (:meth:`_ack_through`): one request out at a
        time, up to the last position published when it goes, so a remote slow to
        acknowledge gets fewer, larger ones and holds up neither reading nor
        publishing; only when more than :func:`_behind` messages wait for it does the
        link wait. Before the link waits for more messages, and when the stream ends,
        every acknowledgement is seen through. Raises what ended the stream
        (:class:`RemoteError`) once that is done."""
        c = self.config
        behind = _behind(c.batch)
        self._published = self._acked_upto = self._next - 1
        acker: asyncio.Task[None] | None = None
        try:
            while not self._stopping:
                batch = await events.take(c.batch, c.wait)
                if not batch:
                    if acker is not None:
                        await acker
                        acker = None
                    if events.ended:
                        return
                    continue
                last = batch[-1][0]
                self._holding += len(batch)
                self._read_at.append((last, len(batch), time.time()))
                self._oldest = self._read_at[0][2]
                self.counters.received += len(batch)
                await self._take_in(pipe, batch)
                if self._stopping:
                    return  # not acknowledged: read and published again after a restart
                self._next, self._published = last + 1, last
                if acker is None or acker.done():
                    acker = asyncio.ensure_future(self._ack_through(remote, pipe))
                if self._holding > behind:
                    await acker
                    acker = None
        except asyncio.CancelledError:
            if acker is not None:
                acker.cancel()
            raise
        finally:
            if acker is not None:
                with contextlib.suppress(asyncio.CancelledError):
                    await acker
            await events.close()

    async def _ack_through(self, remote: Remote, pipe: str) -> None:
        """Acknowledge on the remote up to the last position published here, again
        while more was published meanwhile (each request cumulative: DELETE of
        ``pipe.<position>``), retrying while the remote is away (:meth:`_ack_remote`)."""
        while self._acked_upto < self._published and not self._stopping:
            upto = self._published
            if not await self._ack_remote(remote, pipe, upto):
                return  # stopping: read, published and acknowledged again after a restart
            self._acked_upto = upto
            held = self._read_at
            while held and held[0][0] <= upto:
                _, count, _ = held.popleft()
                self.counters.acked += count
                self._holding = max(0, self._holding - count)
            self._oldest = held[0][2] if held else None

    async def _remote_pipe(self, remote: Remote) -> str:
        """The URL of this link's pipe on the remote, joined as the definition says:
        the one remembered, or a new one (remembered before it is read)."""
        engine, key, c = self._engine, PIPE_SETTING.format(name=self.name), self.config
        pipe = await engine.setting(key) or None  # "": forgotten
        wanted = (c.remote, c.address, tuple(sorted(c.headers)))
        if pipe is not None:
            joins = await remote.pipe_joins(pipe)
            if joins is None:
                pipe = None
            elif not any((f, a, tuple(sorted(h))) == wanted for f, a, h in joins):
                await remote.create_join(pipe, c.remote, c.address, c.headers)
        if pipe is None:
            title = f"federation {self._gateway_id}/{self.name}"
            pipe = await remote.create_pipe(c.remote, title)
            await engine.keep_setting(key, pipe)
            await remote.create_join(pipe, c.remote, c.address, c.headers)
        return pipe

    async def _forget_remote_pipe(self) -> None:
        """The next read makes a new remote pipe (a failed write: the old one is
        looked at, and found gone, again)."""
        with contextlib.suppress(RestMSError):
            await self._engine.keep_setting(PIPE_SETTING.format(name=self.name), "")

    async def _take_in(self, pipe: str, read: list[tuple[int, MessageSpec]]) -> None:
        """Publish what was read from the remote ``pipe`` into the local feed (those
        that may come here). A message without a ``message_id`` is named by its place
        in that pipe, so a read again after a crash is recognised as a repeat."""
        remote_id = self._remote_id or urllib.parse.urlsplit(self.config.remote).netloc
        pipe_name = pipe.rstrip("/").rpartition("/")[2]
        batch: list[tuple[int, MessageSpec]] = []
        for position, spec in read:
            headers = onward(
                spec.headers, own=remote_id, feed=self._remote_feed, remote=self._gateway_id,
                max_hops=self.config.max_hops,
            )  # fmt: skip
            if headers is None:
                self.counters.looped += 1
                continue
            stamp = f"{pipe_name}.{position}"
            props = with_origin_id(spec.props, own=remote_id, feed=self._remote_feed, stamp=stamp)
            arriving = MessageSpec(
                address=spec.address, props=props, headers=headers, contents=spec.contents
            )
            batch.append((position, arriving))
        refused: list[tuple[int, str]] = []
        kept = {position: spec for position, spec in batch}
        await self._absorb(
            batch, lambda done, counts: None, lambda p, why: refused.append((p, why))
        )
        for position, why in refused:
            await self._refused_here(kept[position], why)

    async def _refused_here(self, spec: MessageSpec, why: str) -> None:
        """A pulled message this gateway will not take goes to the dead-letter feed."""
        feed = self.config.dead_letter or self._host.dead_letter_feed
        if not feed:
            self.counters.discarded += 1
            self.health.error(f"a refused message was discarded (no dead-letter feed): {why}")
            return
        headers = (("x-death-reason", "rejected"), ("x-bridge", self.name), ("x-bridge-error", why))
        letter = MessageSpec(
            address=spec.address,
            props=spec.props,
            headers=headers + spec.headers,
            contents=spec.contents,
        )
        try:
            await self._engine.publish(self._owner, feed, [letter], via=self.name)
        except RestMSError as exc:
            self.counters.discarded += 1
            self.health.error(f"a refused message was discarded ({exc}): {why}")
        else:
            self.counters.dead_lettered += 1

    async def _ack_remote(self, remote: Remote, pipe: str, position: int) -> bool:
        """Acknowledge up to ``position`` on the remote, retrying while it is away;
        False when the link stops first (the messages are read and published again,
        and the feed's message_id window absorbs them)."""
        attempt = 0
        while not self._stopping:
            try:
                await remote.ack(pipe, position)
                return True
            except PipeGone:
                return True  # what it held went with it; a new pipe is made next
            except RemoteError as exc:
                attempt += 1
                self.counters.retried += 1
                await self._failed(exc, attempt)
        return False


def _done(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _behind(batch: int) -> int:
    """How many messages a pull link publishes ahead of its acknowledgements."""
    return max(batch, UNACKED_MAX)


def outgoing(
    message: Message, *, own: str, feed: str, remote: str | None, max_hops: int
) -> MessageSpec | None:
    """``message``, taken from the pipe of a push link of gateway ``own`` joined to its
    ``feed``, as gateway ``remote`` is sent it (:mod:`.trail`: the trail extended, a
    ``message_id`` made when it has none, contents embedded); None when it must not
    travel there."""
    spec = message.spec
    headers = onward(spec.headers, own=own, feed=feed, remote=remote, max_hops=max_hops)
    if headers is None:
        return None
    parts = message.parts
    contents = parts if _all_embedded(parts) else tuple(_embedded(parts))
    props = with_origin_id(spec.props, own=own, feed=feed, stamp=message.stamp)
    # Built from parts checked when the message was published here, so without the
    # checks of MessageSpec(): they were most of a batch's conversion.
    head = (spec.address, props, head_size(spec.address, props, ()))
    return checked_message(head, list(headers), list(contents), _UNBOUNDED)


def _all_embedded(parts: tuple[Part, ...]) -> TypeGuard[tuple[EmbeddedContent, ...]]:
    """Whether the parts go as they are (most do: published embedded, none deleted)."""
    return all(type(part) is EmbeddedContent for part in parts)


def _embedded(parts: tuple[Part, ...]) -> Iterator[EmbeddedContent]:
    """A message's parts as the remote is sent them: bytes embedded, deleted ones left out."""
    for part in parts:
        if isinstance(part, Blob):
            yield EmbeddedContent.of(part.data, part.content_type)
        elif part is not None:
            yield part
