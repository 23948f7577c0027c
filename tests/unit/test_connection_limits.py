"""The connection caps count a client by the same key the secret checks use: an IPv4
address as it is, an IPv6 address by its /64."""

from __future__ import annotations

from gateway.server.connections import ConnectionLimits


def limits(per_ip: int) -> ConnectionLimits:
    return ConnectionLimits(
        max_connections=100,
        max_connections_per_ip=per_ip,
        header_timeout=10.0,
        body_timeout=10.0,
    )


def test_addresses_of_one_ipv6_slash_64_share_one_cap() -> None:
    caps = limits(2)
    assert caps.admit("2001:db8:0:1::1")
    assert caps.admit("2001:db8:0:1::2")
    # A third address of the same /64 is the same client: refused.
    assert not caps.admit("2001:db8:0:1:ffff::3")
    # Another /64 is another client.
    assert caps.admit("2001:db8:0:2::1")
    assert caps.from_peer("2001:db8:0:1::9") == 2
    caps.release("2001:db8:0:1::1")
    assert caps.admit("2001:db8:0:1::7")
    assert caps.open == 3
    assert caps.refused == 1


def test_ipv4_addresses_and_mapped_ones_are_counted_as_themselves() -> None:
    caps = limits(1)
    assert caps.admit("192.0.2.1")
    assert not caps.admit("::ffff:192.0.2.1")  # the same IPv4 client, mapped
    assert caps.admit("192.0.2.2")
    caps.release("::ffff:192.0.2.1")
    assert caps.from_peer("192.0.2.1") == 0
