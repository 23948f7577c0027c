"""What a trusted proxy's forwarding headers say of the client (gateway/server/proxies.py)."""

from __future__ import annotations

import re
import time

import pytest
from multidict import CIMultiDict, CIMultiDictProxy

from gateway.server.proxies import Proxies, parse_trusted
from restms.errors import BadRequest

PROXIES = Proxies(parse_trusted("127.0.0.1, 10.0.0.0/8 ::1"))


def _headers(*pairs: tuple[str, str]) -> CIMultiDictProxy[str]:
    return CIMultiDictProxy(CIMultiDict(pairs))


@pytest.mark.parametrize(
    ("peer", "trusted"),
    [
        ("127.0.0.1", True),
        ("10.9.8.7", True),
        ("::1", True),
        ("::ffff:10.1.1.1", True),  # an IPv4 proxy seen on a dual-stack socket
        ("127.0.0.2", False),
        ("192.0.2.1", False),
        ("not-an-address", False),
        (None, False),
    ],
)
def test_only_configured_peers_are_trusted(peer: str | None, trusted: bool) -> None:
    assert PROXIES.trusts(peer) is trusted
    assert PROXIES.trusts(peer) is trusted  # the remembered answer is the same


@pytest.mark.parametrize(
    ("forwarded_for", "client"),
    [
        ("192.0.2.7", "192.0.2.7"),
        ("192.0.2.7, 10.0.0.5", "192.0.2.7"),  # a second trusted hop is skipped
        ("203.0.113.9, 192.0.2.7", "192.0.2.7"),  # what the client wrote is not believed
        ("10.0.0.9, 10.0.0.5", "10.0.0.9"),  # all trusted: the left-most
        ("2001:db8::1", "2001:db8::1"),
        ("[2001:db8::2]", "2001:db8::2"),
    ],
)
def test_the_client_is_the_right_most_untrusted_hop(forwarded_for: str, client: str) -> None:
    assert PROXIES.overrides(_headers(("X-Forwarded-For", forwarded_for))) == {"remote": client}


def test_scheme_and_host_take_the_last_value() -> None:
    found = PROXIES.overrides(
        _headers(
            ("X-Forwarded-Proto", "http, HTTPS"),
            ("X-Forwarded-Host", "inner.local, gw.example.com:8443"),
        )
    )
    assert found == {"scheme": "https", "host": "gw.example.com:8443"}


def test_no_forwarding_headers_change_nothing() -> None:
    assert PROXIES.overrides(_headers(("Host", "x"))) == {}


@pytest.mark.parametrize(
    ("pairs", "reason"),
    [
        ((("X-Forwarded-For", "192.0.2.7, nonsense"),), "'nonsense' is not an address"),
        ((("X-Forwarded-For", "1.2.3.4"), ("X-Forwarded-For", "5.6.7.8")), "given 2 times"),
        ((("X-Forwarded-Proto", "gopher"),), "'gopher' is neither http nor https"),
        ((("X-Forwarded-Host", "evil.example/path"),), "is not a host[:port]"),
        ((("X-Forwarded-Host", "a@b"),), "is not a host[:port]"),
    ],
)
def test_a_wrong_forwarding_header_is_a_400_naming_it(
    pairs: tuple[tuple[str, str], ...], reason: str
) -> None:
    with pytest.raises(BadRequest, match=re.escape(reason)):
        PROXIES.overrides(_headers(*pairs))


def test_a_bad_setting_names_the_entry() -> None:
    with pytest.raises(ValueError, match=re.escape("'proxy.local' is not an address or network")):
        parse_trusted("10.0.0.1 proxy.local")
    assert parse_trusted("") == ()


def test_a_long_bad_forwarded_host_is_refused_at_once() -> None:
    """nginx relays a client's Host as X-Forwarded-Host: matching it must not backtrack
    (the first pattern took seconds on 25 letters and a '!', the event loop stopped)."""
    started = time.perf_counter()
    with pytest.raises(BadRequest, match="is not a host"):
        PROXIES.overrides(_headers(("X-Forwarded-Host", "a" * 25 + "!")))
    assert time.perf_counter() - started < 0.5
