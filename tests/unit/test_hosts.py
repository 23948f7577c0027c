"""Host values and the public_url / allowed_hosts settings (gateway/server/hosts.py)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from gateway.auth.startup import issuer_url
from gateway.server.config import Config, ConfigError, load
from gateway.server.hosts import split_host


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("gw.example.com", ("gw.example.com", None)),
        ("GW.Example.COM.:8443", ("gw.example.com", 8443)),
        ("localhost:8080", ("localhost", 8080)),
        ("127.0.0.1:80", ("127.0.0.1", 80)),
        ("[::1]:8080", ("[::1]", 8080)),
        ("[0:0::1]", ("[::1]", None)),
        ("restms_gateway:8080", ("restms_gateway", 8080)),  # a compose service name
        ("a/b", None),
        ("gw.example.com:99999", None),
        ("gw..example.com", None),
        ("[not-v6]:80", None),
        ("gw.example.com:", None),
        ("user@gw.example.com", None),
        ("", None),
        ("a" * 256, None),
    ],
)
def test_split_host(text: str, expected: tuple[str, int | None] | None) -> None:
    assert split_host(text) == expected


def test_a_long_bad_host_is_refused_at_once() -> None:
    """The regex it replaced (proxies._HOST) took seconds on 25 letters and a '!'."""
    started = time.perf_counter()
    for n in range(20, 250, 10):
        assert split_host("a" * n + "!") is None
        assert split_host("a." * (n // 2) + "!") is None
    assert time.perf_counter() - started < 0.5


def test_public_url_and_allowed_hosts_are_checked() -> None:
    for bad in (
        "gw.example.com",
        "ftp://gw.example.com",
        "https://gw.example.com/restms",
        "https://gw.example.com?x=1",
        "https://user@gw.example.com",
        "https://",
    ):
        with pytest.raises(ConfigError, match="public_url"):
            Config(public_url=bad)
    assert Config(public_url="https://GW.example.com/").hosts.public == "https://gw.example.com"
    with pytest.raises(ConfigError, match="allowed_hosts: 'a/b'"):
        Config(allowed_hosts="gw.example.com a/b")


def test_allowed_hosts_is_a_toml_array(tmp_path: Path) -> None:
    path = tmp_path / "gateway.toml"
    path.write_text('allowed_hosts = ["gw.example.com", "*.example.org:8443"]\n')
    config = load(str(path), env={})
    assert config.allowed_hosts == "gw.example.com *.example.org:8443"
    assert config.hosts.configured


def test_public_url_is_the_derived_issuer() -> None:
    assert issuer_url(Config(public_url="https://gw.example.com")) == "https://gw.example.com"
    both = Config(public_url="https://gw.example.com", oauth_issuer="https://id.example.com")
    assert issuer_url(both) == "https://id.example.com"
    assert issuer_url(Config()) == "http://127.0.0.1:8080"


def test_the_start_up_line_says_which_hosts_are_served() -> None:
    assert "set public_url or allowed_hosts" in Config(host="0.0.0.0").hosts.describe()
    allowed = Config(allowed_hosts="gw.lan *.lan:8443").hosts.describe()
    assert allowed.startswith("Host served: gw.lan, *.lan:8443 and the gateway's addresses")
    public = Config(public_url="https://gw.example.com").hosts.describe()
    assert public.startswith("URIs name https://gw.example.com; Host served: gw.example.com")
    assert "any Host is served" in Config(allowed_hosts="*").hosts.describe()
