"""A progress line on the terminal while the command line waits for something slow.

``main.py analytics`` starts Spark in its own process (a JVM: a minute on a small
machine) and then runs a query; without a sign of life a user would think it hung.
:class:`Progress` shows, on standard error and only when that is a terminal, what is
awaited and for how long (``starting Spark ... 12 s``), redrawn in place a few times a
second by a background thread, and erases it when the step is done, so that the answer
printed on standard output (or piped elsewhere) is never mixed with it. When standard
error is not a terminal (a pipe, a log file, a test) it writes nothing at all.
"""

from __future__ import annotations

import threading
import time
from types import TracebackType
from typing import TextIO

FRAMES = "|/-\\"
CLEAR = "\r\x1b[K"  # back to the start of the line, and erase it


class Progress:
    """``with Progress(sys.stderr, "starting Spark") as progress: ...; progress.step(...)``"""

    def __init__(self, stream: TextIO, what: str, *, every: float = 0.2) -> None:
        self.stream = stream
        self.what = what
        self.every = every
        self.shown = stream.isatty()
        self._began = time.monotonic()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="progress", daemon=True)

    def step(self, what: str) -> None:
        """Now waiting for ``what`` (the clock starts again)."""
        self.what, self._began = what, time.monotonic()

    def _run(self) -> None:
        frame = 0
        while not self._done.wait(self.every):
            waited = time.monotonic() - self._began
            line = f"{CLEAR}{FRAMES[frame % len(FRAMES)]} {self.what} ... {waited:.0f} s"
            self.stream.write(line)
            self.stream.flush()
            frame += 1

    def __enter__(self) -> Progress:
        if self.shown:
            self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        if not self.shown:
            return
        self._done.set()
        self._thread.join()
        self.stream.write(CLEAR)
        self.stream.flush()
