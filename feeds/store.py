"""The durable store: SQLite in WAL mode, written by one thread with group commit.

The engine stays in memory and synchronous; when it is durable it appends a
**journal** of small records (:data:`Op`) as it changes: feeds, pipes and joins
created, changed or deleted, persistent messages delivered to a pipe or queued in a
feed, acknowledgements, expiries. :class:`Store` turns a batch of records into SQL on
the event loop's thread (cheap tuples) and hands it to its writer thread, which
commits every batch waiting at that moment in **one transaction**: concurrent
publishers share one fsync (group commit). The future of a batch resolves when its
transaction has committed, so a reply that awaits it is sent only after its messages
are on disk.

At start-up :meth:`Store.load` reads everything back (in a worker thread, before the
server listens) and :meth:`feeds.engine.Engine.restore` rebuilds the same resources
under the same URIs, each pipe's messages at the same positions.

Message records are compact JSON arrays (orjson), content bytes in base64::

    [address, props, headers, feed_name, arrived, expires_at, parts, redeliveries, epoch, stamp]
    part: ["e", type, encoding, value] | ["b", content_type, base64] | null

``epoch`` is null for a persistent message. ``stamp`` is the message's origin stamp
(:func:`stamps`), the same in every copy of one published message. Records written
before schema 5 end after ``parts``, ``redeliveries`` or ``epoch`` and carry no stamp:
:func:`stamp_of` gives them one derived from where they are kept.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import itertools
import logging
import queue
import secrets
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from restms.specs import EmbeddedContent, MessageSpec

from .model import Blob, Part, Parts

log = logging.getLogger(__name__)

FILE_NAME = "gateway.sqlite3"
SCHEMA_VERSION = 5
_WEBHOOKS = "CREATE TABLE IF NOT EXISTS webhooks (pipe TEXT PRIMARY KEY, state BLOB NOT NULL)"
# The gateway's own values (EngineService.setting). Made by _SCHEMA in a store of any
# version: a gateway that knows nothing of it reads the store as before.
_SETTINGS = "CREATE TABLE IF NOT EXISTS settings (name TEXT PRIMARY KEY, value TEXT NOT NULL)"
# How to bring an older store up to SCHEMA_VERSION, one version at a time.
_MIGRATIONS: dict[int, str] = {
    1: "ALTER TABLE pipes ADD COLUMN options TEXT NOT NULL DEFAULT '{}'",
    2: _WEBHOOKS,  # webhook pipes' delivery state
    # what a resuming reader is told of (feeds.values.Gap)
    3: "ALTER TABLE pipes ADD COLUMN acked INTEGER NOT NULL DEFAULT 0;"
    "ALTER TABLE pipes ADD COLUMN lost INTEGER NOT NULL DEFAULT 0",
    # Message records gained a stamp (the record format above). Nothing to change: a
    # record without one loads with one derived (stamp_of); the version is raised so
    # that a gateway that reads no stamp refuses the file instead of misreading it.
    4: "",
}

_SCHEMA = (
    """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS feeds (
    key TEXT PRIMARY KEY, name TEXT, type TEXT NOT NULL, title TEXT, license TEXT,
    domain TEXT NOT NULL, owner TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS pipes (
    key TEXT PRIMARY KEY, type TEXT NOT NULL, title TEXT, domain TEXT NOT NULL,
    owner TEXT NOT NULL, next_seq INTEGER NOT NULL DEFAULT 1,
    options TEXT NOT NULL DEFAULT '{}', acked INTEGER NOT NULL DEFAULT 0,
    lost INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS joins (
    key TEXT PRIMARY KEY, pipe TEXT NOT NULL, feed TEXT NOT NULL, type TEXT NOT NULL,
    address TEXT NOT NULL, headers TEXT NOT NULL, is_default INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS messages (
    pipe TEXT NOT NULL, seq INTEGER NOT NULL, source TEXT, data BLOB NOT NULL,
    PRIMARY KEY (pipe, seq));
CREATE TABLE IF NOT EXISTS queued (
    feed TEXT NOT NULL, qid INTEGER NOT NULL, data BLOB NOT NULL,
    PRIMARY KEY (feed, qid));
"""
    + _WEBHOOKS
    + ";\n"
    + _SETTINGS
    + ";\n"
)

# Journal records: a tag, then plain values captured when the change happened.
Op = tuple[Any, ...]

_SQL: dict[str, str] = {
    "feed": "INSERT OR REPLACE INTO feeds VALUES (?, ?, ?, ?, ?, ?, ?)",
    "pipe": "INSERT INTO pipes (key, type, title, domain, owner, options) "
    "VALUES (?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (key) DO UPDATE SET title = excluded.title, options = excluded.options",
    "join": "INSERT OR REPLACE INTO joins VALUES (?, ?, ?, ?, ?, ?, ?)",
    "join-": "DELETE FROM joins WHERE key = ?",
    "msg": "INSERT OR REPLACE INTO messages VALUES (?, ?, ?, ?)",
    "ack": "DELETE FROM messages WHERE pipe = ? AND seq <= ?",
    "drop": "DELETE FROM messages WHERE pipe = ? AND seq = ?",
    "seq": "UPDATE pipes SET next_seq = max(next_seq, ?) WHERE key = ?",
    "marks": "UPDATE pipes SET acked = max(acked, ?), lost = max(lost, ?) WHERE key = ?",
    "queue+": "INSERT OR REPLACE INTO queued VALUES (?, ?, ?)",
    "queue-": "DELETE FROM queued WHERE feed = ? AND qid = ?",
    "hook": "INSERT OR REPLACE INTO webhooks VALUES (?, ?)",
    "setting": "INSERT OR REPLACE INTO settings VALUES (?, ?)",
    "setting-": "DELETE FROM settings WHERE name = ?",
}
# Deleting a feed or a pipe takes what hangs off it with it.
_CASCADE: dict[str, tuple[str, ...]] = {
    "feed-": ("DELETE FROM feeds WHERE key = ?", "DELETE FROM queued WHERE feed = ?"),
    "pipe-": (
        "DELETE FROM pipes WHERE key = ?",
        "DELETE FROM joins WHERE pipe = ?",
        "DELETE FROM messages WHERE pipe = ?",
        "DELETE FROM webhooks WHERE pipe = ?",
    ),
}


class StoreError(Exception):
    """The store could not be opened or could not commit."""


@dataclass(slots=True)
class Snapshot:
    """Everything the store holds, as rows, for :meth:`Engine.restore`."""

    feeds: list[tuple[Any, ...]] = field(default_factory=list)
    pipes: list[tuple[Any, ...]] = field(default_factory=list)
    joins: list[tuple[Any, ...]] = field(default_factory=list)
    messages: list[tuple[Any, ...]] = field(default_factory=list)  # by pipe, seq
    queued: list[tuple[Any, ...]] = field(default_factory=list)  # by feed, qid
    # Messages left on disk past the memory budget: (pipe, first seq, last seq + 1,
    # count, estimated bytes) per pipe, read back a page at a time.
    spills: list[tuple[str, int, int, int, int]] = field(default_factory=list)
    # The same for feeds' queues: (feed, first queue id, last + 1, count, estimated bytes).
    queue_spills: list[tuple[str, int, int, int, int]] = field(default_factory=list)
    webhooks: list[tuple[Any, ...]] = field(default_factory=list)  # (pipe, state record)
    settings: list[tuple[str, str]] = field(default_factory=list)  # (name, value)
    epoch: int = 1  # this run's number (non-persistent rows of earlier runs are stale)


# ---------------------------------------------------------------- message records
def encode_parts(parts: Iterable[Part | None]) -> list[Any]:
    out: list[Any] = []
    for part in parts:
        if part is None:
            out.append(None)
        elif isinstance(part, Blob):
            out.append(["b", part.content_type, base64.b64encode(part.data).decode()])
        else:
            out.append(["e", part.type, part.encoding, part.value])
    return out


def decode_parts(items: list[Any]) -> Parts:
    out: list[Part | None] = []
    for item in items:
        if item is None:
            out.append(None)
        elif item[0] == "b":
            out.append(Blob(base64.b64decode(item[2]), item[1]))
        else:
            out.append(EmbeddedContent(type=item[1], encoding=item[2], value=item[3]))
    return tuple(out)


def persistent(spec: MessageSpec) -> bool:
    """AMQP9 ``delivery_mode`` 2: the message must survive a restart."""
    return spec.prop("delivery_mode") == "2"


def record(
    spec: MessageSpec,
    parts: Parts,
    feed_name: str | None,
    arrived: float,
    expires_at: float | None,
    redeliveries: int = 0,
    epoch: int | None = None,
    *,
    stamp: str,
) -> bytes:
    """A message as the store keeps it (the record format above). ``epoch`` marks a
    non-persistent message that went to disk only for room: it is stale in any other run."""
    return dumps(
        [
            spec.address,
            spec.props,
            spec.headers,
            feed_name,
            arrived,
            expires_at,
            encode_parts(parts),
            redeliveries,
            epoch,
            stamp,
        ]
    )


def epoch_of(record: list[Any]) -> int | None:
    """The run a non-persistent record belongs to (None: a persistent message)."""
    return int(record[8]) if len(record) > 8 and record[8] is not None else None


# ---------------------------------------------------------------- origin stamps
def stamps() -> Iterator[str]:
    """Origin stamps for the messages one engine publishes (``Message.stamp``): ``next``
    gives one per published message, never the same twice. Each is an 80-bit number in
    hex (``0x`` and 20 digits, 22 characters, URL-safe): a count from a random start of
    this iterator's own, 55 random bits (under a set top bit, so the length never
    varies) above 24 zero bits. Two engines (two nodes, two runs) meet only if their
    starts are closer than either one's count ran: for engines that published under 16
    million messages each, a chance of one in 2**54 per pair. It is ``hex`` over a
    counter, in C: no Python frame, no format to parse, no string joined, as a publish
    takes one per message (its cost: about 1,350 CPU instructions a message, where a
    publish through HTTP takes some 54,000)."""
    return map(hex, itertools.count((secrets.randbits(55) | 1 << 55) << 24))


def stamp_in(record: list[Any]) -> str | None:
    """The stamp a record carries, None for one written before stamps (schema 4)."""
    return record[9] if len(record) > 9 else None


def stamp_of(record: list[Any], where: str, number: int) -> str:
    """The stamp a record carries, or for a record written before stamps (schema 4), one
    derived from what identifies it where it is kept: ``where`` (a pipe's key, or a
    feed queue's ``q:`` and feed key) and ``number`` (its position, or queue id). The
    same record loads with the same stamp every time, though the copies of one message
    in two pipes get two; once written again (a redelivery), it carries it."""
    found = stamp_in(record)
    return found if found is not None else derived_stamp(where, number)


def derived_stamp(where: str, number: int) -> str:
    """20 URL-safe characters of a digest of ``where`` and ``number``, with a ``~`` in
    front: never the same as a stamp :func:`stamps` makes, which has none."""
    digest = hashlib.sha256(f"{where}.{number}".encode()).digest()
    return "~" + base64.urlsafe_b64encode(digest).decode()[:19]


def redeliveries(record: list[Any]) -> int:
    """How many leases of a stored message ran out (absent: none)."""
    return int(record[7]) if len(record) > 7 else 0


def message_spec(record: list[Any]) -> MessageSpec:
    return MessageSpec(
        address=record[0],
        props=tuple((k, v) for k, v in record[1]),
        headers=tuple((k, v) for k, v in record[2]),
    )


def dumps(value: Any) -> bytes:
    return orjson.dumps(value)


def loads(data: bytes) -> Any:
    return orjson.loads(data)


# ---------------------------------------------------------------- the store
class Store:
    """One SQLite file in the data directory, one writer thread, group commit."""

    def __init__(
        self, directory: str | Path, *, synchronous: str = "FULL", busy_timeout: float = 5.0
    ) -> None:
        self.path = Path(directory) / FILE_NAME
        self.synchronous = synchronous
        # Seconds a connection waits for a lock another connection holds (another
        # process's write transaction) before its statement fails: a commit then fails.
        self.busy_timeout = busy_timeout
        self._db: sqlite3.Connection | None = None
        self._queue: queue.SimpleQueue[
            tuple[list[tuple[str, list[Any]]], asyncio.Future[None]] | None
        ]
        self._queue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._reader: sqlite3.Connection | None = None  # for pages read back
        self._reader_lock = threading.Lock()
        # Written by the writer thread only, read by anyone (plain ints and floats: a
        # reader sees a value at most one transaction old).
        self.commits = 0  # transactions
        self.batches = 0  # batches they carried (batches / commits = group-commit factor)
        self.commit_seconds = 0.0  # time spent in transactions, failed ones included
        self.failures = 0  # transactions that failed (rolled back)
        self.failing = ""  # the last failure, until a transaction succeeds again

    # -- start-up and shut-down (blocking: call from a worker thread)
    def load(self, head_budget: int = 0, overhead: int = 0) -> Snapshot:
        """Open (creating if needed) and read everything back.

        With a ``head_budget`` (bytes; 0: none), pipes' messages are read, oldest first,
        until the stored bytes plus ``overhead`` per message pass the budget; the rest
        stay on disk (:attr:`Snapshot.spills`) to be read back when readers get there.
        """
        try:
            db = sqlite3.connect(
                self.path,
                timeout=self.busy_timeout,
                isolation_level=None,
                check_same_thread=False,
            )
            db.execute("PRAGMA journal_mode = WAL")
            db.execute(f"PRAGMA synchronous = {self.synchronous}")
            found = _version(db)
            db.executescript(_SCHEMA)
            if found is None:
                db.execute("INSERT INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),))
            elif found > SCHEMA_VERSION:
                raise StoreError(
                    f"{self.path} has schema {found}, newer than this gateway's {SCHEMA_VERSION}"
                )
            while found is not None and found < SCHEMA_VERSION:
                db.executescript(_MIGRATIONS[found])
                found += 1
                db.execute("UPDATE meta SET value = ? WHERE key = 'schema'", (str(found),))
                log.info("store %s migrated to schema %d", self.path, found)
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open the store {self.path}: {exc}") from exc
        self._db = db
        snap = Snapshot()
        try:
            self._read_back(db, snap, head_budget, overhead)
        except sqlite3.Error as exc:
            raise StoreError(f"cannot read the store {self.path}: {exc}") from exc
        return snap

    def _read_back(
        self, db: sqlite3.Connection, snap: Snapshot, budget: int, overhead: int
    ) -> None:
        found = db.execute("SELECT value FROM meta WHERE key = 'epoch'").fetchone()
        snap.epoch = int(found[0]) + 1 if found else 1
        db.execute("INSERT OR REPLACE INTO meta VALUES ('epoch', ?)", (str(snap.epoch),))
        snap.feeds = db.execute("SELECT * FROM feeds").fetchall()
        snap.pipes = db.execute(
            "SELECT key, type, title, domain, owner, next_seq, options, acked, lost FROM pipes"
        ).fetchall()
        snap.joins = db.execute("SELECT * FROM joins").fetchall()
        snap.webhooks = db.execute("SELECT pipe, state FROM webhooks").fetchall()
        snap.settings = db.execute("SELECT name, value FROM settings").fetchall()
        # Pipes' messages first, then feeds' queues, each oldest first, within the budget.
        left = _read_head(db, _MESSAGES, snap.messages, snap.spills, budget, budget, overhead)
        _read_head(db, _QUEUED, snap.queued, snap.queue_spills, budget, left, overhead)

    def _connect_reader(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, timeout=self.busy_timeout, check_same_thread=False)

    def read_page(self, pipe: str, low: int, limit: int) -> list[tuple[int, Any, bytes]]:
        """Up to ``limit`` stored messages of a pipe from position ``low`` on (blocking:
        call from a worker thread). Reads only what has been committed."""
        with self._reader_lock:
            if self._reader is None:
                self._reader = self._connect_reader()
            try:
                return self._reader.execute(
                    "SELECT seq, source, data FROM messages WHERE pipe = ? AND seq >= ? "
                    "ORDER BY seq LIMIT ?",
                    (pipe, low, limit),
                ).fetchall()
            except sqlite3.Error as exc:
                raise StoreError(f"cannot read from the store: {exc}") from exc

    def read_queue_page(
        self, feed: str, low: int, limit: int, max_bytes: int
    ) -> list[tuple[int, bytes]]:
        """Up to ``limit`` stored queued messages of a feed from queue id ``low`` on, and
        no more than ``max_bytes`` of records past the first (blocking: call from a
        worker thread). Reads only what has been committed."""
        with self._reader_lock:
            if self._reader is None:
                self._reader = self._connect_reader()
            rows: list[tuple[int, bytes]] = []
            try:
                cursor = self._reader.execute(
                    "SELECT qid, data FROM queued WHERE feed = ? AND qid >= ? ORDER BY qid LIMIT ?",
                    (feed, low, limit),
                )
                for row in cursor:
                    rows.append(row)
                    max_bytes -= len(row[1])
                    if max_bytes <= 0:
                        break
                cursor.close()
            except sqlite3.Error as exc:
                raise StoreError(f"cannot read from the store: {exc}") from exc
            return rows

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._thread = threading.Thread(target=self._write_loop, name="store-writer", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Finish every batch submitted so far, then close (blocking)."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None
        with self._reader_lock:
            if self._reader is not None:
                self._reader.close()
                self._reader = None
        if self._db is not None:
            with contextlib.suppress(sqlite3.Error):
                self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            self._db.close()
            self._db = None

    @property
    def running(self) -> bool:
        """The writer thread is there to commit what is submitted."""
        return self._thread is not None and self._thread.is_alive()

    def waiting(self) -> int:
        """Batches submitted and not yet taken into a transaction."""
        return self._queue.qsize()

    # -- writing (event loop thread)
    def submit(self, ops: list[Op]) -> asyncio.Future[None]:
        """Queue a batch of journal records; the future resolves once they are committed."""
        assert self._loop is not None, "store not started"
        future: asyncio.Future[None] = self._loop.create_future()
        self._queue.put((_statements(ops), future))
        return future

    # -- the writer thread
    def _write_loop(self) -> None:
        db = self._db
        assert db is not None
        while True:
            first = self._queue.get()
            if first is None:
                return
            batches = [first]
            stop = False
            while True:  # group commit: everything that queued up meanwhile
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    stop = True
                    break
                batches.append(more)
            error: BaseException | None = None
            began = time.perf_counter()
            try:
                db.execute("BEGIN IMMEDIATE")
                for statements, _ in batches:
                    for sql, rows in statements:
                        db.executemany(sql, rows)
                db.execute("COMMIT")
                self.commits += 1
                self.batches += len(batches)
                self.failing = ""
            except sqlite3.Error as exc:
                log.error("store commit failed: %s", exc)
                with contextlib.suppress(sqlite3.Error):
                    db.execute("ROLLBACK")
                error = StoreError(f"could not commit to the store: {exc}")
                self.failures += 1
                self.failing = str(exc)
            self.commit_seconds += time.perf_counter() - began
            self._resolve([future for _, future in batches], error)
            if stop:
                return

    def _resolve(self, futures: list[asyncio.Future[None]], error: BaseException | None) -> None:
        """Wake the loop once per transaction, for every batch it carried."""
        assert self._loop is not None

        def done() -> None:
            for future in futures:
                if future.done():
                    continue
                if error is None:
                    future.set_result(None)
                else:
                    future.set_exception(error)

        with contextlib.suppress(RuntimeError):  # the loop may be closed at shut-down
            self._loop.call_soon_threadsafe(done)


# What start-up reads stored messages back with: each owner's (pipe's or feed's) first
# and last positions and count, its rows in order, and which column holds the record.
_MESSAGES = (
    "SELECT pipe, min(seq), max(seq), count(*) FROM messages GROUP BY pipe",
    "SELECT * FROM messages WHERE pipe = ? ORDER BY seq",
    3,
)
_QUEUED = (
    "SELECT feed, min(qid), max(qid), count(*) FROM queued GROUP BY feed",
    "SELECT * FROM queued WHERE feed = ? ORDER BY qid",
    2,
)


def _read_head(
    db: sqlite3.Connection,
    table: tuple[str, str, int],
    rows_out: list[tuple[Any, ...]],
    spills: list[tuple[str, int, int, int, int]],
    budget: int,
    left: int,
    overhead: int,
) -> int:
    """Read each pipe's (or feed queue's) stored messages in order while the budget
    lasts (``left`` of it; a budget of 0: no limit); what stays on disk is summed up
    per owner as (owner, first position, last + 1, count, estimated bytes). Returns
    what is left of the budget."""
    summary, ordered, data = table
    for key, low, high, count in db.execute(summary).fetchall():
        rows: list[tuple[Any, ...]] = []
        if not budget or left > 0:
            cursor = db.execute(ordered, (key,))
            for row in cursor:
                rows.append(row)
                left -= len(row[data]) + overhead
                if budget and left <= 0:
                    break
            cursor.close()
        rows_out.extend(rows)
        if count > len(rows):
            average = sum(len(row[data]) for row in rows) // len(rows) if rows else 1024
            start = rows[-1][1] + 1 if rows else low
            rest = count - len(rows)
            spills.append((key, start, high + 1, rest, rest * average))
    return left


def _version(db: sqlite3.Connection) -> int | None:
    """The schema version a store file has, or None for a new file."""
    if db.execute("SELECT 1 FROM sqlite_master WHERE name = 'meta'").fetchone() is None:
        return None
    found = db.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()
    return None if found is None else int(found[0])


def _statements(ops: list[Op]) -> list[tuple[str, list[Any]]]:
    """Journal records -> SQL, runs of the same statement merged for executemany."""
    out: list[tuple[str, list[Any]]] = []
    for op in ops:
        tag = op[0]
        cascade = _CASCADE.get(tag)
        if cascade is not None:
            for sql in cascade:
                out.append((sql, [op[1:]]))
            continue
        sql = _SQL[tag]
        if out and out[-1][0] == sql:
            out[-1][1].append(op[1:])
        else:
            out.append((sql, [op[1:]]))
    return out
