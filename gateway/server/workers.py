"""Several gateway processes on one port: ``main.py serve --workers N``.

With the Redis engine every gateway process is a node of one cluster, so one machine
can run as many as it has cores. The supervisor (this module, in the process the
command started) holds the data directory's lock and starts N worker processes; each
runs the whole gateway (:func:`gateway.server.run.serve`) on the same address with
``SO_REUSEPORT``, so the kernel spreads new connections across them.

- A worker runs in its own session, so a Ctrl-C at the terminal reaches the
  supervisor alone, which then stops every worker the same way (SIGTERM), and a second
  signal is passed on as a second SIGTERM (requests still in flight are cancelled).
- A worker that ends while the supervisor is not stopping (killed, say) is started
  again after a short pause. One that fails by itself soon after its start (it could
  not listen, or reach the cluster) would only fail again: the supervisor then stops
  the others and exits with an error, so a broken set-up is seen at once rather than
  restarted for ever.
- Workers are spawned (not forked): each starts its own interpreter, event loop and
  connections.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess
from types import FrameType

from feeds.service import EngineService
from gateway.server.config import Config
from gateway.server.requestid import configure_logging
from gateway.server.shutdown import CANCEL_WAIT

log = logging.getLogger("gateway.workers")

RESTART_PAUSE = 1.0  # seconds before a worker that ended is started again
EARLY_FAILURE = 10.0  # seconds: a worker that fails sooner after its start is not restarted
STOP_MARGIN = 10.0  # seconds past the shutdown grace before a worker is killed

OpenEngine = Callable[[Config], EngineService]
# gateway.server.run.serve: the whole gateway, until SIGTERM (passed in, as run imports us)
Serve = Callable[..., Coroutine[None, None, None]]


@dataclass(slots=True)
class _Worker:
    index: int
    process: BaseProcess
    started: float


def _work(config: Config, open_engine: OpenEngine, serve: Serve, index: int) -> None:
    """A worker's entry: the whole gateway on the shared port, until SIGTERM."""
    import uvloop

    os.setsid()
    configure_logging(config.log_level, who=f"worker {index} ")
    uvloop.run(serve(config, open_engine, reuse_port=True))


def exit_code(process: BaseProcess) -> int | None:
    """The exit code of a process whose sentinel is ready.

    The sentinel is ready once the process's files are closed, which the kernel does a
    moment before the process can be reaped: ``exitcode`` read at once is often still
    None. Joining reaps it.
    """
    process.join(STOP_MARGIN)
    return process.exitcode


class Supervisor:
    """Starts ``config.workers`` gateway processes and keeps them running until stopped."""

    def __init__(self, config: Config, open_engine: OpenEngine, serve: Serve) -> None:
        self.config = config
        self.open_engine = open_engine
        self.serve = serve
        self._context = multiprocessing.get_context("spawn")
        self._workers: dict[int, _Worker] = {}
        self._signals = 0

    def _start(self, index: int) -> None:
        process = self._context.Process(
            target=_work,
            args=(self.config, self.open_engine, self.serve, index),
            name=f"restms-worker-{index}",
        )
        process.start()
        self._workers[index] = _Worker(index, process, time.monotonic())
        log.info("worker %d started (pid %d)", index, process.pid)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._signals += 1
        for worker in self._workers.values():
            if worker.process.is_alive() and worker.process.pid is not None:
                os.kill(worker.process.pid, signal.SIGTERM)

    def run(self) -> int:
        """Serve until SIGINT or SIGTERM; the exit code for the command (0: stopped)."""
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._on_signal)
        for index in range(self.config.workers):
            self._start(index)
        failed = False
        while not self._signals:
            ended = wait([w.process.sentinel for w in self._workers.values()], timeout=1.0)
            for worker in [w for w in self._workers.values() if w.process.sentinel in ended]:
                code = exit_code(worker.process)
                lived = time.monotonic() - worker.started
                if self._signals:
                    break
                if code is not None and code > 0 and lived < EARLY_FAILURE:
                    log.error(
                        "worker %d ended with exit code %s %.1f s after its start: "
                        "stopping (it would only fail again; see its log above)",
                        worker.index,
                        code,
                        lived,
                    )
                    failed = True
                    self._on_signal(signal.SIGTERM, None)
                    break
                log.warning(
                    "worker %d (pid %s) ended with exit code %s: starting it again",
                    worker.index,
                    worker.process.pid,
                    code,
                )
                time.sleep(RESTART_PAUSE)
                if not self._signals:
                    self._start(worker.index)
        self._stop()
        return 1 if failed else 0

    def _stop(self) -> None:
        deadline = time.monotonic() + self.config.shutdown_grace + CANCEL_WAIT + STOP_MARGIN
        for worker in self._workers.values():
            worker.process.join(max(0.0, deadline - time.monotonic()))
            if worker.process.is_alive():
                log.warning("worker %d did not stop in time: killed", worker.index)
                worker.process.kill()
                worker.process.join()
        log.info("all %d workers stopped", len(self._workers))
