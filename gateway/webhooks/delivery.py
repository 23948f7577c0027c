"""Webhook pipes: the gateway reads them itself and POSTs each message to a callback.

Theory of operation
-------------------
A webhook pipe (our extension, docs/WEBHOOKS.md) is read through the engine service's
cursor (:mod:`feeds.service`), as SSE, WebSocket, streams and bridges read theirs:
messages are routed into it like into any pipe, and this module takes them out. One
:class:`Worker` (an asyncio task) runs per webhook pipe. The :class:`Webhooks` registry
starts the workers of the pipes the service has when the app starts, and the service
tells it (``watch_webhooks``) when a webhook pipe is created (start one), changed by a
PUT (start a new one once the old has stopped) or deleted (stop it); the app's cleanup
context stops them all. A running worker holds its cursor open, which pins the pipe,
so it is never collected as idle.

* **Verification** (state ``verifying``): before anything is delivered, the worker
  GETs the callback with ``restms.mode=subscribe``, ``restms.challenge=<random>`` and
  ``restms.pipe=<pipe URI>`` added to its query. A 2xx answer whose body is the
  challenge verifies the pipe; anything else fails it, and nothing is delivered.
* **Delivery** (``active``, ``retrying``): ``concurrency`` lanes, each of which takes
  the oldest message of the pipe that no other lane holds (they take from the one
  cursor in turn, which starts at the pipe's oldest message) and delivers it until it
  is done. With one lane (the default) messages go strictly in order, one at a time;
  with more they overlap and may arrive in any order. An idle lane waits for the
  pipe's next change (a message arriving): it never polls.
* **An attempt** POSTs the RestMS JSON message document (contents embedded) with
  ``X-RestMS-Signature``, ``X-RestMS-Message-Id`` and ``X-RestMS-Attempt``
  (:mod:`restms.webhook`). A 2xx answer within the pipe's ``timeout`` delivers the
  message, which leaves the pipe. 410 ends the subscription (state ``ended``).
  Anything else (another status, a redirect, a timeout, a refused or failed
  connection) fails the attempt: the next one comes after a capped exponential
  backoff with full jitter. After ``max_attempts`` attempts, or once the next one
  would come ``max_age`` seconds or more after the message arrived, the message goes
  to the pipe's dead-letter feed and the lane moves on.
* **State** lives in the engine (:mod:`feeds.webhook`) and in its store: the worker
  reports each outcome to the service (``webhook_verified``, ``webhook_delivered``,
  ``webhook_failed``, ``webhook_give_up``, ``webhook_gone``) and reads the attempts
  made at a message back from it. ``webhook_failed`` returns once committed, so the
  attempt is on disk before the wait, and a restart carries on with the attempt
  numbers and times recorded.

All workers share one client session: at most ``webhook_connections`` connections,
the SSRF guard's resolver (:mod:`gateway.webhooks.guard`), no cookies, no redirects, no
proxies from the environment, no decompression, and at most ``webhook_response_max``
bytes of any answer read. Failures are logged at most once a minute per pipe, naming
the pipe by a digest of its name and the callback by its host only; the secret is
never logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import logging
import math
import secrets
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web
from opentelemetry.trace import SpanKind, StatusCode, Tracer
from yarl import URL

import restms
from bridges import tracing
from feeds.service import Cursor, EngineService, Message, Webhook
from gateway.restms import http, views
from gateway.server import tracing as gateway_tracing
from gateway.server.bodies import read_at_most
from gateway.server.keys import CONFIG, SERVICE
from gateway.webhooks.guard import Guard, GuardedResolver, RefusedAddress, split_allow
from restms.errors import NotFound, ServiceUnavailable
from restms.media import Format
from restms.specs import PipeSpec, Update
from restms.uris import Base
from restms.webhook import (
    ATTEMPT,
    CHALLENGE,
    MESSAGE_ID,
    MODE,
    PIPE,
    SIGNATURE,
    SUBSCRIBE,
    WebhookOptions,
    backoff,
    delivery_id,
    signature,
)

log = logging.getLogger(__name__)

LOG_EVERY = 60.0  # seconds between failure reports of one pipe
IDLE_WAIT = 3600.0  # seconds an idle lane waits for news before it looks again anyway
STORE_RETRY = 1.0  # seconds before a lane reads again after the store failed a read
BATCH = 64  # messages a worker takes from its cursor at once
USER_AGENT = "restms-gateway-webhooks/1"
JSON = Format.JSON.media_type


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one request to a receiver came to: an HTTP status, or a word saying why
    there was none (``timeout``, ``connect``, ``refused``, ``error``)."""

    status: str
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.status.isdigit() and 200 <= int(self.status) < 300

    @property
    def gone(self) -> bool:
        return self.status == "410"


