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

The file has more than one writer: the running gateway (the admin API) and the
offline ``main.py client revoke``. Each write happens under an exclusive lock on a
lock file and merges what the file holds, so neither loses the other's entries, and
the gateway notices a new version of the file (:meth:`Revocations.refresh`: a changed
inode, size, mtime or ctime, as :class:`auth.clients.ClientStore` does) to learn of
revocations it did not make.

One token alone can be revoked too (RFC 7009, ``POST /oauth/revoke``): its entry is
named ``<client id>:<jti>`` (:func:`token_entry`; a client id has no ``:``), kept and
dropped like a client's, and refuses that token only, whatever its ``iat``.

``iat`` has a resolution of one second, and a token request may be under way while a
client is revoked, so tokens issued up to :data:`MARGIN` seconds after the revocation
are refused too: a client re-added under the same id gets working tokens after that.

:meth:`Revocations.refuses` is a dict lookup (the hot path: every bearer request of
the built-in issuer); :meth:`Revocations.load`, :meth:`Revocations.refresh` and
:meth:`Revocations.revoke` do blocking file I/O and must be called through
``asyncio.to_thread`` from an event loop; the gateway calls their async faces
:meth:`Revocations.update` and :meth:`Revocations.record`, which do so. Those make the
interface :class:`RevocationList`, which :class:`auth.cluster.RedisRevocations` serves
too, when several nodes share one list (docs/AUTH.md, "Several nodes").
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Protocol

from .clients import check_client_id, file_lock, write_private

REVOKED_FILE = Path("oauth", "revoked.json")  # relative to the data directory
MARGIN = 1.0  # seconds after a revocation during which new tokens are still refused
CLIENT_REVOKED = "its client was revoked"  # why a token is refused, as a reply says it
TOKEN_REVOKED = "the token was revoked"  # noqa: S105 (a reason, not a password)
_TOKEN_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")  # a jti of the built-in issuer


def token_entry(client_id: str, token_id: str) -> str:
    """The entry that revokes one token: its client id and its ``jti``; ValueError when
    either is malformed."""
    if not _TOKEN_ID.fullmatch(token_id):
        raise ValueError("a token id must be 1 to 64 of A-Z a-z 0-9 _ -")
    return f"{check_client_id(client_id)}:{token_id}"


def check_entry(entry: str) -> str:
    """``entry`` if it names a client or one of its tokens (:func:`token_entry`); else
    ValueError."""
    client_id, colon, token_id = entry.partition(":")
    if colon:
        token_entry(client_id, token_id)
    else:
        check_client_id(client_id)
    return entry


def client_of(entry: str) -> str:
    """The client an entry revokes, or whose token it revokes."""
    return entry.partition(":")[0]


def refused(
    at: Mapping[str, float],
    client_id: str | None,
    issued: float | None,
    token_id: str | None = None,
) -> str | None:
    """Why a token of the built-in issuer for ``client_id`` issued at ``issued`` (its
    ``iat``; None: unknown, refused) with the ``jti`` ``token_id`` is refused by ``at``:
    it predates its client's revocation (:data:`CLIENT_REVOKED`) or it was revoked
    itself (:data:`TOKEN_REVOKED`); None when it is not."""
    if not at or client_id is None:
        return None
    revoked = at.get(client_id)
    if revoked is not None and (issued is None or issued <= revoked + MARGIN):
        return CLIENT_REVOKED
    if token_id is not None and f"{client_id}:{token_id}" in at:
        return TOKEN_REVOKED
    return None


class RevocationList(Protocol):
    """The revocation list as the gateway uses it from its event loop."""

    @property
    def at(self) -> Mapping[str, float]:
        """Entry (a client id, or a :func:`token_entry`) -> time of its revocation, as
        this node knows it (usually empty)."""
        ...

    def refuses(
        self, client_id: str | None, issued: float | None, token_id: str | None = None
    ) -> str | None:
        """:func:`refused`, on what this node knows: no I/O (the hot path)."""
        ...

    def stale(self) -> bool:
        """Whether what this node knows is too old to judge a token by (then 503)."""
        ...

    async def update(self) -> list[str]:
        """Learn of revocations made elsewhere; the entries revoked since last time."""
        ...

    async def record(self, entry: str) -> float:
        """Revoke ``entry`` (a client id, or a :func:`token_entry`) now, kept before this
        returns; the time recorded."""
        ...


