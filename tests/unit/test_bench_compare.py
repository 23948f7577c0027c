"""The pure parts of bench/compare.py: the ABBA order and the median/ratio table."""

from __future__ import annotations

from bench.compare import Figure, format_table, schedule, table

RATE = Figure("publish", "msg/s")
P50 = Figure("latency p50", "ms", higher_is_better=False)


def test_two_rounds_of_one_run_are_abba() -> None:
    assert schedule(2, ("r",)) == [
        (0, "r", "base"),
        (0, "r", "current"),
        (1, "r", "current"),
        (1, "r", "base"),
    ]


def test_every_round_measures_every_run_on_both_sides_and_flips_who_goes_first() -> None:
    order = schedule(4, ("a", "b"))
    assert len(order) == 4 * 2 * 2
    for n in range(4):
        this_round = [(run, side) for round_no, run, side in order if round_no == n]
        first = "base" if n % 2 == 0 else "current"
        second = "current" if first == "base" else "base"
        assert this_round == [("a", first), ("a", second), ("b", first), ("b", second)]


def test_the_table_has_each_sides_median_and_the_ratio_current_over_base() -> None:
    samples = [
        ("base", {RATE: 100.0, P50: 2.0}),
        ("current", {RATE: 130.0, P50: 1.0}),
        ("current", {RATE: 110.0, P50: 3.0}),
        ("base", {RATE: 300.0, P50: 4.0}),
        ("base", {RATE: 90.0, P50: 2.5}),
    ]
    rows = table(samples)
    assert [row["figure"] for row in rows] == ["publish", "latency p50"]
    rate, p50 = rows
    assert (rate["base"], rate["current"]) == (100.0, 120.0)
    assert rate["ratio"] == 1.2
    assert rate["n"] == {"base": 3, "current": 2}
    assert (p50["base"], p50["current"], p50["ratio"]) == (2.5, 2.0, 0.8)
    assert (rate["higher_is_better"], p50["higher_is_better"]) == (True, False)


def test_a_figure_one_side_lacks_has_no_ratio() -> None:
    (row,) = table([("current", {RATE: 5.0})])
    assert (row["base"], row["current"], row["ratio"]) == (None, 5.0, None)


def test_the_printed_table_shows_medians_ratio_and_which_way_is_better() -> None:
    lines = format_table(table([("base", {RATE: 80_000.0}), ("current", {RATE: 100_000.0})]))
    assert lines[0].split() == ["figure", "unit", "base", "current", "current/base"]
    assert lines[1].split() == [
        "publish",
        "msg/s",
        "80,000",
        "100,000",
        "1.250",
        "higher",
        "is",
        "better",
    ]
