"""The kept replies behind ``Idempotency-Key``: found while fresh, trimmed by age,
count and bytes, oldest first."""

from __future__ import annotations

import time

import pytest

from gateway.restms.idempotency import Kept, Replies
from restms.errors import Conflict


def kept(at: float, size: int = 1, fingerprint: bytes = b"f") -> Kept:
    return Kept(fingerprint, at, 200, b"x" * size, ())


def test_a_reply_is_found_until_the_window_passes() -> None:
    replies = Replies(window=10, limit=100, budget=1000)
    replies.keep(("p", "/f", "k"), kept(at=0))
    assert replies.get(("p", "/f", "k"), 9.9) is not None
    assert replies.get(("p", "/f", "k"), 10) is None
    assert replies.get(("q", "/f", "k"), 1) is None  # another principal's key is not this one


def test_old_replies_go_when_new_ones_come() -> None:
    replies = Replies(window=10, limit=100, budget=1000)
    replies.keep(("p", "/f", "a"), kept(at=0))
    replies.keep(("p", "/f", "b"), kept(at=11))
    assert len(replies) == 1


def test_count_and_byte_budgets_drop_the_oldest() -> None:
    replies = Replies(window=100, limit=2, budget=10)
    for n, key in enumerate("abc"):
        replies.keep(("p", "/f", key), kept(at=n))
    assert len(replies) == 2
    assert replies.get(("p", "/f", "a"), 3) is None
    replies.keep(("p", "/f", "d"), kept(at=4, size=9))  # 11 bytes: "b" goes
    assert replies.bytes == 10
    assert replies.get(("p", "/f", "b"), 4) is None
    assert replies.get(("p", "/f", "c"), 4) is not None
    replies.keep(("p", "/f", "e"), kept(at=5, size=11))  # larger than the budget: not kept
    assert replies.get(("p", "/f", "e"), 5) is None
    assert replies.bytes == 10


async def test_a_first_request_runs_once_and_then_its_reply_is_found() -> None:
    replies = Replies(window=10, limit=100, budget=1000)
    scope = ("p", "/f", "k")
    assert await replies.begin(scope) is None  # running from now on
    with pytest.raises(Conflict):
        await replies.begin(scope)
    await replies.end(scope, kept(at=time.monotonic()))
    found = await replies.begin(scope)
    assert found is not None
    assert found.body == b"x"
    assert not replies.running


async def test_a_failed_first_request_leaves_nothing_kept() -> None:
    replies = Replies(window=10, limit=100, budget=1000)
    scope = ("p", "/f", "k")
    assert await replies.begin(scope) is None
    await replies.end(scope, None)
    assert len(replies) == 0
    assert await replies.begin(scope) is None  # runs again
