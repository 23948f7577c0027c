"""Who a request without credentials acts as: loopback peers are guest, others nobody."""

from __future__ import annotations

import pytest

from auth import GUEST, Guests


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
def test_anonymous_principal_for_peer(
    peer: str | None, insecure: bool, expected: str | None
) -> None:
    guests = Guests(anonymous=True, guest_user=True, scopes=["restms:read"], insecure=insecure)
    principal = guests.anonymous_for(peer)
    assert (principal.name if principal is not None else None) == expected


def test_a_proxied_request_is_not_loopback() -> None:
    """Behind a reverse proxy on the same host every peer is loopback: a request that
    says it was forwarded is judged as coming from elsewhere."""
    guests = Guests(anonymous=True, guest_user=True, scopes=["restms:read"], insecure=False)
    assert guests.anonymous_for("127.0.0.1", forwarded=True) is None
    assert guests.guest_login("guest", "guest", "127.0.0.1", forwarded=True) is None
    assert guests.anonymous_for("127.0.0.1", forwarded=False) is not None
