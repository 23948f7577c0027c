"""Room in the pipes a publish would reach, for publishers that must not lose a
message to a full pipe (:meth:`feeds.service.EngineService.room`).

A "skip" pipe that is full is passed over by a publish (Q2): the message is not lost
to the publisher, who got a count, but that pipe never sees it. A bridge with
``backpressure = "wait"`` publishes only as many leading messages as every such pipe
they reach can hold together, and waits for the rest.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from restms.specs import MessageSpec

from ..mirroring import embedded
from ..model import Feed, Pipe
from ..selection import matching

FEW_JOINS = 64  # feeds with at most this many joins get the cheap check first


async def wait_for_room(feed: Feed, messages: Sequence[MessageSpec], wait: float) -> int:
    """How many leading ``messages`` a publish to ``feed`` can place: now or, when none
    fits, after waiting up to ``wait`` seconds for one of the full pipes to change."""
    fits, full = fitting(feed, messages)
    if fits or not full or wait <= 0:
        return fits
    waits = [asyncio.ensure_future(pipe.changed(wait, seen)) for pipe, seen in full.items()]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiting in waits:
            waiting.cancel()
    return fitting(feed, messages)[0]


def fitting(feed: Feed, messages: Sequence[MessageSpec]) -> tuple[int, dict[Pipe, int]]:
    """How many leading messages every "skip" pipe they reach can hold together and,
    when it is none, the full pipes (with their versions) to wait for."""
    if feed.type in ("rotator", "service"):
        return len(messages), {}  # queueing feeds answer 503 themselves when full
    if len(feed.joins) <= FEW_JOINS and _all_fit(feed, messages):
        return len(messages), {}  # the usual case, without matching each message
    used: dict[Pipe, tuple[int, int]] = {}
    for index, spec in enumerate(messages):
        size = embedded(spec)
        pipes = {join.pipe for join in matching(feed, spec)}
        for pipe in pipes:
            if pipe.overflow != "skip" or size > pipe.max_bytes:
                continue  # reject answers 503; drop-oldest and too big are policy
            count, total = used.get(pipe, (0, 0))
            if not _room(pipe, count + 1, total + size):
                return index, ({} if index else {pipe: pipe.version})
        for pipe in pipes:
            count, total = used.get(pipe, (0, 0))
            used[pipe] = (count + 1, total + size)
    return len(messages), {}


def _all_fit(feed: Feed, messages: Sequence[MessageSpec]) -> bool:
    """Whether every pipe joined to ``feed`` has room for all the messages: then none
    of them can meet a full pipe, whichever pipes it reaches."""
    total = sum(embedded(spec) for spec in messages)
    return all(
        join.pipe.overflow != "skip" or _room(join.pipe, len(messages), total)
        for join in feed.joins.values()
    )


def _room(pipe: Pipe, count: int, size: int) -> bool:
    """Whether the pipe can hold ``count`` more messages of ``size`` bytes in all."""
    return (
        len(pipe.messages) + pipe.spilled + count <= pipe.max_messages
        and pipe.bytes + pipe.spilled_bytes + size <= pipe.max_bytes
    )
