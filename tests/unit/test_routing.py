"""Pure routing rules per feed type (digest §6.2: F5-F8, F12, F21), no engine, no HTTP."""

from __future__ import annotations

import time
from functools import cache

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from feeds.routing import (
    INDEXED_TYPES,
    MAX_PATTERN,
    QUEUEING_TYPES,
    headers_match,
    matcher,
    topic_match,
    words,
)
from restms.errors import BadRequest
from tests.examples import examples


def topic(pattern: str, address: str) -> bool:
    return topic_match(words(pattern), words(address))


# ---------------------------------------------------------------- words
@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("", ()),
        ("rec", ("rec",)),
        ("rec.pets.cats", ("rec", "pets", "cats")),
        ("a..b", ("a", "", "b")),
        (".", ("", "")),
    ],
)
def test_F5_words_split_on_dots_and_empty_has_none(address: str, expected: tuple[str, ...]) -> None:
    assert words(address) == expected


# ---------------------------------------------------------------- topic (F5)
F5_TABLE = [
    # the digest's vectors
    ("rec.pets.*", "rec.pets.cats", True),
    ("rec.pets.*", "rec.pets", False),
    ("rec.pets.*", "rec.pets.cats.tabby", False),
    ("rec.#", "rec", True),
    ("rec.#", "rec.cars", True),
    ("rec.#", "rec.pets.dogs", True),
    ("#", "", True),
    ("#", "a", True),
    ("#", "a.b.c", True),
    ("*.cars", "rec.cars", True),
    ("rec.*.dogs", "rec.pets.dogs", True),
    ("*", "", False),
    # our own edges
    ("*", "a", True),
    ("*", "a.b", False),
    ("*.*", "a.b", True),
    ("*.*", "a", False),
    ("", "", True),
    ("", "a", False),
    ("a", "", False),
    ("rec", "rec", True),
    ("rec", "Rec", False),
    ("rec.#", "recx", False),
    ("rec.#", "re", False),
    ("#.cats", "cats", True),
    ("#.cats", "rec.pets.cats", True),
    ("#.cats", "rec.cats.tabby", False),
    ("a.#.b", "a.b", True),
    ("a.#.b", "a.x.y.b", True),
    ("a.#.b", "a.x.b.c", False),
    ("a.#.b.#.c", "a.b.x.b.y.c", True),
    ("a.#.b.#.c", "a.c.b", False),
    ("#.#", "", True),
    ("#.#", "a.b", True),
    ("#.*", "", False),
    ("#.*", "a.b.c", True),
    ("*.#", "a", True),
    ("*.#.*", "a", False),
    ("*.#.*", "a.b", True),
    ("a.*.#.c", "a.b.c", True),
    ("a.*.#.c", "a.c", False),
    ("a..b", "a..b", True),
    ("a.*.b", "a..b", True),
]


@pytest.mark.parametrize(("pattern", "address", "expected"), F5_TABLE)
def test_F5_topic_match_table(pattern: str, address: str, expected: bool) -> None:
    assert topic(pattern, address) is expected


@cache
def reference(pattern: tuple[str, ...], address: tuple[str, ...]) -> bool:
    """AMQP topic matching written the slow, obvious way."""
    if not pattern:
        return not address
    head, rest = pattern[0], pattern[1:]
    if head == "#":
        return reference(rest, address) or (bool(address) and reference(pattern, address[1:]))
    if not address:
        return False
    return (head == "*" or head == address[0]) and reference(rest, address[1:])


WORDS = st.sampled_from(["a", "b", "c", ""])
PATTERN_WORDS = st.sampled_from(["a", "b", "c", "*", "#"])


@settings(max_examples=examples(500), deadline=None)
@given(st.lists(PATTERN_WORDS, max_size=6), st.lists(WORDS, max_size=7))
def test_F5_topic_match_agrees_with_a_reference(pattern: list[str], address: list[str]) -> None:
    assert topic_match(tuple(pattern), tuple(address)) is reference(tuple(pattern), tuple(address))


def test_F5_topic_match_stays_fast_on_many_hashes() -> None:
    pattern = words(".".join(["#", "a"] * 30 + ["z"]))
    address = words(".".join(["a"] * 200))
    started = time.perf_counter()
    assert topic_match(pattern, address) is False
    assert time.perf_counter() - started < 0.5


