"""Scopes, grants, guests and tenants: the access policy without HTTP."""

from __future__ import annotations

import pytest

from auth import GUEST, Guests, Tenants, grants
from auth.principals import Principal
from auth.scopes import Scope, parse


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("restms:read", Scope("read")),
        ("restms:admin", Scope("admin")),
        ("restms:publish:feed/weather.*", Scope("publish", "*", "weather.*")),
        ("restms:subscribe:domain/acme", Scope("subscribe", "acme", "*")),
        ("restms:admin:domain/acme/feed/orders.*", Scope("admin", "acme", "orders.*")),
        ("restms:write", None),  # no such action
        ("restms:", None),
        ("restms:read:feed/", None),
        ("restms:read:domain/", None),
        ("restms:read:domain/a/b", None),
        ("restms:read:domain/acme/feed/", None),
        ("restms:read:queue/x", None),
        ("openid", None),  # someone else's scope: ignored
        ("RESTMS:read", None),
    ],
)
def test_parse(text: str, expected: Scope | None) -> None:
    assert parse(text) == expected


@pytest.mark.parametrize(
    ("scopes", "action", "domain", "feed", "allowed"),
    [
        (("restms:read",), "read", "default", "weather", True),
        (("restms:read",), "publish", "default", "weather", False),
        (("restms:publish:feed/weather.*",), "publish", "default", "weather.rain", True),
        (("restms:publish:feed/weather.*",), "publish", "default", "weather", False),
        (("restms:publish:feed/weather.*",), "publish", "acme", "weather.rain", True),
        (("restms:publish:feed/weather.*",), "publish", "default", None, True),
        (("restms:subscribe:domain/acme",), "subscribe", "acme", None, True),
        (("restms:subscribe:domain/acme",), "subscribe", "default", None, False),
        (("restms:admin:domain/acme",), "publish", "acme", "x", True),
        (("restms:admin:domain/acme",), "read", "default", "x", False),
        (("restms:admin",), "subscribe", "anything", "at.all", True),
        (("restms:read:domain/ac?e/feed/[ab]*",), "read", "acme", "alpha", True),
        (("restms:read:domain/ac?e/feed/[ab]*",), "read", "acme", "gamma", False),
        (("restms:read:feed/Weather",), "read", "default", "weather", False),  # case matters
        (("openid", "profile"), "read", "default", "x", False),
        ((), "read", "default", None, False),
    ],
)
def test_grants_allow(
    scopes: tuple[str, ...], action: str, domain: str, feed: str | None, allowed: bool
) -> None:
    assert grants(scopes).allows(action, domain, feed) is allowed
    assert grants(scopes).allows(action, domain, feed) is allowed  # the remembered answer


def test_grants_see_only_the_domains_their_scopes_reach() -> None:
    g = grants(("restms:read:domain/acme", "restms:publish:domain/beta/feed/x"))
    assert g.sees("acme")
    assert g.sees("beta")
    assert not g.sees("default")
    assert grants(("restms:read",)).sees("anything")
    assert not grants(("restms:read",)).admin
    assert grants(("restms:admin",)).admin
    assert not grants(("restms:admin:domain/acme",)).admin


def test_grants_are_shared_between_equal_scope_tuples() -> None:
    assert grants(("restms:read", "restms:publish")) is grants(("restms:read", "restms:publish"))


def test_guests_only_from_loopback_unless_insecure() -> None:
    guests = Guests(anonymous=True, guest_user=True, scopes=["restms:read"], insecure=False)
    assert guests.anonymous_for("127.0.0.1") is not None
    assert guests.anonymous_for("::1") is not None
    assert guests.anonymous_for("192.0.2.7") is None
    assert guests.anonymous_for(None) is None
    assert guests.guest_login("guest", "guest", "127.0.0.1") is not None
    assert guests.guest_login("guest", "guest", "192.0.2.7") is None
    assert guests.guest_login("guest", "wrong", "127.0.0.1") is None
    assert guests.guest_login("admin", "guest", "127.0.0.1") is None
    anyone = Guests(anonymous=True, guest_user=True, scopes=["restms:read"], insecure=True)
    assert anyone.anonymous_for("192.0.2.7") is not None
    principal = guests.anonymous_for("127.0.0.1")
    assert principal is not None
    assert principal.name == GUEST
    assert principal.grants.allows("read", "default", "x")


def test_guests_can_be_turned_off() -> None:
    guests = Guests(anonymous=False, guest_user=False, scopes=["restms:read"], insecure=False)
    assert guests.anonymous_for("127.0.0.1") is None
    assert guests.guest_login("guest", "guest", "127.0.0.1") is None


def test_tenants_need_both_the_domain_acl_and_a_scope() -> None:
    tenants = Tenants({"acme": ("svc-*", "alice"), "beta": ("bob",)})
    everywhere = grants(("restms:read",))
    assert tenants.sees(Principal("alice", everywhere), "acme")
    assert tenants.sees(Principal("svc-orders", everywhere), "acme")
    assert not tenants.sees(Principal("bob", everywhere), "acme")
    assert tenants.sees(Principal("bob", everywhere), "beta")
    assert tenants.sees(Principal("bob", everywhere), "default")  # no ACL: everyone
    only_beta = grants(("restms:read:domain/beta",))
    assert not tenants.sees(Principal("bob", only_beta), "default")  # no scope reaches it


def test_tenants_answer_by_name_and_grants_when_remembered() -> None:
    """The same name with other grants (another token) is answered for those grants."""
    tenants = Tenants({"beta": ("bob",)})
    wide, narrow = grants(("restms:read",)), grants(("restms:read:domain/beta",))
    for _ in range(2):  # the second round is answered from the memo
        assert tenants.sees(Principal("bob", wide), "default")
        assert not tenants.sees(Principal("bob", narrow), "default")
        assert tenants.sees(Principal("bob", narrow), "beta")
        assert not tenants.sees(Principal("alice", wide), "beta")
