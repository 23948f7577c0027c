"""``bridge_allow`` and the guard of AMQP and ZeroMQ bridges made at run time
(gateway/admin/bridge_guard.py; docs/AMQP.md and docs/ZEROMQ.md, "Security"): read
from the TOML file and from ``RESTMS_BRIDGE_ALLOW``, a bad entry stops the gateway
naming the setting, and the policy as a table: what a run-time bridge may connect to,
bind on and use, with the setting and without it; and the URL a guarded AMQP bridge
gives proton. Only ``localhost`` is resolved."""

from __future__ import annotations

import ipaddress
import re
import socket
from pathlib import Path

import pytest

from bridges.amqp_link import guarded
from gateway.admin.bridge_guard import BridgeGuard, parse_bridge_allow
from gateway.server.config import Config, ConfigError, load
from gateway.webhooks.guard import RefusedAddress

REACH = "a bridge made at run time may reach only public addresses, or those bridge_allow names"
BIND = "a bridge made at run time binds on loopback, or on what bridge_allow names"
WIDE = "10.0.0.0/8 broker.internal tcp://* tcp://10.0.0.0/8 ipc:///run/restms/ inproc://made.here"


def test_bridge_allow_from_toml_and_environment(tmp_path: Path) -> None:
    path = tmp_path / "gateway.toml"
    path.write_text('bridge_allow = ["10.0.0.0/8", "tcp://*", "ipc:///run/x/"]\n', "utf-8")
    allow = parse_bridge_allow(load(str(path), env={}).bridge_allow)
    assert (allow.hosts, allow.wildcard, allow.local) == (("10.0.0.0/8",), True, ("ipc:///run/x/",))
    config = load(env={"RESTMS_BRIDGE_ALLOW": "127.0.0.1,inproc://a localhost"})
    allow = parse_bridge_allow(config.bridge_allow)
    assert (allow.hosts, allow.wildcard, allow.local) == (
        ("127.0.0.1", "localhost"),
        False,
        ("inproc://a",),
    )


@pytest.mark.parametrize(
    ("entry", "said"),
    [
        ("10.0.0.0/33", "'10.0.0.0/33' is neither a CIDR nor a host name"),
        ("no_underscores.example", "'no_underscores.example' is neither a CIDR nor a host"),
        ("tcp://10.0.0.1:5555", "'tcp://10.0.0.1:5555' is not an endpoint entry"),
        (
            "ipc:///run/x/../y",
            "'ipc:///run/x/../y' is not an endpoint entry (tcp://*, tcp://NETWORK",
        ),
    ],
)
def test_a_bad_entry_stops_the_gateway_naming_the_setting(entry: str, said: str) -> None:
    with pytest.raises(ConfigError, match=f"^bridge_allow: {re.escape(said)}"):
        Config(bridge_allow=entry)


