"""Webhook pipes: the gateway reads them itself and POSTs each message to a callback.

Theory of operation
-------------------
A webhook pipe (our extension, docs/WEBHOOKS.md) is another reader of the same pipe
cursor as asynclets, SSE and streams: messages are routed into it like into any pipe,
and this module takes them out. One :class:`Worker` (an asyncio task) runs per
webhook pipe. The :class:`Webhooks` registry starts the workers of pipes restored from
the store when the app starts, and the engine tells it (``engine.on_hook``) when a
webhook pipe is created (start one), changed by a PUT (start a new one once the old
has stopped) or deleted (stop it); the app's cleanup context stops them all. A running
worker pins its pipe, so it is never collected as idle.

* **Verification** (state ``verifying``): before anything is delivered, the worker
  GETs the callback with ``restms.mode=subscribe``, ``restms.challenge=<random>`` and
  ``restms.pipe=<pipe URI>`` added to its query. A 2xx answer whose body is the
  challenge verifies the pipe; anything else fails it, and nothing is delivered.
* **Delivery** (``active``, ``retrying``): ``concurrency`` lanes, each of which takes
  the oldest message of the pipe that no other lane holds and delivers it until it is
  done. With one lane (the default) messages go strictly in order, one at a time;
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
* **State** lives in the engine (:mod:`feeds.webhook`) and in the store. After a
  failed attempt the worker waits for the commit before it waits for the next
  attempt, so a restart carries on with the attempt numbers and times recorded.

All workers share one client session: at most ``webhook_connections`` connections,
the SSRF guard's resolver (:mod:`gateway.webhook_guard`), no cookies, no redirects, no
proxies from the environment, no decompression, and at most ``webhook_response_max``
bytes of any answer read. Failures are logged at most once a minute per pipe, naming
the pipe by a digest of its name and the callback by its host only; the secret is
never logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web
from yarl import URL

import restms
from feeds.delivery import label
from feeds.engine import Engine
from feeds.model import Message, Pipe
from feeds.webhook import Hook
from restms.errors import ServiceUnavailable
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

from . import durability, spill, views
from .keys import CONFIG, ENGINE
from .webhook_guard import Guard, GuardedResolver, RefusedAddress, split_allow

log = logging.getLogger(__name__)

LOG_EVERY = 60.0  # seconds between failure reports of one pipe
IDLE_WAIT = 3600.0  # seconds an idle lane waits for news before it looks again anyway
STORE_RETRY = 1.0  # seconds before a lane reads again after the store failed a read
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
        self._workers: dict[str, Worker] = {}
        self._stopping: set[asyncio.Task[None]] = set()
        self._session: aiohttp.ClientSession | None = None

    @property
    def engine(self) -> Engine:
        return self.app[ENGINE]

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
        self.engine.on_hook = self.notify
        for pipe in list(self.engine.hooks.values()):
            self.notify(pipe)

    async def stop(self) -> None:
        """Stop every worker (attempts under way are cut: made again after a restart)."""
        self.engine.on_hook = None
        tasks = [worker.task for worker in self._workers.values()] + list(self._stopping)
        self._workers.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._session is not None:
            await self._session.close()

    def notify(self, pipe: Pipe) -> None:
        """The engine's news of a webhook pipe: made, changed or deleted."""
        worker = self._workers.pop(pipe.key, None)
        if pipe.deleted or pipe.hook is None:
            if worker is not None:
                self._stop(worker)
            return
        if worker is not None and worker.generation == pipe.hook.generation:
            self._workers[pipe.key] = worker  # nothing it runs with has changed
            return
        if worker is not None:
            self._stop(worker)  # the new one starts once it has stopped
        self._workers[pipe.key] = Worker(self, pipe, pipe.hook, worker)

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
                return Outcome(str(reply.status)), await self._read(reply)
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

    async def _read(self, reply: aiohttp.ClientResponse) -> bytes:
        """At most ``webhook_response_max`` bytes; the connection is dropped past them."""
        chunks: list[bytes] = []
        left = self.response_max
        while left > 0:
            chunk = await reply.content.read(left)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
            left -= len(chunk)
        if not reply.content.at_eof():
            reply.close()
        return b"".join(chunks)


