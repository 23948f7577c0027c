"""Delivery guarantees of the engine on its own: acknowledgement leases and dead letters,
per-pipe limits and overflow policies, message_id deduplication, idle pipe collection.

Time is a hand-moved clock, so leases, windows and idle timeouts run out exactly when
a test says, with no sleeping.
"""

from __future__ import annotations

from typing import Any

import pytest

from feeds import EngineConfig
from feeds.config import OVERHEAD
from feeds.engine import Engine
from feeds.model import Feed, Pipe, Slot
from restms.errors import BadRequest, PayloadTooLarge, ServiceUnavailable
from restms.specs import (
    Duplicate,
    EmbeddedContent,
    FeedSpec,
    JoinSpec,
    MessageSpec,
    PipeOptions,
    PipeSpec,
)

OWNER = "guest"


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def engine(clock: Clock | None = None, **config: Any) -> Engine:
    clock = clock or Clock()
    return Engine(EngineConfig(**config), wall=clock, mono=clock)


def new_feed(e: Engine, name: str, kind: str = "fanout") -> Feed:
    feed, _ = e.create_feed(e.domain("default"), FeedSpec(name=name, type=kind), OWNER)
    return feed


def new_pipe(e: Engine, kind: str = "", title: str | None = None, **options: Any) -> Pipe:
    spec = PipeSpec(type=kind, title=title, options=PipeOptions(**options))
    return e.create_pipe(e.domain("default"), spec, OWNER)


def join(e: Engine, pipe: Pipe, feed: Feed) -> None:
    e.create_join(pipe, JoinSpec(feed_path=f"/restms/feed/{feed.key}"))


def msg(mid: str = "", body: str = "", **props: str) -> MessageSpec:
    pairs = (("message_id", mid),) if mid else ()
    contents = (EmbeddedContent(value=body),) if body else ()
    return MessageSpec(address="", props=pairs + tuple(props.items()), contents=contents)


def ids(pipe: Pipe) -> list[str | None]:
    return [m.spec.prop("message_id") for m in pipe.messages.values()]


def fetch(e: Engine, pipe: Pipe) -> int:
    """Fetch the oldest message as a GET does (starting its lease); its position."""
    seq = next(iter(pipe.messages))
    message = e.message(Slot(pipe, seq))
    assert message is not None
    e.lease(pipe, message)
    return seq


# ---------------------------------------------------------------- leases
def test_a_fetched_message_not_acknowledged_in_its_lease_comes_back_at_the_end() -> None:
    clock = Clock()
    e = engine(clock, lease=30, max_deliveries=3)
    feed, pipe = new_feed(e, "f"), new_pipe(e)
    join(e, pipe, feed)
    e.publish(feed, [msg("a"), msg("b")])
    first = fetch(e, pipe)
    clock.now += 29
    assert e.sweep_leases() == 0
    assert ids(pipe) == ["a", "b"]
    clock.now += 1
    assert e.sweep_leases() == 1
    assert ids(pipe) == ["b", "a"]  # behind what was waiting, at a new position
    again = pipe.messages[max(pipe.messages)]
    assert again.seq > first
    assert again.redeliveries == 1
    assert first not in pipe.messages
    assert e.counters.redelivered == 1


def test_an_acknowledged_message_is_not_redelivered() -> None:
    clock = Clock()
    e = engine(clock, lease=5)
    feed, pipe = new_feed(e, "f"), new_pipe(e)
    join(e, pipe, feed)
    e.publish(feed, [msg("a")])
    seq = fetch(e, pipe)
    e.ack(Slot(pipe, seq))
    clock.now += 10
    assert e.sweep_leases() == 0
    assert not pipe.messages


def test_unfetched_messages_and_a_zero_lease_never_expire() -> None:
    clock = Clock()
    e = engine(clock, lease=5)
    feed = new_feed(e, "f")
    unread, unleased = new_pipe(e), new_pipe(e, lease=0)
    join(e, unread, feed)
    join(e, unleased, feed)
    e.publish(feed, [msg("a")])
    fetch(e, unleased)
    clock.now += 1_000
    assert e.sweep_leases() == 0
    assert ids(unread) == ids(unleased) == ["a"]


