"""Catalogue records and stream entries as the frozen values of :mod:`feeds.service`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from restms.specs import EmbeddedContent, MessageSpec, PipeOptions
from restms.webhook import WebhookOptions

from ..config import EngineConfig
from ..model import Blob as HeldBlob
from ..model import message_size
from ..service import (
    Blob,
    DomainInfo,
    FeedInfo,
    JoinInfo,
    Message,
    Part,
    PipeInfo,
    StagedInfo,
    Webhook,
)
from ..store import decode_parts, loads, message_spec, record, stamp_of
from ..webhook import Hook
from .catalogue import DomainRec, FeedRec, JoinRec, PipeRec, StagedRec


def domain_info(domain: DomainRec, feeds: list[str]) -> DomainInfo:
    return DomainInfo(
        name=domain.name,
        title=domain.title,
        feeds=tuple(feeds),
        version=domain.version,
        modified=domain.modified,
    )


def feed_info(feed: FeedRec, default: bool, system: bool) -> FeedInfo:
    return FeedInfo(
        key=feed.key,
        name=feed.name,
        type=feed.type,
        title=feed.title,
        license=feed.license,
        domain=feed.domain,
        owner=feed.owner,
        configured=feed.configured,
        default=default,
        system=system,
        joins=len(feed.joins),
        queued=0,
        version=feed.version,
        modified=feed.modified,
    )


def join_info(join: JoinRec, pipe: PipeRec, feed_public: bool) -> JoinInfo:
    return JoinInfo(
        key=join.key,
        pipe=join.pipe,
        domain=pipe.domain,
        feed=join.feed,
        feed_public=feed_public,
        type=join.type,
        address=join.address,
        headers=join.headers,
        is_default=join.is_default,
        version=join.version,
        modified=join.modified,
    )


class Settings:
    """A pipe's options with the configuration's defaults filled in."""

    __slots__ = (
        "dead_letter",
        "durable",
        "lease",
        "max_bytes",
        "max_deliveries",
        "max_messages",
        "overflow",
        "webhook",
    )

    def __init__(self, given: dict[str, Any], config: EngineConfig) -> None:
        options = PipeOptions.stored(given)
        self.durable = bool(options.durable)
        self.lease = config.lease if options.lease is None else options.lease
        self.max_deliveries = options.max_deliveries or config.max_deliveries
        self.dead_letter = options.dead_letter
        self.max_messages = options.max_messages or config.max_pipe_messages
        self.max_bytes = options.max_bytes or config.max_pipe_bytes
        self.overflow = options.overflow or config.overflow
        hook = options.webhook
        self.webhook: WebhookOptions | None = (
            None if hook is None else config.webhooks.fill(hook, clamp=True)
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Figures:
    """What a pipe's stream and state hash say of its messages now."""

    held: int
    oldest: int | None
    asynclet: int
    version: int
    acked: int  # the highest position acknowledged
    lost: int  # the highest position gone unacknowledged (a gap for a resuming reader)


def pipe_info(
    pipe: PipeRec,
    settings: Settings,
    joins: tuple[JoinInfo, ...],
    figures: Figures,
    dead_letter_feed: str,
    hook: Hook | None,
) -> PipeInfo:
    options = tuple(
        (name, str(value)) for name, value in sorted(pipe.options.items()) if name != "webhook"
    )
    if settings.dead_letter is None:
        dead_letter = f"/restms/feed/{dead_letter_feed}" if dead_letter_feed else ""
    else:
        dead_letter = settings.dead_letter
    return PipeInfo(
        key=pipe.key,
        type=pipe.type,
        title=pipe.title,
        domain=pipe.domain,
        owner=pipe.owner,
        joins=joins,
        held=figures.held,
        oldest=figures.oldest,
        asynclet=figures.asynclet,
        acked=figures.acked,
        lost=figures.lost,
        durable=settings.durable,
        lease=settings.lease,
        max_deliveries=settings.max_deliveries,
        overflow=settings.overflow,
        max_messages=settings.max_messages,
        max_bytes=settings.max_bytes,
        options=options,
        dead_letter=dead_letter,
        webhook=None if hook is None else webhook(pipe, hook),
        progress=None if hook is None else hook.progress_value(),
        version=pipe.version + figures.version,
        modified=pipe.modified,
    )


def webhook(pipe: PipeRec, hook: Hook) -> Webhook:
    return Webhook(
        pipe=pipe.key,
        title=pipe.title,
        options=hook.options,
        generation=hook.generation,
        state=hook.state_value(),
    )


def staged_info(staged: StagedRec, feed_public: bool, domain: str) -> StagedInfo:
    return StagedInfo(
        key=staged.key,
        feed=staged.feed,
        feed_public=feed_public,
        domain=domain,
        content_type=staged.content_type,
        size=staged.size,
        owner=staged.owner,
        modified=staged.modified,
    )


# ---------------------------------------------------------------- messages
def encode_message(
    spec: MessageSpec,
    parts: tuple[EmbeddedContent | HeldBlob, ...],
    feed: str | None,
    now: float,
    stamp: str,
) -> tuple[bytes, int]:
    """A message as its stream entry holds it (the store's record format), and its size.
    One record is made for each published message, and each pipe's copy is that record:
    every copy carries the one origin ``stamp``."""
    return record(spec, parts, feed, now, None, stamp=stamp), message_size(spec, parts)


def decode_message(
    pipe: str, position: int, data: bytes, size: int, redeliveries: int, deleted: bytes
) -> Message:
    """An entry as a reader gets it. An entry written before stamps gets one derived
    from its pipe and position (:func:`feeds.store.stamp_of`)."""
    fields = loads(data)
    parts: list[Part] = []
    for part in decode_parts(fields[6]):
        parts.append(
            Blob(data=part.data, content_type=part.content_type)
            if isinstance(part, HeldBlob)
            else part
        )
    if deleted:
        for index in deleted.split(b","):
            parts[int(index)] = None
    return Message(
        pipe=pipe,
        position=position,
        spec=message_spec(fields),
        parts=tuple(parts),
        feed=fields[3],
        arrived=fields[4],
        redeliveries=redeliveries,
        size=size,
        version=1 + sum(part is None for part in parts),
        stamp=stamp_of(fields, pipe, position),
    )


def reheaded(
    data: bytes, headers: tuple[tuple[str, str], ...], feed: str | None
) -> tuple[MessageSpec, tuple[Any, ...]]:
    """A stored message's spec with ``headers`` in front of its own, and its parts: a
    dead letter's copy."""
    fields = loads(data)
    spec = message_spec(fields)
    spec = MessageSpec(address=spec.address, props=spec.props, headers=headers + spec.headers)
    return spec, decode_parts(fields[6])


def first_position(reply: list[Any]) -> int:
    """The position of the first message a ``range`` reply holds (0: none)."""
    return int(reply[4]) if len(reply) > 4 else 0
