"""Client secrets (scrypt) and the client store (file, modes, reloads)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from auth import clients
from auth.clients import Client, ClientStore, hash_secret, parse_scopes, verify_secret


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# -- hashing ------------------------------------------------------------------------


def test_hash_round_trip_and_encoding() -> None:
    encoded = hash_secret("s3cret")
    name, n, r, p, salt, digest = encoded.split("$")
    assert (name, n, r, p) == ("scrypt", "16384", "8", "1")
    assert (len(salt), len(digest)) == (24, 44)  # base64 of 16 and 32 bytes
    assert verify_secret("s3cret", encoded)
    assert hash_secret("s3cret") != encoded  # a fresh salt each time


def test_wrong_secret_is_refused() -> None:
    encoded = hash_secret("right")
    assert not verify_secret("wrong", encoded)
    assert not verify_secret("", encoded)
    assert not verify_secret("right ", encoded)


@pytest.mark.parametrize(
    "encoded",
    [
        "",
        "plain",
        "scrypt$16384$8$1$c2FsdA==",  # one part short
        "bcrypt$16384$8$1$AAAAAAAAAAAAAAAAAAAAAA==$AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=",
        "scrypt$x$8$1$AAAAAAAAAAAAAAAAAAAAAA==$AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=",
        "scrypt$16384$8$1$not base64!$AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=",
        "scrypt$16384$8$1$AAAAAAAAAAAAAAAAAAAAAA==$",  # no hash
        "scrypt$1000$8$1$AAAAAAAAAAAAAAAAAAAAAA==$AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=",
        "scrypt$1048576$8$1$AAAAAAAAAAAAAAAAAAAAAA==$AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=",
        "scrypt$-2$8$1$AAAAAAAAAAAAAAAAAAAAAA==$AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=",
    ],
)
def test_malformed_encodings_are_false_not_errors(encoded: str) -> None:
    assert verify_secret("anything", encoded) is False


def test_a_tampered_hash_is_refused() -> None:
    encoded = hash_secret("right")
    head, digest = encoded.rsplit("$", 1)
    flipped = ("B" if digest[0] == "A" else "A") + digest[1:]
    assert not verify_secret("right", f"{head}${flipped}")


# -- values -------------------------------------------------------------------------


@pytest.mark.parametrize("client_id", ["", "a b", "a/b", "é", "x" * 65, "a:b"])
def test_bad_client_ids_are_refused(client_id: str) -> None:
    with pytest.raises(ValueError, match="client id"):
        Client(client_id=client_id, secret_hash="h", scopes=("restms:read",))


@pytest.mark.parametrize("scopes", [(), ("a b",), ('a"b',), ("a\\b",), ("",), ("x", "x")])
def test_bad_scopes_are_refused(scopes: tuple[str, ...]) -> None:
    with pytest.raises(ValueError, match="scope"):
        Client(client_id="ok", secret_hash="h", scopes=scopes)


def test_parse_scopes_keeps_order_once_each() -> None:
    assert parse_scopes(" restms:read  restms:publish:feed/weather.* restms:read ") == (
        "restms:read",
        "restms:publish:feed/weather.*",
    )
    with pytest.raises(ValueError, match="scope-token"):
        parse_scopes('restms:"read"')


# -- the store ----------------------------------------------------------------------


def test_a_secret_is_43_url_safe_characters_never_starting_with_a_dash() -> None:
    drawn = [clients.new_secret() for _ in range(3_000)]
    assert all(len(s) == 43 and s.replace("-", "").replace("_", "").isalnum() for s in drawn)
    assert len(set(drawn)) == len(drawn)
    # one base64 character in 64 is "-": 3,000 draws without the rule would hold about 47
    assert not [s for s in drawn if s.startswith("-")]


def test_a_secret_drawn_with_a_leading_dash_is_drawn_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``main.py clients list --client-secret -abc...`` would read it as an option."""
    draws = iter(["-" + "a" * 42, "b" * 43])
    monkeypatch.setattr(clients.secrets, "token_urlsafe", lambda n: next(draws))
    assert clients.new_secret() == "b" * 43


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "var" / "oauth" / "clients.json"


def test_add_get_authenticate_remove(path: Path) -> None:
    store = ClientStore(path)
    assert store.get("app") is None
    secret = store.add("app", ("restms:read", "restms:publish"))
    client = store.get("app")
    assert client is not None
    assert client.scopes == ("restms:read", "restms:publish")
    assert secret not in path.read_text()  # only the hash is stored
    assert verify_secret(secret, client.secret_hash)
    assert store.authenticate("app", secret) == client
    assert store.authenticate("app", secret + "x") is None
    assert store.authenticate("nobody", secret) is None
    store.remove("app")
    assert store.get("app") is None
    assert store.authenticate("app", secret) is None
    with pytest.raises(KeyError):
        store.remove("app")