def test_a_second_fetch_does_not_extend_the_lease() -> None:
    clock = Clock()
    e = engine(clock, lease=10)
    feed, pipe = new_feed(e, "f"), new_pipe(e)
    join(e, pipe, feed)
    e.publish(feed, [msg("a")])
    fetch(e, pipe)
    clock.now += 8
    fetch(e, pipe)
    clock.now += 2
    assert e.sweep_leases() == 1


def test_after_max_deliveries_the_message_goes_to_the_dead_letter_feed() -> None:
    clock = Clock()
    e = engine(clock, lease=1, max_deliveries=2)
    feed, pipe, inspector = new_feed(e, "f"), new_pipe(e), new_pipe(e)
    join(e, pipe, feed)
    dead = e.public_feed("dead-letter")
    assert dead.type == "rotator"
    e.publish(feed, [msg("poison", body="x" * 10)])
    for _ in range(2):
        fetch(e, pipe)
        clock.now += 1
        e.sweep_leases()
    assert not pipe.messages
    assert e.counters.dead_lettered == 1
    assert [entry[0].prop("message_id") for entry in dead.queue] == ["poison"]
    join(e, inspector, dead)  # a reader who joins later gets what waited
    [letter] = inspector.messages.values()
    headers = dict(letter.spec.headers)
    assert headers["x-death-reason"] == "max-deliveries"
    assert headers["x-delivery-count"] == "2"
    assert headers["x-original-feed"] == "f"
    assert letter.parts == (EmbeddedContent(value="x" * 10),)


def test_a_feed_queue_weighs_in_the_memory_budget_until_it_hands_its_messages_out() -> None:
    """Queued messages count their head and contents (as pipes count them) in the
    feed's queue bytes and in what the engine holds; handed to a pipe, they move there;
    a dead letter weighs its added headers; a deleted feed's queue is let go."""
    clock = Clock()
    e = engine(clock, lease=1, max_deliveries=1)
    held = e.held
    jobs = new_feed(e, "jobs", "rotator")
    header = (("x-trace", "t" * 100),)
    spec = MessageSpec(address="a.b", headers=header, contents=(EmbeddedContent(value="12345"),))
    size = len("a.b") + len("x-trace") + 100 + 5
    assert spec.head_size == size - 5
    e.publish(jobs, [spec, spec])
    assert (jobs.queue_bytes, e.held) == (2 * size, held + 2 * (size + OVERHEAD))
    worker = new_pipe(e)
    join(e, worker, jobs)
    assert (jobs.queue_bytes, worker.bytes) == (0, 2 * size)
    assert e.held == held + 2 * (size + OVERHEAD)  # moved, not counted twice
    fetch(e, worker)
    clock.now += 1
    e.sweep_leases()  # its lease ran out: the dead-letter feed queues it, more headers
    dead = e.public_feed("dead-letter")
    [(letter, _, _, _, letter_size, _)] = dead.queue
    assert letter_size == letter.head_size + 5 == dead.queue_bytes
    assert letter_size > size
    assert e.held == held + size + OVERHEAD + letter_size + OVERHEAD
    before = e.held
    idle = new_feed(e, "idle", "rotator")
    e.publish(idle, [spec])
    assert e.held == before + size + OVERHEAD
    e.delete_feed(idle)
    assert (idle.queue_bytes, e.held) == (0, before)


def test_a_feed_queue_refuses_what_would_pass_its_byte_bound() -> None:
    e = engine(max_feed_queue_bytes=12)
    jobs = new_feed(e, "jobs", "rotator")
    e.publish(jobs, [msg(body="12345"), msg(body="1234567")])
    with pytest.raises(ServiceUnavailable) as caught:
        e.publish(jobs, [msg(body="1")])
    assert "has 12 of 12 bytes queued" in caught.value.reason
    assert e.counters.published == 2
    worker = new_pipe(e, max_messages=1)
    join(e, worker, jobs)  # takes one: room for that many bytes again
    assert jobs.queue_bytes == 7
    e.publish(jobs, [msg(body="12345")])
    assert jobs.queue_bytes == 12


