"""What a webhook pipe's delivery worker asks of an engine (docs/WEBHOOKS.md): the pipes
and news of them, the state machine of each subscription as the outcomes of attempts
move it, and the attempts at each message, kept across a restart."""

from __future__ import annotations

import time

import pytest

from feeds.service import EngineService, PipeInfo, Webhook, WebhookAttempts, WebhookState
from restms.errors import NotFound, ServiceUnavailable
from restms.specs import Update
from restms.webhook import WebhookOptions

from .conftest import MakeEngine
from .helpers import ME, join, msg, new_feed, new_pipe, publish, texts

HOOK = WebhookOptions(callback="http://127.0.0.1:9/hook", secret="s" * 32)


async def _hooked(engine: EngineService, **options: object) -> tuple[PipeInfo, int]:
    """A webhook pipe joined to a feed, holding one persistent message: its position."""
    feed = await new_feed(engine, "news", "fanout")
    pipe = await new_pipe(engine, "webhook", webhook=HOOK, **options)
    await join(engine, pipe, feed)
    await publish(engine, feed, msg("one", persistent=True))
    (first,) = await engine.cursor(None, pipe.key).take(1)
    return pipe, first.position


async def test_webhook_pipes_are_listed_and_their_news_told(engine: EngineService) -> None:
    news: list[tuple[str, Webhook | None]] = []
    engine.watch_webhooks(lambda key, hook: news.append((key, hook)))
    plain = await new_pipe(engine)
    pipe = await new_pipe(engine, "webhook", webhook=HOOK, title="orders")
    (told,) = await engine.webhooks()
    assert told == await engine.webhook(pipe.key)
    assert (told.pipe, told.title, told.generation, told.delivering) == (
        pipe.key,
        "orders",
        0,
        False,
    )
    assert told.options.callback == HOOK.callback
    assert told.options.max_attempts == 10  # the default filled in
    assert told.state == WebhookState(state="verifying", delivered=0, failures=0, dead_lettered=0)
    assert news == [(pipe.key, told)]
    other = WebhookOptions(callback="http://127.0.0.1:9/other")
    await engine.update_pipe(ME, pipe.key, Update(title="orders", webhook=other))
    changed = await engine.webhook(pipe.key)
    assert (changed.generation, changed.options.callback) == (1, other.callback)
    assert news[-1] == (pipe.key, changed)
    await engine.delete_pipe(ME, pipe.key)
    assert news[-1] == (pipe.key, None)
    engine.watch_webhooks(None)
    await new_pipe(engine, "webhook", webhook=HOOK)
    assert len(news) == 3  # no longer told
    for key in (pipe.key, plain.key):
        with pytest.raises(NotFound):
            await engine.webhook(key)


async def test_verification_starts_or_refuses_delivery(engine: EngineService) -> None:
    good = await new_pipe(engine, "webhook", webhook=HOOK)
    bad = await new_pipe(engine, "webhook", webhook=HOOK)
    await engine.webhook_verified(good.key, True, "200", "")
    await engine.webhook_verified(bad.key, False, "404", "the receiver answered 404")
    assert (await engine.webhook(good.key)).state.state == "active"
    assert (await engine.webhook(good.key)).delivering
    assert (await engine.webhook(bad.key)).state.state == "failed"


async def test_a_failed_attempt_is_committed_before_it_returns(restart: MakeEngine) -> None:
    engine = await restart()
    pipe, position = await _hooked(engine)
    await engine.webhook_verified(pipe.key, True, "200", "")
    assert await engine.webhook_attempts(pipe.key, position) == WebhookAttempts(made=0, due=0.0)
    retry_at = time.time() + 60
    assert await engine.webhook_failed(pipe.key, position, 1, "500", "boom", retry_at)
    engine = await restart(crash=True)  # nothing the engine had not committed is kept
    assert await engine.webhook_attempts(pipe.key, position) == WebhookAttempts(
        made=1, due=retry_at
    )
    assert (await engine.webhook(pipe.key)).state == WebhookState(
        state="retrying", delivered=0, failures=1, dead_lettered=0
    )


