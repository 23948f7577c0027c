"""One gateway per data directory: an exclusive lock on ``<data_dir>/gateway.lock``.

Two gateways on one directory would each answer 200 for persistent publishes into
the same pipe at the same position, and a restart keeps only one of them. The lock
is an ``flock`` held by an open file for the life of the process, so the kernel
releases it however the process ends (``kill -9`` too): a crash never blocks the
next start. The holder's PID is written into the file for the refusal's message.

It is taken by ``main.py serve`` before the event loop runs and before anything in
the directory is opened. The offline ``main.py client`` verbs do not take it: they
never touch the store, and each writes its file under that file's own lock, merging
(:func:`auth.clients.file_lock`), so they are safe beside a running gateway.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from pathlib import Path

LOCK_FILE = "gateway.lock"
_PID_WAIT = 2.0  # seconds a holder may take between its lock and writing its PID


class DataDirError(Exception):
    """The data directory cannot be locked: another process holds it, or it cannot be
    made or opened."""


def lock_data_dir(directory: str | Path) -> int:
    """Lock ``directory`` (made if missing) for this process and return the lock
    file's descriptor, which must stay open as long as the lock is wanted.
    DataDirError naming the directory and the holder's PID when another holds it."""
    path = Path(directory)
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd = os.open(path / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise DataDirError(f"cannot lock the data directory {path}: {exc}") from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(fd)
        os.close(fd)
        raise DataDirError(
            f"a gateway (pid {holder}) holds the data directory {path.resolve()}: one"
            " gateway per data directory; stop it, or give this one another --data-dir"
        ) from None
    except BaseException:
        os.close(fd)
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def _holder(fd: int) -> str:
    """The PID the holder wrote, waiting a little for a holder that has only just
    taken the lock; "unknown" if none appears."""
    deadline = time.monotonic() + _PID_WAIT
    while True:
        with contextlib.suppress(OSError, ValueError):
            return str(int(os.pread(fd, 32, 0).decode().strip()))
        if time.monotonic() >= deadline:
            return "unknown"
        time.sleep(0.05)
