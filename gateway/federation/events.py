"""A remote pipe's event stream read as it comes: the reading side of a pull link's
fast path (docs/FEDERATION.md, "Push and pull"; :meth:`.client.HttpRemote.stream`
opens it)."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Awaitable, Callable

import aiohttp

from bridges.checks import redact
from bridges.federation.remote import PipeGone, RemoteError, Unavailable
from restms.errors import RestMSError
from restms.specs import MessageSpec

from . import wire

log = logging.getLogger(__name__)


class EventStream:
    """A remote pipe's event stream, read as it comes (docs/EXTENSIONS.md §3): the
    reading side of a pull link's fast path (docs/FEDERATION.md, "Push and pull").

    A task reads the stream in chunks and turns each whole ``message`` event into
    the message it carries (:func:`wire.plain_message`; else the general reading,
    which fetches linked contents). It holds at most ``room`` messages not taken
    yet (and those of the last chunk read): past that it stops reading, and the
    remote's writes wait on the connection, so a backlog of any size costs this
    gateway that much memory. :meth:`take` hands them over in order.

    The positions must rise (the first may be anywhere): one that does not, an
    event that is not understood, or a failure of the connection ends the stream
    with :class:`RemoteError`, raised by :meth:`take` once everything read before
    was taken, so nothing is lost: the caller opens the stream again after the
    last message it took. A ``deleted`` event is :class:`PipeGone`. The stream also
    ends without an error (:attr:`ended`) when the remote ends it (its
    ``stream_max``, an expired token) or when no line, not even a keep-alive, came
    for ``idle`` seconds."""

    def __init__(
        self,
        general: Callable[[str, wire.Reply], Awaitable[MessageSpec]],
        pipe_url: str,
        reply: aiohttp.ClientResponse,
        *,
        after: int,
        room: int,
        idle: float,
        limit: int,
    ) -> None:
        self._general = general  # reads a message as a GET of its URL would be read
        self._limit = limit  # bytes an event may have
        self._pipe_url = pipe_url
        self._where = f"GET {redact(pipe_url)} (event stream)"
        self._reply = reply
        self._last = 0  # the position of the last message read (0: none yet)
        self._room = max(room, 1)
        self._idle = idle
        self._held: collections.deque[tuple[int, MessageSpec]] = collections.deque()
        self._came = asyncio.Event()  # a message (or the end) came
        self._taken = asyncio.Event()  # room was made
        self._error: RemoteError | None = None
        self._task = asyncio.create_task(self._run(), name="federation-event-stream")

    @property
    def ended(self) -> bool:
        """Whether the stream is over and everything it brought was taken."""
        return self._task.done() and not self._held

    async def take(self, limit: int, wait: float) -> list[tuple[int, MessageSpec]]:
        """Up to ``limit`` messages in the pipe's order, waiting up to ``wait`` seconds
        when none came yet; [] when none did (or the stream ended: :attr:`ended`)."""
        held = self._held
        if not held and not self._task.done():
            self._came.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self._came.wait()
        out = [held.popleft() for _ in range(min(limit, len(held)))]
        if out:
            self._taken.set()
        elif self._task.done() and self._error is not None:
            raise self._error
        return out

    async def close(self) -> None:
        """Stop reading; what was not taken is read again by the next stream."""
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._reply.close()

    async def _run(self) -> None:
        reply, held, where = self._reply, self._held, self._where
        limit = self._limit
        buffer = b""
        try:
            while True:
                async with asyncio.timeout(self._idle):
                    chunk = await reply.content.readany()
                if not chunk:
                    return  # the remote ended it
                blocks, buffer = wire.event_blocks(buffer + chunk if buffer else chunk)
                if len(buffer) > limit:
                    raise Unavailable(f"{where}: an event larger than {limit} bytes")
                for block in blocks:
                    found = await self._event(block)
                    if found is not None:
                        held.append(found)
                        self._came.set()
                while len(held) >= self._room:
                    self._taken.clear()
                    await self._taken.wait()
        except TimeoutError:
            return  # silent for ``idle`` seconds: opened again, as a long-poll is
        except RemoteError as exc:
            self._error = exc
        except (aiohttp.ClientError, OSError, ValueError) as exc:
            self._error = Unavailable(f"{where}: the stream failed ({type(exc).__name__})")
        finally:
            reply.close()
            self._came.set()

    async def _event(self, block: bytes) -> tuple[int, MessageSpec] | None:
        """The message an event carries, with its position; None for other events."""
        fields = wire.event_fields(block)
        if fields is None:
            return None
        name, ident, data = fields
        where = self._where
        if name == "deleted":
            raise PipeGone(f"{where}: the pipe was deleted")
        if name == "gap":
            log.warning("%s: messages left the pipe unacknowledged: %s", where, wire.reason(
                wire.Reply(200, {}, data)))  # fmt: skip
            return None
        if name != "message":
            return None  # keep-alives, and what this reader does not need (expired, revoked)
        found = wire.position(ident)
        # The first may be at or before ``after``: a pipe that never issued that
        # position starts from the oldest message it holds (EXTENSIONS.md §3: repeats,
        # never a gap), and the feed's deduplication window takes the repeats.
        if found is None or found <= self._last:
            raise Unavailable(f"{where}: an event at position {ident[:20]!r} after {self._last}")
        url = f"{self._pipe_url}.{found}"
        try:
            spec = wire.plain_message(data, wire.READ_LIMITS)
        except RestMSError as exc:
            raise Unavailable(
                f"{where}: the message at position {found} is not understood: {exc}"
            ) from exc
        if spec is None:  # the general reading: linked contents, and the reasons
            try:
                spec = await self._general(url, wire.Reply(200, {}, data))
            except Unavailable as exc:
                raise Unavailable(f"{where}: {exc}", exc.retry_after) from exc
        self._last = found
        return found, spec