def test_a_pipe_names_its_own_dead_letter_feed_or_none() -> None:
    clock = Clock()
    e = engine(clock, lease=1, max_deliveries=1)
    feed, mine = new_feed(e, "f"), new_feed(e, "my-dead", "fanout")
    catcher, pipe = new_pipe(e), new_pipe(e, dead_letter="/restms/feed/my-dead")
    nowhere = new_pipe(e, dead_letter="")
    join(e, catcher, mine)
    join(e, pipe, feed)
    join(e, nowhere, feed)
    e.publish(feed, [msg("m")])
    fetch(e, pipe)
    fetch(e, nowhere)
    clock.now += 1
    assert e.sweep_leases() == 2
    assert ids(catcher) == ["m"]
    assert e.counters.dead_lettered == 1
    assert e.counters.dead_discarded == 1
    assert not e.public_feed("dead-letter").queue


def test_a_dead_letter_feed_must_exist_when_the_pipe_is_made() -> None:
    e = engine()
    with pytest.raises(BadRequest):
        new_pipe(e, dead_letter="/restms/feed/nope")


def test_wolfpack_a_crashed_workers_message_goes_to_another_worker() -> None:
    """A rotator message fetched by one worker that never acknowledges it goes back to
    the feed, and the next eligible worker gets it, with its redelivery count."""
    clock = Clock()
    e = engine(clock, lease=10)
    jobs = new_feed(e, "jobs", "rotator")
    crashed, healthy = new_pipe(e), new_pipe(e)
    join(e, crashed, jobs)
    join(e, healthy, jobs)
    e.publish(jobs, [msg("J1"), msg("J2")])
    assert (ids(crashed), ids(healthy)) == (["J1"], ["J2"])
    fetch(e, crashed)
    e.ack(Slot(healthy, fetch(e, healthy)))
    clock.now += 10
    assert e.sweep_leases() == 1
    assert ids(crashed) == []
    assert ids(healthy) == ["J1"]
    assert healthy.messages[max(healthy.messages)].redeliveries == 1


def test_ondemand_worker_that_dies_gives_its_message_to_the_next_request() -> None:
    clock = Clock()
    e = engine(clock, lease=10)
    jobs = new_feed(e, "jobs", "rotator")
    worker = new_pipe(e, "ondemand")
    join(e, worker, jobs)
    e.publish(jobs, [msg("J1")])
    worker.demand = 1  # a GET waits on the asynclet (what wait_message sets)
    e.placement.drain(jobs)
    worker.demand = 0
    fetch(e, worker)
    clock.now += 10
    e.sweep_leases()
    assert not worker.messages  # an ondemand pipe holds work only while asked
    assert [entry[0].prop("message_id") for entry in jobs.queue] == ["J1"]


# ---------------------------------------------------------------- limits and overflow
def test_skip_leaves_a_full_pipe_out_and_does_not_count_it() -> None:
    e = engine()
    feed, small, big = new_feed(e, "f"), new_pipe(e, max_messages=2), new_pipe(e)
    join(e, small, feed)
    join(e, big, feed)
    assert e.publish(feed, [msg("1"), msg("2"), msg("3")]) == [2, 2, 1]
    assert ids(small) == ["1", "2"]
    assert e.counters.skipped_full == 1


def test_byte_limits_count_content_bytes() -> None:
    e = engine()
    feed, pipe = new_feed(e, "f"), new_pipe(e, max_bytes=10)
    join(e, pipe, feed)
    assert e.publish(feed, [msg("", "12345"), msg("", "123456"), msg("", "12345")]) == [1, 0, 1]
    assert pipe.bytes == 10
    e.ack(Slot(pipe, next(iter(pipe.messages))))
    assert pipe.bytes == 5


def test_drop_oldest_makes_room_and_counts_what_it_dropped() -> None:
    e = engine()
    feed, pipe = new_feed(e, "f"), new_pipe(e, max_messages=3, overflow="drop-oldest")
    join(e, pipe, feed)
    assert e.publish(feed, [msg(str(n)) for n in range(5)]) == [1] * 5
    assert ids(pipe) == ["2", "3", "4"]
    assert e.counters.dropped_oldest == 2


