"""OAuth clients of the built-in authorization server: who they are and their secrets.

A client is an id, the scrypt hash of its secret, and the scopes it may be granted.
Clients come from two places: the configuration (read-only here) and a JSON file in
the data directory (:data:`CLIENTS_FILE`), which ``python main.py client add|remove``
edits while the gateway may be running. The gateway never writes the file; it notices
a new version (a changed inode, size, mtime or ctime: every write is a rename) on the next
:meth:`ClientStore.get`, so a new client works, and a removed one stops working,
without a restart. Tokens already issued stay valid until they expire, unless the
client is revoked through the gateway (``DELETE /admin/clients/{id}``:
:mod:`auth.revocations`).

Secrets are 32 random bytes (``secrets.token_urlsafe``), never starting with "-" (the
admin CLI's ``--client-secret S`` would read one as an option), shown once and stored only as
``scrypt$<n>$<r>$<p>$<salt>$<hash>`` (base64). scrypt is slow on purpose: every
:func:`hash_secret`, :func:`verify_secret` and :meth:`ClientStore.authenticate` costs
tens of milliseconds of CPU, and every :class:`ClientStore` method does blocking file
I/O, so code on an event loop must call them through ``asyncio.to_thread``: the gateway
reaches the store through :class:`FileClients`, its async face. The same face,
:class:`Clients`, is served by :class:`auth.cluster.RedisClients` when several nodes
share one registry (docs/AUTH.md, "Several nodes").

The file, its lock file and their directory are private to the gateway's user (0600
and 0700): a hash still invites an offline guess.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import fcntl
import hashlib
import hmac
import json
import os
import re
import secrets
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from .limits import Remembered

CLIENTS_FILE = Path("oauth", "clients.json")  # relative to the data directory

_N, _R, _P = 2**14, 8, 1  # scrypt cost: 16 MiB and about 40 ms a hash
_SALT_BYTES = 16
_HASH_BYTES = 32
_MAXMEM = 64 * 1024 * 1024  # refuses encodings that would ask for more (returns False)

_CLIENT_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")
# RFC 6749 section 3.3: scope-token = 1*( %x21 / %x23-5B / %x5D-7E )
_SCOPE_TOKEN = re.compile(r"[\x21\x23-\x5b\x5d-\x7e]+")


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _scrypt(secret: str, salt: bytes, n: int, r: int, p: int, length: int) -> bytes:
    data = secret.encode("utf-8")
    return hashlib.scrypt(data, salt=salt, n=n, r=r, p=p, maxmem=_MAXMEM, dklen=length)


def hash_secret(secret: str) -> str:
    """The self-describing scrypt hash of ``secret`` with a fresh random salt.

    CPU-heavy (tens of milliseconds): on an event loop, run it in a thread.
    """
    salt = secrets.token_bytes(_SALT_BYTES)
    digest = _scrypt(secret, salt, _N, _R, _P, _HASH_BYTES)
    return f"scrypt${_N}${_R}${_P}${_b64(salt)}${_b64(digest)}"


def verify_secret(secret: str, encoded: str) -> bool:
    """True when ``secret`` hashes to ``encoded`` (compared in constant time).

    A malformed encoding, or one whose parameters scrypt refuses, is False, never an
    error. CPU-heavy like :func:`hash_secret`: on an event loop, run it in a thread.
    """
    parts = encoded.split("$")
    if len(parts) != 6 or parts[0] != "scrypt":
        return False
    try:
        n, r, p = int(parts[1]), int(parts[2]), int(parts[3])
        salt = base64.b64decode(parts[4], validate=True)
        expected = base64.b64decode(parts[5], validate=True)
    except (ValueError, binascii.Error):
        return False
    if not (salt and 16 <= len(expected) <= 64 and n > 1 and r > 0 and p > 0):
        return False
    try:
        actual = _scrypt(secret, salt, n, r, p, len(expected))
    except (ValueError, OverflowError, MemoryError):  # n not a power of 2, too costly
        return False
    return hmac.compare_digest(actual, expected)


# Verified against when the client id is unknown, so that a miss costs what a wrong
# secret costs and timing does not tell which ids exist. No secret matches it.
# A well-formed hash no secret matches: checking against it costs what a real check does.
DUMMY_HASH = f"scrypt${_N}${_R}${_P}${_b64(bytes(_SALT_BYTES))}${_b64(bytes(_HASH_BYTES))}"


def check_client_id(client_id: str) -> str:
    """``client_id`` if it is 1 to 64 of ``A-Z a-z 0-9 . _ -``; else ValueError."""
    if not _CLIENT_ID.fullmatch(client_id):
        raise ValueError(f"client id {client_id!r} must be 1 to 64 of A-Z a-z 0-9 . _ -")
    return client_id


def check_scope_token(token: str) -> str:
    """``token`` if it is an RFC 6749 scope-token (printable ASCII but space, ``"`` and
    ``\\``); else ValueError. What a scope means is not decided here."""
    if not _SCOPE_TOKEN.fullmatch(token):
        raise ValueError(f"scope {token!r} is not an RFC 6749 scope-token")
    return token


@dataclass(frozen=True, slots=True, kw_only=True)
class Client:
    """A client of the built-in authorization server (client-credentials grant)."""

    client_id: str
    secret_hash: str
    scopes: tuple[str, ...]

    def __post_init__(self) -> None:
        check_client_id(self.client_id)
        if not self.secret_hash:
            raise ValueError(f"client {self.client_id!r} has no secret hash")
        if not self.scopes:
            raise ValueError(f"client {self.client_id!r} has no scopes")
        for scope in self.scopes:
            check_scope_token(scope)
        if len(set(self.scopes)) != len(self.scopes):
            raise ValueError(f"client {self.client_id!r} lists a scope twice")


def parse_scopes(text: str) -> tuple[str, ...]:
    """Scopes from a space-separated list (as ``--scopes`` takes them), in order, once
    each; ValueError on a scope that is not a scope-token."""
    return tuple(dict.fromkeys(check_scope_token(s) for s in text.split()))


_Version = tuple[int, int, int, int]  # inode, size, mtime, ctime: what tells a new file apart


def new_secret() -> str:
    """A client secret: 43 URL-safe characters of 32 random bytes. One draw in 64 starts
    with "-", which a command line reads as an option: such a draw is drawn again."""
    while True:
        secret = secrets.token_urlsafe(32)
        if secret[0] != "-":
            return secret


class ClientStore:
    """The configured clients plus those in the file ``path``.

    Every method does blocking I/O (and :meth:`authenticate` hashes): from an event
    loop, call them through ``asyncio.to_thread``. Safe to call from several threads.
    A configured client cannot be added, replaced or removed through the file.
    """

    def __init__(self, path: Path, configured: Sequence[Client] = ()) -> None:
        self.path = Path(path)
        self._configured = {c.client_id: c for c in configured}
        if len(self._configured) != len(configured):
            raise ValueError("a client id is configured twice")
        self._lock = threading.Lock()
        self._version: _Version | None = None
        self._stored: Mapping[str, Client] = {}

    def get(self, client_id: str) -> Client | None:
        """The client with this id, or None; re-reads the file if it has changed."""
        found = self._configured.get(client_id)
        if found is not None:
            return found
        with self._lock:
            self._refresh()
            return self._stored.get(client_id)

    def authenticate(self, client_id: str, secret: str) -> Client | None:
        """The client if ``secret`` is its secret, else None. An unknown id costs one
        scrypt verification too, as a wrong secret does."""
        client = self.get(client_id)
        if client is None:
            verify_secret(secret, DUMMY_HASH)
            return None
        return client if verify_secret(secret, client.secret_hash) else None

    def clients(self) -> list[Client]:
        """Every client, configured ones first, each group sorted by id."""
        with self._lock:
            self._refresh()
            stored = sorted(self._stored.values(), key=lambda c: c.client_id)
        return sorted(self._configured.values(), key=lambda c: c.client_id) + stored

    def add(self, client_id: str, scopes: Sequence[str]) -> str:
        """Add a client to the file and return its new secret, which is not kept.

        ValueError when the id is malformed, taken, or a scope is not a scope-token.
        """
        check_client_id(client_id)
        if client_id in self._configured:
            raise ValueError(f"client {client_id!r} is in the configuration already")
        secret = new_secret()
        client = Client(client_id=client_id, secret_hash=hash_secret(secret), scopes=tuple(scopes))
        with self._edit() as stored:
            if client_id in stored:
                raise ValueError(f"client {client_id!r} exists already")
            stored[client_id] = client
        return secret

    def remove(self, client_id: str) -> None:
        """Remove a client from the file; KeyError if the file has no such client,
        ValueError if it is a configured one."""
        if client_id in self._configured:
            raise ValueError(f"client {client_id!r} is configured: remove it from the config")
        with self._edit() as stored:
            if stored.pop(client_id, None) is None:
                raise KeyError(client_id)

    # -- the file -----------------------------------------------------------------

    def _refresh(self) -> None:
        """Re-read the file if it is not the version read last (caller holds the lock)."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            self._version, self._stored = None, {}
            return
        version = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        if version != self._version:
            self._stored = self._read()
            self._version = version

    def _read(self) -> dict[str, Client]:
        try:
            data = json.loads(self.path.read_bytes())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise ValueError(f"cannot read the clients file {self.path}: {exc}") from exc
        try:
            if data.get("version") != 1:
                raise ValueError("unknown version")
            clients = [client_from_json(item) for item in data["clients"]]
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"the clients file {self.path} is malformed: {exc}") from exc
        return {c.client_id: c for c in clients}

    @contextmanager
    def _edit(self) -> Iterator[dict[str, Client]]:
        """Read, let the caller change, write back atomically: under an exclusive lock
        on a lock file, so that two ``client add`` runs cannot lose each other's edit."""
        with file_lock(self.path):
            stored = self._read()
            yield stored
            self._write(stored)
        with self._lock:
            self._version = None  # the next get reads what was written

    def _write(self, stored: Mapping[str, Client]) -> None:
        document: dict[str, Any] = {
            "version": 1,
            "clients": [
                {"client_id": c.client_id, "secret_hash": c.secret_hash, "scopes": list(c.scopes)}
                for c in sorted(stored.values(), key=lambda c: c.client_id)
            ],
        }
        write_private(self.path, json.dumps(document, indent=2).encode("utf-8") + b"\n")