@pytest.mark.parametrize(
    ("endpoint", "bind", "allow", "reason"),
    [
        # connecting: public addresses; names are looked up as the bridge connects
        ("tcp://8.8.8.8:5555", False, "", None),
        ("tcp://broker.example:5555", False, "", None),
        ("tcp://127.0.0.1:5555", False, "", f"the peer address is loopback: {REACH}"),
        ("tcp://169.254.169.254:80", False, "", "the peer address is link-local"),
        ("tcp://[::ffff:10.1.2.3]:5555", False, "", "private (carried in ::ffff:a01:203)"),
        ("tcp://10.1.2.3:5555", False, WIDE, None),
        ("tcp://192.168.1.1:5555", False, WIDE, "the peer address is private"),
        # binding: loopback, or what the setting names, on this machine
        ("tcp://127.0.0.1:*", True, "", None),
        ("tcp://[::1]:5555", True, "", None),
        ("tcp://*:5555", True, "", f"binds on every interface: {BIND} (tcp://*)"),
        ("tcp://0.0.0.0:5555", True, "", "binds on every interface"),
        ("tcp://[::]:5555", True, "", "binds on every interface"),
        ("tcp://*:5555", True, WIDE, None),
        ("tcp://10.1.2.3:5555", True, "", f"binds on 10.1.2.3, which is not loopback: {BIND}"),
        ("tcp://10.1.2.3:5555", True, WIDE, None),
        ("tcp://10.1.2.3:5555", True, "10.0.0.0/8", "not loopback: a bridge made at run time"),
        ("tcp://10.1.2.3:5555", True, "10.0.0.0/8", "what bridge_allow names (tcp://10.1.2.3)"),
        ("tcp://10.1.2.3:5555", False, "tcp://10.0.0.0/8", "the peer address is private"),
        ("tcp://[fd00::5]:5555", True, "tcp://[fd00::/64]", None),
        ("tcp://8.8.8.8:5555", True, "", "binds on 8.8.8.8, which is not loopback"),
        ("tcp://eth0:5555", True, WIDE, "binds on the interface 'eth0'"),
        # ipc:// and inproc://: only where an entry of that scheme allows them
        ("ipc:///run/restms/a.sock", True, "", "uses ipc:// endpoints only where bridge_allow"),
        ("ipc:///run/restms/a.sock", True, WIDE, None),
        ("ipc:///run/restms/../gw.db", True, WIDE, "uses ipc:// endpoints only where"),
        ("ipc:///run/restms-other/a", False, WIDE, "uses ipc:// endpoints only where"),
        ("inproc://made.here", False, WIDE, None),
        ("inproc://made.here.too", False, WIDE, "uses inproc:// endpoints only where"),
        ("inproc://zeromq.zap.01", False, "", "uses inproc:// endpoints only where"),
    ],
)
def test_what_a_run_time_zeromq_endpoint_may_be(
    endpoint: str, bind: bool, allow: str, reason: str | None
) -> None:
    said = BridgeGuard(allow).endpoint(endpoint, bind=bind)
    if reason is None:
        assert said is None
    else:
        assert said is not None
        assert reason in said, said


def test_addresses_checks_literals_and_what_names_resolve_to() -> None:
    guard = BridgeGuard("")
    assert guard.addresses("8.8.8.8", 5672, socket.AF_INET) == ["8.8.8.8"]
    with pytest.raises(RefusedAddress, match=f"^the peer address is loopback: {REACH}$"):
        guard.addresses("[::1]", 5672, socket.AF_UNSPEC)
    with pytest.raises(RefusedAddress, match=r"resolves only to refused addresses \(loopback"):
        guard.addresses("localhost", 5672, socket.AF_INET)
    assert BridgeGuard("127.0.0.0/8").addresses("localhost", 5672, socket.AF_INET) == ["127.0.0.1"]
    # a name the setting names is let through whatever it resolves to
    assert BridgeGuard("localhost").addresses("localhost", 5672, socket.AF_INET) == ["127.0.0.1"]


class Two:
    """A guard whose every name has two allowed addresses."""

    def endpoint(self, endpoint: str, *, bind: bool) -> str | None:
        return None

    def addresses(self, host: str, port: int, family: int) -> list[str]:
        try:
            return [str(ipaddress.ip_address(host))]  # a literal: as the guard keeps it
        except ValueError:
            return ["192.0.2.1", "2001:db8::1"]


@pytest.mark.parametrize(
    ("url", "turn", "connects_to", "name"),
    [
        ("amqps://broker.example:5671/vh", 0, "amqps://192.0.2.1:5671/vh", "broker.example"),
        ("amqp://broker.example", 1, "amqp://[2001:db8::1]", "broker.example"),
        ("amqp://broker.example:5672", 2, "amqp://192.0.2.1:5672", "broker.example"),
        ("amqp://8.8.8.8:5672", 1, "amqp://8.8.8.8:5672", ""),
    ],
)
def test_a_guarded_amqp_bridge_connects_to_a_checked_address_in_turn(
    url: str, turn: int, connects_to: str, name: str
) -> None:
    """The name stays for the Open frame and TLS (``virtual_host``); a URL whose host is
    an address is kept as it is."""
    assert guarded(url, Two(), turn) == (connects_to, name)
