"""The coalescing of management events (feeds.events.Coalescer), with a fake clock."""

from __future__ import annotations

import pytest

from feeds import events
from feeds.events import Coalescer

FIELDS: events.Fields = ("pipe.full", "abc", "guest", "default", {})


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def fields(n: int) -> events.Fields:
    return ("pipe.full", "abc", "guest", "default", {"n": n})


def test_the_first_goes_out_at_once_and_a_burst_becomes_one_more() -> None:
    clock = Clock()
    coalescer = Coalescer(10.0, clock)
    assert coalescer.offer(("pipe.full", "abc"), fields(1)) == 1
    for n in range(2, 6):
        assert coalescer.offer(("pipe.full", "abc"), fields(n)) == 0
    assert coalescer.due() == []  # not before the interval is over
    clock.now += 10.0
    assert coalescer.due() == [(fields(5), 4)]  # the last one's fields, four occurrences
    assert coalescer.due() == []


def test_a_steady_stream_is_one_event_per_interval() -> None:
    clock = Clock()
    coalescer = Coalescer(1.0, clock)
    sent = 0
    for _ in range(100):  # ten seconds, ten occurrences a second
        sent += coalescer.offer(("auth.failed", "bearer"), FIELDS) > 0
        sent += len(coalescer.due())
        clock.now += 0.1
    assert 9 <= sent <= 11


def test_an_occurrence_after_a_quiet_interval_goes_out_with_what_was_held() -> None:
    clock = Clock()
    coalescer = Coalescer(10.0, clock)
    coalescer.offer(("a", "x"), FIELDS)
    coalescer.offer(("a", "x"), FIELDS)  # held
    clock.now += 11.0
    assert coalescer.offer(("a", "x"), FIELDS) == 2  # this one and the held one
    assert coalescer.due() == []


def test_keys_are_separate() -> None:
    coalescer = Coalescer(10.0, Clock())
    assert coalescer.offer(("pipe.full", "a"), FIELDS) == 1
    assert coalescer.offer(("pipe.full", "b"), FIELDS) == 1
    assert coalescer.offer(("webhook.failing", "a"), FIELDS) == 1


def test_quiet_keys_are_forgotten_and_the_number_of_keys_is_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(events, "MAX_KEYS", 3)
    clock = Clock()
    coalescer = Coalescer(10.0, clock)
    for name in "abc":
        assert coalescer.offer(("k", name), FIELDS) == 1
    assert coalescer.offer(("k", "d"), FIELDS) == 0  # full: dropped
    clock.now += 10.0
    assert coalescer.offer(("k", "d"), FIELDS) == 1  # the quiet ones were forgotten
    assert coalescer.due() == []
