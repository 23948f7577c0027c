"""Placing a publish's copies on the Redis engine: the joins each message matches (a
feed that is not a rotator or service feed), the "reject" pipes' room checked before
anything is placed, then one function call per bucket of target pipes; what a failed
call may have placed is taken back (:mod:`.settling` for a marked call, else
:func:`withdraw`). :mod:`.publishing` and :mod:`.queueing` place through here.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from restms.errors import PayloadTooLarge, ServiceUnavailable
from restms.specs import MessageSpec

from ..service import Placed
from . import mirror, settling, waiting
from .catalogue import FeedRec, PipeRec, bucket, route_key
from .link import FUNCTIONS, Unconfirmed
from .mirror import Copy
from .values import Settings

if TYPE_CHECKING:
    from .service import RedisEngine

Item = tuple[MessageSpec, bytes, int, bool]  # spec, record, size, persistent


class Refused(ServiceUnavailable):
    """The whole publish is refused for room (a full "reject" pipe; a full feed queue,
    ``publisher``: the publisher's principal is in the mirror's events)."""

    def __init__(self, reason: str, *, publisher: bool) -> None:
        super().__init__(reason, retry_after=1)
        self.publisher = publisher


async def fanout(
    engine: RedisEngine, feed: FeedRec, items: list[Item], routed: list[int], exact: bool = False
) -> tuple[dict[int, int], list[Placed], bool, dict[int, Sequence[Copy]]]:
    """Route ``items`` (those at ``routed``) to the joins they match: each message's
    count, the positions placed, whether durably, and (the mirror on) each message's
    pipes in the order of its joins, whether each took it, and its joins there."""
    # Messages that select the same joins are routed once, together: all of a fanout
    # feed's, a direct or topic feed's by address, a headers feed's by address and
    # headers. A route is each pipe its joins lead to and how many of them do.
    routes: dict[Any, dict[str, int]] = {}
    route_of: dict[int, Any] = {}
    targets: dict[str, list[int]] = {}  # pipe -> messages, in order
    for index in routed:
        spec = items[index][0]
        key = route_key(feed, spec.address, spec.headers)
        route = routes.get(key)
        if route is None:
            route = routes[key] = engine.cache.route(feed, spec.address, spec.headers)
        route_of[index] = key
        for pipe in route:
            targets.setdefault(pipe, []).append(index)
    pipes = {key: engine.cache.pipes[key] for key in targets if key in engine.cache.pipes}
    settings = {key: engine.settings(pipe) for key, pipe in pipes.items()}
    await _check_reject(engine, settings, targets, items)
    durable = any(items[i][3] for i in routed) or any(s.durable for s in settings.values())
    positions = await place(engine, pipes, targets, items, durable, exact, settings=settings)
    placements: list[Placed] = []
    skipped: set[tuple[str, int]] = set()  # (pipe, message): the pipe was full
    for key, got in positions.items():
        taken = list(filter(None, got))
        if taken:
            placements.append(Placed(pipe=key, first=min(taken), last=max(taken)))
        if len(taken) < len(got):
            skipped.update((key, i) for i, p in zip(targets[key], got, strict=True) if not p)
        engine.counters.routed += len(taken)
    engine.counters.skipped_full += len(skipped)

    def copies_of(key: Any, index: int | None = None) -> tuple[Copy, ...]:
        """Message ``index``'s copies along route ``key`` (None: those of any message
        of it, when no pipe skipped one)."""
        return tuple(
            (pipes[pipe], index is None or (pipe, index) not in skipped, joins)
            for pipe, joins in routes[key].items()
            if pipe in positions
        )

    took: dict[int, int]
    copies: dict[int, Sequence[Copy]] = {}
    if not skipped:  # (most publishes) every message of a route went to its pipes
        whole = {key: copies_of(key) for key in routes}
        counted = {key: sum(joins for _pipe, _took, joins in went) for key, went in whole.items()}
        took = {i: counted[route_of[i]] for i in routed}
        if engine._mirror is not None:
            copies = {i: whole[route_of[i]] for i in routed}
    else:
        copies = {i: copies_of(route_of[i], i) for i in routed}
        took = {i: sum(joins for _pipe, went, joins in copies[i] if went) for i in routed}
        if engine._mirror is None:
            copies = {}
    return took, placements, durable, copies


async def _check_reject(
    engine: RedisEngine,
    pipes: dict[str, Settings],
    targets: dict[str, list[int]],
    items: list[Item],
) -> None:
    """Q2 "reject": a message larger than the pipe takes is 413; a pipe too full for
    what comes is 503 for the whole publish, before anything is placed."""
    asks: dict[str, list[Any]] = defaultdict(list)
    for key, settings in pipes.items():
        if settings.overflow != "reject":
            continue
        sizes = [items[i][2] for i in targets[key]]
        if any(size > settings.max_bytes for size in sizes):
            raise PayloadTooLarge("a message is larger than a pipe it goes to accepts")
        stream, state, tag = engine.keys.pipe(key)
        asks[tag].append((stream, state, settings.max_messages, settings.max_bytes, sizes))
    for tag, pipes_here in asks.items():
        keys: list[Any] = []
        args: list[Any] = []
        for stream, state, most, most_bytes, sizes in pipes_here:
            keys += [stream, state]
            args += [most, most_bytes, len(sizes), *sizes]
        fits = await engine.link.call(tag, "FCALL", FUNCTIONS + "room", len(keys), *keys, *args)
        if any(fit < len(ask[4]) for fit, ask in zip(fits, pipes_here, strict=True)):
            engine.counters.rejected_full += 1
            raise Refused("a pipe this publish reaches is full; retry", publisher=False)


async def place(
    engine: RedisEngine,
    pipes: dict[str, PipeRec],
    targets: dict[str, list[int]],
    items: list[Item],
    durable: bool,
    exact: bool = False,
    redelivered: int = 0,
    settings: dict[str, Settings] | None = None,
) -> dict[str, list[int]]:
    """One call per bucket; each pipe's positions (0: skipped, full). ``redelivered``:
    the redeliveries the messages had (a leased message handed over), set with them;
    ``settings``: each pipe's, when the caller has them. A durable publish, or one
    that must place its messages once (``exact``: message ids), marks each call
    (:mod:`.settling`): should it fail, what it may have placed is taken back for sure,
    in the background, and Unsettled raised at once."""
    if settings is None:
        settings = {key: engine.settings(pipe) for key, pipe in pipes.items()}
    by_tag: dict[str, list[str]] = defaultdict(list)
    for key in pipes:
        by_tag[engine.keys.tag(bucket(key))].append(key)
    now_ms = int(time.time() * 1000)
    marked = durable or exact

    async def one(
        tag: str, here: list[str]
    ) -> tuple[str, list[str], list[int] | None, Unconfirmed | None, list[Any] | None, str]:
        keys: list[Any] = []
        args: list[Any] = [tag, now_ms, engine.link.origin]
        heads = False  # whether the call answers what drop-oldest pipes drop (the mirror's)
        for key in here:
            stream, state, _tag = engine.keys.pipe(key)
            keys += [stream, state]
            limits = settings[key]
            args += [
                limits.max_messages,
                limits.max_bytes,
                limits.overflow,
                redelivered,
                len(targets[key]),
            ]
            for index in targets[key]:
                spec, record, size, _kept = items[index]
                ttl = spec.prop("expiration") if spec.props else None
                expires = now_ms + int(ttl) if ttl and ttl.isdigit() else 0
                args += [size, expires, record]
            heads = heads or (engine._mirror is not None and limits.overflow == "drop-oldest")
        if heads:
            args.append(1)
        mark = f"{tag}:u:{next(engine.marks)}" if marked else ""
        if mark:
            keys.append(mark)
        command = ("FCALL", FUNCTIONS + "place", len(keys), *keys, *args)
        unsure: Unconfirmed | None = None
        try:
            reply = await engine.link.call(tag, *command, write=True, durable=durable)
        except Unconfirmed as unconfirmed:  # perhaps placed, unconfirmed: taken back below
            if unconfirmed.results is None:  # not even its answer came
                return tag, here, None, unconfirmed, None, mark
            unsure, reply = unconfirmed, unconfirmed.results[0]
        removed: list[Any] | None = None
        if heads:
            *reply, removed = reply
        return tag, here, list(map(int, reply)), unsure, removed, mark

    results: list[Any]
    if len(by_tag) == 1:  # (most publishes: no gather, no task)
        ((tag, here),) = by_tag.items()
        try:
            results = [await one(tag, here)]
        except BaseException as exc:  # as gather's return_exceptions: taken back below
            results = [exc]
    else:
        results = await asyncio.gather(
            *(one(tag, here) for tag, here in by_tag.items()), return_exceptions=True
        )
    positions: dict[str, list[int]] = {}
    failure: BaseException | None = None
    calls: list[settling.Call] = []  # (marked) those that may have placed copies
    for result in results:
        if isinstance(result, BaseException):
            failure = failure or result  # refused: that bucket's call placed nothing
            continue
        tag, here, reply, unconfirmed, removed, mark = result
        failure = failure or unconfirmed
        if mark:
            calls.append(settling.Call(tag, mark, tuple(here)))
        if reply is None:
            continue
        at = 0
        for index, key in enumerate(here):
            engine.counters.dropped_oldest += reply[at]
            count = len(targets[key])
            positions[key] = reply[at + 1 : at + 1 + count]
            if reply[at] and removed is not None:  # (the mirror on)
                mirror.dropped(engine, pipes[key], removed[index])
            at += 1 + count
    if failure is not None:
        if calls and isinstance(failure, ServiceUnavailable):
            raise settling.start(engine, failure, calls, targets) from failure
        records = {key: [items[index][1] for index in targets[key]] for key in positions}
        await withdraw(engine, positions, records)
        raise failure
    for key in positions:
        waiting.wake(engine, key)
    return positions


async def withdraw(
    engine: RedisEngine, positions: dict[str, list[int]], records: dict[str, list[bytes]]
) -> None:
    """Take back the copies a failed publish of non-persistent messages without ids
    placed, as far as it knows them (best effort: the store failing; marked publishes
    are settled instead). Each goes only if its position still holds its record: a
    master that failed over may have issued that position again to another message,
    which stays."""
    for key, got in positions.items():
        stream, state, tag = engine.keys.pipe(key)
        for position, record in zip(got, records[key], strict=True):
            if position:
                try:
                    taken = await engine.link.call(
                        tag,
                        "FCALL",
                        FUNCTIONS + "take_out",
                        2,
                        stream,
                        state,
                        tag,
                        position,
                        "lost",  # a reader may have seen it: told as a gap
                        record,
                        write=True,
                    )
                    engine.counters.withdrawn += 1 if taken else 0
                except ServiceUnavailable:
                    return
