"""The command line's progress line (admincli/progress.py).

Decided behaviour under test: on a terminal (a real pseudo-terminal here) the line
says what is awaited and for how long, follows a step, and is erased at the end; when
standard error is not a terminal nothing at all is written.
"""

from __future__ import annotations

import io
import os
import select
import time

from admincli.progress import CLEAR, Progress


def test_a_terminal_sees_what_is_awaited_and_the_line_is_erased() -> None:
    leader, follower = os.openpty()
    terminal = os.fdopen(follower, "w")
    try:
        with Progress(terminal, "starting Spark", every=0.01) as progress:
            time.sleep(0.1)
            progress.step("running the latency query")
            time.sleep(0.1)
        shown = ""
        while select.select([leader], [], [], 0.2)[0]:  # a pty hands its output in pieces
            shown += os.read(leader, 65536).decode()
    finally:
        terminal.close()
        os.close(leader)
    assert "starting Spark ... 0 s" in shown
    assert "running the latency query ... 0 s" in shown
    assert shown.endswith(CLEAR)


def test_nothing_is_written_where_stderr_is_not_a_terminal() -> None:
    piped = io.StringIO()
    with Progress(piped, "starting Spark", every=0.01):
        time.sleep(0.05)
    assert piped.getvalue() == ""