REMEMBERED_FOR = 300.0  # seconds a client secret that checked right skips scrypt
REMEMBERED_KEPT = 10_000  # such secrets remembered at most (the least recently used go)


class CheckedSecrets:
    """Client secrets that checked right lately, so that a client asking again (a
    resource server introspecting token after token, a client fetching a token per
    job) costs a keyed hash instead of scrypt and a turn of the bounds on secret
    checks. Each is kept as an HMAC, under a key made at start, of the client id, the
    secret hash it checked against and the secret, never the secret: a client removed,
    or added again with a new secret, does not match. Single-threaded: it belongs to
    one event loop."""

    __slots__ = ("_key", "_right")

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._key = secrets.token_bytes(32)
        self._right = Remembered(REMEMBERED_FOR, REMEMBERED_KEPT, clock)

    def _mac(self, client: Client, secret: str) -> bytes:
        data = "\0".join((client.client_id, client.secret_hash, secret))
        return hmac.new(self._key, data.encode("utf-8", "surrogatepass"), hashlib.sha256).digest()

    def holds(self, client: Client, secret: str) -> bool:
        """Whether ``secret`` checked right against ``client`` as it is now, lately."""
        return self._mac(client, secret) in self._right

    def add(self, client: Client, secret: str) -> None:
        """``secret`` has just checked right against ``client``."""
        self._right.add(self._mac(client, secret))