class Revocations:
    """Entry (client id or :func:`token_entry`) -> Unix time of its revocation, kept in
    ``path`` (None: in memory)."""

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
        self._version: tuple[int, ...] | None = None  # of the file, when last read

    def __len__(self) -> int:
        return len(self.at)

    def refuses(
        self, client_id: str | None, issued: float | None, token_id: str | None = None
    ) -> str | None:
        """Why a token of the built-in issuer is refused (:func:`refused`), or None."""
        return refused(self.at, client_id, issued, token_id)

    def stale(self) -> bool:
        """Never: this node's file is what is in force (a damaged one keeps what was read)."""
        return False

    async def update(self) -> list[str]:
        """:meth:`refresh`, in a thread."""
        return await asyncio.to_thread(self.refresh)

    async def record(self, entry: str) -> float:
        """:meth:`revoke`, in a thread."""
        return await asyncio.to_thread(self.revoke, entry)

    def load(self) -> None:
        """Read the file (blocking); a missing file is an empty list, a malformed one a
        ValueError and an unreadable one an OSError (starting without it would bring
        revoked tokens back)."""
        self.refresh()

    def refresh(self) -> list[str]:
        """Read the file again if it is not the version read last (blocking), and return
        the entries revoked since (new ones, or later times). A malformed file is a
        ValueError (an unreadable one an OSError), and what was read before stays: a
        damaged file never brings a revoked token back."""
        path = self.path
        if path is None:
            return []
        with self._lock:
            version = self._stat(path)
            if version == self._version:
                return []
            self._version = version  # a damaged version is reported once, not each time
            before = self.at
            at = self._pruned(_later(before, self._read(path)))
            self.at = at
        return [c for c, when in at.items() if when > before.get(c, -1.0)]

    def revoke(self, entry: str) -> float:
        """Record that ``entry`` (a client id, or a :func:`token_entry`) is revoked now,
        on disk before this returns (blocking), with what other writers put in the file;
        returns the time recorded."""
        check_entry(entry)
        path = self.path
        with self._lock:
            if path is None:
                now = self._clock()
                self.at = self._pruned({**self.at, entry: now})
                return now
            with file_lock(path):
                now = self._clock()
                at = self._pruned({**_later(self.at, self._read(path)), entry: now})
                document = {"version": 1, "revoked": at}
                write_private(path, json.dumps(document, indent=2).encode() + b"\n")
                self._version = self._stat(path)
            self.at = at
        return now

    def _stat(self, path: Path) -> tuple[int, ...] | None:
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return None
        return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)

    def _read(self, path: Path) -> dict[str, float]:
        """The entries in the file (blocking): none if it is missing, ValueError if it
        is malformed, OSError if it cannot be read."""
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return {}
        try:
            data = json.loads(raw)
        except ValueError as exc:
            raise ValueError(f"cannot read the revocation list {path}: {exc}") from exc
        if not isinstance(data, dict) or data.get("version") != 1:
            raise ValueError(f"the revocation list {path} is malformed")
        entries = data.get("revoked")
        if not isinstance(entries, dict):
            raise ValueError(f"the revocation list {path} is malformed")
        at: dict[str, float] = {}
        for entry, when in entries.items():
            if not isinstance(when, int | float) or isinstance(when, bool):
                raise ValueError(f"the revocation list {path} is malformed")
            try:
                at[check_entry(entry)] = float(when)
            except ValueError as exc:
                raise ValueError(f"the revocation list {path} is malformed") from exc
        return at

    def _pruned(self, at: dict[str, float]) -> dict[str, float]:
        """Without entries every token issued before which has expired."""
        cutoff = self._clock() - self.keep - MARGIN
        return {entry: when for entry, when in at.items() if when > cutoff}


def _later(ours: dict[str, float], theirs: dict[str, float]) -> dict[str, float]:
    """Both lists in one: an entry in either is kept, and the later of two times holds
    (an entry leaves only by :meth:`Revocations._pruned`)."""
    merged = {**ours, **theirs}
    for entry, when in ours.items():
        merged[entry] = max(when, merged[entry])
    return merged
