"""Scopes: what a principal may do, and where (docs/AUTH.md).

A scope is ``restms:ACTION`` optionally narrowed to domains and feed names::

    restms:read                                   read everything it can see
    restms:publish:feed/weather.*                 publish to feeds named weather.*
    restms:subscribe:domain/acme                  pipes and joins in domain acme
    restms:admin:domain/acme/feed/orders.*        any action on acme's orders.* feeds
    restms:analytics                              the analytics queries (only unqualified)
    restms:metrics                                GET /metrics (only unqualified)

``ACTION`` is one of :data:`ACTIONS`; ``admin`` implies the others. ``analytics`` and
``metrics`` aggregate every domain and feed, so the gateway honours them only
unqualified. Patterns are shell-style globs (``*``, ``?``, ``[...]``) matched
case-sensitively; a missing part means "any". Scopes that do not start with
``restms:`` belong to someone else and are ignored, as are malformed ``restms:``
scopes (a typo grants nothing, never more).

Feed patterns name public feeds. A private feed has no name: only its creator reaches
it (the gateway checks ownership first), and for it the domain part alone decides.

Checks run on every request, so :class:`Grants` remembers its answers (bounded).
"""

from __future__ import annotations

import fnmatch
import functools
from dataclasses import dataclass

ACTIONS = ("read", "publish", "subscribe", "analytics", "metrics", "admin")
PREFIX = "restms:"
_MEMO = 4096  # answers a Grants object keeps; cleared when full


@dataclass(frozen=True, slots=True)
class Scope:
    """One parsed ``restms:`` scope: an action on domains and feeds matching two globs."""

    action: str
    domain: str = "*"
    feed: str = "*"

    def covers_domain(self, domain: str) -> bool:
        return self.domain == "*" or fnmatch.fnmatchcase(domain, self.domain)

    def covers(self, action: str, domain: str, feed: str | None) -> bool:
        """``action`` "*" asks whether this scope grants anything at all there."""
        if action not in ("*", self.action) and self.action != "admin":
            return False
        if not self.covers_domain(domain):
            return False
        return feed is None or self.feed == "*" or fnmatch.fnmatchcase(feed, self.feed)


def parse(text: str) -> Scope | None:
    """The scope ``text`` grants, or None when it is not (well-formed) ours."""
    if not text.startswith(PREFIX):
        return None
    action, _, qualifier = text[len(PREFIX) :].partition(":")
    if action not in ACTIONS:
        return None
    if not qualifier:
        return Scope(action)
    domain, feed = "*", "*"
    if qualifier.startswith("domain/"):
        domain, sep, rest = qualifier[len("domain/") :].partition("/feed/")
        if not domain or "/" in domain:
            return None
        if sep:
            if not rest:
                return None
            feed = rest
    elif qualifier.startswith("feed/"):
        feed = qualifier[len("feed/") :]
        if not feed:
            return None
    else:
        return None
    return Scope(action, domain, feed)


class Grants:
    """Everything a set of scopes allows, with the answers remembered."""

    __slots__ = ("_memo", "scopes")

    def __init__(self, scopes: tuple[str, ...]) -> None:
        parsed = (parse(s) for s in scopes)
        self.scopes: tuple[Scope, ...] = tuple(s for s in parsed if s is not None)
        self._memo: dict[tuple[str, str, str | None], bool] = {}

    def allows(self, action: str, domain: str, feed: str | None = None) -> bool:
        """May these scopes do ``action`` in ``domain`` on the feed named ``feed``?

        ``feed`` None asks about the domain itself (or a private feed in it).
        """
        key = (action, domain, feed)
        answer = self._memo.get(key)
        if answer is None:
            answer = any(s.covers(action, domain, feed) for s in self.scopes)
            if len(self._memo) >= _MEMO:
                self._memo.clear()
            self._memo[key] = answer
        return answer

    def sees(self, domain: str) -> bool:
        """True when some scope reaches into ``domain`` (tenants: the rest are invisible)."""
        return self.allows("*", domain)

    def unqualified(self, action: str) -> bool:
        """An unqualified scope for ``action``, or an unqualified ``restms:admin``: what
        the gateway-wide actions (analytics, metrics) need."""
        return any(
            s.action in (action, "admin") and s.domain == "*" and s.feed == "*" for s in self.scopes
        )

    @property
    def admin(self) -> bool:
        """Admin everywhere (an unqualified ``restms:admin``)."""
        return Scope("admin") in self.scopes


@functools.lru_cache(maxsize=4096)
def grants(scopes: tuple[str, ...]) -> Grants:
    """The (shared) Grants for a tuple of scope strings: tokens with equal scopes share one."""
    return Grants(scopes)
