"""Revoked clients of the built-in authorization server, and the tokens that die with them.

A bearer token is a signed JWT: once issued it is valid until its ``exp`` wherever its
signature is checked, and removing its client from the clients file only stops new
tokens. Revoking a client (``DELETE /admin/clients/{id}``, docs/AUTH.md) also records
the time of the revocation under the client id; from then on every token of the
built-in issuer whose subject is that client and whose ``iat`` is not after that time
(plus :data:`MARGIN`) is refused, including tokens the verifier has cached.

The record is kept in :data:`REVOKED_FILE` in the data directory (0600, written
atomically), read at start-up, so a restart does not bring revoked tokens back. An
entry is useful only while a token issued before it could still be unexpired: entries
older than ``keep`` seconds (the token lifetime plus the clock leeway) are dropped.

``iat`` has a resolution of one second, and a token request may be under way while a
client is revoked, so tokens issued up to :data:`MARGIN` seconds after the revocation
are refused too: a client re-added under the same id gets working tokens after that.

:meth:`Revocations.refuses` is a dict lookup (the hot path: every bearer request of
the built-in issuer); :meth:`Revocations.load` and :meth:`Revocations.revoke` do
blocking file I/O and must be called through ``asyncio.to_thread`` from an event loop.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path

from .clients import check_client_id, write_private

REVOKED_FILE = Path("oauth", "revoked.json")  # relative to the data directory
MARGIN = 1.0  # seconds after a revocation during which new tokens are still refused


class Revocations:
    """Client id -> Unix time of its revocation, kept in ``path`` (None: in memory)."""

    def __init__(
        self, path: Path | None, keep: float, clock: Callable[[], float] = time.time
    ) -> None:
        self.path = path
        self.keep = keep
        self._clock = clock
        # Read-only to others: replaced whole on each change, so a reader on the loop
        # never sees one half-changed. Empty in the usual case: one truth test per token.
        self.at: dict[str, float] = {}
        self._lock = threading.Lock()  # revocations written from worker threads

    def __len__(self) -> int:
        return len(self.at)

    def refuses(self, client_id: str | None, issued: float | None) -> bool:
        """Whether a token of the built-in issuer for ``client_id`` issued at ``issued``
        (its ``iat``; None: unknown, refused) predates that client's revocation."""
        if not self.at or client_id is None:
            return False
        revoked = self.at.get(client_id)
        if revoked is None:
            return False
        return issued is None or issued <= revoked + MARGIN

    def load(self) -> None:
        """Read the file (blocking); a missing file is an empty list, a malformed one a
        ValueError (starting without it would bring revoked tokens back)."""
        if self.path is None:
            return
        try:
            data = json.loads(self.path.read_bytes())
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            raise ValueError(f"cannot read the revocation list {self.path}: {exc}") from exc
        if not isinstance(data, dict) or data.get("version") != 1:
            raise ValueError(f"the revocation list {self.path} is malformed")
        entries = data.get("revoked")
        if not isinstance(entries, dict):
            raise ValueError(f"the revocation list {self.path} is malformed")
        at: dict[str, float] = {}
        for client_id, when in entries.items():
            if not isinstance(when, int | float) or isinstance(when, bool):
                raise ValueError(f"the revocation list {self.path} is malformed")
            at[check_client_id(client_id)] = float(when)
        with self._lock:
            self.at = self._pruned(at)

    def revoke(self, client_id: str) -> float:
        """Record that ``client_id`` is revoked now, on disk before this returns
        (blocking); returns the time recorded."""
        check_client_id(client_id)
        with self._lock:
            now = self._clock()
            at = self._pruned({**self.at, client_id: now})
            if self.path is not None:
                document = {"version": 1, "revoked": at}
                self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                write_private(self.path, json.dumps(document, indent=2).encode() + b"\n")
            self.at = at
        return now

    def _pruned(self, at: dict[str, float]) -> dict[str, float]:
        """Without entries every token issued before which has expired."""
        cutoff = self._clock() - self.keep - MARGIN
        return {client_id: when for client_id, when in at.items() if when > cutoff}
