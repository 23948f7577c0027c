"""The shared timer of waits' deadlines (feeds/deadlines.py) and Watchable.watch.

A future is resolved with False at its deadline unless something resolved it first; a
wait that ends otherwise leaves a dead entry, and dead entries never make up most of
a heap past :data:`REBUILD_AFTER`; one loop timer serves every deadline.
"""

from __future__ import annotations

import asyncio

import pytest

from feeds.deadlines import REBUILD_AFTER, Deadlines
from feeds.model import Watchable


def future() -> asyncio.Future[bool]:
    return asyncio.get_running_loop().create_future()


async def test_each_future_is_resolved_false_at_its_deadline_in_order() -> None:
    deadlines = Deadlines()
    late, early = future(), future()
    deadlines.add(late, 1.0)
    deadlines.add(early, 0.02)  # earlier than the armed timer: it is armed again
    async with asyncio.timeout(0.9):
        assert await early is False
    assert not late.done()
    async with asyncio.timeout(2):
        assert await late is False
    assert len(deadlines) == 0


async def test_a_future_resolved_first_keeps_its_result() -> None:
    deadlines = Deadlines()
    woken = future()
    deadlines.add(woken, 0.02)
    woken.set_result(True)
    deadlines.ended(woken)
    await asyncio.sleep(0.04)
    assert woken.result() is True
    assert len(deadlines) == 0  # its dead entry left the heap at its deadline


async def test_ended_by_the_deadline_is_not_counted_dead() -> None:
    deadlines = Deadlines()
    waits = [future() for _ in range(REBUILD_AFTER * 2)]
    for each in waits:
        deadlines.add(each, 0.01)
    await asyncio.sleep(0.03)
    for each in waits:
        deadlines.ended(each)
    assert deadlines._dead == 0


@pytest.mark.parametrize("end", ["woken", "cancelled"])
async def test_dead_entries_never_make_up_most_of_a_large_heap(end: str) -> None:
    deadlines = Deadlines()
    live = [future() for _ in range(10)]
    for each in live:
        deadlines.add(each, 60)
    for _ in range(10 * REBUILD_AFTER):  # waits answered at once, the next made at once
        gone = future()
        deadlines.add(gone, 60)
        if end == "woken":
            gone.set_result(True)
        else:
            gone.cancel()
        deadlines.ended(gone)
        assert len(deadlines) <= max(REBUILD_AFTER, 2 * 10) + 10
    assert not any(each.done() for each in live)


async def test_one_loop_timer_serves_every_deadline() -> None:
    deadlines = Deadlines()
    for delay in (0.5, 0.4, 0.3, 0.6):
        deadlines.add(future(), delay)
    timer = deadlines._timer
    assert timer is not None
    assert not timer.cancelled()
    assert timer.when() == pytest.approx(asyncio.get_running_loop().time() + 0.3, abs=0.05)


async def test_watch_wakes_with_true_and_unwatch_forgets() -> None:
    resource = Watchable(0.0)
    alone = resource.watch()  # one waiter: held without a set
    assert resource.waiting == 1
    resource.unwatch(alone)
    assert resource.waiting == 0
    resource.touch(1.0)
    assert not alone.done()
    alone = resource.watch()
    resource.touch(2.0)
    assert alone.result() is True
    assert resource.waiting == 0
    first, second = resource.watch(), resource.watch()
    assert resource.waiting == 2
    resource.unwatch(second)
    assert resource.waiting == 1
    resource.touch(1.0)
    assert first.result() is True
    assert not second.done()  # forgotten: the touch did not reach it
    assert resource.waiting == 0


async def test_a_deadline_watch_ends_by_touch_or_by_deadline_and_unwatch_clears_it() -> None:
    deadlines, resource = Deadlines(), Watchable(0.0)
    touched = deadlines.watch(resource, 5.0)
    assert (resource.waiting, len(deadlines)) == (1, 1)
    resource.touch(1.0)
    assert await touched is True
    deadlines.unwatch(resource, touched)
    assert resource.waiting == 0  # its heap entry is dead until its deadline comes up
    expired = deadlines.watch(resource, 0.02)
    async with asyncio.timeout(2):
        assert await expired is False
    deadlines.unwatch(resource, expired)
    assert resource.waiting == 0
    resource.touch(2.0)  # nobody waits: nothing to wake, nothing raised


async def test_changed_leaves_no_waiter_behind_however_it_ends() -> None:
    resource = Watchable(0.0)
    assert await resource.changed(0.01) is False  # timed out
    assert resource.waiting == 0
    waiter = asyncio.create_task(resource.changed(5))
    await asyncio.sleep(0.01)
    assert resource.waiting == 1
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert resource.waiting == 0
    waiter = asyncio.create_task(resource.changed(5))
    await asyncio.sleep(0.01)
    resource.touch(1.0)
    assert await waiter is True
