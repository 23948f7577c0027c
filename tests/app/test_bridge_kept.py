"""Run-time bridges kept in the data directory (the embedded engine, bridges/registry.py
FileKept): a name the configuration file takes later wins over the run-time copy,
which is dropped from ``bridges.json`` for good."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

import bridges.config
from tests.app.test_bridge_admin import admin_gateway, call, inbound, outbound
from tests.conftest import MakeGateway

pytestmark = pytest.mark.app


async def test_a_configured_bridge_drops_the_run_time_copy_of_its_name(
    make_gateway: MakeGateway, tmp_path: Path
) -> None:
    data = tmp_path / "kept"
    gw, auth = await admin_gateway(make_gateway, data_dir=str(data))
    for definition in (outbound("dup"), outbound("other")):
        status, reply, _ = await call(gw, auth["root"], "POST", definition=definition)
        assert status == 201, reply
    await gw.stop()

    configured = bridges.config.parse(inbound("dup"))
    gw, auth = await admin_gateway(make_gateway, data_dir=str(data), bridges=(configured,))
    status, listed, _ = await call(gw, auth["root"], "GET")
    assert status == 200, listed
    shown = {b["name"]: (b["configured"], b["direction"]) for b in listed["bridges"]}
    assert shown == {"dup": (True, "in"), "other": (False, "out")}
    text = await asyncio.to_thread((data / "bridges.json").read_text, encoding="utf-8")
    assert [b["name"] for b in json.loads(text)["bridges"]] == ["other"]
    await gw.stop()

    gw, auth = await admin_gateway(make_gateway, data_dir=str(data))  # configured no more
    status, listed, _ = await call(gw, auth["root"], "GET")
    assert [b["name"] for b in listed["bridges"]] == ["other"]
