"""Token buckets and slots (auth.limits), against a fake clock."""

from __future__ import annotations

import math

import pytest

from auth import limits
from auth.limits import RateLimiter, SecretChecks, Slots, address_key


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


def test_burst_is_allowed_at_once_then_refused(clock: Clock) -> None:
    limiter = RateLimiter(10, 5, clock=clock)
    assert [limiter.take("alice") for _ in range(5)] == [0.0] * 5
    assert limiter.take("alice") == pytest.approx(0.1)


def test_refusal_consumes_nothing_and_says_when(clock: Clock) -> None:
    limiter = RateLimiter(4, 2, clock=clock)
    limiter.take("alice")
    limiter.take("alice")
    assert limiter.take("alice") == pytest.approx(0.25)
    assert limiter.take("alice") == pytest.approx(0.25)  # asking again costs nothing
    clock.now += 0.1
    assert limiter.take("alice") == pytest.approx(0.15)
    clock.now += 0.15
    assert limiter.take("alice") == 0.0
    assert limiter.take("alice") == pytest.approx(0.25)


def test_refill_is_capped_at_burst(clock: Clock) -> None:
    limiter = RateLimiter(10, 3, clock=clock)
    for _ in range(3):
        limiter.take("alice")
    clock.now += 3600
    assert [limiter.take("alice") for _ in range(3)] == [0.0] * 3
    assert limiter.take("alice") == pytest.approx(0.1)


def test_partial_refill_allows_what_has_accrued(clock: Clock) -> None:
    limiter = RateLimiter(2, 10, clock=clock)
    for _ in range(10):
        limiter.take("alice")
    clock.now += 1.5  # three tokens back
    assert [limiter.take("alice") for _ in range(3)] == [0.0] * 3
    assert limiter.take("alice") == pytest.approx(0.5)


def test_cost_above_one(clock: Clock) -> None:
    limiter = RateLimiter(10, 10, clock=clock)
    assert limiter.take("alice", 7) == 0.0
    assert limiter.take("alice", 7) == pytest.approx(0.4)  # 3 held, 4 more at 10/s
    assert limiter.take("alice", 3) == 0.0
    clock.now += 0.5
    assert limiter.take("alice", 5) == 0.0


def test_cost_above_burst_can_never_be_paid(clock: Clock) -> None:
    limiter = RateLimiter(10, 10, clock=clock)
    assert limiter.take("alice", 11) == math.inf
    assert len(limiter) == 0
    assert limiter.take("alice", 10) == 0.0


def test_keys_are_independent(clock: Clock) -> None:
    limiter = RateLimiter(1, 1, clock=clock)
    assert limiter.take("alice") == 0.0
    assert limiter.take("alice") > 0
    assert limiter.take("bob") == 0.0


def test_rate_zero_is_unlimited_and_stateless(clock: Clock) -> None:
    limiter = RateLimiter(0, 1, clock=clock)
    assert all(limiter.take(f"p{i % 3}", 1000) == 0.0 for i in range(100))
    assert len(limiter) == 0


def test_full_buckets_are_forgotten(clock: Clock) -> None:
    limiter = RateLimiter(10, 5, clock=clock)
    for i in range(100):
        limiter.take(f"p{i}")
    assert len(limiter) == 100  # all within one refill period: each owes a token
    clock.now += 0.1  # every bucket is full again
    limiter.take("newcomer")
    assert len(limiter) == 1


def test_eviction_bound_holds_even_when_no_bucket_is_full(clock: Clock) -> None:
    limiter = RateLimiter(1, 1, max_keys=50, clock=clock)
    for i in range(1000):
        limiter.take(f"p{i}")
        assert len(limiter) <= 50
    # The trade-off: the oldest key lost its debt and is allowed again at once ...
    assert limiter.take("p0") == 0.0
    # ... while a recent one still owes.
    assert limiter.take("p999") == pytest.approx(1.0)


def test_recently_used_keys_are_evicted_last(clock: Clock) -> None:
    limiter = RateLimiter(1, 1, max_keys=3, clock=clock)
    for key in ("a", "b", "c"):
        limiter.take(key)
    limiter.take("a")  # refused, but touched: now the most recent
    limiter.take("d")  # over the bound: "b" goes, not "a"
    assert limiter.take("a") > 0
    assert limiter.take("b") == 0.0


@pytest.mark.parametrize(("rate", "burst", "max_keys"), [(-1, 1, 1), (1, 0, 1), (1, 1, 0)])
def test_bad_settings_are_refused(rate: float, burst: int, max_keys: int) -> None:
    with pytest.raises(ValueError, match="must"):
        RateLimiter(rate, burst, max_keys=max_keys)


# ------------------------------------------------------------------------ slots


def test_slots_acquire_up_to_limit_and_release() -> None:
    slots = Slots(2)
    assert slots.acquire("alice")
    assert slots.acquire("alice")
    assert not slots.acquire("alice")
    assert slots.count("alice") == 2
    assert slots.acquire("bob")
    slots.release("alice")
    assert slots.acquire("alice")


def test_slots_forget_keys_holding_nothing() -> None:
    slots = Slots(3)
    for key in ("alice", "alice", "bob"):
        slots.acquire(key)
    assert len(slots) == 2
    slots.release("alice")
    slots.release("alice")
    slots.release("bob")
    assert len(slots) == 0
    assert slots.count("alice") == 0


