"""The webhook workers' side of the Redis engine: a webhook pipe's delivery state
(:class:`feeds.webhook.Hook`, its machine and record) kept in the pipe's state hash
(field ``hook``, with its generation), read and written by the pipe's one worker.

The outcomes that decide a wait or a pipe's state (a failure, a verification, a gone
endpoint) are written with ``WAIT`` before the call returns, as a persistent publish
is. A message that left the pipe meanwhile is no longer delivered: its attempts are
forgotten and the worker is told so (False, or None).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from restms.errors import NotFound, ServiceUnavailable
from restms.webhook import WebhookOptions

from ..service import HIDDEN, Message, Webhook, WebhookAttempts
from ..store import dumps, loads
from ..webhook import Hook, apply_change
from . import mirror, syncing, waiting
from .catalogue import PipeRec
from .link import FUNCTIONS
from .values import webhook

if TYPE_CHECKING:
    from .service import RedisEngine


async def hook_of(engine: RedisEngine, pipe: PipeRec) -> Hook | None:
    """A pipe's delivery state as the cluster keeps it; None for another type."""
    options = engine.settings(pipe).webhook
    if options is None:
        return None
    _stream, state, tag = engine.keys.pipe(pipe.key)
    return hook_from(options, await engine.link.call(tag, "HGET", state, "hook"))


def hook_from(options: WebhookOptions, data: bytes | None) -> Hook:
    """A webhook pipe's delivery state from its options and the record its state hash
    keeps (None: none yet)."""
    hook = Hook(options)
    if data:
        record = loads(data)
        hook.restore(record)
        hook.generation = int(record.get("generation", 0))
    return hook


async def save(
    engine: RedisEngine, pipe: PipeRec, hook: Hook, durable: bool, *, worker: bool = True
) -> None:
    """Keep a pipe's delivery state: a ``worker``'s write carries this node's fencing
    token (:mod:`.owners`) and is refused (NotFound: the worker stops) once another
    node owns the pipe; any write that would take the generation back is refused."""
    _stream, state, tag = engine.keys.pipe(pipe.key)
    token = engine.owners.token(pipe.key) if worker else 0
    record = dumps({**hook.record(), "generation": hook.generation})
    kept = await engine.link.call(
        tag,
        "FCALL",
        FUNCTIONS + "hook_save",
        1,
        state,
        token,
        hook.generation,
        record,
        write=True,
        durable=durable,
    )
    if int(kept) == 0:
        raise NotFound(HIDDEN)
    if int(kept) < 0:
        raise NotFound("another gateway node runs that pipe's webhook deliveries")


async def changed(engine: RedisEngine, pipe: PipeRec, change: WebhookOptions) -> dict[str, object]:
    """A PUT's webhook options on ``pipe``: the pipe's new options (400 before any
    change); the state moves (a new callback is verified first) and is kept."""
    hook = await hook_of(engine, pipe)
    given = apply_change(hook, pipe.options.get("webhook"), change, engine.config)
    if given is None or hook is None:
        return pipe.options
    await save(engine, pipe, hook, durable=True, worker=False)
    return {**pipe.options, "webhook": given}


async def _hooked(engine: RedisEngine, key: str) -> tuple[PipeRec, Hook]:
    pipe = await syncing.find(engine, "pipes", key)
    hook = None if pipe is None else await hook_of(engine, pipe)
    if pipe is None or hook is None:
        raise NotFound(HIDDEN)
    return pipe, hook


async def _held(
    engine: RedisEngine, pipe: PipeRec, hook: Hook, position: int, attempt: str | None = None
) -> Message | None:
    """The message, if it is still in the pipe (``attempt``: the status of an attempt at
    it, mirrored); when not, its attempts are forgotten."""
    message = await engine.look(None, pipe.key, position)
    if message is not None:
        if attempt is not None and engine._mirror is not None:
            held = mirror.Held.of_message(message)
            mirror.pipe_event(engine, "webhook_attempt", pipe, held, attempt)
        return message
    if position in hook.attempts:
        hook.done(position)
        await save(engine, pipe, hook, durable=False)
    return None