def test_reject_fails_the_whole_publish_naming_the_pipe_by_title_and_digest() -> None:
    e = engine()
    feed = new_feed(e, "f")
    pipe = new_pipe(e, title="orders", max_messages=2, overflow="reject")
    other = new_pipe(e)
    join(e, pipe, feed)
    join(e, other, feed)
    e.publish(feed, [msg("1")])
    with pytest.raises(ServiceUnavailable) as caught:
        e.publish(feed, [msg("2"), msg("3")])
    reason = caught.value.reason
    assert "'orders'" in reason
    assert "1 of 2 messages" in reason
    assert pipe.key not in reason  # the name is the pipe's capability
    assert caught.value.retry_after > 0
    assert ids(pipe) == ids(other) == ["1"]  # nothing of the refused publish was routed
    assert e.counters.rejected_full == 1
    assert e.publish(feed, [msg("2")]) == [2]


def test_reject_a_message_larger_than_the_pipe_accepts_is_413() -> None:
    e = engine()
    feed, pipe = new_feed(e, "f"), new_pipe(e, max_bytes=4, overflow="reject")
    join(e, pipe, feed)
    with pytest.raises(PayloadTooLarge):
        e.publish(feed, [msg("big", "12345")])


def test_pipe_limits_may_not_pass_the_configured_maximum() -> None:
    e = engine(max_pipe_messages=100)
    with pytest.raises(BadRequest, match="at most 100"):
        new_pipe(e, max_messages=101)
    assert new_pipe(e).max_messages == 100


def test_rotator_skips_pipes_full_by_bytes() -> None:
    e = engine()
    jobs = new_feed(e, "jobs", "rotator")
    small, big = new_pipe(e, max_bytes=3), new_pipe(e)
    join(e, small, jobs)
    join(e, big, jobs)
    e.publish(jobs, [msg("a", "123"), msg("b", "1"), msg("c", "1")])
    assert (ids(small), ids(big)) == (["a"], ["b", "c"])


# ---------------------------------------------------------------- deduplication
def test_a_repeated_message_id_is_answered_not_routed() -> None:
    e = engine()
    feed, pipe = new_feed(e, "f"), new_pipe(e)
    join(e, pipe, feed)
    assert e.publish(feed, [msg("a"), msg("b")]) == [1, 1]
    counts = e.publish(feed, [msg("a"), msg("c")])
    assert counts == [1, 1]
    assert isinstance(counts[0], Duplicate)
    assert not isinstance(counts[1], Duplicate)
    assert ids(pipe) == ["a", "b", "c"]
    assert e.counters.duplicates == 1


def test_a_repeat_within_one_request_is_a_duplicate_of_the_first() -> None:
    e = engine()
    feed, pipe = new_feed(e, "f"), new_pipe(e)
    join(e, pipe, feed)
    counts = e.publish(feed, [msg("a"), msg("a")])
    assert [isinstance(n, Duplicate) for n in counts] == [False, True]
    assert ids(pipe) == ["a"]


def test_one_message_id_in_a_batch_takes_the_remembering_route() -> None:
    # A batch without any message_id is routed without the window; one id among
    # messages without takes the other route, which remembers it and answers repeats.
    e = engine()
    feed, pipe = new_feed(e, "f"), new_pipe(e)
    join(e, pipe, feed)
    assert e.publish(feed, [msg(body="1"), msg(body="2")]) == [1, 1]
    counts = e.publish(feed, [msg(body="3"), msg("x"), msg(body="4"), msg("x")])
    assert [isinstance(n, Duplicate) for n in counts] == [False, False, False, True]
    assert isinstance(e.publish(feed, [msg(body="5"), msg("x")])[1], Duplicate)
    held = [m.spec.prop("message_id") or m.spec.contents[0] for m in pipe.messages.values()]
    assert held == [EmbeddedContent(value=v) if v != "x" else v for v in "123x45"]


def test_the_window_ends_by_time_and_by_count() -> None:
    clock = Clock()
    e = engine(clock, dedup_window=60, dedup_max=2)
    feed, pipe = new_feed(e, "f"), new_pipe(e)
    join(e, pipe, feed)
    e.publish(feed, [msg("a")])
    clock.now += 60
    assert not isinstance(e.publish(feed, [msg("a")])[0], Duplicate)  # the window passed
    e.publish(feed, [msg("b"), msg("c")])  # pushes "a" out: two ids at most
    assert not isinstance(e.publish(feed, [msg("a")])[0], Duplicate)
    assert isinstance(e.publish(feed, [msg("c")])[0], Duplicate)


