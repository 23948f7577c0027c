"""The embedded engine's live objects as the frozen values of :mod:`feeds.service`.

Each function takes a snapshot: the value never changes afterwards, and holds no
reference to the object it was made from (contents are shared bytes, immutable).
"""

from __future__ import annotations

from restms.specs import EmbeddedContent

from ..model import Blob as HeldBlob
from ..model import Feed, Join, Pipe, StagedContent
from ..model import Message as Held
from ..service import (
    Blob,
    FeedInfo,
    JoinInfo,
    Message,
    Part,
    PipeInfo,
    PipeState,
    StagedInfo,
    Webhook,
)


def feed_info(feed: Feed, default: bool = False, system: bool = False) -> FeedInfo:
    """``default``, ``system``: whether it is the engine's default or system feed."""
    return FeedInfo(
        key=feed.key,
        name=feed.name,
        type=feed.type,
        title=feed.title,
        license=feed.license,
        domain=feed.domain.name,
        owner=feed.owner,
        configured=feed.configured,
        default=default,
        system=system,
        joins=len(feed.joins),
        queued=len(feed.queue) + feed.qspilled,
        version=feed.version,
        modified=feed.modified,
    )


def join_info(join: Join) -> JoinInfo:
    spec = join.spec
    return JoinInfo(
        key=join.key,
        pipe=join.pipe.key,
        domain=join.pipe.domain.name,
        feed=join.feed.key,
        feed_public=join.feed.public,
        type=spec.type,
        address=spec.address,
        headers=spec.headers,
        is_default=join.is_default,
        version=join.version,
        modified=join.modified,
    )


def pipe_info(pipe: Pipe, dead_letter_feed: str) -> PipeInfo:
    """``dead_letter_feed``: the configured one, where a pipe that names none sends."""
    hidden = pipe.hidden  # positions held back for a commit are not shown (feeds.settling)
    shown = [seq for seq in pipe.messages if not hidden or seq < hidden]
    options = tuple(
        (name, str(value)) for name, value in sorted(pipe.options.items()) if name != "webhook"
    )
    return PipeInfo(
        key=pipe.key,
        type=pipe.type,
        title=pipe.title,
        domain=pipe.domain.name,
        owner=pipe.owner,
        joins=tuple(join_info(join) for join in pipe.joins.values()),
        held=len(shown) + pipe.spilled,
        oldest=shown[0] if shown else (pipe.spill_lo if pipe.spilled else None),
        asynclet=pipe.asynclet,
        acked=pipe.acked,
        lost=pipe.lost,
        durable=pipe.durable,
        lease=pipe.lease,
        max_deliveries=pipe.max_deliveries,
        overflow=pipe.overflow,
        max_messages=pipe.max_messages,
        max_bytes=pipe.max_bytes,
        options=options,
        dead_letter=_dead_letter(pipe, dead_letter_feed),
        webhook=None if pipe.hook is None else webhook(pipe),
        progress=None if pipe.hook is None else pipe.hook.progress_value(),
        version=pipe.version,
        modified=pipe.modified,
    )


def _dead_letter(pipe: Pipe, configured: str) -> str:
    if pipe.dead_letter is None:
        return f"/restms/feed/{configured}" if configured else ""
    return pipe.dead_letter


def staged_info(staged: StagedContent) -> StagedInfo:
    return StagedInfo(
        key=staged.key,
        feed=staged.feed.key,
        feed_public=staged.feed.public,
        domain=staged.feed.domain.name,
        content_type=staged.blob.content_type,
        size=len(staged.blob.data),
        owner=staged.owner,
        modified=staged.modified,
    )


def message(pipe: Pipe, held: Held) -> Message:
    return Message(
        pipe=pipe.key,
        position=held.seq,
        spec=held.spec,
        parts=tuple(map(_part, held.parts)),
        feed=held.feed_name,
        arrived=held.arrived,
        redeliveries=held.redeliveries,
        size=held.size,
        version=held.version,
        stamp=held.stamp,
    )


# A cursor turns every message it yields into a value, so its batches are made without
# the dataclass's __init__, whose frozen-field assignments are most of that cost (a
# bridge pays it per message: docs/BENCHMARKS.md, benchmark 10). The fields are those
# :func:`message` sets (tests/unit/test_embedded_values.py proves they agree).
_NEW = object.__new__
_FIELDS = (
    "pipe",
    "position",
    "spec",
    "parts",
    "feed",
    "arrived",
    "redeliveries",
    "size",
    "version",
    "stamp",
)
_SET = tuple(Message.__dict__[name].__set__ for name in _FIELDS)


def messages(pipe: Pipe, held: list[Held]) -> list[Message]:
    """:func:`message` of each, for a cursor's batch."""
    key = pipe.key
    s_pipe, s_pos, s_spec, s_parts, s_feed, s_arrived, s_red, s_size, s_ver, s_stamp = _SET
    made: list[Message] = []
    for one in held:
        value = _NEW(Message)
        s_pipe(value, key)
        s_pos(value, one.seq)
        s_spec(value, one.spec)
        s_parts(value, tuple(map(_part, one.parts)))
        s_feed(value, one.feed_name)
        s_arrived(value, one.arrived)
        s_red(value, one.redeliveries)
        s_size(value, one.size)
        s_ver(value, one.version)
        s_stamp(value, one.stamp)
        made.append(value)
    return made


def _part(part: HeldBlob | EmbeddedContent | None) -> Part:
    if isinstance(part, HeldBlob):
        return Blob(data=part.data, content_type=part.content_type)
    return part  # an EmbeddedContent is a frozen value already


# admin
def pipe_state(pipe: Pipe, dead_letter_feed: str) -> PipeState:
    return PipeState(
        info=pipe_info(pipe, dead_letter_feed),
        on_disk=pipe.spilled,
        bytes=pipe.bytes + pipe.spilled_bytes,
        waiting=pipe.waiting,
        pinned=pipe.pinned,
        webhook=None if pipe.hook is None else pipe.hook.state_value(),
    )


# webhooks
def webhook(pipe: Pipe) -> Webhook:
    hook = pipe.hook
    if hook is None:
        raise TypeError("not a webhook pipe")
    return Webhook(
        pipe=pipe.key,
        title=pipe.title,
        options=hook.options,
        generation=hook.generation,
        state=hook.state_value(),
    )
