"""The revocation list of the built-in issuer's clients (auth/revocations.py)."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from auth.revocations import (
    CLIENT_REVOKED,
    MARGIN,
    TOKEN_REVOKED,
    Revocations,
    check_entry,
    client_of,
    token_entry,
)

KEEP = 3600.0  # the token lifetime plus leeway


class Clock:
    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_tokens_issued_before_or_just_after_are_refused(tmp_path: Path) -> None:
    clock = Clock()
    revoked = Revocations(tmp_path / "oauth" / "revoked.json", KEEP, clock)
    assert not revoked.refuses("worker", clock.now - 10)
    at = revoked.revoke("worker")
    assert at == clock.now
    assert revoked.refuses("worker", at - 100)
    assert revoked.refuses("worker", int(at))  # iat is whole seconds
    assert revoked.refuses("worker", at + MARGIN)
    assert revoked.refuses("worker", None)  # no iat: cannot tell, refused
    assert not revoked.refuses("worker", at + MARGIN + 1)  # re-added later: new tokens work
    assert not revoked.refuses("other", at - 100)
    assert not revoked.refuses(None, at - 100)


def test_kept_on_disk_privately_and_read_back(tmp_path: Path) -> None:
    clock = Clock()
    path = tmp_path / "oauth" / "revoked.json"
    Revocations(path, KEEP, clock).revoke("worker")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    again = Revocations(path, KEEP, clock)
    assert not again.refuses("worker", clock.now - 1)
    again.load()
    assert again.refuses("worker", clock.now - 1)
    assert json.loads(path.read_text()) == {"version": 1, "revoked": {"worker": clock.now}}


def test_entries_go_once_every_token_they_refuse_has_expired(tmp_path: Path) -> None:
    clock = Clock()
    path = tmp_path / "revoked.json"
    revoked = Revocations(path, KEEP, clock)
    revoked.revoke("old")
    clock.now += KEEP + MARGIN + 1
    revoked.revoke("new")
    assert len(revoked) == 1
    assert not revoked.refuses("old", clock.now - KEEP - 100)
    assert set(json.loads(path.read_text())["revoked"]) == {"new"}
    clock.now += KEEP + MARGIN + 1
    fresh = Revocations(path, KEEP, clock)
    fresh.load()
    assert len(fresh) == 0


def test_in_memory_without_a_path() -> None:
    revoked = Revocations(None, KEEP, Clock())
    revoked.load()
    revoked.revoke("worker")
    assert revoked.refuses("worker", 0)


@pytest.mark.parametrize(
    "content",
    [
        b"{",
        b"[]",
        b'{"version": 2, "revoked": {}}',
        b'{"version": 1, "revoked": {"a b": 1}}',
        b'{"version": 1, "revoked": {"w": "soon"}}',
        b'{"version": 1, "revoked": {"w": true}}',
        b'{"version": 1, "revoked": {"w:": 1}}',
        b'{"version": 1, "revoked": {"w:a:b": 1}}',
        b'{"version": 1, "revoked": {":abc": 1}}',
    ],
)
def test_a_damaged_file_stops_the_start(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "revoked.json"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=r"revoked\.json|client id|token id"):
        Revocations(path, KEEP, Clock()).load()


def test_another_writer_is_seen_and_never_overwritten(tmp_path: Path) -> None:
    """The gateway and ``main.py client revoke`` both write the file: each keeps the
    other's entries, and :meth:`Revocations.refresh` reports what the other added."""
    clock = Clock()
    path = tmp_path / "oauth" / "revoked.json"
    gateway, offline = Revocations(path, KEEP, clock), Revocations(path, KEEP, clock)
    gateway.load()
    assert gateway.refresh() == []
    offline.revoke("a")
    assert gateway.refresh() == ["a"]
    assert gateway.refresh() == []  # the same version: not read again
    clock.now += 5
    gateway.revoke("b")  # written over a file holding "a": "a" stays
    offline.revoke("c")  # this writer never read "b": it stays too
    assert sorted(gateway.refresh()) == ["c"]
    assert set(json.loads(path.read_text())["revoked"]) == {"a", "b", "c"}
    assert gateway.refuses("a", clock.now - 10)
    assert gateway.refuses("c", clock.now - 10)


def test_a_damaged_file_while_running_keeps_what_was_read(tmp_path: Path) -> None:
    clock = Clock()
    path = tmp_path / "revoked.json"
    revoked = Revocations(path, KEEP, clock)
    revoked.revoke("a")
    path.write_bytes(b"{")
    with pytest.raises(ValueError, match=r"revoked\.json"):
        revoked.refresh()
    assert revoked.refresh() == []  # reported once per version
    assert revoked.refuses("a", clock.now - 1)
    path.unlink()  # a list removed by hand revokes nothing back either
    assert revoked.refresh() == []
    assert revoked.refuses("a", clock.now - 1)


def test_one_token_alone_is_refused_whenever_it_was_issued(tmp_path: Path) -> None:
    clock = Clock()
    path = tmp_path / "oauth" / "revoked.json"
    revoked = Revocations(path, KEEP, clock)
    entry = token_entry("worker", "Jti_of-22-characters_x")
    assert entry == "worker:Jti_of-22-characters_x"
    assert (check_entry(entry), client_of(entry)) == (entry, "worker")
    revoked.revoke(entry)
    assert revoked.refuses("worker", clock.now - 100, "Jti_of-22-characters_x") == TOKEN_REVOKED
    assert revoked.refuses("worker", clock.now + 100, "Jti_of-22-characters_x") == TOKEN_REVOKED
    assert revoked.refuses("worker", clock.now - 100, "another-token") is None
    assert revoked.refuses("worker", clock.now - 100) is None  # no jti: not that token
    assert revoked.refuses("other", clock.now - 100, "Jti_of-22-characters_x") is None
    revoked.revoke("worker")  # the client too: its own reason comes first
    assert revoked.refuses("worker", clock.now - 100, "Jti_of-22-characters_x") == CLIENT_REVOKED
    again = Revocations(path, KEEP, clock)
    again.load()  # kept on disk like a client's entry, and dropped like one
    assert again.refuses("worker", clock.now + 100, "Jti_of-22-characters_x") == TOKEN_REVOKED
    clock.now += KEEP + MARGIN + 1
    again.revoke("unrelated")
    assert again.refuses("worker", clock.now, "Jti_of-22-characters_x") is None


@pytest.mark.parametrize(
    ("client_id", "token_id"), [("a b", "jti"), ("worker", ""), ("worker", "a:b"), ("w", "x" * 65)]
)
def test_malformed_token_entries_are_refused(client_id: str, token_id: str) -> None:
    with pytest.raises(ValueError, match="must be 1 to 64"):
        token_entry(client_id, token_id)
