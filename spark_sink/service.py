"""The gateway's side of analytics: the worker process, a cache, shared computations
(docs/ANALYTICS.md, "How the gateway runs Spark", "Caching and timeouts").

Theory of operation. :class:`Worker` owns one ``python -m spark_sink.worker`` child
process, started in the background when the gateway starts (:meth:`Worker.preload`,
``analytics_preload``), else on the first request, and again after it ended or was
stopped. Its lifecycle is the state machine :data:`TRANSITIONS`; the state, since when
and why are :meth:`Worker.status`, which ``GET /admin/analytics`` and ``/readyz`` show.
A worker that answered nothing for ``idle_seconds`` is stopped and its memory
released (``idle-released``); the next request starts a new one. It sends one JSON line per
request and awaits one answer line: the event loop only awaits pipe I/O, never Spark.
Requests go one at a time (Spark on a small machine gains nothing from two scans at
once), at most ``max_pending`` wait behind the running one and more are refused at
once (:class:`Busy`). A request that outlives its timeout kills the worker
(:class:`TimedOut`): a stuck Spark job cannot be trusted to end, and the next request
starts a fresh worker, whose streaming job resumes from its checkpoint.

:class:`Analytics` sits in front: parameters are checked here first (a bad one never
reaches the worker), answers are cached for ``cache_seconds`` under the request's
normalised words (:func:`spark_sink.params.cache_key`), and identical requests while
one is computed share that one computation. A computation is shielded from the
requests awaiting it: a client that goes away does not cancel work that others wait
for, and its answer still fills the cache.

Error tree (``status`` is the HTTP status the gateway answers with)::

    AnalyticsError                  503
    ├── Refused                     400  a bad query name or parameter
    ├── Busy                        503  too many requests waiting for the worker
    ├── WorkerFailed                503  the worker could not start, or ended
    ├── Off                         503  analytics are turned off (no worker at all)
    └── TimedOut                    504  a request took longer than its timeout
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import itertools
import json
import logging
import sys
import time
from collections import OrderedDict
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from .params import cache_key, check_query, parse

log = logging.getLogger(__name__)

LINE_LIMIT = 16 * 1024 * 1024  # bytes of one answer at most
CACHE_ENTRIES = 256  # answers kept at most (the oldest go first)
STOP_WAIT = 15.0  # seconds a worker gets to end after its input closes
ROOT = Path(__file__).resolve().parents[1]  # the worker runs from the project's root
# An answer whose range reaches the last RECENT seconds is reused FRESH seconds at most,
# whatever the cache time: new traffic shows in queries within ten seconds.
RECENT = 60.0
FRESH = 2.0

# The worker's lifecycle. The rules: a worker is started from any state but "starting"
# and "ready" (preload, or a request); a start ends "ready" or "failed" (no Java, a bad
# master, no ready line in time); a ready worker is stopped by the gateway ("stopped"),
# for idleness ("idle-released"), or ends otherwise ("failed": it died, answered out of
# turn, or was killed because a query outlived its timeout).
STOPPED = "stopped"
STARTING = "starting"
READY = "ready"
IDLE_RELEASED = "idle-released"
FAILED = "failed"
TRANSITIONS: dict[str, frozenset[str]] = {
    STOPPED: frozenset({STARTING}),
    STARTING: frozenset({READY, FAILED, STOPPED}),
    READY: frozenset({STOPPED, IDLE_RELEASED, FAILED}),
    IDLE_RELEASED: frozenset({STARTING, STOPPED}),
    FAILED: frozenset({STARTING, STOPPED}),
}


class AnalyticsError(Exception):
    status = 503

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Refused(AnalyticsError):
    status = 400


class Busy(AnalyticsError):
    status = 503


class WorkerFailed(AnalyticsError):
    status = 503


class TimedOut(AnalyticsError):
    status = 504


class Off(AnalyticsError):
    status = 503


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerConfig:
    """How to start the worker (see ``python -m spark_sink.worker --help``)."""

    lake: str
    checkpoint: str
    snapshot: str
    master: str = "local[*]"
    interval: float = 10.0  # seconds between streaming triggers
    max_files: int = 100  # new files per streaming trigger at most
    partitions: int = 4  # spark.sql.shuffle.partitions
    memory: str = "1g"  # spark.driver.memory
    stream: bool = True
    start_timeout: float = 120.0  # seconds the worker has to say it is ready
    log_file: str = ""  # the worker's standard error ("": the gateway's)
    python: str = field(default=sys.executable)

    def __post_init__(self) -> None:
        if self.interval <= 0 or self.start_timeout <= 0:
            raise ValueError("the streaming interval and start timeout must be positive")
        if self.max_files < 1 or self.partitions < 1:
            raise ValueError("max_files and partitions must be at least 1")

    def argv(self) -> list[str]:
        args = [
            self.python,
            "-m",
            "spark_sink.worker",
            f"--lake={self.lake}",
            f"--master={self.master}",
            f"--checkpoint={self.checkpoint}",
            f"--snapshot={self.snapshot}",
            f"--interval={self.interval:g}",
            f"--max-files={self.max_files}",
            f"--partitions={self.partitions}",
            f"--memory={self.memory}",
        ]
        return args if self.stream else [*args, "--no-stream"]


def _open_log(path: str) -> IO[bytes]:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    return open(path, "ab")  # handed to the child process; closed by stop()


class Worker:
    """One worker process at a time, started when needed, one request at a time."""

    def __init__(
        self, config: WorkerConfig, *, max_pending: int = 8, idle_seconds: float = 0.0
    ) -> None:
        self.config = config
        self.max_pending = max_pending
        self.idle_seconds = idle_seconds  # 0: never released for idleness
        self.starts = 0  # workers started so far
        self._process: asyncio.subprocess.Process | None = None
        self._log: IO[bytes] | None = None
        self._lock = asyncio.Lock()
        self._waiting = 0
        self._ids = itertools.count(1)
        self.state = STOPPED
        self._since = time.time()
        self._reason = ""
        self._used = time.monotonic()  # when the last request ended
        self._tasks: set[asyncio.Task[None]] = set()  # the preload and the idle watch

    def _enter(self, state: str, reason: str = "") -> None:
        """Move to ``state`` (a transition of :data:`TRANSITIONS`; staying is no move)."""
        if state == self.state:
            return
        if state not in TRANSITIONS[self.state]:
            raise RuntimeError(f"analytics worker: no transition {self.state} -> {state}")
        self.state, self._since, self._reason = state, time.time(), reason
        log.info("analytics worker %s", state, extra={"reason": reason} if reason else None)

    def status(self) -> dict[str, Any]:
        """The state, since when (UTC), why (for "failed"), the process and the starts."""
        since = datetime.datetime.fromtimestamp(self._since, datetime.UTC)
        process = self._process
        return {
            "state": self.state,
            "since": since.isoformat(timespec="seconds").replace("+00:00", "Z"),
            "reason": self._reason,
            "pid": process.pid if process is not None and process.returncode is None else None,
            "starts": self.starts,
            "idle_seconds": self.idle_seconds,
        }

    def preload(self) -> None:
        """Start the worker in the background now (a failure shows in the state)."""
        self._spawn(self._preload())

    async def _preload(self) -> None:
        with contextlib.suppress(AnalyticsError):
            async with self._lock:
                await self._start()

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _watch_idle(self, process: asyncio.subprocess.Process) -> None:
        """Stop ``process`` once it answered nothing for ``idle_seconds``."""
        while self._process is process and process.returncode is None:
            left = self._used + self.idle_seconds - time.monotonic()
            if left > 0 or self._lock.locked():
                await asyncio.sleep(max(left, 0.1))
                continue
            async with self._lock:
                if self._process is not process or self._waiting:
                    continue
                if self._used + self.idle_seconds > time.monotonic():
                    continue
                await self._close(process)
                self._enter(IDLE_RELEASED, f"no query for {self.idle_seconds:g} s")
            return

    @property
    def running(self) -> bool:
        """Whether a worker process is alive now."""
        return self._process is not None and self._process.returncode is None

    async def _start(self) -> asyncio.subprocess.Process:
        process = self._process
        if process is not None and process.returncode is None:
            return process
        await self._reap()
        if self.state == READY:  # it ended by itself since the last request
            self._enter(FAILED, "the analytics worker ended")
        self._enter(STARTING)
        if self.config.log_file and self._log is None:
            self._log = await asyncio.to_thread(_open_log, self.config.log_file)
        process = await asyncio.create_subprocess_exec(
            *self.config.argv(),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=self._log,
            cwd=ROOT,
            limit=LINE_LIMIT,
        )
        self._process = process
        self.starts += 1
        log.info("analytics worker started", extra={"pid": process.pid})
        try:
            async with asyncio.timeout(self.config.start_timeout):
                line = await self._read(process)
        except TimeoutError:
            await self._reap()
            raise self._failed(
                f"the analytics worker did not start within {self.config.start_timeout:g} s"
            ) from None
        except WorkerFailed as exc:
            raise self._failed(exc.reason) from None
        except asyncio.CancelledError:
            await self._reap()
            self._enter(STOPPED, "its start was cancelled")
            raise
        if not line.get("ready"):
            await self._reap()
            raise self._failed(f"the analytics worker could not start: {line.get('error')}")
        self._enter(READY)
        self._used = time.monotonic()
        if self.idle_seconds > 0:
            self._spawn(self._watch_idle(process))
        return process

    def _failed(self, reason: str) -> WorkerFailed:
        """The worker is failed, for ``reason``: the error to raise."""
        self._enter(FAILED, reason)
        return WorkerFailed(reason)

    async def _read(self, process: asyncio.subprocess.Process) -> dict[str, Any]:
        if process.stdout is None:
            raise WorkerFailed("the analytics worker has no output pipe")
        try:
            line = await process.stdout.readline()
        except (ValueError, asyncio.LimitOverrunError):
            await self._reap()
            raise WorkerFailed("the analytics worker's answer is too large") from None
        if not line:
            await self._reap()
            raise WorkerFailed("the analytics worker ended (its log has the reason)")
        answer = json.loads(line)
        if not isinstance(answer, dict):
            raise WorkerFailed("the analytics worker answered something that is not an object")
        return answer

    async def ask(self, request: Mapping[str, Any], timeout: float) -> dict[str, Any]:
        """Send one request and return its result (raises :class:`AnalyticsError`)."""
        if self._waiting >= self.max_pending:
            raise Busy(f"{self._waiting} analytics requests are waiting already; try later")
        self._waiting += 1
        try:
            async with self._lock:
                process = await self._start()
                ident = next(self._ids)
                line = json.dumps({**request, "id": ident}).encode() + b"\n"
                if process.stdin is None:
                    raise WorkerFailed("the analytics worker has no input pipe")
                try:
                    async with asyncio.timeout(timeout):
                        process.stdin.write(line)
                        await process.stdin.drain()
                        answer = await self._read(process)
                except TimeoutError:
                    log.warning("analytics request timed out; worker stopped", extra=request)
                    await self._reap()
                    reason = f"the analytics query took longer than {timeout:g} s"
                    self._enter(FAILED, reason + "; the worker was stopped")
                    raise TimedOut(reason) from None
                except (ConnectionError, BrokenPipeError):
                    await self._reap()
                    raise self._failed("the analytics worker ended") from None
                except WorkerFailed as exc:
                    raise self._failed(exc.reason) from None
                except asyncio.CancelledError:  # its answer would come to the next request
                    await self._reap()
                    self._enter(FAILED, "a request was cancelled while it ran")
                    raise
                finally:
                    self._used = time.monotonic()
        finally:
            self._waiting -= 1
        if answer.get("id") != ident:
            await self._reap()
            raise self._failed("the analytics worker answered out of turn")
        if "error" in answer:
            if answer.get("status") == 400:
                raise Refused(str(answer["error"]))
            raise AnalyticsError(f"the analytics query failed: {answer['error']}")
        result: dict[str, Any] = answer["result"]
        return result

    async def _reap(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        if process.returncode is None:
            process.kill()
        await process.wait()

    async def _close(self, process: asyncio.subprocess.Process) -> None:
        """End ``process`` gently: its input closes, it stops its streaming job and exits
        (killed after :data:`STOP_WAIT` seconds)."""
        if process.returncode is None and process.stdin is not None:
            process.stdin.close()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(STOP_WAIT):
                    await process.wait()
        await self._reap()

    async def stop(self) -> None:
        """End the worker (a worker still starting is killed: it cannot be asked)."""
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        process = self._process
        if process is not None:
            await self._close(process)
        if self.state != STOPPED:
            self._enter(STOPPED, "the gateway stopped it")
        if self._log is not None:
            log_file, self._log = self._log, None
            await asyncio.to_thread(log_file.close)


@dataclass(slots=True)
class Counters:
    hits: int = 0  # answered from the cache
    shared: int = 0  # answered by a computation another request started
    computed: int = 0  # computations started
    failed: int = 0  # computations that ended in an error


class Analytics:
    """Checked, cached and shared queries over one :class:`Worker`."""

    def __init__(
        self, worker: Worker, *, cache_seconds: float, timeout: float, enabled: bool = True
    ) -> None:
        self.worker = worker
        self.cache_seconds = cache_seconds
        self.timeout = timeout
        self.enabled = enabled  # off: checked queries are refused (Off), no worker starts
        self.counters = Counters()
        self._cache: OrderedDict[tuple[str, ...], tuple[float, dict[str, Any]]] = OrderedDict()
        self._running: dict[tuple[str, ...], asyncio.Task[dict[str, Any]]] = {}

    async def query(self, name: str, raw: Mapping[str, str]) -> tuple[dict[str, Any], str]:
        """The answer to a query and how it was had: "hit", "shared" or "miss"."""
        try:
            check_query(name)
            params = parse(raw)
        except ValueError as exc:
            raise Refused(str(exc)) from None
        if not self.enabled:
            raise Off("analytics are off in this gateway (the setting analytics = false)")
        key = cache_key(name, raw)
        cached = self._cache.get(key)
        if cached is not None and cached[0] > time.monotonic():
            self.counters.hits += 1
            return cached[1], "hit"
        task = self._running.get(key)
        how = "shared"
        if task is None:
            how = "miss"
            self.counters.computed += 1
            request = {"op": "query", "query": name, "params": params.wire()}
            task = asyncio.create_task(self.worker.ask(request, self.timeout))
            self._running[key] = task
            keep = self.cache_seconds
            if params.until.timestamp() > time.time() - RECENT:
                keep = min(keep, FRESH)  # new traffic must show soon
            task.add_done_callback(lambda done: self._settle(key, done, keep))
        else:
            self.counters.shared += 1
        return await asyncio.shield(task), how

    def _settle(
        self, key: tuple[str, ...], task: asyncio.Task[dict[str, Any]], keep: float
    ) -> None:
        self._running.pop(key, None)
        if task.cancelled() or task.exception() is not None:
            self.counters.failed += 1
            return
        if keep > 0:
            self._cache[key] = (time.monotonic() + keep, task.result())
            self._cache.move_to_end(key)
            while len(self._cache) > CACHE_ENTRIES:
                self._cache.popitem(last=False)

    async def sync(self) -> dict[str, Any]:
        """Have the streaming job take in every file in the lake now (tests, tools)."""
        return await self.worker.ask({"op": "sync"}, self.timeout)

    def status(self) -> dict[str, Any]:
        """What ``GET /admin/analytics`` shows: on or off, the worker, the cache."""
        return {
            "enabled": self.enabled,
            "worker": self.worker.status(),
            "cache": self.stats(),
        }

    def start(self, *, preload: bool) -> None:
        """The gateway started: with ``preload`` (and analytics on), the worker starts
        in the background now rather than on the first query."""
        if preload and self.enabled:
            self.worker.preload()

    def stats(self) -> dict[str, Any]:
        return {
            "hits": self.counters.hits,
            "shared": self.counters.shared,
            "computed": self.counters.computed,
            "failed": self.counters.failed,
            "cached": len(self._cache),
            "running": len(self._running),
            "worker_starts": self.worker.starts,
        }

    async def stop(self) -> None:
        for task in list(self._running.values()):
            task.cancel()
        for task in list(self._running.values()):
            with contextlib.suppress(asyncio.CancelledError, AnalyticsError):
                await task
        await self.worker.stop()
