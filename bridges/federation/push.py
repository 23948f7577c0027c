"""A federation link's push direction (``direction = "out"``; the module docstring of
:mod:`.link`): the link's pipe here, joined to its local feed, published to the remote
feed a batch at a time, each batch acknowledged here once the remote answered 2xx.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TypeGuard

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

from ..base import Host
from ..common import bridge_pipe_spec
from .config import FederationConfig
from .link import FederationLink
from .remote import Refused, RemoteError
from .trail import onward, with_origin_id

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


class PushLink(FederationLink):
    """A federation link that pushes (module docstring)."""

    def __init__(
        self, config: FederationConfig, host: Host, *, configured: bool, gateway_id: str
    ) -> None:
        super().__init__(config, host, configured=configured, gateway_id=gateway_id)
        self._unacked = 0  # messages the remote took, not yet acknowledged here

    def backlog(self) -> int:
        return self._pipe_backlog()

    async def _starting(self) -> None:
        await self._open()  # joined from now, whether the remote answers or not

    async def _winding_up(self) -> None:
        with contextlib.suppress(RestMSError):  # else they are sent again after a restart
            await self._settle()
        self._unacked = 0

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

    # ------------------------------------------------------------ the loop
    async def _run(self) -> None:
        """Send the pipe's batches one request at a time, in order. While the remote
        works on one, the next is taken, converted and encoded and the one before is
        acknowledged here: this gateway's share of the work overlaps the remote's, and
        the remote finds the next request ready when it answers. That work starts once
        the request is written (or its first attempt failed): begun before, it would
        hold the request back, the remote idle."""
        if not await self._reach(up=True):
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


def _done(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


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