class Webhooks:
    """The workers of every webhook pipe, and the client session they share."""

    def __init__(self, app: web.Application) -> None:
        self.app = app
        config = app[CONFIG]
        self.guard = Guard(split_allow(config.webhook_allow))
        self.response_max = config.webhook_response_max
        self.tracer = gateway_tracing.tracer(config)  # None unless tracing is on
        self._workers: dict[str, Worker] = {}
        self._stopping: set[asyncio.Task[None]] = set()
        self._session: aiohttp.ClientSession | None = None

    @property
    def service(self) -> EngineService:
        return self.app[SERVICE]

    async def start(self) -> None:
        """Open the client session; start a worker per webhook pipe the store had."""
        resolver = GuardedResolver(self.guard, aiohttp.ThreadedResolver())
        connector = aiohttp.TCPConnector(
            limit=self.app[CONFIG].webhook_connections, resolver=resolver
        )
        self._session = aiohttp.ClientSession(
            connector=connector,
            cookie_jar=aiohttp.DummyCookieJar(),
            auto_decompress=False,
            trust_env=False,
            timeout=aiohttp.ClientTimeout(total=None),
            headers={"User-Agent": USER_AGENT, "Accept-Encoding": "identity"},
        )
        self.service.watch_webhooks(self.notify)
        for hook in await self.service.webhooks():
            self.notify(hook.pipe, hook)

    async def stop(self) -> None:
        """Stop every worker (attempts under way are cut: made again after a restart)."""
        self.service.watch_webhooks(None)
        tasks = [worker.task for worker in self._workers.values()] + list(self._stopping)
        self._workers.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._session is not None:
            await self._session.close()

    def notify(self, key: str, hook: Webhook | None) -> None:
        """The engine's news of a webhook pipe: made, changed or deleted (None)."""
        worker = self._workers.pop(key, None)
        if hook is None:
            if worker is not None:
                self._stop(worker)
            return
        if worker is not None and worker.generation == hook.generation:
            self._workers[key] = worker  # nothing it runs with has changed
            return
        if worker is not None:
            self._stop(worker)  # the new one starts once it has stopped
        self._workers[key] = Worker(self, hook, worker)

    def _stop(self, worker: Worker) -> None:
        worker.task.cancel()
        self._stopping.add(worker.task)
        worker.task.add_done_callback(self._stopping.discard)

    async def send(
        self, method: str, url: str, timeout: float, **kwargs: Any
    ) -> tuple[Outcome, bytes]:
        """One request to a receiver, never following redirects, within ``timeout``
        seconds; the answer's status and the first ``webhook_response_max`` bytes."""
        if self._session is None:
            raise RuntimeError("the webhook client session is not open")
        try:
            self.guard.check_literal(URL(url).host or "")
            async with (
                asyncio.timeout(timeout),
                self._session.request(method, url, allow_redirects=False, **kwargs) as reply,
            ):
                body, _ = await read_at_most(reply.content, self.response_max)
                return Outcome(str(reply.status)), body
        except TimeoutError:
            return Outcome("timeout", f"no answer within {timeout:g} s"), b""
        except RefusedAddress as exc:
            return Outcome("refused", str(exc)), b""
        except aiohttp.ClientConnectorError as exc:
            if isinstance(exc.os_error, RefusedAddress):
                return Outcome("refused", str(exc.os_error)), b""
            return Outcome("connect", f"cannot connect: {exc.os_error.strerror or 'failed'}"), b""
        except (aiohttp.ClientError, OSError) as exc:
            return Outcome("error", f"the exchange failed ({type(exc).__name__})"), b""


