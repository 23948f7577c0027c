"""The catalogue: domains, feeds, pipes, joins and staged contents, kept in one hash
(slot ``{<ns>:cat}``) and cached on every engine as the routing table.

Each resource is one field holding its record (JSON): ``d:<domain>``, ``f:<feed>``,
``p:<pipe>``, ``j:<join>``, ``s:<staged>``. A change is made against the version the
cache holds, by one function call that refuses it when the version moved on
(:meth:`Cache.change`): the caller reads the news and decides again, so every check
(a public feed's name taken, a join's identity) holds when the change lands. The
configured feeds are the configuration's, never stored.
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Hashable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from restms.errors import BadRequest
from restms.uris import split_path

from ..config import DEFAULT_FEED, EngineConfig, FeedConfig
from ..routing import INDEXED_TYPES, Matcher, matcher
from ..store import dumps, loads

Headers = tuple[tuple[str, str], ...]  # a message's, as its spec holds them
BUCKETS = 64  # pipes are spread over this many hash slots (never change it for a namespace)


@dataclass(slots=True, kw_only=True)
class FeedRec:
    key: str
    name: str | None
    type: str
    title: str | None = None
    license: str | None = None
    domain: str
    owner: str = ""
    configured: bool = False
    version: int = 1
    modified: float = 0.0
    joins: dict[str, JoinRec] = field(default_factory=dict, repr=False)
    by_address: dict[str, list[JoinRec]] = field(default_factory=dict, repr=False)


@dataclass(slots=True, kw_only=True)
class PipeRec:
    key: str
    type: str
    title: str | None
    domain: str
    owner: str
    options: dict[str, Any]
    version: int = 1
    modified: float = 0.0
    joins: dict[str, JoinRec] = field(default_factory=dict, repr=False)


@dataclass(slots=True, kw_only=True)
class JoinRec:
    key: str
    pipe: str
    feed: str
    type: str = ""
    address: str = ""
    headers: tuple[tuple[str, str], ...] = ()
    is_default: bool = False
    version: int = 1
    modified: float = 0.0
    match: Matcher | None = field(default=None, repr=False)


@dataclass(slots=True, kw_only=True)
class StagedRec:
    key: str
    feed: str
    content_type: str
    size: int
    owner: str
    modified: float
    expires: float  # wall-clock seconds


@dataclass(slots=True, kw_only=True)
class DomainRec:
    name: str
    title: str
    version: int = 1
    modified: float = 0.0


_PERSISTED = {
    "f": ("key", "name", "type", "title", "license", "domain", "owner", "version", "modified"),
    "p": ("key", "type", "title", "domain", "owner", "options", "version", "modified"),
    "j": ("key", "pipe", "feed", "type", "address", "headers", "is_default", "version", "modified"),
    "s": ("key", "feed", "content_type", "size", "owner", "modified", "expires"),
    "d": ("name", "title", "version", "modified"),
}


def encode(record: FeedRec | PipeRec | JoinRec | StagedRec | DomainRec) -> bytes:
    kind = _kind(record)
    return dumps({name: getattr(record, name) for name in _PERSISTED[kind]})


def _kind(record: object) -> str:
    return {FeedRec: "f", PipeRec: "p", JoinRec: "j", StagedRec: "s", DomainRec: "d"}[type(record)]


def field_of(record: FeedRec | PipeRec | JoinRec | StagedRec | DomainRec) -> str:
    name = record.name if isinstance(record, DomainRec) else record.key
    return f"{_kind(record)}:{name}"


def bucket(pipe: str) -> int:
    """The bucket of a pipe: stable across processes and releases (CRC-32)."""
    return zlib.crc32(pipe.encode()) % BUCKETS


class Keys:
    """The key names of one namespace."""

    def __init__(self, namespace: str) -> None:
        self.ns = namespace
        self.cat = f"{{{namespace}:cat}}"
        self.log = f"{self.cat}:log"
        self.own = f"{{{namespace}:own}}"  # the slot of the owners' locks (.owners)

    def staged(self, key: str) -> str:
        return f"{self.cat}:st:{key}"

    def tag(self, index: int) -> str:
        """A bucket's hash tag: also its wake-up channel."""
        return f"{{{self.ns}:b{index}}}"

    def pipe(self, pipe: str) -> tuple[str, str, str]:
        """A pipe's stream, state hash and bucket tag."""
        tag = self.tag(bucket(pipe))
        return f"{tag}:s:{pipe}", f"{tag}:h:{pipe}", tag

    def leases(self, index: int) -> tuple[str, str]:
        tag = self.tag(index)
        return f"{tag}:l", f"{tag}:lock"

    def dedup(self, feed: str, message_id: str) -> str:
        return f"{{{self.ns}:f:{feed}}}:d:{message_id}"


