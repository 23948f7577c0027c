"""A feed's deduplication window (feeds/dedup.py) against a plain model of it: the
newest ``limit`` ids routed within ``window`` seconds, a repeat after the window
counting as new."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from feeds.dedup import DedupWindow


def test_the_oldest_go_first_by_count_and_by_age() -> None:
    window = DedupWindow(10.0, 3)
    for number, now in enumerate((0.0, 1.0, 2.0, 3.0)):
        window.add(f"m{number}", number, now)
    assert len(window) == 3
    assert window.get("m0", 3.0) is None  # the fourth pushed the first out
    assert window.get("m1", 3.0) == 1
    window.add("m4", 4, 11.5)  # m1 (1.0) is past the window now
    assert window.get("m1", 11.5) is None
    assert [window.get(f"m{n}", 11.5) for n in (2, 3, 4)] == [2, 3, 4]
    assert len(window) == 3


def test_an_id_added_again_is_the_newest() -> None:
    window = DedupWindow(100.0, 2)
    window.add("a", 1, 0.0)
    window.add("b", 2, 1.0)
    window.add("a", 5, 2.0)  # newest again: b is the oldest now
    window.add("c", 3, 3.0)
    assert window.get("b", 3.0) is None
    assert window.get("a", 3.0) == 5
    window.discard("a")
    assert window.get("a", 3.0) is None
    assert len(window) == 1


@given(
    st.lists(st.tuples(st.integers(0, 30), st.floats(0.0, 3.0)), max_size=200),
    st.integers(1, 12),
)
def test_the_window_agrees_with_a_model(adds: list[tuple[int, float]], limit: int) -> None:
    window = DedupWindow(5.0, limit)
    model: list[tuple[str, float, int]] = []  # oldest first
    now = 0.0
    for count, (number, step) in enumerate(adds):
        now += step
        key = f"id-{number}"
        window.add(key, count, now)
        model = [entry for entry in model if entry[0] != key] + [(key, now, count)]
        model = [entry for entry in model[-limit:] if entry[1] > now - 5.0]
        assert len(window) == len(model)
        for key, _, routed in model:
            assert window.get(key, now) == routed
