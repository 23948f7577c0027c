"""Small steps the conformance tests share, written against the service alone."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from feeds.service import EngineService, FeedInfo, JoinInfo, Message, PipeInfo
from restms.specs import EmbeddedContent, FeedSpec, JoinSpec, MessageSpec, PipeOptions, PipeSpec

ME = "alice"
OTHER = "bob"
DOMAIN = "default"


async def new_feed(
    engine: EngineService, name: str | None = None, kind: str = "", owner: str = ME
) -> FeedInfo:
    feed, created = await engine.create_feed(owner, DOMAIN, FeedSpec(name=name, type=kind))
    assert created
    return feed


def path(feed: FeedInfo) -> str:
    """How a join names its feed (U5: the path of its URI)."""
    return f"/restms/feed/{feed.key}" if feed.name is not None else f"/restms/resource/{feed.key}"


async def new_pipe(
    engine: EngineService,
    kind: str = "",
    owner: str = ME,
    title: str | None = None,
    **options: object,
) -> PipeInfo:
    spec = PipeSpec(type=kind, title=title, options=PipeOptions(**options))  # type: ignore[arg-type]
    return await engine.create_pipe(owner, DOMAIN, spec)


async def join(
    engine: EngineService,
    pipe: PipeInfo,
    feed: FeedInfo,
    address: str = "",
    headers: tuple[tuple[str, str], ...] = (),
    owner: str = ME,
) -> JoinInfo:
    spec = JoinSpec(feed_path=path(feed), address=address, headers=headers)
    made, created = await engine.create_join(owner, pipe.key, spec)
    assert created
    return made


def msg(
    text: str = "",
    address: str = "",
    *,
    mid: str | None = None,
    persistent: bool = False,
    expiration: int | None = None,
    headers: tuple[tuple[str, str], ...] = (),
) -> MessageSpec:
    props: list[tuple[str, str]] = []
    if mid is not None:
        props.append(("message_id", mid))
    if persistent:
        props.append(("delivery_mode", "2"))
    if expiration is not None:
        props.append(("expiration", str(expiration)))
    return MessageSpec(
        address=address,
        props=tuple(props),
        headers=headers,
        contents=(EmbeddedContent(value=text),),
    )


def text(message: Message) -> str:
    part = message.parts[0]
    assert isinstance(part, EmbeddedContent)
    return part.value


async def texts(engine: EngineService, pipe: PipeInfo, owner: str = ME) -> list[str]:
    """The text of every message the pipe lists, oldest first."""
    listing = await engine.listing(owner, pipe.key)
    return [text(message) for message in listing.messages]


async def positions(engine: EngineService, pipe: PipeInfo) -> list[int]:
    return [m.position for m in (await engine.listing(ME, pipe.key)).messages]


async def publish(engine: EngineService, feed: FeedInfo, *messages: MessageSpec) -> list[int]:
    result = await engine.publish(ME, feed.key, messages)
    return list(result.counts)


async def eventually(check: Callable[[], Awaitable[bool]], timeout: float = 5.0) -> None:
    """Wait until ``check`` holds (bounded: fails after ``timeout`` seconds)."""
    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline, "the condition never held"
        await asyncio.sleep(0.01)