async def test_a_delivered_message_leaves_the_pipe_and_settles_it(
    engine: EngineService,
) -> None:
    pipe, position = await _hooked(engine)
    await engine.webhook_verified(pipe.key, True, "200", "")
    assert await engine.webhook_failed(pipe.key, position, 1, "503", "busy", time.time())
    assert await engine.webhook_delivered(pipe.key, position, "204")
    assert await texts(engine, pipe) == []
    assert (await engine.webhook(pipe.key)).state == WebhookState(
        state="active", delivered=1, failures=1, dead_lettered=0
    )
    assert await engine.webhook_attempts(pipe.key, position) is None


async def test_a_message_given_up_goes_to_the_dead_letter_feed(engine: EngineService) -> None:
    dead = await new_feed(engine, "dead", "fanout")
    pipe, position = await _hooked(engine, dead_letter="/restms/feed/dead")
    reader = await new_pipe(engine)
    await join(engine, reader, dead)
    await engine.webhook_verified(pipe.key, True, "200", "")
    await engine.webhook_give_up(pipe.key, position, "webhook-max-attempts")
    assert await texts(engine, pipe) == []
    assert await texts(engine, reader) == ["one"]
    (copy,) = (await engine.listing(ME, reader.key)).messages
    assert ("x-death-reason", "webhook-max-attempts") in copy.spec.headers
    assert (await engine.webhook(pipe.key)).state.dead_lettered == 1


async def test_gone_ends_the_subscription_and_keeps_the_messages(engine: EngineService) -> None:
    pipe, position = await _hooked(engine)
    await engine.webhook_verified(pipe.key, True, "200", "")
    assert await engine.webhook_gone(pipe.key, position, "410")
    hook = await engine.webhook(pipe.key)
    assert (hook.state.state, hook.delivering) == ("ended", False)
    assert await texts(engine, pipe) == ["one"]
    # Another lane's outcome once it ended records nothing.
    assert not await engine.webhook_failed(pipe.key, position, 1, "500", "", time.time())
    assert not await engine.webhook_gone(pipe.key, position, "410")
    assert (await engine.webhook(pipe.key)).state.failures == 0


async def test_an_outcome_for_a_message_acknowledged_meanwhile_only_forgets_it(
    engine: EngineService,
) -> None:
    pipe, position = await _hooked(engine)
    await engine.webhook_verified(pipe.key, True, "200", "")
    assert await engine.webhook_failed(pipe.key, position, 1, "500", "", time.time() + 60)
    await engine.ack(ME, pipe.key, position)  # a DELETE by the pipe's owner
    assert not await engine.webhook_delivered(pipe.key, position, "200")
    assert await engine.webhook_attempts(pipe.key, position) is None
    hook = await engine.webhook(pipe.key)
    assert (hook.state.state, hook.state.delivered) == ("active", 0)  # settled, not counted


async def test_no_attempt_is_begun_once_the_engine_closes(make_engine: MakeEngine) -> None:
    engine = await make_engine()
    pipe = await new_pipe(engine, "webhook", webhook=HOOK)
    await engine.close()
    with pytest.raises(ServiceUnavailable):
        await engine.webhook(pipe.key)  # a worker asks before each attempt


async def test_stats_count_the_webhook_pipes(engine: EngineService) -> None:
    assert (await engine.stats()).census.webhook_pipes == 0
    first = await new_pipe(engine, "webhook", webhook=HOOK)
    await new_pipe(engine, "webhook", webhook=HOOK)
    await new_pipe(engine)
    assert (await engine.stats()).census.webhook_pipes == 2
    await engine.delete_pipe(ME, first.key)
    assert (await engine.stats()).census.webhook_pipes == 1
