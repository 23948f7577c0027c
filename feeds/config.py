"""Engine configuration and counters."""

from __future__ import annotations

from dataclasses import dataclass

from restms.errors import BadRequest
from restms.specs import FeedSpec

DEFAULT_FEED = "default"
DEFAULT_DOMAIN = "default"


@dataclass(frozen=True, slots=True, kw_only=True)
class FeedConfig:
    """A feed the configuration declares: it always exists and clients cannot change it."""

    name: str
    type: str = ""
    title: str | None = None
    license: str | None = None
    domain: str = DEFAULT_DOMAIN

    def __post_init__(self) -> None:
        try:
            FeedSpec(name=self.name, type=self.type, title=self.title, license=self.license)
        except BadRequest as exc:
            raise ValueError(f"configured feed {self.name!r}: {exc.reason}") from exc


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineConfig:
    domains: tuple[tuple[str, str], ...] = ((DEFAULT_DOMAIN, "Default domain"),)
    feeds: tuple[FeedConfig, ...] = ()
    default_feed_type: str = ""  # "direct" for older clients (L4)
    max_pipe_messages: int = 10_000  # Q2
    max_feed_queue: int = 10_000  # F8, Q22
    listing_cap: int = 1_000  # A8
    staged_ttl: float = 300.0  # M4
    max_staged_bytes: int = 256 * 1024 * 1024

    def __post_init__(self) -> None:
        if not self.domains:
            raise ValueError("at least one domain is needed")
        if min(self.max_pipe_messages, self.max_feed_queue, self.listing_cap) < 1:
            raise ValueError("max_pipe_messages, max_feed_queue and listing_cap must be positive")
        if self.staged_ttl <= 0 or self.max_staged_bytes < 0:
            raise ValueError("staged_ttl must be positive and max_staged_bytes not negative")
        names = [name for name, _ in self.domains]
        if len(set(names)) != len(names):
            raise ValueError("a domain is declared twice")
        seen = {DEFAULT_FEED}
        for feed in self.feeds:
            if feed.name in seen:
                raise ValueError(f"feed {feed.name!r} is configured twice (or is the default feed)")
            if feed.domain not in names:
                raise ValueError(f"feed {feed.name!r} names unknown domain {feed.domain!r}")
            seen.add(feed.name)


@dataclass(slots=True)
class Counters:
    published: int = 0
    routed: int = 0
    queued: int = 0
    skipped_full: int = 0
    acknowledged: int = 0
    staged: int = 0
    staged_expired: int = 0
    requeued: int = 0
    discarded: int = 0
    expired: int = 0
