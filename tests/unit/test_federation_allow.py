"""``federation_allow`` (docs/FEDERATION.md, "Security"): read from the TOML file (an
array) and from ``RESTMS_FEDERATION_ALLOW`` (commas or spaces), with the syntax of
``webhook_allow``, and a bad entry stops the gateway naming the setting; the guard it
makes names the remote in its reasons."""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path

import pytest

from gateway.admin.bridging import remote_guard
from gateway.server.config import Config, ConfigError, load
from gateway.webhooks.guard import RefusedAddress


def test_federation_allow_from_toml_and_environment(tmp_path: Path) -> None:
    path = tmp_path / "gateway.toml"
    path.write_text('federation_allow = ["10.0.0.0/8", "peer.internal"]\n', encoding="utf-8")
    guard = remote_guard(load(str(path), env={}))
    assert guard.why_not(ipaddress.ip_address("10.1.2.3")) is None
    assert guard.why_not(ipaddress.ip_address("192.168.1.1")) == "private"
    assert guard.host_allowed("PEER.internal.")
    guard = remote_guard(load(env={"RESTMS_FEDERATION_ALLOW": "127.0.0.1,::1 localhost"}))
    assert guard.why_not(ipaddress.ip_address("::1")) is None
    assert guard.host_allowed("localhost")
    assert guard.why_not(ipaddress.ip_address("127.0.0.2")) == "loopback"


def test_by_default_only_public_addresses_and_the_reason_names_the_remote() -> None:
    guard = remote_guard(Config())
    assert guard.why_not(ipaddress.ip_address("8.8.8.8")) is None
    with pytest.raises(RefusedAddress, match=r"^the remote address is link-local$"):
        guard.check_literal("169.254.169.254")


@pytest.mark.parametrize("entry", ["10.0.0.0/33", "no_underscores.example", "a..b"])
def test_a_bad_entry_stops_the_gateway_naming_the_setting(entry: str) -> None:
    said = re.escape(f"federation_allow: {entry!r} is neither a CIDR nor a host name")
    with pytest.raises(ConfigError, match=f"^{said}$"):
        Config(federation_allow=entry)
