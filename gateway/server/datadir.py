"""The data directory, made private before anything is written into it.

The store holds webhook secrets and persistent message bodies, the ``oauth``
directory keys and client secrets: nobody but the gateway's user may read them.
Modes set where each file is created would miss the files others create for us
(SQLite's ``-wal`` and ``-shm``, the lake written by the mirror's process, Spark's
checkpoints), so :func:`prepare` sets the process umask to ``0o077`` before the
gateway creates anything: every file is then 0600 and every directory 0700,
whatever umask the gateway was started with, and child processes inherit it.

Files an older version left readable (it followed the umask, often 022) are
tightened at start. A directory that others may *write* into is refused rather
than fixed: someone else could already have put or replaced a file in it, which
no mode change undoes; the operator decides. A data directory the gateway cannot
write into (read-only mount, wrong owner) is refused at start with one line,
before the store fails halfway through opening.
"""

from __future__ import annotations

import logging
import os
import stat
import tempfile
from pathlib import Path

from gateway.server.config import ConfigError

log = logging.getLogger(__name__)

PRIVATE_UMASK = 0o077
OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH
OTHERS_ANY = stat.S_IRWXG | stat.S_IRWXO


def prepare(data_dir: str) -> None:
    """Make ``data_dir`` (created if missing) and everything in it private to this
    user, and check that it is writable; :class:`ConfigError` with one line saying
    what is wrong and what to do when it cannot be used."""
    os.umask(PRIVATE_UMASK)
    path = Path(data_dir)
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"data directory {path} cannot be created: {exc.strerror}") from exc
    if not path.is_dir():
        raise ConfigError(f"data directory {path} is not a directory")
    _shared(path)
    _writable(path)
    tree = _tree(path)
    for directory in tree:
        if directory.is_dir() and not directory.is_symlink():
            _shared(directory)
    tightened = sum(_tighten(entry) for entry in [path, *tree])
    if tightened:
        log.warning("%s: %d files or directories were open to others: now private", path, tightened)


def _shared(directory: Path) -> None:
    mode = directory.stat().st_mode
    if mode & OTHERS_WRITE:
        raise ConfigError(
            f"data directory {directory} is writable by others (mode"
            f" {stat.S_IMODE(mode):04o}); check what is in it, then run"
            f" 'chmod 700 {directory}'"
        )


def _tree(path: Path) -> list[Path]:
    """Everything under ``path``, not following symbolic links."""
    found: list[Path] = []
    for top, dirs, files in os.walk(path):
        found += (Path(top, name) for name in [*dirs, *files])
    return found


def _writable(path: Path) -> None:
    try:
        fd, probe = tempfile.mkstemp(prefix=".write-test-", dir=path)
    except OSError as exc:
        raise ConfigError(
            f"data directory {path} is not writable ({exc.strerror}); the gateway"
            " needs to write its store there: give its user write access, or choose"
            " another data_dir"
        ) from exc
    os.close(fd)
    os.unlink(probe)


def _tighten(entry: Path) -> bool:
    """Take group and other permissions off ``entry``; whether it had any (symbolic
    links are left as they are: their own mode means nothing on Linux)."""
    mode = entry.lstat().st_mode
    if stat.S_ISLNK(mode) or not mode & OTHERS_ANY:
        return False
    try:
        entry.chmod(stat.S_IMODE(mode) & ~OTHERS_ANY)
    except OSError as exc:
        raise ConfigError(
            f"{entry} in the data directory cannot be made private ({exc.strerror});"
            " it must belong to the gateway's user"
        ) from exc
    return True