# ---------------------------------------------------------------- headers (F6)
@pytest.mark.parametrize(
    ("wanted", "have", "expected"),
    [
        ((), {}, True),
        ((), {"x": "1"}, True),
        ((("region", "eu"),), {"region": "eu"}, True),
        ((("region", "eu"),), {"region": "eu", "extra": "y"}, True),
        ((("region", "eu"),), {"region": "EU"}, False),
        ((("region", "eu"),), {"Region": "eu"}, False),
        ((("region", "eu"),), {}, False),
        ((("region", "eu"), ("tier", "gold")), {"region": "eu"}, False),
        ((("region", "eu"), ("tier", "gold")), {"tier": "gold", "region": "eu"}, True),
        ((("empty", ""),), {"empty": ""}, True),
        ((("empty", ""),), {}, False),
    ],
)
def test_F6_headers_match(
    wanted: tuple[tuple[str, str], ...], have: dict[str, str], expected: bool
) -> None:
    assert headers_match(wanted, have) is expected


# ---------------------------------------------------------------- matcher per feed type
@pytest.mark.parametrize("kind", ["", "direct"])
def test_F7_direct_and_default_match_exactly_and_star_is_literal(kind: str) -> None:
    star = matcher(kind, "*", ())
    exact = matcher(kind, "rec.cars", ())
    assert star is not None
    assert exact is not None
    assert star("*", {})
    assert not star("anything", {})
    assert not star("", {})
    assert exact("rec.cars", {})
    assert not exact("rec.cars.x", {})
    assert not exact("Rec.cars", {})
    assert not exact("rec.*", {})
    assert kind in INDEXED_TYPES


def test_F5_topic_matcher_uses_the_join_address_as_pattern() -> None:
    match = matcher("topic", "rec.#", ())
    assert match is not None
    assert match("rec", {})
    assert match("rec.pets.dogs", {"ignored": "header"})
    assert not match("news.rec", {})


def test_F6_headers_matcher_ignores_the_address() -> None:
    assert matcher("headers", "anything", ()) is None  # no headers: every message
    match = matcher("headers", "only.this", (("region", "eu"),))
    assert match is not None
    assert match("something.else", {"region": "eu"})
    assert not match("only.this", {})


@pytest.mark.parametrize("kind", ["fanout", "rotator", "service"])
def test_F8_F21_unfiltered_types_have_no_matcher(kind: str) -> None:
    assert matcher(kind, "whatever", (("h", "v"),)) is None


def test_F8_queueing_types() -> None:
    assert frozenset({"rotator", "service"}) == QUEUEING_TYPES


@pytest.mark.parametrize(
    ("pattern", "address", "expected"),
    [
        (r"rec\.(cats|dogs)", "rec.cats", True),
        (r"rec\.(cats|dogs)", "rec.dogs", True),
        (r"rec\.(cats|dogs)", "xrec.cats", False),
        (r"rec\.(cats|dogs)", "rec.cats.tabby", False),
        ("cars", "rec.cars", False),
        (".*cars", "rec.cars", True),
        ("", "", True),
        ("", "a", False),
        ("a|b", "b", True),
        ("a|b", "ab", False),
        ("[0-9]+", "123", True),
        ("[0-9]+", "12a", False),
    ],
)
def test_F12_regexp_is_an_re2_full_match(pattern: str, address: str, expected: bool) -> None:
    match = matcher("regexp", pattern, ())
    assert match is not None
    assert match(address, {}) is expected


@pytest.mark.parametrize("pattern", ["(", "a[", "*x", "a{2,1}", "(?P<n>a", r"(a)\1"])
def test_F12_invalid_regexp_is_400(pattern: str) -> None:
    with pytest.raises(BadRequest):
        matcher("regexp", pattern, ())


def test_an_invalid_regexp_is_refused_with_re2s_reason_as_text() -> None:
    with pytest.raises(BadRequest) as refused:
        matcher("regexp", "a((", ())
    assert refused.value.reason == "join address is not a valid RE2 pattern: missing ): a(("


def test_F12_overlong_regexp_is_400() -> None:
    with pytest.raises(BadRequest):
        matcher("regexp", "a" * (MAX_PATTERN + 1), ())
    assert matcher("regexp", "a" * MAX_PATTERN, ()) is not None


def test_F12_regexp_runs_in_linear_time() -> None:
    match = matcher("regexp", "(a+)+b", ())
    assert match is not None
    assert match("a" * 5000, {}) is False  # catastrophic for backtracking engines