class Cache:
    """The catalogue as this engine last read it, indexed for routing."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.version = 0
        self.domains: dict[str, DomainRec] = {}
        self.feeds: dict[str, FeedRec] = {}  # public by name, private by key
        self.pipes: dict[str, PipeRec] = {}
        self.joins: dict[str, JoinRec] = {}
        self.staged: dict[str, StagedRec] = {}
        # Each principal's pipes and feeds (keys, in the order made), so that a quota
        # check or a listing of one's own reads those, not every pipe there is.
        self.pipes_of: dict[str, dict[str, None]] = {}
        self.feeds_of: dict[str, dict[str, None]] = {}
        self.hooks: set[str] = set()  # the webhook pipes, which the owners' rounds share out
        # Each bucket's pipes, so that the look for idle ones goes a bucket at a time.
        self.by_bucket: list[dict[str, None]] = []
        self.configured = self._configured()
        self.reset()

    def _configured(self) -> list[FeedConfig]:
        config = self.config
        first = config.domains[0][0]
        default = FeedConfig(
            name=DEFAULT_FEED, type=config.default_feed_type, title="Default feed", domain=first
        )
        feeds = [default, *config.feeds]
        if config.dead_letter_feed and all(f.name != config.dead_letter_feed for f in feeds):
            feeds.append(
                FeedConfig(
                    name=config.dead_letter_feed, type="rotator", title="Dead letters", domain=first
                )
            )
        if config.system_feed:
            feeds.append(
                FeedConfig(
                    name=config.system_feed,
                    type=config.system_feed_type,
                    title="System events",
                    domain=first,
                )
            )
        return feeds

    def reset(self) -> None:
        self.domains = {
            name: DomainRec(name=name, title=title) for name, title in self.config.domains
        }
        self.feeds = {
            feed.name: FeedRec(
                key=feed.name,
                name=feed.name,
                type=feed.type,
                title=feed.title,
                license=feed.license,
                domain=feed.domain,
                configured=True,
            )
            for feed in self.configured
        }
        self.pipes, self.joins, self.staged = {}, {}, {}
        self.pipes_of, self.feeds_of, self.hooks = {}, {}, set()
        self.by_bucket = [{} for _ in range(BUCKETS)]

    # ------------------------------------------------------------ news from the store
    def load(self, version: int, items: Iterable[tuple[str, bytes | None]]) -> None:
        """Apply fields as the catalogue holds them now (``None``: gone), at ``version``."""
        pending = sorted(items, key=lambda item: "fpjsd".find(item[0][:1]))  # joins after both ends
        for name, value in pending:
            if name == "v" or ":" not in name:
                continue
            self.apply(name, value)
        self.version = version

    def swap(self, other: Cache) -> None:
        """Hold what ``other`` holds (the catalogue read whole), in one step, and leave
        ``other`` holding what this held: whoever keeps this cache (the system feed's
        view) sees the new, and the old can be let go a piece at a time."""
        for name in list(vars(self)):  # (the configuration too: both have the same)
            mine, theirs = getattr(self, name), getattr(other, name)
            setattr(self, name, theirs)
            setattr(other, name, mine)

    def apply(self, name: str, value: bytes | None) -> None:
        kind, _, key = name.partition(":")
        if kind == "d":
            if value is not None:
                self.domains[key] = DomainRec(**loads(value))
            return
        if value is None:
            self._forget(kind, key)
            return
        data = loads(value)
        if kind in ("f", "p"):
            known: FeedRec | PipeRec | None = (self.feeds if kind == "f" else self.pipes).get(key)
            if known is not None:  # changed: its joins stay, its type and owner never change
                for attribute, item in data.items():
                    setattr(known, attribute, item)
                return
        if kind == "f":
            feed = self.feeds[key] = FeedRec(**data)
            if not feed.configured:
                self.feeds_of.setdefault(feed.owner, {})[key] = None
        elif kind == "p":
            pipe = self.pipes[key] = PipeRec(**data)
            self.pipes_of.setdefault(pipe.owner, {})[key] = None
            self.by_bucket[bucket(key)][key] = None
            if pipe.type == "webhook":
                self.hooks.add(key)
        elif kind == "j":
            data["headers"] = tuple(tuple(h) for h in data["headers"])
            self._forget(kind, key)
            self._link(JoinRec(**data))
        elif kind == "s":
            self.staged[key] = StagedRec(**data)

    def _forget(self, kind: str, key: str) -> None:
        if kind == "f":
            feed = self.feeds.get(key)
            if feed is not None and not feed.configured:
                del self.feeds[key]
                _disown(self.feeds_of, feed.owner, key)
                for join in list(feed.joins.values()):
                    self._unlink(join)
        elif kind == "p":
            pipe = self.pipes.pop(key, None)
            if pipe is not None:
                _disown(self.pipes_of, pipe.owner, key)
                self.hooks.discard(key)
                self.by_bucket[bucket(key)].pop(key, None)
                for join in list(pipe.joins.values()):
                    self._unlink(join)
        elif kind == "j":
            known = self.joins.get(key)
            if known is not None:
                self._unlink(known)
        elif kind == "s":
            self.staged.pop(key, None)

    def _link(self, join: JoinRec) -> None:
        feed, pipe = self.feeds.get(join.feed), self.pipes.get(join.pipe)
        if feed is None or pipe is None:
            return  # its feed or pipe went meanwhile: the join is gone with it
        join.match = matcher(feed.type, join.address, join.headers)
        self.joins[join.key] = join
        feed.joins[join.key] = join
        pipe.joins[join.key] = join
        if feed.type in INDEXED_TYPES:
            feed.by_address.setdefault(join.address, []).append(join)

    def _unlink(self, join: JoinRec) -> None:
        self.joins.pop(join.key, None)
        feed, pipe = self.feeds.get(join.feed), self.pipes.get(join.pipe)
        if feed is not None:
            feed.joins.pop(join.key, None)
            peers = feed.by_address.get(join.address)
            if peers is not None and join in peers:
                peers.remove(join)
                if not peers:
                    del feed.by_address[join.address]
        if pipe is not None:
            pipe.joins.pop(join.key, None)

    # ------------------------------------------------------------ look-ups
    def feed_at(self, path: str) -> FeedRec:
        """The feed a URI path names (U5); 400 when there is none (G14)."""
        where = split_path(path)
        feed = None
        if where is not None and where[0] in ("feed", "resource"):
            feed = self.feeds.get(where[1])
            if feed is not None and (where[0] == "feed") != (feed.name is not None):
                feed = None
        if feed is None:
            raise BadRequest(f"join names no existing feed: {path}")
        return feed

    def buckets(self) -> Iterator[tuple[int, list[PipeRec]]]:
        """Each bucket that holds pipes, and its pipes as the cache has them when the
        bucket comes: a caller may wait between two buckets while the cache changes."""
        for index in range(BUCKETS):
            here = [p for p in map(self.pipes.get, self.by_bucket[index]) if p is not None]
            if here:
                yield index, here

    def pipes_owned(self, owner: str) -> list[PipeRec]:
        """``owner``'s pipes, in the order this cache learned of them."""
        return [self.pipes[key] for key in self.pipes_of.get(owner, ())]

    def feeds_owned(self, owner: str) -> int:
        """How many feeds ``owner`` made, public and private (configured ones are nobody's)."""
        return len(self.feeds_of.get(owner, ()))

    def public_feeds(self, domain: str) -> list[FeedRec]:
        return [f for f in self.feeds.values() if f.name is not None and f.domain == domain]

    def matching(self, feed: FeedRec, address: str, headers: Headers) -> list[JoinRec]:
        """The joins of a fanout-style feed that select a message (feeds.routing); they
        depend on what :func:`route_key` gives."""
        if feed.type == "fanout":
            return list(feed.joins.values())
        if feed.type in INDEXED_TYPES:
            return list(feed.by_address.get(address, ()))
        named = dict(headers) if feed.type == "headers" else {}
        return [j for j in feed.joins.values() if j.match is None or j.match(address, named)]

    def route(self, feed: FeedRec, address: str, headers: Headers) -> dict[str, int]:
        """The pipes the joins that select a message lead to, in the order of those
        joins, each with how many of them lead there: a pipe takes one copy of the
        message, and each join counts."""
        route: dict[str, int] = {}
        for join in self.matching(feed, address, headers):
            route[join.pipe] = route.get(join.pipe, 0) + 1
        return route


def route_key(feed: FeedRec, address: str, headers: Headers) -> Hashable:
    """What the joins of ``feed`` that select a message depend on (:meth:`Cache.matching`):
    nothing on a fanout feed, the address and headers on a headers feed, else the
    address. Messages with one key have one route."""
    if feed.type == "fanout":
        return None
    if feed.type == "headers":
        return address, headers
    return address


def _disown(index: dict[str, dict[str, None]], owner: str, key: str) -> None:
    mine = index.get(owner)
    if mine is not None:
        mine.pop(key, None)
        if not mine:
            del index[owner]


def replace(record: Any, **changes: Any) -> Any:
    """A changed copy of a record, its version one more (the cache's own stays as it is
    until the change is committed)."""
    made = dataclasses.replace(record, **changes)
    made.version = record.version + 1
    if isinstance(made, (FeedRec, PipeRec)):
        made.joins = {}
    if isinstance(made, FeedRec):
        made.by_address = {}
    return made
