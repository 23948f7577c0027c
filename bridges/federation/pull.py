"""A federation link's pull direction (``direction = "in"``; the module docstring of
:mod:`.link`): a pipe of the link's own on the remote gateway, read in order from its
event stream (or a message at a time), each batch published here and acknowledged
there once committed here.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
import urllib.parse

from restms.errors import RestMSError
from restms.specs import MessageSpec

from ..base import Host, backoff
from .config import FederationConfig
from .link import FederationLink
from .remote import Events, PipeGone, Remote, RemoteError
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


class PullLink(FederationLink):
    """A federation link that pulls (module docstring)."""

    def __init__(
        self, config: FederationConfig, host: Host, *, configured: bool, gateway_id: str
    ) -> None:
        super().__init__(config, host, configured=configured, gateway_id=gateway_id)
        self._holding = 0  # messages read from the remote, not yet acknowledged there
        # (last position, messages, when read) of each batch not yet acknowledged
        self._read_at: collections.deque[tuple[int, int, float]] = collections.deque()
        self._published = 0  # the last remote position published here
        self._acked_upto = 0  # the last remote position acknowledged there
        self._next = 1  # the next position of the remote pipe to read
        self._plain_until = 0.0  # reading a message at a time until then

    def backlog(self) -> int:
        return self._holding

    async def _winding_up(self) -> None:
        self._holding = 0
        self._read_at.clear()

    async def forget(self) -> None:
        """The link is deleted: its pipe on the remote goes too, when the remote
        answers (else the remote collects it once idle), and so does its address."""
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

    # ------------------------------------------------------------ the loop
    async def _run(self) -> None:
        """Read the remote pipe until the link stops: from its event stream while the
        remote offers one (:meth:`_stream_in`), else a read at a time, each batch
        published here and then acknowledged there."""
        attempt = 0
        pipe: str | None = None
        self._next = 1  # the next position to read (1: the oldest the pipe holds)
        if not await self._reach(up=False):
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
            pipe = await remote.create_pipe(c.remote, title, c.max_messages, c.max_bytes)
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


def _behind(batch: int) -> int:
    """How many messages a pull link publishes ahead of its acknowledgements."""
    return max(batch, UNACKED_MAX)