class Clients(Protocol):
    """The client registry as the gateway uses it, from its event loop: configured
    clients first, then the stored ones. Errors: ValueError (malformed, taken, or a
    damaged store), KeyError (:meth:`remove` of an unknown client), OSError (the store
    cannot be reached: a retriable 503)."""

    async def get(self, client_id: str) -> Client | None: ...

    async def authenticate(self, client_id: str, secret: str) -> Client | None: ...

    async def clients(self) -> list[Client]: ...

    async def add(self, client_id: str, scopes: Sequence[str]) -> str: ...

    async def remove(self, client_id: str) -> None: ...


class FileClients:
    """A :class:`ClientStore` (one node's file) behind :class:`Clients`: every call in a
    thread, off the event loop."""

    def __init__(self, store: ClientStore) -> None:
        self.store = store

    async def get(self, client_id: str) -> Client | None:
        return await asyncio.to_thread(self.store.get, client_id)

    async def authenticate(self, client_id: str, secret: str) -> Client | None:
        return await asyncio.to_thread(self.store.authenticate, client_id, secret)

    async def clients(self) -> list[Client]:
        return await asyncio.to_thread(self.store.clients)

    async def add(self, client_id: str, scopes: Sequence[str]) -> str:
        return await asyncio.to_thread(self.store.add, client_id, scopes)

    async def remove(self, client_id: str) -> None:
        await asyncio.to_thread(self.store.remove, client_id)


def client_from_json(item: Mapping[str, Any]) -> Client:
    """A client from its JSON form (``client_id``, ``secret_hash``, ``scopes``); a
    ValueError, KeyError or TypeError when it is malformed."""
    scopes = item["scopes"]
    if not isinstance(scopes, list) or not all(isinstance(s, str) for s in scopes):
        raise ValueError("scopes must be a list of strings")
    client_id, secret_hash = item["client_id"], item["secret_hash"]
    if not isinstance(client_id, str) or not isinstance(secret_hash, str):
        raise ValueError("client_id and secret_hash must be strings")
    return Client(client_id=client_id, secret_hash=secret_hash, scopes=tuple(scopes))


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive lock on ``path``'s lock file (``<name>.lock``, 0600, made in a 0700
    directory if need be) for the block: writers in other processes wait for it."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path.with_name(path.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def write_private(path: Path, data: bytes, *, replace: bool = True) -> bool:
    """Write ``data`` to ``path`` atomically with mode 0600: a temporary file in the
    same directory, fsync, then rename (``replace``) or hard link (not ``replace``: the
    file is created only if absent, and False says another writer was first), then
    fsync of the directory so that the new name survives a crash."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        if replace:
            os.replace(tmp, path)
        else:
            try:
                os.link(tmp, path)
            except FileExistsError:
                return False
            finally:
                os.unlink(tmp)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return True