async def _settle(
    engine: RedisEngine, pipe: PipeRec, position: int, *, lost: bool = False
) -> bytes | None:
    """Take this one message out (concurrent deliveries finish in any order); ``lost``
    when it leaves undelivered (given up: a gap for a reader that resumes)."""
    stream, state, tag = engine.keys.pipe(pipe.key)
    mark = ("lost",) if lost else ()
    taken = await engine.link.call(
        tag, "FCALL", FUNCTIONS + "take_out", 2, stream, state, tag, position, *mark, write=True
    )
    if not taken:
        return None
    engine.counters.acknowledged += 1
    waiting.wake(engine, pipe.key)
    data: bytes = taken[0]
    return data


async def webhook_value(engine: RedisEngine, key: str) -> Webhook:
    if engine._closing:  # a worker asks before each attempt: none is begun now
        raise ServiceUnavailable("the gateway is shutting down")
    pipe, hook = await _hooked(engine, key)
    return webhook(pipe, hook)


async def webhooks(engine: RedisEngine) -> tuple[Webhook, ...]:
    """The webhook pipes whose deliveries this node runs (:mod:`.owners`)."""
    made: list[Webhook] = []
    for key in list(engine.owners.held):
        pipe = engine.cache.pipes.get(key)
        if pipe is not None and (hook := await hook_of(engine, pipe)) is not None:
            made.append(webhook(pipe, hook))
    return tuple(made)


async def attempts(engine: RedisEngine, key: str, position: int) -> WebhookAttempts | None:
    pipe, hook = await _hooked(engine, key)
    if not await _held(engine, pipe, hook, position):
        return None
    return WebhookAttempts(made=hook.attempts.get(position, 0), due=hook.due.get(position, 0.0))


async def verified(engine: RedisEngine, key: str, ok: bool, status: str, error: str) -> None:
    pipe, hook = await _hooked(engine, key)
    hook.outcome(status, error, time.time())
    hook.fire("verified" if ok else "refused")
    await save(engine, pipe, hook, durable=True)


async def delivered(engine: RedisEngine, key: str, position: int, status: str) -> bool:
    pipe, hook = await _hooked(engine, key)
    message = await _held(engine, pipe, hook, position, status)
    if message is None:
        return False
    hook.outcome(status, "", time.time())
    hook.delivered += 1
    hook.done(position)
    engine.counters.hook_delivered += 1
    engine.counters.delivered += 1
    if await _settle(engine, pipe, position) is not None and engine._mirror is not None:
        mirror.hook_delivered(engine, pipe, message, status)
    await save(engine, pipe, hook, durable=False)
    return True


async def failed(
    engine: RedisEngine,
    key: str,
    position: int,
    attempt: int,
    status: str,
    error: str,
    retry_at: float,
) -> bool:
    pipe, hook = await _hooked(engine, key)
    if not await _held(engine, pipe, hook, position, status) or not hook.delivering:
        return False
    hook.outcome(status, error, time.time())
    hook.failed(position, attempt, retry_at)
    engine.counters.hook_failed += 1
    await save(engine, pipe, hook, durable=True)  # on two machines before the wait
    return True


async def give_up(engine: RedisEngine, key: str, position: int, reason: str) -> None:
    from .publishing import dead_letter

    pipe, hook = await _hooked(engine, key)
    if not await _held(engine, pipe, hook, position):
        return
    made = hook.attempts.get(position, 0)
    why = (("x-delivery-count", str(made)), ("x-webhook-status", hook.last_status))
    data = await _settle(engine, pipe, position, lost=True)
    if data is not None:
        await dead_letter(engine, pipe, data, reason, why, None)
    hook.dead += 1
    engine.counters.hook_dead += 1
    hook.done(position)
    await save(engine, pipe, hook, durable=True)


async def gone(engine: RedisEngine, key: str, position: int, status: str) -> bool:
    pipe, hook = await _hooked(engine, key)
    if not await _held(engine, pipe, hook, position, status) or not hook.delivering:
        return False
    hook.outcome(status, "the receiver ended the subscription", time.time())
    hook.done(position)
    hook.fire("gone")
    await save(engine, pipe, hook, durable=True)
    return True
