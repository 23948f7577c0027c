"""One event-loop timer for the deadlines of many waits.

A waiting asynclet (A2, A9) waits for a future that a change of its pipe resolves with
True, or its deadline with False. A timer of its own per wait (``loop.call_later``)
costs about 650 bytes on uvloop: the handle, a libuv timer allocated beside it, an
arguments tuple and an entry in the loop's set of timers. Ten thousand waiting
asynclets would hold 6.5 MB in timers alone. :class:`Deadlines` keeps the deadlines
in a heap instead (a tuple, a float and an int each, about 130 bytes) and holds one
loop timer, armed for the earliest.

A wait that ends before its deadline (the message came, the client went away) leaves
its entry in the heap until that deadline comes up; its future is done by then and
is skipped. So that a busy gateway (waits answered quickly, the next one made at
once, each with a deadline minutes away) does not pile up such entries, the heap is
rebuilt without them once they are more than half of it.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .model import Watchable

# Below this many dead entries, the heap is never rebuilt (a rebuild costs a pass).
REBUILD_AFTER = 64


class Deadlines:
    """Futures resolved with False at their deadline, unless something resolved them first."""

    __slots__ = ("_dead", "_due", "_heap", "_loop", "_order", "_timer")

    def __init__(self) -> None:
        # (deadline in loop time, order of arrival: ties never compare futures, future)
        self._heap: list[tuple[float, int, asyncio.Future[bool]]] = []
        self._order = itertools.count()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._due = math.inf  # when the timer fires
        self._dead = 0  # entries of waits that ended otherwise, still in the heap

    def __len__(self) -> int:
        """Entries in the heap, dead ones included."""
        return len(self._heap)

    def add(self, future: asyncio.Future[bool], timeout: float) -> None:
        """Resolve ``future`` with False in ``timeout`` seconds if it is not done by then.

        The waiter calls :meth:`ended` once it is done waiting, however the wait ended.
        """
        loop = future.get_loop()
        if loop is not self._loop:  # the first wait, or a new loop (tests): start afresh
            self._reset(loop)
        when = loop.time() + timeout
        heapq.heappush(self._heap, (when, next(self._order), future))
        if when < self._due:
            self._arm(loop, when)

    def watch(self, watched: Watchable, timeout: float) -> asyncio.Future[bool]:
        """A future the next touch of ``watched`` resolves with True, or ``timeout``
        seconds from now with False: :meth:`Watchable.changed` without its coroutine or
        its timer, for a waiter that awaits the future in its own frame. The waiter calls
        :meth:`unwatch` once done, however the wait ended (cancelled too)."""
        future = watched.watch()
        self.add(future, timeout)
        return future

    def unwatch(self, watched: Watchable, future: asyncio.Future[bool]) -> None:
        """The wait :meth:`watch` began is over: ``watched`` and the heap forget it."""
        watched.unwatch(future)
        self.ended(future)

    def ended(self, future: asyncio.Future[bool]) -> None:
        """The wait on ``future`` is over. If not by its deadline, its entry is now dead."""
        if not future.cancelled() and future.done() and future.result() is False:
            return  # its deadline resolved it: its entry left the heap then
        self._dead += 1
        if self._dead >= REBUILD_AFTER and 2 * self._dead > len(self._heap):
            heap = [entry for entry in self._heap if not entry[2].done()]
            heapq.heapify(heap)
            self._heap, self._dead = heap, 0
            if not heap and self._timer is not None:
                self._timer.cancel()
                self._timer, self._due = None, math.inf

    def _arm(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._due = when
        self._timer = loop.call_at(when, self._fire, loop)

    def _fire(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer, self._due = None, math.inf
        heap, now = self._heap, loop.time()
        while heap and heap[0][0] <= now:
            future = heapq.heappop(heap)[2]
            if future.done():
                self._dead -= 1
            else:
                future.set_result(False)
        if heap:
            self._arm(loop, heap[0][0])

    def _reset(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._heap, self._loop, self._timer = [], loop, None
        self._due, self._dead = math.inf, 0