def test_the_file_and_directory_are_private(path: Path) -> None:
    ClientStore(path).add("app", ("restms:read",))
    assert mode(path) == 0o600
    assert mode(path.parent) == 0o700
    assert [p.name for p in path.parent.iterdir() if p.name.endswith(".tmp")] == []
    document = json.loads(path.read_text())
    assert document["version"] == 1
    assert document["clients"][0]["client_id"] == "app"


def test_clients_persist_for_a_new_store(path: Path) -> None:
    secret = ClientStore(path).add("app", ("restms:read",))
    again = ClientStore(path)
    assert again.authenticate("app", secret) is not None
    assert [c.client_id for c in again.clients()] == ["app"]


def test_duplicates_and_bad_ids_are_refused(path: Path) -> None:
    store = ClientStore(path)
    store.add("app", ("restms:read",))
    with pytest.raises(ValueError, match="exists already"):
        store.add("app", ("restms:publish",))
    with pytest.raises(ValueError, match="exists already"):
        ClientStore(path).add("app", ("restms:read",))  # another process, same file
    with pytest.raises(ValueError, match="client id"):
        store.add("no spaces", ("restms:read",))
    kept = store.get("app")
    assert kept is not None
    assert kept.scopes == ("restms:read",)


def test_a_running_store_sees_another_writers_changes(path: Path) -> None:
    running = ClientStore(path)
    assert running.get("late") is None  # and it has looked at the (absent) file
    secret = ClientStore(path).add("late", ("restms:read",))  # `main.py client add`
    assert running.authenticate("late", secret) is not None
    ClientStore(path).add("later", ("restms:read",))
    ClientStore(path).remove("late")  # a removal takes effect too, not only a miss
    assert running.get("late") is None
    assert running.get("later") is not None


def test_a_same_size_rewrite_in_the_same_tick_is_noticed(path: Path) -> None:
    running = ClientStore(path)
    running.add("aaa", ("restms:read",))
    assert running.get("aaa") is not None
    stamp = path.stat().st_mtime_ns
    with path.open("rb"):  # the old inode stays in use: the new file cannot reuse its number
        other = ClientStore(path)
        other.remove("aaa")
        other.add("bbb", ("restms:read",))  # same length of file
        os.utime(path, ns=(stamp, stamp))  # and the same mtime
        assert running.get("bbb") is not None
        assert running.get("aaa") is None


def test_configured_clients_come_first_and_are_read_only(path: Path) -> None:
    configured = Client(client_id="ops", secret_hash=hash_secret("pw"), scopes=("restms:admin",))
    store = ClientStore(path, [configured])
    store.add("app", ("restms:read",))
    assert [c.client_id for c in store.clients()] == ["ops", "app"]
    assert store.authenticate("ops", "pw") == configured
    with pytest.raises(ValueError, match="configuration"):
        store.add("ops", ("restms:read",))
    with pytest.raises(ValueError, match="configured"):
        store.remove("ops")
    with pytest.raises(ValueError, match="twice"):
        ClientStore(path, [configured, configured])


def test_a_corrupt_file_is_an_error_not_an_empty_store(path: Path) -> None:
    ClientStore(path).add("app", ("restms:read",))
    path.write_text('{"version": 1, "clients": [{"client_id": "app"}]}')
    with pytest.raises(ValueError, match="malformed"):
        ClientStore(path).get("app")
    path.write_text("not json")
    with pytest.raises(ValueError, match="cannot read"):
        ClientStore(path).get("app")


def test_a_checked_secret_is_remembered_against_the_client_as_it_was() -> None:
    now = [0.0]
    checked = clients.CheckedSecrets(clock=lambda: now[0])
    client = Client(client_id="app", secret_hash="scrypt$one", scopes=("restms:read",))
    assert not checked.holds(client, "s3cret")
    checked.add(client, "s3cret")
    assert checked.holds(client, "s3cret")
    assert not checked.holds(client, "other")
    again = Client(client_id="app", secret_hash="scrypt$two", scopes=("restms:read",))
    assert not checked.holds(again, "s3cret")  # added again, with another secret
    now[0] = clients.REMEMBERED_FOR + 1
    assert not checked.holds(client, "s3cret")  # forgotten after its time


def test_checked_secrets_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(clients, "REMEMBERED_KEPT", 3)
    checked = clients.CheckedSecrets()
    made = [Client(client_id=f"c{i}", secret_hash="scrypt$h", scopes=("a",)) for i in range(5)]
    for client in made:
        checked.add(client, "s")
    assert [checked.holds(client, "s") for client in made] == [False, False, True, True, True]
