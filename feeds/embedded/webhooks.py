"""The webhook workers' side of the embedded engine: ``watch_webhooks`` and the
``webhook_*`` calls of :class:`feeds.service.EngineService`.

A webhook pipe's worker (in the gateway) asks for the pipe before each attempt and
reports each outcome; the engine keeps the attempts, the due times and the pipe's
state (:mod:`feeds.webhook`). A message that left the pipe meanwhile (acknowledged,
expired, the pipe deleted) is no longer delivered: its attempts are forgotten and the
worker is told so. The outcomes that decide a wait or a pipe's state (a failure, a
gone endpoint, a verification) are committed before the call returns; a delivery is
committed within the journal interval, as an acknowledgement is.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from restms.errors import NotFound, ServiceUnavailable

from .. import paging
from ..model import Message as Held
from ..model import Pipe
from ..service import HIDDEN, Webhook, WebhookAttempts
from .values import webhook

if TYPE_CHECKING:
    from ..engine import Engine
    from ..store import Store


class Webhooks:
    """The webhook calls of an :class:`~feeds.embedded.EmbeddedEngine`, over its engine
    and store."""

    def __init__(self, engine: Engine, store: Store | None) -> None:
        self.engine = engine
        self.store = store

    def watch(self, listener: Callable[[str, Webhook | None], None] | None) -> None:
        if listener is None:
            self.engine.on_hook = None
            return

        def news(pipe: Pipe) -> None:
            listener(pipe.key, None if pipe.deleted or pipe.hook is None else webhook(pipe))

        self.engine.on_hook = news

    async def webhooks(self) -> tuple[Webhook, ...]:
        return tuple(webhook(pipe) for pipe in self.engine.hooks.values())

    def _hooked(self, key: str) -> Pipe:
        """A webhook pipe that is there, for its worker (not counted as use: it pins)."""
        found = self.engine.peek(key)
        if not isinstance(found, Pipe) or found.deleted or found.hook is None:
            raise NotFound(HIDDEN)
        return found

    async def _hooked_message(self, key: str, position: int) -> tuple[Pipe, Held | None]:
        """The webhook pipe and its message at ``position``, None when it left the pipe
        (its attempts then are forgotten)."""
        pipe = self._hooked(key)
        await paging.ensure(self.engine, self.store, pipe, position)
        held = pipe.messages.get(position)
        if held is None:
            self.engine.hook_forget(pipe, position)
        return pipe, held

    def _attempted(self, pipe: Pipe, held: Held | None, status: str) -> None:
        if held is not None and self.engine.mirror is not None:
            self.engine.mirrored("webhook_attempt", pipe, held, status)

    async def webhook(self, pipe: str) -> Webhook:
        if self.engine.closing:  # a worker asks before each attempt: none is begun now
            raise ServiceUnavailable("the gateway is shutting down")
        return webhook(self._hooked(pipe))

    async def attempts(self, pipe: str, position: int) -> WebhookAttempts | None:
        found, held = await self._hooked_message(pipe, position)
        if held is None:
            return None
        hook = found.hook
        assert hook is not None  # a webhook pipe (_hooked)
        return WebhookAttempts(made=hook.attempts.get(position, 0), due=hook.due.get(position, 0.0))

    async def verified(self, pipe: str, ok: bool, status: str, error: str) -> None:
        self.engine.hook_verified(self._hooked(pipe), ok, status, error)
        await paging.commit(self.engine, self.store)

    async def delivered(self, pipe: str, position: int, status: str) -> bool:
        found, held = await self._hooked_message(pipe, position)
        self._attempted(found, held, status)
        if held is None:
            return False
        self.engine.hook_delivered(found, held, status)
        return True  # committed within the journal interval, as an acknowledgement

    async def failed(
        self, pipe: str, position: int, attempt: int, status: str, error: str, retry_at: float
    ) -> bool:
        found, held = await self._hooked_message(pipe, position)
        self._attempted(found, held, status)
        if held is None or found.hook is None or not found.hook.delivering:
            return False
        self.engine.hook_failed(found, held, attempt, status, error, retry_at)
        await paging.commit(self.engine, self.store)  # the attempt is on disk before the wait
        return True

    async def give_up(self, pipe: str, position: int, reason: str) -> None:
        found, held = await self._hooked_message(pipe, position)
        if held is not None:
            self.engine.hook_give_up(found, held, reason)

    async def gone(self, pipe: str, position: int, status: str) -> bool:
        found, held = await self._hooked_message(pipe, position)
        self._attempted(found, held, status)
        if held is None or found.hook is None or not found.hook.delivering:
            return False
        self.engine.hook_gone(found, held, status)
        await paging.commit(self.engine, self.store)
        return True
