"""Who a request acts as, and which domains (tenants) it may see.

A request names its principal one of three ways (the gateway's middleware asks, in
this order):

* ``Authorization: Bearer <token>``: the token's subject, with the token's scopes
  (:mod:`auth.tokens` checks the token);
* ``Authorization: Basic``: a configured user (scrypt-hashed password), for older
  RestMS clients that know nothing else. The built-in ``guest``/``guest`` user is
  honoured only from loopback, like a request with no credentials at all;
* nothing: from loopback (or from anywhere when started ``--insecure``) the request
  acts as ``guest``, unless anonymous access is turned off.

Framework-free: the gateway passes in what it read from the request.
"""

from __future__ import annotations

import fnmatch
import functools
import hmac
import ipaddress
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from .scopes import Grants, grants

GUEST = "guest"
MEMO = 65_536  # answers the admits memo keeps; cleared when full
SEEN = 4096  # answers the sees memo keeps (it holds Grants objects): cleared when full
NAME = re.compile(r"[A-Za-z0-9._@:/+-]{1,200}")


@dataclass(frozen=True, slots=True)
class Principal:
    """The identity a request acts as: its name owns what it creates."""

    name: str
    grants: Grants = field(compare=False)
    expires: float | None = None  # epoch seconds when its credentials stop being valid
    via: str = "anonymous"  # "anonymous", "basic" or "bearer"
    # The iat of the built-in issuer's token it came with, which a revocation of its
    # client is checked against (auth.revocations); None for every other principal.
    issued: float | None = None
    # The jti of that token, which a revocation of the token alone names; None else.
    token_id: str | None = None


@functools.lru_cache(maxsize=4096)
def is_loopback(host: str | None) -> bool:
    """True for loopback addresses (``127.0.0.0/8``, ``::1``, ``[::1]``, ``localhost``)
    and for Unix socket peers (a path); False for anything else or nothing."""
    if not host:
        return False
    if host == "localhost" or host.startswith("/"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True, slots=True, kw_only=True)
class User:
    """A configured HTTP Basic user: its password is kept only as an scrypt hash."""

    name: str
    password_hash: str = field(repr=False)
    scopes: tuple[str, ...]

    def __post_init__(self) -> None:
        if not NAME.fullmatch(self.name):
            raise ValueError(f"user name {self.name!r} must be 1-200 of A-Z a-z 0-9 . _ @ : / + -")
        if not self.password_hash.startswith("scrypt$"):
            raise ValueError(f"user {self.name}: password_hash must come from main.py user hash")


class Guests:
    """The loopback policy: anonymous requests and the ``guest``/``guest`` user."""

    def __init__(self, *, anonymous: bool, guest_user: bool, scopes: Sequence[str], insecure: bool):
        self.anonymous = anonymous
        self.guest_user = guest_user
        self.insecure = insecure
        self.principal = Principal(GUEST, grants(tuple(scopes)), via="anonymous")
        self.basic = Principal(GUEST, self.principal.grants, via="basic")

    def trusted(self, peer: str | None, forwarded: bool = False) -> bool:
        """Loopback, and not relayed: a reverse proxy on this host makes every peer
        loopback, so a request carrying forwarding headers counts as from elsewhere."""
        return self.insecure or (is_loopback(peer) and not forwarded)

    def anonymous_for(self, peer: str | None, forwarded: bool = False) -> Principal | None:
        """The principal of a request without credentials, or None (then: 401)."""
        return self.principal if self.anonymous and self.trusted(peer, forwarded) else None

    def guest_login(
        self, name: str, password: str, peer: str | None, forwarded: bool = False
    ) -> Principal | None:
        """``guest``/``guest`` from loopback; None for anything else (other users decide)."""
        if not self.guest_user or name != GUEST or not self.trusted(peer, forwarded):
            return None
        return self.basic if hmac.compare_digest(password.encode(), b"guest") else None


class Tenants:
    """Which principals each configured domain admits (``principals`` globs; ``*``: all).

    A principal sees a domain when the domain admits it *and* one of its scopes reaches
    into that domain; every other domain, and all it holds, is 404 to it.
    """

    def __init__(self, acl: Mapping[str, Iterable[str]]) -> None:
        self._acl = {domain: tuple(patterns) for domain, patterns in acl.items()}
        self._memo: dict[tuple[str, str], bool] = {}
        # sees() answers by domain, name and grants (shared objects, hashed by identity):
        # asked on every request, it is one lookup then, not three calls.
        self._seen: dict[tuple[str, str, Grants], bool] = {}

    def admits(self, domain: str, name: str) -> bool:
        key = (domain, name)
        answer = self._memo.get(key)
        if answer is None:
            patterns = self._acl.get(domain, ("*",))
            answer = any(p == "*" or fnmatch.fnmatchcase(name, p) for p in patterns)
            if len(self._memo) >= MEMO:
                self._memo.clear()
            self._memo[key] = answer
        return answer

    def sees(self, principal: Principal, domain: str) -> bool:
        key = (domain, principal.name, principal.grants)
        answer = self._seen.get(key)
        if answer is None:
            answer = self.admits(domain, principal.name) and principal.grants.sees(domain)
            if len(self._seen) >= SEEN:
                self._seen.clear()
            self._seen[key] = answer
        return answer
