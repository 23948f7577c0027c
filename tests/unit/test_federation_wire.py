"""What a federation link reads off the wire without I/O (gateway/federation/wire.py):
Server-Sent Events a line at a time."""

from __future__ import annotations

from gateway.federation.wire import EventLines


def events(stream: bytes) -> list[tuple[str, str, str]]:
    lines = EventLines()
    found = [lines.line(raw) for raw in stream.splitlines(keepends=True)]
    return [event for event in found if event is not None]


def test_events_end_at_a_blank_line_and_comments_are_skipped() -> None:
    stream = (
        b"retry: 2000\n\n: keep-alive\n\n"
        b'id: 7\nevent: message\ndata: {"a":1}\n\n'
        b"event: gap\ndata: {}\r\n\r\n"  # no id: the last one carries over
        b"id: 9\ndata:first\ndata: second\n\n"  # no name: a message; data lines joined
    )
    assert events(stream) == [
        ("message", "7", '{"a":1}'),
        ("gap", "7", "{}"),
        ("message", "9", "first\nsecond"),
    ]


def test_an_event_without_data_is_no_event() -> None:
    assert events(b"id: 3\nevent: message\n\n") == []
