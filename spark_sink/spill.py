"""Where the mirror's writer thread puts frames while the writer process is behind.

Theory of operation
-------------------
The writer thread (:mod:`spark_sink.writer`) hands the writer process one marshalled
frame of events every ``poll_seconds``. When the process is slower than the gateway
(a burst of batched publishes on a machine whose cores are all busy), a blocking hand
over would stop the thread, the in-memory queue would fill, and events would be
dropped. Instead the thread appends the frames the process has no room for to a
:class:`Spill`, a file on the local disk, and hands them over in order once the process
has caught up. The queue therefore only has to hold what arrives between two of the
thread's polls, and the disk, which is far larger, takes a burst.

The file is an unnamed temporary file (``O_TMPFILE`` or created and unlinked at once),
so a crash leaves nothing behind; each frame is stored as its length, its row count
and its bytes. It is emptied (truncated) whenever everything in it has been handed
over; when a frame would take the file past ``limit`` bytes while its head has been
handed over already, the frames still waiting are moved to its start first. A frame
for which the waiting frames leave no room within ``limit`` is refused: the caller
counts its rows as dropped. Only the writer thread uses a spill: no lock.
"""

from __future__ import annotations

import os
import struct
import tempfile
from collections import deque
from pathlib import Path
from typing import IO

_HEADER = struct.Struct("<II")  # frame length, rows
REWIND_CHUNK = 1 << 20  # bytes copied at a time when the waiting frames move to the start


class Spill:
    """A first-in first-out file of frames, at most ``limit`` bytes."""

    def __init__(self, directory: str, limit: int) -> None:
        self.directory = directory
        self.limit = limit
        self._file: IO[bytes] | None = None
        self._frames: deque[tuple[int, int, int]] = deque()  # (offset, length, rows)
        self._end = 0  # where the next frame goes
        self.rows = 0  # rows waiting in the file
        self.peak = 0  # the most bytes the file ever held
        self.total_rows = 0  # rows ever spilled

    @property
    def size(self) -> int:
        """Bytes waiting in the file."""
        return self._end - (self._frames[0][0] if self._frames else self._end)

    def __len__(self) -> int:
        return len(self._frames)

    def push(self, frame: bytes, rows: int) -> bool:
        """Keep one frame at the end; False (nothing written) when it would not fit or
        the disk refused it."""
        size = _HEADER.size + len(frame)
        if self.size + size > self.limit:
            return False
        try:
            file = self._open()
            if self._end + size > self.limit:  # the file's head was handed over: reuse it
                self._rewind(file)
            file.seek(self._end)
            file.write(_HEADER.pack(len(frame), rows))
            file.write(frame)
        except OSError:
            return False
        self._frames.append((self._end + _HEADER.size, len(frame), rows))
        self._end += size
        self.rows += rows
        self.total_rows += rows
        self.peak = max(self.peak, self.size)
        return True

    def _rewind(self, file: IO[bytes]) -> None:
        """Move the frames still waiting to the start of the file and cut it there, so
        that the file never holds more than ``limit`` bytes on disk."""
        start = self._frames[0][0] - _HEADER.size
        file.flush()
        for offset in range(start, self._end, REWIND_CHUNK):
            file.seek(offset)
            chunk = file.read(min(REWIND_CHUNK, self._end - offset))
            file.seek(offset - start)
            file.write(chunk)
        self._end -= start
        file.truncate(self._end)
        self._frames = deque((at - start, length, rows) for at, length, rows in self._frames)

    def pop(self) -> tuple[bytes, int] | None:
        """The oldest frame and its rows, taken out; None when the spill is empty."""
        if not self._frames or self._file is None:
            return None
        offset, length, rows = self._frames.popleft()
        self._file.flush()
        self._file.seek(offset)
        frame = self._file.read(length)
        self.rows -= rows
        if not self._frames:  # all handed over: start the file again
            self._end = 0
            self._file.seek(0)
            self._file.truncate()
        return frame, rows

    def _open(self) -> IO[bytes]:
        if self._file is None:
            Path(self.directory).mkdir(parents=True, exist_ok=True)
            # Kept open across calls (closed by close()): no context manager fits.
            self._file = tempfile.TemporaryFile(dir=self.directory, prefix="mirror-spill-")  # noqa: SIM115
        return self._file

    def close(self) -> None:
        """Forget the file (its space is freed: it has no name)."""
        if self._file is not None:
            file, self._file = self._file, None
            file.close()
        self._frames.clear()
        self._end = self.rows = 0


def default_directory(data_dir: str) -> str:
    """Where a gateway's mirror spills: ``<data_dir>/mirror/spill``."""
    return os.path.join(data_dir, "mirror", "spill")