def test_releasing_what_is_not_held_is_an_error() -> None:
    slots = Slots(1)
    with pytest.raises(KeyError):
        slots.release("alice")


def test_slots_hold_releases_only_what_it_took() -> None:
    slots = Slots(1)
    with slots.hold("alice") as first:
        assert first
        with slots.hold("alice") as second:
            assert not second
        assert slots.count("alice") == 1
    assert len(slots) == 0
    with pytest.raises(RuntimeError), slots.hold("alice"):
        raise RuntimeError
    assert len(slots) == 0


def test_slots_limit_must_be_positive() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        Slots(0)


# ---------------------------------------------------------------- secret checks
@pytest.mark.parametrize(
    ("peer", "key"),
    [
        ("192.0.2.7", "192.0.2.7"),  # IPv4: the address itself
        ("2001:db8:1:2:3:4:5:6", "2001:db8:1:2::/64"),
        ("2001:db8:1:2:ffff:ffff:ffff:ffff", "2001:db8:1:2::/64"),  # the same /64
        ("[2001:db8:1:3::1]", "2001:db8:1:3::/64"),  # the next /64: another key
        ("::1", "::/64"),
        ("::ffff:192.0.2.7", "192.0.2.7"),  # IPv4 mapped into IPv6: as IPv4
        ("/run/gateway.sock", "/run/gateway.sock"),  # a Unix socket peer
        (None, ""),
    ],
)
def test_addresses_are_keyed_by_ipv4_address_and_ipv6_slash_64(peer: str | None, key: str) -> None:
    assert address_key(peer) == key


def checks(clock: Clock) -> SecretChecks:
    return SecretChecks(
        address_rate=5, address_burst=4, account_rate=0.5, account_burst=2, clock=clock
    )


async def test_an_account_is_bounded_whatever_address_guesses(clock: Clock) -> None:
    bounds = checks(clock)
    assert await bounds.admit("192.0.2.1", "alice", "x") == (0.0, "")
    assert await bounds.admit("192.0.2.2", "alice", "y") == (0.0, "")
    wait, reason = await bounds.admit("192.0.2.3", "alice", "z")
    assert (wait, reason) == (pytest.approx(2.0), "too many failed secret checks for this account")
    assert await bounds.admit("192.0.2.3", "bob", "z") == (0.0, "")  # another account
    clock.now += 2.0  # one failure regained
    assert await bounds.admit("192.0.2.4", "alice", "w") == (0.0, "")


async def test_one_ipv6_slash_64_is_one_address(clock: Clock) -> None:
    bounds = checks(clock)
    for i in range(4):  # four accounts, so that no account's bound is reached
        assert await bounds.admit(f"2001:db8::{i + 1}", f"user{i}", "x") == (0.0, "")
    wait, reason = await bounds.admit("2001:db8::ffff", "user9", "x")
    assert reason == "too many secret checks from this address"
    assert wait == pytest.approx(0.2)
    assert await bounds.admit("2001:db8:0:1::1", "user9", "x") == (0.0, "")  # another /64


async def test_a_right_secret_gives_back_its_check_and_then_skips_the_guessers_bounds(
    clock: Clock,
) -> None:
    bounds = checks(clock)
    assert await bounds.admit("192.0.2.1", "alice", "right") == (0.0, "")
    await bounds.passed("alice", "right")
    assert await bounds.admit("192.0.2.1", "alice", "a") == (0.0, "")  # what it paid came back
    assert await bounds.admit("192.0.2.1", "alice", "b") == (0.0, "")
    assert (await bounds.admit("192.0.2.1", "alice", "c"))[0] > 0  # the account: over the bound
    _, reason = await bounds.admit("192.0.2.1", "bob", "d")
    assert reason == "too many secret checks from this address"
    # The holder, from the guesser's address or another: an address bucket of its own.
    for _ in range(4):
        assert await bounds.admit("192.0.2.1", "alice", "right") == (0.0, "")
        assert await bounds.admit("198.51.100.1", "alice", "right") == (0.0, "")
    wait, reason = await bounds.admit("192.0.2.1", "alice", "right")  # bounded all the same
    assert (wait, reason) == (pytest.approx(0.2), "too many secret checks from this address")
    assert (await bounds.admit("192.0.2.2", "bob", "right"))[0] == 0.0  # known for alice only:
    assert not bounds.known("bob", "right")  # bob's bound applies to it
    clock.now += limits.KNOWN_FOR  # forgotten after a while: bounded again
    assert not bounds.known("alice", "right")


async def test_known_secrets_are_bounded_in_number(
    clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(limits, "KNOWN_KEPT", 3)
    bounds = checks(clock)
    for i in range(5):
        await bounds.passed(f"user{i}", "s")
    assert not bounds.known("user0", "s")
    assert not bounds.known("user1", "s")
    assert all(bounds.known(f"user{i}", "s") for i in (2, 3, 4))


async def test_no_account_bound_at_rate_zero(clock: Clock) -> None:
    bounds = SecretChecks(
        address_rate=5, address_burst=100, account_rate=0, account_burst=1, clock=clock
    )
    assert all([await bounds.admit("192.0.2.1", "alice", str(i)) == (0.0, "") for i in range(50)])
