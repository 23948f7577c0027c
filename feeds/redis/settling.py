"""Settling a publish that failed after it may have placed copies (Redis engine).

A publish's call into a bucket can fail in two ways. Refused (``NOREPLICAS``,
``CLUSTERDOWN``, a moved slot): the master ran nothing. Or unsure: the master may have
placed the copies though the engine never heard it confirmed: no replica confirmed
them in time (``WAIT``), or the connection failed once the call was sent. A master
stopped (SIGSTOP, a frozen VM) past the node timeout is the hard case: the call waits
in its socket; the master may have placed the copies, and its replica received them,
just before it stopped (the replica is then promoted with them), or it runs the call
only when it resumes, as the stale master it then is (its writes are then dropped when
it turns replica). Which of these happened is known only once the failover is over.

So a publish that may place copies exactly once (a durable one, or one with message
ids) gives each bucket's call a **mark**: a key of the bucket's slot, new for each
call, which the ``place`` function writes with the positions it placed, atomically
with them. When the publish fails, :func:`settle` asks each bucket the publish may have
placed into (the ``settle`` function): the copies its mark records that are still
there are taken back, and the mark is left settled, so that a call of that publish
reaching a master only later (queued in a stopped master's socket) places nothing. The
answer counts only once a replica confirmed it (``WAIT`` after the call): a stale
master's answer (it has no replica) never does. Until then it is asked again, for
SETTLE_FOR seconds at most (a failover takes the node timeout plus a few seconds); a
publish still unsettled then is logged, and its message may be held twice.

The publish answers 503 at once; its message ids stay claimed while it settles
(:mod:`.claims`), so a repeat of the message waits for the outcome instead of placing
it beside a copy that is still to be taken back.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import secrets
from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING

from restms.errors import NotCommitted, ServiceUnavailable

from .link import FUNCTIONS

if TYPE_CHECKING:
    from .service import RedisEngine

log = logging.getLogger(__name__)
SETTLE_FOR = 20.0  # seconds; library.lua keeps a mark 60 s (MARK_TTL)
PAUSE = 0.2  # seconds between two tries


def marks() -> Iterator[str]:
    """Names for an engine's marks, each new: a random prefix of the engine's own and a
    counter (a mark's key is ``<bucket tag>:u:<name>``)."""
    prefix = secrets.token_hex(6)
    return (f"{prefix}.{n}" for n in itertools.count())


@dataclasses.dataclass(frozen=True)
class Call:
    """A publish's call into one bucket that may have placed copies."""

    tag: str  # the bucket's hash tag (and wake-up channel)
    mark: str
    pipes: tuple[str, ...]  # the pipes' keys, in the call's order


class Unsettled(NotCommitted):
    """A publish failed after it may have placed copies: answered 503 at once, while
    ``settled`` takes them back. Its result: for each message (by index) some copy of
    which could not be taken back, having gone already (acknowledged, dropped or
    expired), how many such copies: that message counts as kept. None: the publish
    could not be settled."""

    def __init__(self, failure: NotCommitted, settled: asyncio.Task[dict[int, int] | None]) -> None:
        super().__init__(failure.reason, retry_after=failure.retry_after)
        self.settled = settled


def start(
    engine: RedisEngine,
    failure: ServiceUnavailable,
    calls: list[Call],
    targets: dict[str, list[int]],
) -> Unsettled:
    """Settle ``calls`` in the background (``targets``: each pipe's messages, by
    index, in the order placed); the error the publish raises meanwhile."""
    task = asyncio.get_running_loop().create_task(_settle(engine, calls, targets))
    engine.adopt(task)
    if not isinstance(failure, NotCommitted):
        failure = NotCommitted(failure.reason, retry_after=failure.retry_after)
    return Unsettled(failure, task)


async def _settle(
    engine: RedisEngine, calls: list[Call], targets: dict[str, list[int]]
) -> dict[int, int] | None:
    loop = asyncio.get_running_loop()
    started = loop.time()
    deadline = started + SETTLE_FOR
    kept: Counter[int] = Counter()
    outcome: list[str] = []  # each pipe's fates
    left = list(calls)
    why = ""
    while True:
        for call in list(left):
            keys: list[str] = [call.mark]
            for pipe in call.pipes:
                stream, state, _tag = engine.keys.pipe(pipe)
                keys += [stream, state]
            try:
                answer = await engine.link.call(
                    call.tag,
                    "FCALL",
                    FUNCTIONS + "settle",
                    len(keys),
                    *keys,
                    call.tag,
                    write=True,
                    durable=True,  # only a replica's confirmation makes the answer true
                )
            except ServiceUnavailable as exc:
                why = exc.reason
                continue
            left.remove(call)
            fates = answer.decode().split(",")
            outcome += fates
            for pipe, fate in zip(call.pipes, fates, strict=True):
                engine.counters.withdrawn += fate.count("t")
                kept.update(i for i, f in zip(targets[pipe], fate, strict=False) if f == "g")
        if not left:
            log.info(
                "a failed publish is settled after %.1f s: %d copies taken back, %d gone before",
                loop.time() - started,
                sum(f.count("t") for f in outcome),
                sum(kept.values()),
            )
            return dict(kept)
        if loop.time() >= deadline:
            log.error(
                "a failed publish could not be settled in %s s (%s): copies it placed in %d"
                " bucket(s) may stay, and a repeat of its messages may be held twice",
                SETTLE_FOR,
                why,
                len(left),
            )
            return None
        await asyncio.sleep(PAUSE)
