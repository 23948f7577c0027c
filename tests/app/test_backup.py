"""The backup and restore procedure of docs/OPERATIONS.md ("Backups"), on a real gateway.

Decided behaviour under test:

* SQLite's online backup of ``gateway.sqlite3``, taken while the gateway runs and
  keeps committing, holds every persistent message whose publish was answered
  before the backup began; a gateway started on a directory restored from it (the
  store, ``oauth/``) has the same pipe under the same URI with those messages, and
  none published after the backup.
* Tokens signed before the backup are still accepted after the restore: the signing
  key is part of what is restored.
"""

from __future__ import annotations

import asyncio
import shutil
import sqlite3
from pathlib import Path

import pytest

from feeds.store import FILE_NAME
from tests.app.jsonapi import DOMAIN, HJ, body, new_pipe
from tests.app.oauth import clients, token
from tests.app.test_shutdown import persistent
from tests.app.test_streams import held
from tests.conftest import MakeGateway

pytestmark = pytest.mark.app

FEED = "/restms/feed/default"


def backup(data_dir: Path, target: Path) -> None:
    """What OPERATIONS.md says to run: the backup API for the store, copies for the rest
    (blocking: run it in a thread)."""
    target.mkdir(parents=True)
    source = sqlite3.connect(data_dir / FILE_NAME)
    copy = sqlite3.connect(target / FILE_NAME)
    try:
        source.backup(copy)
    finally:
        copy.close()
        source.close()
    shutil.copytree(data_dir / "oauth", target / "oauth")


async def test_an_online_backup_restores_what_was_committed_before_it(
    make_gateway: MakeGateway, tmp_path: Path
) -> None:
    configured, secrets = await clients(app="restms:read restms:publish restms:subscribe")
    live, restored = tmp_path / "live", tmp_path / "restored"
    gw = await make_gateway(data_dir=str(live), clients=configured)
    bearer = await token(gw, "app", secrets["app"])
    pipe = await new_pipe(gw)

    async def publish(*mids: str) -> None:
        document = body(message=[persistent(pipe, mid) for mid in mids])
        async with gw.http.post(FEED, data=document, headers=HJ) as r:
            assert r.status == 200, await r.text()

    await publish(*(f"before-{n}" for n in range(50)))
    # The backup runs while publishes keep committing next to it.
    during = asyncio.create_task(publish(*(f"during-{n}" for n in range(50))))
    await asyncio.to_thread(backup, live, restored)
    await during
    await publish("after")
    await gw.stop()

    again = await make_gateway(data_dir=str(restored), clients=configured)
    path = "/" + pipe["uri"].split("/", 3)[3]  # the same URI on the new server
    messages = [m["message_id"] for m in await held(again, {"uri": path})]
    assert messages[:50] == [f"before-{n}" for n in range(50)]
    # Publishes racing the backup are in it or not, each whole and in order.
    assert messages[50:] == [f"during-{n}" for n in range(len(messages) - 50)]
    assert "after" not in messages
    # The restored signing key still vouches for a token issued before the backup; a
    # gateway with a fresh data directory (a new key) does not.
    bearing = {"Authorization": f"Bearer {bearer}"}
    async with again.http.get(DOMAIN, headers=bearing) as r:
        assert r.status == 200
    fresh = await make_gateway(data_dir=str(tmp_path / "fresh"), clients=configured)
    async with fresh.http.get(DOMAIN, headers=bearing) as r:
        assert r.status == 401