class Worker:
    """Verifies one webhook pipe's receiver, then delivers its messages."""

    def __init__(self, hooks: Webhooks, hook: Webhook, previous: Worker | None) -> None:
        self.hooks = hooks
        self.key = hook.pipe
        self.hook = hook  # as last asked: options, state
        self.generation = hook.generation
        self.label = _label(hook.pipe, hook.title)
        self.logged = -math.inf  # monotonic time of the last failure report
        self.quiet = 0  # failures since then, not reported
        self._taking = asyncio.Lock()  # lanes take from the one cursor in turn
        self._ready: deque[Message] = deque()  # taken, not yet held by a lane
        self.task = asyncio.create_task(self._run(previous), name=f"webhook {self.label}")
        self.task.add_done_callback(self._ended)

    @property
    def service(self) -> EngineService:
        return self.hooks.service

    async def _current(self) -> Webhook | None:
        """The pipe's options and state, None when this worker should not go on: the
        pipe is gone, or its options changed. While the engine cannot answer (a store
        failing over, or the app stopping, which cancels the worker) it asks again."""
        while True:
            try:
                hook = await self.service.webhook(self.key)
                break
            except NotFound:
                return None
            except ServiceUnavailable:
                await asyncio.sleep(STORE_RETRY)
        if hook.generation != self.generation:
            return None
        self.hook = hook
        return hook

    def _ended(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("webhook worker of pipe %s stopped", self.label, exc_info=task.exception())

    async def _run(self, previous: Worker | None) -> None:
        if previous is not None:  # its lanes finish (cut) before this one's start
            await asyncio.wait([previous.task])
        # Every message the pipe holds is the worker's until it is done with it: the
        # cursor starts at the oldest. Open, it pins the pipe (never collected as idle);
        # closed, an ended or failed pipe may be collected.
        cursor = self.service.cursor(None, self.key)
        try:
            await cursor.take(0)  # open it (and pin the pipe) now
            hook = await self._current()
            if hook is not None and hook.state.state == "verifying":
                await self._verify()
                hook = await self._current()
            if hook is not None and hook.delivering:
                lanes = hook.options.concurrency or 1
                if lanes == 1:
                    await self._lane(cursor)  # in order: this task is the only one
                else:
                    await asyncio.gather(*(self._lane(cursor) for _ in range(lanes)))
        except NotFound:
            return  # the pipe went meanwhile
        finally:
            await cursor.close()

    # ------------------------------------------------------------ verification
    async def _verify(self) -> None:
        options = self.hook.options
        challenge = secrets.token_urlsafe(24)
        query = {MODE: SUBSCRIBE, CHALLENGE: challenge, PIPE: self._base().resource(self.key)}
        url = URL(options.callback or "", encoded=True).extend_query(query)
        outcome, body = await self.hooks.send("GET", str(url), options.timeout or 1.0)
        ok = outcome.ok and body.strip() == challenge.encode()
        if ok:
            error = ""
        elif outcome.ok:
            error = "the answer was not the challenge"
        else:
            error = outcome.error or f"the receiver answered {outcome.status}"
        if await self._current() is not None:
            if not ok:
                self._complain(outcome.status, f"verification failed: {error}")
            with contextlib.suppress(ServiceUnavailable):  # the store logs it; kept in memory
                await self.service.webhook_verified(self.key, ok, outcome.status, error)

    # ------------------------------------------------------------ delivery
    async def _lane(self, cursor: Cursor) -> None:
        while True:
            message = await self._next(cursor)
            if message is None or not await self._deliver(message):
                await cursor.close()  # the other lanes' waits end too
                return

    async def _next(self, cursor: Cursor) -> Message | None:
        """The oldest message no lane holds, waiting for one; None: stop."""
        async with self._taking:
            ready = self._ready
            while not ready:
                hook = await self._current()
                if hook is None or not hook.delivering:
                    return None
                try:
                    ready.extend(await cursor.take(BATCH, wait=IDLE_WAIT))
                except ServiceUnavailable:  # the store failed a read (messages on disk)
                    await asyncio.sleep(STORE_RETRY)
            return ready.popleft()

    async def _deliver(self, message: Message) -> bool:
        """Attempts at one message until it is delivered, given up or gone; False when
        the worker should stop (the pipe went, or it no longer delivers)."""
        while (hook := await self._current()) is not None and hook.delivering:
            try:
                done = await self._try(message, hook)
            except ServiceUnavailable:  # the engine could not answer: ask again
                await asyncio.sleep(STORE_RETRY)
                continue
            if done:
                return True
        return False

    async def _try(self, message: Message, hook: Webhook) -> bool:
        """One step at a message: True once it is done with (delivered, given up,
        gone, or out of the pipe), False to go on with it. A delivery the engine could
        not record is made again (at least once: the receiver knows a repeat by its
        message id)."""
        service, key, seq = self.service, self.key, message.position
        made = await service.webhook_attempts(key, seq)
        if made is None:
            return True  # acknowledged by a DELETE meanwhile: forgotten
        options = hook.options
        now = time.time()
        if made.made >= (options.max_attempts or 1):
            await service.webhook_give_up(key, seq, "webhook-max-attempts")
            return True
        if max(now, made.due) - message.arrived >= (options.max_age or math.inf):
            await service.webhook_give_up(key, seq, "webhook-max-age")
            return True
        if made.due > now:
            await asyncio.sleep(made.due - now)
            return False
        attempt = made.made + 1
        outcome = await self._attempt(message, attempt, options)
        if outcome.ok:
            await service.webhook_delivered(key, seq, outcome.status)
            return True
        if outcome.gone:
            with contextlib.suppress(ServiceUnavailable):  # kept in memory
                await service.webhook_gone(key, seq, outcome.status)
            return True  # the subscription ended (asked before the next message)
        config = self.hooks.app[CONFIG]
        retry_at = time.time() + backoff(
            attempt, config.webhook_backoff_base, config.webhook_backoff_cap
        )
        try:  # the attempt count is on disk before the wait
            kept = await service.webhook_failed(
                key, seq, attempt, outcome.status, outcome.error, retry_at
            )
        except ServiceUnavailable:
            kept = True  # the store logs it; the count is kept in memory
        if not kept:
            return True  # it left the pipe, or another lane's receiver ended it meanwhile
        self._complain(outcome.status, outcome.error)
        return False

    async def _attempt(self, message: Message, attempt: int, options: WebhookOptions) -> Outcome:
        document = views.doc(views.delivered_element(self._base(), message, embed=True))
        body = restms.to_json(document)
        headers = {
            "Content-Type": JSON,
            SIGNATURE: signature(options.secret or "", int(time.time()), body),
            MESSAGE_ID: delivery_id(self.key, message.position),
            ATTEMPT: str(attempt),
        }
        url, timeout = options.callback or "", options.timeout or 1.0
        tracer = self.hooks.tracer
        if tracer is not None:
            return await self._traced(tracer, message, attempt, url, timeout, body, headers)
        outcome, _ = await self.hooks.send("POST", url, timeout, data=body, headers=headers)
        return outcome

    async def _traced(
        self,
        tracer: Tracer,
        message: Message,
        attempt: int,
        url: str,
        timeout: float,
        body: bytes,
        headers: dict[str, str],
    ) -> Outcome:
        """An attempt as a CLIENT span, child of the context the message carries; the
        POST's ``traceparent`` names the span, so the receiver continues the trace."""
        attributes: dict[str, str | int] = {
            "http.request.method": "POST",
            "server.address": URL(url).host or "",
            "restms.webhook.attempt": attempt,
        }
        with tracer.start_as_current_span(
            "webhook POST",
            context=tracing.carried(message.spec.headers),
            kind=SpanKind.CLIENT,
            attributes=attributes,
        ) as span:
            tracing.W3C.inject(headers)  # the current context: this span
            outcome, _ = await self.hooks.send("POST", url, timeout, data=body, headers=headers)
            span.set_attribute("restms.webhook.outcome", outcome.status)
            if not outcome.ok:
                span.set_status(StatusCode.ERROR, outcome.error or outcome.status)
            return outcome

    # ------------------------------------------------------------ helpers
    def _base(self) -> Base:
        """URIs under ``public_url``, else as the pipe's creator saw them (U4)."""
        public = self.hooks.app[CONFIG].hosts.public_base
        if public is not None:
            return public
        scheme, _, host = (self.hook.options.origin or "http://localhost").partition("://")
        return Base(scheme, host)

    def _complain(self, status: str, error: str) -> None:
        """Log a receiver's failure, at most once every LOG_EVERY seconds per pipe."""
        now = time.monotonic()
        if now - self.logged < LOG_EVERY:
            self.quiet += 1
            return
        host = URL(self.hook.options.callback or "", encoded=True).host
        log.warning(
            "webhook pipe %s: callback host %s: %s %s (%d more failures since the last report)",
            self.label,
            host,
            status,
            error,
            self.quiet,
        )
        self.logged, self.quiet = now, 0


# ---------------------------------------------------------------- the app's side
HOOKS = web.AppKey("webhooks", Webhooks)


async def webhooks_context(app: web.Application) -> AsyncIterator[None]:
    """Start the workers once the store is restored; stop them before it closes."""
    hooks = app[HOOKS]
    await hooks.start()
    yield
    await hooks.stop()


async def admit(request: web.Request, spec: PipeSpec) -> PipeSpec:
    """A webhook pipe about to be created: its callback past the SSRF guard (400), and
    the origin its URIs are shown with."""
    hook = spec.options.webhook
    if hook is None:
        return spec
    await request.app[HOOKS].guard.admit(hook.callback or "")
    hook = dataclasses.replace(hook, origin=http.origin(request))
    return dataclasses.replace(spec, options=dataclasses.replace(spec.options, webhook=hook))


async def admit_update(request: web.Request, webhook: bool, update: Update) -> None:
    """A PUT that sets a webhook pipe's callback: past the SSRF guard first (400)."""
    change = update.webhook
    if change is not None and change.callback and webhook:
        await request.app[HOOKS].guard.admit(change.callback)


def new_secret(spec: PipeSpec, secret: str | None) -> str | None:
    """The secret the gateway made for a pipe just created without one (shown once):
    ``secret`` is the new pipe's."""
    given = spec.options.webhook
    if given is None or given.secret is not None:
        return None
    return secret


def _label(key: str, title: str | None) -> str:
    """How logs name a pipe: its title and a digest of its name, never the name
    itself, which is the pipe's capability (as the engine's replies name it)."""
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    return f"{title!r} (sha256 {digest})" if title else f"sha256 {digest}"
