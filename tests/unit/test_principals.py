"""Who a request acts as until OAuth exists: loopback peers are guest, others nobody."""

from __future__ import annotations

import pytest

from auth import GUEST, principal_for


@pytest.mark.parametrize(
    ("peer", "insecure", "expected"),
    [
        ("127.0.0.1", False, GUEST),
        ("127.10.0.7", False, GUEST),
        ("::1", False, GUEST),
        ("/run/gateway.sock", False, GUEST),  # a Unix socket peer is local
        ("192.168.1.20", False, None),  # refused with 401 by the gateway
        ("8.8.8.8", False, None),
        ("::ffff:10.0.0.1", False, None),
        ("not an address", False, None),
        (None, False, None),
        ("", False, None),
        ("192.168.1.20", True, GUEST),  # --insecure: everyone is guest
        (None, True, GUEST),
    ],
)
def test_principal_for_peer(peer: str | None, insecure: bool, expected: str | None) -> None:
    assert principal_for(peer, insecure=insecure) == expected
