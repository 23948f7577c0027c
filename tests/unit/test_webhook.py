"""Webhook pipes, the pure parts: signature, retry schedule, options, address
classification and the delivery state machine (docs/WEBHOOKS.md)."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Any

import pytest

from feeds.webhook import TRANSITIONS, Hook, StateError, apply_change
from gateway.server.config import Config, ConfigError, load
from gateway.webhooks.guard import Guard, parse_allow, refusal, split_allow
from restms.errors import BadRequest
from restms.specs import PipeOptions, PipeSpec, creation, update
from restms.webhook import (
    WebhookLimits,
    WebhookOptions,
    backoff,
    check_callback,
    delivery_id,
    signature,
    verify,
)
from restms.xmlcodec import CodecLimits, parse_xml

SECRET = "whsec-test-secret-0001"
NS = "http://www.restms.org/schema/restms"

# ---------------------------------------------------------------- signature

# Computed apart from the gateway: printf '1700000000.{"a":1}' | openssl dgst -sha256 -hmac ...
VECTORS = [
    (1700000000, b'{"a":1}', "37d172157c0221fa4582f0ac3db8884ac91d9f79e48d9a74250355fe12409307"),
    (1700000000, b"", "593d9291e9e80a9accd317c26dbd2368bee735a4f1814ca1f1e66d2e42d95bcc"),
]


@pytest.mark.parametrize(("stamp", "body", "mac"), VECTORS)
def test_signature_matches_an_independent_hmac(stamp: int, body: bytes, mac: str) -> None:
    assert signature(SECRET, stamp, body) == f"t={stamp},v1={mac}"


NOW = 1700000100.0
GOOD = signature(SECRET, 1700000000, b"body")


@pytest.mark.parametrize(
    ("header", "secret", "body", "now", "expected"),
    [
        (GOOD, SECRET, b"body", NOW, True),
        (GOOD, SECRET, b"body", 1700000000 + 300, True),  # at the edge of the window
        (GOOD, SECRET, b"body", 1700000000 + 301, False),  # a replay, too late
        (GOOD, SECRET, b"body", 1700000000 - 301, False),  # from the future
        (GOOD, "another-secret-000", b"body", NOW, False),
        (GOOD, SECRET, b"bodY", NOW, False),  # tampered body
        (GOOD.replace("t=1700000000", "t=1700000050"), SECRET, b"body", NOW, False),  # moved time
        (f"{GOOD},v1={'0' * 64}", SECRET, b"body", NOW, True),  # extra signatures are fine
        (f"t=1700000000,v1={'0' * 64}", SECRET, b"body", NOW, False),
        ("v1=abc", SECRET, b"body", NOW, False),  # no timestamp
        (f"t=1700000000,t=1700000001,{GOOD[13:]}", SECRET, b"body", NOW, False),  # two stamps
        ("t=-5,v1=00", SECRET, b"body", NOW, False),
        ("", SECRET, b"body", NOW, False),
    ],
)
def test_verify(header: str, secret: str, body: bytes, now: float, expected: bool) -> None:
    assert verify(header, secret, body, now) is expected


def test_delivery_id_is_stable_and_hides_the_pipe_name() -> None:
    first = delivery_id("PipeNameCapability", 7)
    assert first == delivery_id("PipeNameCapability", 7)
    assert first != delivery_id("PipeNameCapability", 8)
    assert first.endswith("-7")
    assert "PipeName" not in first


# ---------------------------------------------------------------- backoff


@pytest.mark.parametrize(
    ("failures", "rand", "expected"),
    [
        (1, 1.0, 1.0),  # base
        (2, 1.0, 2.0),
        (3, 1.0, 4.0),
        (9, 1.0, 256.0),
        (10, 1.0, 300.0),  # capped
        (1000, 1.0, 300.0),  # no overflow however many
        (5, 0.0, 0.0),  # full jitter: anywhere down to nothing
        (5, 0.5, 8.0),
        (0, 1.0, 1.0),  # treated as the first
    ],
)
def test_backoff_is_capped_exponential_with_full_jitter(
    failures: int, rand: float, expected: float
) -> None:
    assert backoff(failures, 1.0, 300.0, lambda: rand) == pytest.approx(expected)


def test_backoff_draws_below_its_ceiling() -> None:
    delays = [backoff(4, 0.5, 10.0) for _ in range(500)]
    assert all(0 <= d <= 4.0 for d in delays)
    assert max(delays) - min(delays) > 1.0  # jitter spreads them


# ---------------------------------------------------------------- options


@pytest.mark.parametrize(
    "url",
    [
        "http://example.com/hook",
        "https://example.com:8443/a/b?x=1&y=2",
        "HTTPS://Example.COM/",
        "http://192.0.2.1/x",
        "http://[2001:db8::1]:8080/x",
        "http://example.com./x",
    ],
)
def test_callbacks_accepted(url: str) -> None:
    assert check_callback(url) == url


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("ftp://example.com/x", "http:// or https://"),
        ("/relative/path", "http:// or https://"),
        ("example.com/x", "http:// or https://"),
        ("http://user:pw@example.com/x", "user name or password"),
        ("http://example.com/x#frag", "fragment"),
        ("http://example.com/x#", "fragment"),
        ("http:///x", "no valid host"),
        ("http://exa mple.com/", "spaces"),
        ("http://example.com:0/", "no valid host"),
        ("http://example.com:99999/", "not a URL"),
        ("http://-bad-.com/", "no valid host"),
        ("http://ex_ample.com/", "no valid host"),
        ("http://bücher.de/", "non-ASCII"),
        ("http://example.com/" + "a" * 2048, "longer than"),
    ],
)
def test_callbacks_refused(url: str, reason: str) -> None:
    with pytest.raises(BadRequest, match=reason):
        check_callback(url)


@pytest.mark.parametrize(
    ("attrs", "reason"),
    [
        ({"type": "webhook"}, "needs a callback"),
        ({"type": "webhook", "secret": "x" * 20}, "needs a callback"),
        ({"type": "", "callback": "http://example.com/"}, "for webhook pipes only"),
        ({"type": "stream", "timeout": "5"}, "for webhook pipes only"),
        ({"type": "webhook", "callback": "http://example.com/", "secret": "short"}, "secret"),
        ({"type": "webhook", "callback": "http://example.com/", "secret": "a b" * 9}, "secret"),
        ({"type": "webhook", "callback": "http://example.com/", "timeout": "0"}, "more than 0"),
        ({"type": "webhook", "callback": "http://example.com/", "max_age": "0"}, "more than 0"),
        ({"type": "webhook", "callback": "http://example.com/", "concurrency": "0"}, "at least 1"),
        ({"type": "webhook", "callback": "http://example.com/", "max_attempts": "x"}, "number"),
        ({"type": "webhook", "callback": "http://example.com/", "timeout": "nan"}, "number"),
    ],
)
def test_pipe_documents_refused(attrs: dict[str, str], reason: str) -> None:
    element = "".join(f' {k}="{v}"' for k, v in attrs.items())
    document = parse_xml(f'<restms xmlns="{NS}"><pipe{element}/></restms>'.encode(), CodecLimits())
    with pytest.raises(BadRequest, match=reason):
        creation(document)


def test_webhook_pipe_document_read() -> None:
    document = parse_xml(
        f'<restms xmlns="{NS}"><pipe type="webhook" callback="https://example.com/h" '
        f'secret="{SECRET}" concurrency="4" timeout="2.5" max_attempts="3" max_age="60"/>'
        "</restms>".encode(),
        CodecLimits(),
    )
    spec = creation(document)
    assert isinstance(spec, PipeSpec)
    assert spec.options.webhook == WebhookOptions(
        callback="https://example.com/h",
        secret=SECRET,
        concurrency=4,
        timeout=2.5,
        max_attempts=3,
        max_age=60.0,
    )
    # what the store keeps comes back the same
    assert PipeOptions.stored(spec.options.given()) == spec.options


LIMITS = WebhookLimits(concurrency_limit=8, timeout_limit=30.0, max_attempts_limit=20)


@pytest.mark.parametrize(
    ("given", "filled"),
    [
        ({}, {"concurrency": 1, "timeout": 10.0, "max_attempts": 10, "max_age": 86400.0}),
        ({"concurrency": 8, "timeout": 30.0}, {"concurrency": 8, "timeout": 30.0}),
        ({"max_attempts": 1, "max_age": 0.5}, {"max_attempts": 1, "max_age": 0.5}),
    ],
)
def test_limits_fill_defaults(given: dict[str, float], filled: dict[str, float]) -> None:
    options = LIMITS.fill(WebhookOptions(callback="http://example.com/", **given))  # type: ignore[arg-type]
    for name, value in filled.items():
        assert getattr(options, name) == value


@pytest.mark.parametrize(
    ("given", "reason"),
    [
        ({"concurrency": 9}, "concurrency may be at most 8, not 9"),
        ({"timeout": 30.5}, "timeout may be at most 30, not 30.5"),
        ({"max_attempts": 21}, "max_attempts may be at most 20"),
        ({"max_age": 700000.0}, "max_age may be at most 604800"),
    ],
)
def test_limits_refuse_and_clamp(given: dict[str, float], reason: str) -> None:
    options = WebhookOptions(callback="http://example.com/", **given)  # type: ignore[arg-type]
    with pytest.raises(BadRequest, match=reason):
        LIMITS.fill(options)
    clamped = LIMITS.fill(options, clamp=True)  # a stored pipe after the limit went down
    (name,) = given
    assert getattr(clamped, name) == getattr(LIMITS, f"{name}_limit")


@pytest.mark.parametrize(
    "kwargs",
    [
        {"concurrency": 20, "concurrency_limit": 16},
        {"timeout": 0.0},
        {"backoff_base": 10.0, "backoff_cap": 5.0},
        {"max_age": -1.0},
    ],
)
def test_limits_refuse_bad_configuration(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="webhook_"):
        WebhookLimits(**kwargs)  # type: ignore[arg-type]


def test_put_reads_webhook_attributes_only_on_pipes() -> None:
    document = parse_xml(
        f'<restms xmlns="{NS}"><pipe title="t" callback="http://example.org/"/></restms>'.encode(),
        CodecLimits(),
    )
    assert update(document, "pipe").webhook == WebhookOptions(callback="http://example.org/")
    feed = parse_xml(f'<restms xmlns="{NS}"><feed title="t"/></restms>'.encode(), CodecLimits())
    assert update(feed, "feed").webhook is None


# ---------------------------------------------------------------- addresses


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("93.184.216.34", None),
        ("8.8.8.8", None),
        ("2606:4700:4700::1111", None),
        ("0.0.0.0", "unspecified"),
        ("::", "unspecified"),
        ("127.0.0.1", "loopback"),
        ("127.255.0.9", "loopback"),
        ("::1", "loopback"),
        ("169.254.169.254", "link-local"),  # cloud metadata
        ("fe80::1", "link-local"),
        ("224.0.0.1", "multicast"),
        ("ff02::1", "multicast"),
        ("10.1.2.3", "private"),
        ("172.16.0.1", "private"),
        ("192.168.1.1", "private"),
        ("fd12:3456::1", "unique-local"),
        ("fc00::1", "unique-local"),
        ("fec0::1", "site-local"),
        ("100.64.0.1", "reserved"),  # shared address space (carrier NAT)
        ("240.0.0.1", "private"),
        ("255.255.255.255", "private"),
        ("192.0.2.7", "private"),  # documentation
        ("2001:db8::1", "private"),  # documentation
        ("::ffff:127.0.0.1", "loopback (carried in ::ffff:7f00:1)"),
        ("::ffff:10.0.0.1", "private (carried in ::ffff:a00:1)"),
        ("::ffff:8.8.8.8", None),  # IPv4-mapped: the IPv4 address decides
        ("64:ff9b::7f00:1", "loopback (carried in 64:ff9b::7f00:1)"),  # NAT64
        ("64:ff9b::808:808", None),
        ("2002:7f00:1::1", "loopback (carried in 2002:7f00:1::1)"),  # 6to4
        ("2002:a00:1::1", "private (carried in 2002:a00:1::1)"),
        ("2002:808:808::1", None),
    ],
)
def test_address_classification(address: str, reason: str | None) -> None:
    assert refusal(ipaddress.ip_address(address)) == reason


@pytest.mark.parametrize(
    ("allow", "address", "allowed"),
    [
        ([], "127.0.0.1", False),
        (["127.0.0.1"], "127.0.0.1", True),
        (["127.0.0.1"], "127.0.0.2", False),
        (["127.0.0.0/8"], "127.0.0.2", True),
        (["127.0.0.1"], "::ffff:127.0.0.1", True),  # the mapped form of an allowed address
        (["10.0.0.0/8", "::1"], "::1", True),
        (["10.0.0.0/8"], "192.168.0.1", False),
        (["hooks.internal"], "10.0.0.1", False),  # a host name allows names, not addresses
        ([], "8.8.8.8", True),
    ],
)
def test_allow_list(allow: list[str], address: str, allowed: bool) -> None:
    assert (Guard(allow).why_not(ipaddress.ip_address(address)) is None) is allowed


def test_allow_list_parsing() -> None:
    assert split_allow("127.0.0.1, ::1 hooks.internal.") == ["127.0.0.1", "::1", "hooks.internal."]
    networks, hosts = parse_allow(["127.0.0.1", "10.0.0.0/8", "Hooks.Internal."])
    assert [str(n) for n in networks] == ["127.0.0.1/32", "10.0.0.0/8"]
    assert hosts == {"hooks.internal"}
    assert Guard(["hooks.internal"]).host_allowed("HOOKS.internal.")
    for bad in ("10.0.0.0/33", "not a host", "a..b", "*.example.com"):
        with pytest.raises(ValueError, match="webhook_allow"):
            parse_allow([bad])


# ---------------------------------------------------------------- the state machine


@pytest.mark.parametrize(
    ("events", "final"),
    [
        (["verified"], "active"),
        (["refused"], "failed"),
        (["verified", "failed", "failed", "settled"], "active"),
        (["verified", "failed", "gone"], "ended"),
        (["verified", "gone", "changed", "verified"], "active"),
        (["refused", "changed", "verified"], "active"),
        (["verified", "failed", "changed"], "verifying"),
    ],
)
def test_legal_moves(events: list[str], final: str) -> None:
    hook = Hook(WebhookOptions(callback="http://example.com/"))
    for event in events:
        hook.fire(event)
    assert hook.state == final


@pytest.mark.parametrize(
    ("events", "illegal"),
    [
        ([], "failed"),  # nothing is delivered before verification
        ([], "gone"),
        (["verified"], "settled"),
        (["verified"], "verified"),
        (["refused"], "verified"),
        (["verified", "gone"], "failed"),  # ended delivers nothing
    ],
)
def test_illegal_moves(events: list[str], illegal: str) -> None:
    hook = Hook(WebhookOptions(callback="http://example.com/"))
    for event in events:
        hook.fire(event)
    with pytest.raises(StateError):
        hook.fire(illegal)


def test_every_state_can_be_changed_back_to_verifying() -> None:
    assert all(moves.get("changed") == "verifying" for moves in TRANSITIONS.values())


def test_retrying_lasts_while_any_message_waits_and_survives_a_restart() -> None:
    hook = Hook(WebhookOptions(callback="http://example.com/"))
    hook.fire("verified")
    hook.failed(5, 1, 100.0)
    hook.failed(6, 2, 200.0)
    hook.done(5)
    assert hook.state == "retrying"
    record = hook.record()
    again = Hook(hook.options)
    again.restore(record)
    assert (again.state, again.attempts, again.due, again.failures) == (
        "retrying",
        {6: 2},
        {6: 200.0},
        2,
    )
    again.keep_only(set())  # the message was not persistent and is gone
    assert again.state == "active"
    assert again.attempts == {}


def test_a_put_verifies_a_new_callback_and_keeps_the_secret() -> None:
    limits = type("C", (), {"webhooks": WebhookLimits()})()
    options = WebhookLimits().fill(WebhookOptions(callback="http://a.example/", secret=SECRET))
    hook = Hook(options)
    hook.fire("verified")
    given = {"callback": "http://a.example/", "secret": SECRET}
    assert apply_change(hook, given, WebhookOptions(callback="http://a.example/"), limits) is None
    kept = apply_change(hook, given, WebhookOptions(callback="http://b.example/"), limits)
    assert kept == {"callback": "http://b.example/", "secret": SECRET}
    assert hook.state == "verifying"
    assert hook.options.secret == SECRET
    with pytest.raises(BadRequest, match="at most"):
        apply_change(hook, kept, WebhookOptions(concurrency=100), limits)
    with pytest.raises(BadRequest, match="webhook pipes"):
        apply_change(None, {}, WebhookOptions(timeout=1.0), limits)


# ---------------------------------------------------------------- configuration


def test_webhook_settings_from_toml_and_environment(tmp_path: Path) -> None:
    path = tmp_path / "gateway.toml"
    path.write_text(
        'webhook_allow = ["10.0.0.0/8", "hooks.internal"]\nwebhook_timeout = 5.0\n',
        encoding="utf-8",
    )
    config = load(str(path), env={"RESTMS_WEBHOOK_CONCURRENCY": "4"})
    assert split_allow(config.webhook_allow) == ["10.0.0.0/8", "hooks.internal"]
    limits = config.engine_config().webhooks
    assert (limits.timeout, limits.concurrency, limits.concurrency_limit) == (5.0, 4, 16)


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        ({"webhook_allow": "10.0.0.0/33"}, "neither a CIDR nor a host name"),
        ({"webhook_concurrency": 20}, "webhook_concurrency must be"),
        ({"webhook_timeout": 90.0}, "webhook_timeout must be"),
        ({"webhook_backoff_base": 0.0}, "webhook_backoff_base"),
        ({"webhook_connections": 0}, "webhook_connections"),
    ],
)
def test_bad_webhook_settings_stop_the_gateway(overrides: dict[str, Any], reason: str) -> None:
    with pytest.raises(ConfigError, match=reason):
        Config(**overrides)


def test_no_repr_shows_a_pipes_secret() -> None:
    secret = "a-secret-nobody-may-log-1234"
    options = WebhookOptions(callback="https://example.net/hook", secret=secret)
    assert secret not in repr(options)
    assert "https://example.net/hook" in repr(options)
    assert options.secret == secret
