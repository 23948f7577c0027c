"""Every free-text attribute of every document kind is bounded (restms.specs.MAX_TEXT):
titles, licenses, join header names and values, message properties, content types,
whether a client sends them or the configuration declares them.

Each case is accepted at the bound and refused one character past it, with a 400
naming the element and the attribute.
"""

from __future__ import annotations

from collections.abc import Callable

import orjson
import pytest

from feeds import EngineConfig
from feeds.config import FeedConfig
from feeds.engine import Engine
from feeds.model import Pipe
from feeds.store import Snapshot
from restms import BadRequest, Document, Format, fastpath, parse_xml
from restms.specs import (
    MAX_TEXT,
    EmbeddedContent,
    MessageLimits,
    PipeSpec,
    creation,
    join,
    messages,
    update,
)
from restms.xmlcodec import CodecLimits

# The AMQP9 properties a client may fill with any text (the others are numbers).
FREE_PROPERTIES = (
    "message_id",
    "reply_to",
    "correlation_id",
    "timestamp",
    "type",
    "user_id",
    "app_id",
    "sender_id",
)


def xml(inner: str) -> Document:
    return parse_xml(
        f'<restms xmlns="http://www.restms.org/schema/restms">{inner}</restms>'.encode()
    )


def _message(attrs: str = "", inner: str = "") -> object:
    return messages(xml(f"<message {attrs}>{inner}</message>"), MessageLimits())


def _stage(value: str) -> object:
    e = Engine()
    return e.stage(e.default_feed, b"x", value, "guest")


# (element, attribute, what reads a value of it)
CASES: list[tuple[str, str, Callable[[str], object]]] = [
    ("feed", "title", lambda v: creation(xml(f'<feed title="{v}"/>'))),
    ("feed", "license", lambda v: creation(xml(f'<feed license="{v}"/>'))),
    ("pipe", "title", lambda v: creation(xml(f'<pipe title="{v}"/>'))),
    ("pipe", "title", lambda v: PipeSpec(title=v)),
    ("feed", "title", lambda v: update(xml(f'<feed title="{v}"/>'), "feed")),
    ("feed", "license", lambda v: update(xml(f'<feed license="{v}"/>'), "feed")),
    ("pipe", "title", lambda v: update(xml(f'<pipe title="{v}"/>'), "pipe")),
    (
        "header",
        "name",
        lambda v: join(xml(f'<join feed="/restms/feed/f"><header name="{v}"/></join>')),
    ),
    (
        "header",
        "value",
        lambda v: join(xml(f'<join feed="/restms/feed/f"><header name="h" value="{v}"/></join>')),
    ),
    *(
        ("message", name, lambda v, name=name: _message(f'{name}="{v}"'))
        for name in FREE_PROPERTIES
    ),
    ("content", "type", lambda v: _message(inner=f'<content type="{v}">x</content>')),
    ("content", "type", lambda v: EmbeddedContent(type=v)),
    ("content", "type", lambda v: EmbeddedContent.of(b"x", v)),
    ("content", "type", _stage),  # a staged content's Content-Type
    ("feed", "title", lambda v: FeedConfig(name="configured", title=v)),
    ("feed", "license", lambda v: FeedConfig(name="configured", license=v)),
    ("domain", "title", lambda v: EngineConfig(domains=(("default", v),))),
]


@pytest.mark.parametrize(
    ("element", "attribute", "read"),
    [pytest.param(*case, id=f"{i}-{case[0]}-{case[1]}") for i, case in enumerate(CASES)],
)
def test_free_text_is_bounded(element: str, attribute: str, read: Callable[[str], object]) -> None:
    read("x" * MAX_TEXT)
    # configuration errors are ValueErrors that carry the same reason
    with pytest.raises((BadRequest, ValueError)) as info:
        read("x" * (MAX_TEXT + 1))
    reason = f"<{element}> {attribute} is longer than {MAX_TEXT} characters"
    assert reason in str(info.value)
    if isinstance(info.value, BadRequest):
        assert info.value.status == 400


def test_the_bound_counts_characters_not_bytes() -> None:
    creation(xml(f'<feed title="{"é" * MAX_TEXT}"/>'))


@pytest.mark.parametrize("fmt", [Format.XML, Format.JSON])
@pytest.mark.parametrize(("where", "attribute"), [("message", "message_id"), ("content", "type")])
def test_the_publish_fast_path_bounds_properties_and_content_types(
    fmt: Format, where: str, attribute: str
) -> None:
    """The fast path reads messages without the generic path's tree: it refuses the
    same long values itself."""
    long = "x" * (MAX_TEXT + 1)
    message: dict[str, object] = {"message_id": long} if where == "message" else {}
    content = {"type": long, "value": "x"} if where == "content" else {"value": "x"}
    if fmt is Format.JSON:
        body = orjson.dumps({"restms": {"message": [{**message, "content": [content]}]}})
    else:
        attrs = "".join(f' {k}="{v}"' for k, v in message.items())
        ctype = f' type="{content["type"]}"' if "type" in content else ""
        body = (
            f'<restms xmlns="http://www.restms.org/schema/restms"><message{attrs}>'
            f"<content{ctype}>x</content></message></restms>"
        ).encode()
    with pytest.raises(BadRequest, match=f"<{where}> {attribute} is longer"):
        fastpath.direct(body, fmt, CodecLimits(), MessageLimits())


def test_a_stored_join_past_the_bound_is_skipped_at_restore() -> None:
    """A join made before header values were bounded does not stop a restart."""
    long = orjson.dumps([["k", "v" * (MAX_TEXT + 1)]]).decode()
    snapshot = Snapshot(
        feeds=[("news", "news", "headers", None, None, "default", "ann")],
        pipes=[("p", "", None, "default", "ann", 1, "{}", 0, 0)],
        joins=[
            ("short", "p", "news", "", "", '[["k", "v"]]', 0),
            ("long", "p", "news", "", "", long, 0),
        ],
    )
    e = Engine()
    e.restore(snapshot)
    pipe = e.resolve("p")
    assert isinstance(pipe, Pipe)
    assert list(pipe.joins) == ["short"]