def test_windows_are_per_feed_and_can_be_off() -> None:
    e = engine()
    one, two, pipe = new_feed(e, "one"), new_feed(e, "two"), new_pipe(e)
    join(e, pipe, one)
    join(e, pipe, two)
    e.publish(one, [msg("a")])
    assert e.publish(two, [msg("a")]) == [1]
    assert ids(pipe) == ["a", "a"]
    off = engine(dedup_window=0)
    feed, pipe = new_feed(off, "f"), new_pipe(off)
    join(off, pipe, feed)
    off.publish(feed, [msg("a"), msg("a")])
    assert ids(pipe) == ["a", "a"]


def test_a_duplicate_does_not_pass_the_rotator_queue_bound() -> None:
    e = engine(max_feed_queue=1)
    jobs = new_feed(e, "jobs", "rotator")
    e.publish(jobs, [msg("J1")])
    assert e.publish(jobs, [msg("J1")]) == [0]  # answered, not queued: no 503
    with pytest.raises(ServiceUnavailable):
        e.publish(jobs, [msg("J2")])


# ---------------------------------------------------------------- idle pipes (Q1)
def test_idle_pipes_are_collected_and_their_rotator_work_goes_back() -> None:
    clock = Clock()
    e = engine(clock, pipe_idle_timeout=600)
    jobs = new_feed(e, "jobs", "rotator")
    idle, busy = new_pipe(e), new_pipe(e)
    join(e, idle, jobs)
    e.publish(jobs, [msg("J1")])
    clock.now += 599
    e.resolve(busy.key)  # a request touched it
    clock.now += 1
    assert e.collect_idle() == 1
    assert idle.deleted
    assert not busy.deleted
    assert [entry[0].prop("message_id") for entry in jobs.queue] == ["J1"]
    assert e.counters.collected == 1


def test_a_pipe_with_a_waiting_reader_or_touched_messages_is_in_use() -> None:
    clock = Clock()
    e = engine(clock, pipe_idle_timeout=10)
    feed, pipe = new_feed(e, "f"), new_pipe(e)
    join(e, pipe, feed)
    e.publish(feed, [msg("a")])
    clock.now += 9
    e.resolve(f"{pipe.key}.1")  # its message was read
    clock.now += 9
    assert e.collect_idle() == 0
    clock.now += 1
    assert e.collect_idle() == 1
    never = engine(clock, pipe_idle_timeout=0)
    kept = new_pipe(never)
    clock.now += 10**6
    assert never.collect_idle() == 0
    assert not kept.deleted


# ---------------------------------------------------------------- routing a batch
def test_a_batch_to_a_direct_feed_is_routed_by_address_not_as_fanout() -> None:
    e = engine()
    feed, one, two = new_feed(e, "d", "direct"), new_pipe(e), new_pipe(e)
    for pipe, address in ((one, "a"), (two, "b")):
        e.create_join(pipe, JoinSpec(feed_path=f"/restms/feed/{feed.key}", address=address))
    batch = [MessageSpec(address=address) for address in "abxa"]
    assert e.publish(feed, batch) == [1, 1, 0, 1]
    assert [m.spec.address for m in one.messages.values()] == ["a", "a"]
    assert [m.spec.address for m in two.messages.values()] == ["b"]


def test_placed_messages_count_their_bytes_and_expiry_in_the_pipe() -> None:
    clock = Clock()
    e = engine(clock)
    feed, pipe = new_feed(e, "f"), new_pipe(e)
    join(e, pipe, feed)
    held = e.held
    e.publish(feed, [msg(body="abc", expiration="1000"), msg(body="de"), msg(expiration="5")])
    size = sum(
        map(len, ("abc", "expiration", "1000", "de", "expiration", "5"))
    )  # contents and properties
    assert (pipe.bytes, pipe.expiring, len(pipe.messages)) == (size, 2, 3)
    assert e.held == held + size + 3 * OVERHEAD
    clock.now += 1
    assert [m.size for m in e.listing(pipe)[0]] == [2]
    assert pipe.expiring == 0
