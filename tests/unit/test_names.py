"""Private resource hashes (U6): unguessable, and usable as a command-line argument."""

from __future__ import annotations

import re

import pytest

from restms import names


def test_a_hash_is_24_url_safe_characters_and_never_repeats() -> None:
    drawn = [names.new_hash() for _ in range(5_000)]
    assert all(re.fullmatch(r"[A-Za-z0-9_-]{24}", name) for name in drawn)
    assert len(set(drawn)) == len(drawn)
    # One base64 character in 64 is "-": 5,000 draws without the rule would hold about 78.
    assert not [name for name in drawn if name.startswith("-")]


def test_a_draw_starting_with_a_dash_is_drawn_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """``main.py pipes inspect -abc...`` would read the name as an option."""
    draws = iter(["-" + "a" * 23, "-" + "b" * 23, "c" * 24])
    monkeypatch.setattr(names.secrets, "token_urlsafe", lambda n: next(draws))
    assert names.new_hash() == "c" * 24
