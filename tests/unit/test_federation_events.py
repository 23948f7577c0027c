"""A pull link's reading of event streams without I/O (gateway/federation/wire.py):
whole events cut from chunks however the chunks fall, and each event's message
decoded straight to its spec, the same as the general reading gives."""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import given
from hypothesis import strategies as st

from gateway.federation.wire import EventLines, event_blocks, event_fields, plain_message
from restms import specs
from restms.jsoncodec import parse_json
from restms.specs import MessageLimits, MessageSpec

LIMITS = MessageLimits(max_messages=1, max_headers=1000, max_contents=1000, max_header_bytes=10**6)
# Text without backslashes, quotes or controls, nor characters whose UTF-8 starts with
# 0xEF (U+F000 on: U+FFFE and U+FFFF are among them): what the plain shape takes.
TEXT = st.text(
    st.characters(
        blacklist_categories=("Cs", "Cc"), blacklist_characters='\\"', max_codepoint=0xEFFF
    ),
    max_size=20,
)


def read(chunks: list[bytes]) -> list[tuple[str, str, bytes]]:
    buffer, found = b"", []
    for chunk in chunks:
        blocks, buffer = event_blocks(buffer + chunk)
        found += [fields for block in blocks if (fields := event_fields(block)) is not None]
    return found


def general(data: bytes) -> MessageSpec:
    element = next(parse_json(data).iter("message"))
    headers = [specs.header(h.attrs) for h in element.iter("header")]
    contents = [
        specs.content(None, c.attrs.get("type"), c.attrs.get("encoding"), c.text)
        for c in element.iter("content")
    ]
    return specs.build_message(element.attrs, headers, contents, LIMITS)


EVENTS = st.lists(
    st.tuples(
        st.integers(1, 10**6),
        st.sampled_from(["message", "gap", "deleted"]),
        TEXT.filter(lambda t: "\n" not in t and "\r" not in t and t != ""),
        st.sampled_from([b"\n", b"\r\n", b"\r"]),
    ),
    max_size=6,
)


@given(EVENTS, st.lists(st.integers(0, 400), max_size=8), st.booleans())
def test_events_are_the_same_however_the_stream_is_cut(
    events: list[tuple[int, str, str, bytes]], cuts: list[int], comments: bool
) -> None:
    stream = b""
    for position, name, data, end in events:
        if comments:
            stream += b": keep-alive" + end + end
        lines = [b"id: %d" % position, b"event: " + name.encode(), b"data: " + data.encode()]
        stream += end.join(lines) + end + end
    # A CR at the end of what came may be the first half of a CR LF: an event that
    # ends there is taken once the next byte comes (a keep-alive, the next event).
    stream += b": more\n\n"
    points = sorted({min(cut, len(stream)) for cut in cuts})
    chunks = [stream[a:b] for a, b in zip([0, *points], [*points, len(stream)], strict=True)]
    expected = [(name, str(p), data.encode()) for p, name, data, _ in events]
    assert read(chunks) == expected
    # as the general, line-at-a-time reader of the HTML standard's format reads them
    lines = EventLines()
    whole = [
        lines.line(raw)
        for raw in stream.replace(b"\r\n", b"\n").replace(b"\r", b"\n").splitlines(keepends=True)
    ]
    assert [(n, i, d.encode()) for n, i, d in (e for e in whole if e is not None)] == expected


MESSAGES = st.fixed_dictionaries(
    {"address": st.from_regex(r"[a-z]{1,8}(\.[a-z]{1,8}){0,2}", fullmatch=True)},
    optional={
        "message_id": TEXT,
        "correlation_id": TEXT,
        "priority": st.sampled_from(["0", "5", "9"]),
        "href": TEXT,  # the remote's own: not kept
        "feed": st.just("http://remote:8080/restms/feed/f"),
        "delivery_count": st.just("2"),
        "header": st.lists(st.fixed_dictionaries({"name": TEXT.filter(bool), "value": TEXT})),
        "content": st.lists(
            st.fixed_dictionaries(
                {"value": TEXT},
                optional={
                    "type": st.sampled_from(["text/plain", "a/b"]),
                    "encoding": st.just("plain"),
                },
            )
        ),
    },
)


@given(MESSAGES)
def test_a_plain_message_is_read_as_the_general_reading_reads_it(message: dict[str, Any]) -> None:
    data = orjson.dumps({"restms": {"message": [message]}})
    found = plain_message(data, LIMITS)
    assert found is not None
    assert found == general(data)
    assert found.head_size == general(data).head_size


def test_odd_shapes_are_left_to_the_general_reading() -> None:
    def plain(text: str) -> MessageSpec | None:
        return plain_message(text.encode(), LIMITS)

    assert plain('{"restms":{"message":[{"address":"a"}]}}') == MessageSpec(address="a")
    assert plain('{"restms":{"message":[{"address":"a","address":"b"}]}}') is None  # repeated
    assert plain('{"restms":{"message":[{"address":"a:b","x":"1","x":"2"}]}}') is None
    assert plain('{"restms":{"message":[{"address":"a","content":[{"href":"/c"}]}]}}') is None
    assert plain('{"restms":{"message":[{"address":"a\\u0001"}]}}') is None  # an escape
    assert plain('{"restms":{"message":[{"address":"a"},{"address":"b"}]}}') is None  # two
    assert plain('{"restms":{"message":[{"address":"a","priority":5}]}}') is None  # J3
    assert plain('{"restms":{"message":[{"address":"a","content":[{"type":"t"}]}]}}') is None
    assert plain('{"restms":{"pipe":[{}]}}') is None
    assert plain("[1]") is None
    assert plain("{not json") is None