class Worker:
    """Verifies one webhook pipe's receiver, then delivers its messages."""

    def __init__(self, hooks: Webhooks, pipe: Pipe, hook: Hook, previous: Worker | None) -> None:
        self.hooks = hooks
        self.pipe = pipe
        self.hook = hook
        self.generation = hook.generation
        self.claimed: set[int] = set()  # positions a lane is delivering
        self.logged = -math.inf  # monotonic time of the last failure report
        self.quiet = 0  # failures since then, not reported
        self.task = asyncio.create_task(self._run(previous), name=f"webhook {label(pipe)}")
        self.task.add_done_callback(self._ended)

    @property
    def engine(self) -> Engine:
        return self.hooks.engine

    def _current(self) -> bool:
        """Whether this worker should go on: the pipe, its options and the app live."""
        return (
            not self.pipe.deleted
            and not self.engine.closing
            and self.hook.generation == self.generation
        )

    def _ended(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error(
                "webhook worker of pipe %s stopped", label(self.pipe), exc_info=task.exception()
            )

    async def _run(self, previous: Worker | None) -> None:
        if previous is not None:  # its lanes finish (cut) before this one's start
            await asyncio.wait([previous.task])
        self.engine.pin(self.pipe, True)
        try:
            if self.hook.state == "verifying" and self._current():
                await self._verify()
            if self.hook.delivering and self._current():
                lanes = self.hook.options.concurrency or 1
                if lanes == 1:
                    await self._lane()  # in order: this task is the only one
                else:
                    await asyncio.gather(*(self._lane() for _ in range(lanes)))
        finally:
            if not self.pipe.deleted:
                self.engine.pin(self.pipe, False)  # an ended or failed pipe may be collected

    # ------------------------------------------------------------ verification
    async def _verify(self) -> None:
        options = self.hook.options
        challenge = secrets.token_urlsafe(24)
        query = {MODE: SUBSCRIBE, CHALLENGE: challenge, PIPE: self._base().resource(self.pipe.key)}
        url = URL(options.callback or "", encoded=True).extend_query(query)
        outcome, body = await self.hooks.send("GET", str(url), options.timeout or 1.0)
        ok = outcome.ok and body.strip() == challenge.encode()
        if ok:
            error = ""
        elif outcome.ok:
            error = "the answer was not the challenge"
        else:
            error = outcome.error or f"the receiver answered {outcome.status}"
        if self._current():
            self.engine.hook_verified(self.pipe, ok, outcome.status, error)
            if not ok:
                self._complain(outcome.status, f"verification failed: {error}")
            await self._commit()

    # ------------------------------------------------------------ delivery
    async def _lane(self) -> None:
        while True:
            message = await self._next()
            if message is None:
                return
            self.claimed.add(message.seq)
            try:
                await self._deliver(message)
            finally:
                self.claimed.discard(message.seq)

    async def _next(self) -> Message | None:
        """The oldest message no lane holds, waiting for one; None: stop."""
        pipe = self.pipe
        while self._current() and self.hook.delivering:
            try:
                await spill.ensure(self.hooks.app, pipe)  # messages waiting on disk
            except ServiceUnavailable:
                await asyncio.sleep(STORE_RETRY)
                continue
            seen = pipe.version
            for message in self.engine.stream(pipe, 0):
                if message.seq not in self.claimed:
                    return message
            await pipe.changed(IDLE_WAIT, seen)
        return None

    async def _deliver(self, message: Message) -> None:
        """Attempts at one message until it is delivered, given up or gone."""
        pipe, hook, seq = self.pipe, self.hook, message.seq
        while self._current() and hook.delivering:
            if pipe.messages.get(seq) is not message:
                self.engine.hook_forget(pipe, seq)  # acknowledged by a DELETE meanwhile
                return
            options = hook.options
            made = hook.attempts.get(seq, 0)
            due = hook.due.get(seq, 0.0)
            now = time.time()
            if made >= (options.max_attempts or 1):
                self.engine.hook_give_up(pipe, message, "webhook-max-attempts")
                return
            if max(now, due) - message.arrived >= (options.max_age or math.inf):
                self.engine.hook_give_up(pipe, message, "webhook-max-age")
                return
            if due > now:
                await asyncio.sleep(due - now)
                continue
            attempt = made + 1
            outcome = await self._attempt(message, attempt, options)
            if self.engine.mirror is not None:
                self.engine.mirrored("webhook_attempt", pipe, message, outcome.status)
            if pipe.deleted:
                return
            if pipe.messages.get(seq) is not message:
                continue  # forgotten above
            if outcome.ok:
                self.engine.hook_delivered(pipe, message, outcome.status)
                return
            if not hook.delivering:
                return  # another lane's receiver ended the subscription meanwhile
            if outcome.gone:
                self.engine.hook_gone(pipe, message, outcome.status)
                await self._commit()
                return
            limits = self.engine.config.webhooks
            retry_at = time.time() + backoff(attempt, limits.backoff_base, limits.backoff_cap)
            self.engine.hook_failed(pipe, message, attempt, outcome.status, outcome.error, retry_at)
            self._complain(outcome.status, outcome.error)
            await self._commit()  # the attempt count is on disk before the wait

    async def _attempt(self, message: Message, attempt: int, options: WebhookOptions) -> Outcome:
        document = views.doc(views.message_element(self._base(), self.pipe, message, embed=True))
        body = restms.to_json(document)
        headers = {
            "Content-Type": JSON,
            SIGNATURE: signature(options.secret or "", int(time.time()), body),
            MESSAGE_ID: delivery_id(self.pipe.key, message.seq),
            ATTEMPT: str(attempt),
        }
        url = options.callback or ""
        outcome, _ = await self.hooks.send(
            "POST", url, options.timeout or 1.0, data=body, headers=headers
        )
        return outcome

    # ------------------------------------------------------------ helpers
    def _base(self) -> Base:
        """URIs as the pipe's creator saw them (U4)."""
        scheme, _, host = (self.hook.options.origin or "http://localhost").partition("://")
        return Base(scheme, host)

    async def _commit(self) -> None:
        with contextlib.suppress(ServiceUnavailable):  # the store logs it; state is in memory
            await durability.commit(self.hooks.app)

    def _complain(self, status: str, error: str) -> None:
        """Log a receiver's failure, at most once every LOG_EVERY seconds per pipe."""
        now = time.monotonic()
        if now - self.logged < LOG_EVERY:
            self.quiet += 1
            return
        host = URL(self.hook.options.callback or "", encoded=True).host
        log.warning(
            "webhook pipe %s: callback host %s: %s %s (%d more failures since the last report)",
            label(self.pipe),
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
    hook = dataclasses.replace(hook, origin=f"{request.scheme}://{request.host}")
    return dataclasses.replace(spec, options=dataclasses.replace(spec.options, webhook=hook))


async def admit_update(request: web.Request, pipe: Pipe, update: Update) -> None:
    """A PUT that sets a webhook pipe's callback: past the SSRF guard first (400)."""
    change = update.webhook
    if change is not None and change.callback and pipe.hook is not None:
        await request.app[HOOKS].guard.admit(change.callback)


def new_secret(spec: PipeSpec, pipe: Pipe) -> str | None:
    """The secret the gateway made for a pipe just created without one (shown once)."""
    given = spec.options.webhook
    if pipe.hook is None or given is None or given.secret is not None:
        return None
    return pipe.hook.options.secret
