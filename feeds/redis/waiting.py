"""Waiting readers on the Redis engine and their wake-ups: a future per wait on a pipe,
set when a change of that pipe is announced on its bucket's channel (the engine
listens on the channel of each bucket where it ever had a waiter, at most
``BUCKETS``); the waiters then look again, or take the message the wake-up carried
(:func:`carried`). The state is the engine's (``_waiters``, ``_listening``)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from redis.exceptions import RedisError

from ..service import Message
from .link import unavailable
from .values import decode_message

if TYPE_CHECKING:
    from .service import RedisEngine

Carried = tuple[int, bytes, int]  # a message a wake-up carried: position, record, size


def heard(engine: RedisEngine, data: bytes) -> None:
    """A wake-up on a bucket's channel (library.lua, place and the other calls that
    change pipes): the pipes it names, on one line, then the messages it carries, each
    given to the waiters of its pipe. Those of this engine's own places are not taken:
    the place wakes this engine's readers itself once its answer is in (and its
    traffic events are out), as on one node before."""
    names, _, rest = data.partition(b"\n")
    carried: dict[str, Carried] = {}
    origin, _, rest = rest.partition(b"\n")
    if origin == engine.link.origin.encode():
        rest = b""
    while rest:
        head, _, rest = rest.partition(b"\n")
        key, position, size, length = head.split(b" ")
        end = int(length)
        carried[key.decode()] = (int(position), rest[:end], int(size))
        rest = rest[end + 1 :]
    for pipe in names.decode().split():
        wake(engine, pipe, carried.get(pipe, True))


def carried(pipe: str, position: int, future: asyncio.Future[Any]) -> Message | None:
    """The message at ``position`` when the wake-up that ended a wait carried it: a
    reader waiting for the next message is answered without reading the stream again.
    It is the message as placed, which the wait saw come: a reader that read the
    stream then would have had the same (a message carried has no expiry and no
    redelivery; the deleted contents of a new message are none)."""
    if not future.done() or future.cancelled():
        return None
    woken = future.result()
    if type(woken) is not tuple or woken[0] != position:
        return None
    return decode_message(pipe, position, woken[1], woken[2], 0, b"")


async def listen(engine: RedisEngine, index: int) -> None:
    """Subscribe to bucket ``index``'s channel, once: its wake-ups come from then on."""
    if index not in engine._listening:
        try:
            await engine._subscriber.subscribe(engine.keys.tag(index))
        except (RedisError, OSError) as exc:  # (its master gone, or moving): 503
            raise unavailable(exc, write=False) from exc
        engine._listening.add(index)


def watch(engine: RedisEngine, pipe: str) -> asyncio.Future[Any]:
    future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    engine._waiters[pipe].add(future)
    return future


def unwatch(engine: RedisEngine, pipe: str, future: asyncio.Future[Any]) -> None:
    waiters = engine._waiters.get(pipe)
    if waiters is not None:
        waiters.discard(future)
        if not waiters:
            del engine._waiters[pipe]


def count(engine: RedisEngine, pipe: str) -> int:
    """How many wait on ``pipe`` on this engine."""
    return len(engine._waiters.get(pipe, ()))


def wake(engine: RedisEngine, pipe: str, woken: Any = True) -> None:
    """``woken``: what the waiters' futures are given (a message the wake-up
    carried: :func:`carried`)."""
    for future in engine._waiters.pop(pipe, ()):
        if not future.done():
            future.set_result(woken)
