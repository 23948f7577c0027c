"""Which joins of a feed take a message now (§6.2; F8, P3, Q2).

The matching rules themselves are in :mod:`feeds.routing`; this module applies them to
a feed's current joins and pipes: the fanout-style selection (with the address index
and the topic cache) and, for rotator and service feeds, the round-robin choice of one
pipe that can take a message, and how many the feed's pipes could take at once.
"""

from __future__ import annotations

from collections.abc import Sequence

from restms.specs import MessageSpec

from .model import Feed, Join, Pipe
from .routing import INDEXED_TYPES


def matching(feed: Feed, spec: MessageSpec) -> Sequence[Join]:
    """The joins of a fanout-style feed that select this message (cached for topics;
    not to be changed by the caller)."""
    kind = feed.type
    if kind == "fanout":  # every join (the commonest type: asked first)
        return feed.joined
    if kind in INDEXED_TYPES:
        return feed.by_address.get(spec.address, [])
    if kind == "topic":
        cached = feed.topic_cache.get(spec.address)
        if cached is None:
            cached = [
                j for j in feed.joins.values() if j.match is None or j.match(spec.address, {})
            ]
            if len(feed.topic_cache) >= 1024:
                feed.topic_cache.clear()
            feed.topic_cache[spec.address] = cached
        return cached
    header_map = spec.header_map if kind == "headers" else {}
    return [j for j in feed.joins.values() if j.match is None or j.match(spec.address, header_map)]


def capacity(feed: Feed) -> int:
    """How many messages the pipes joined to a rotator/service feed can take now."""
    room = 0
    for pipe in {join.pipe for join in feed.joins.values()}:
        if pipe.type == "ondemand":
            room += 1 if pipe.demand > 0 and not pipe.messages else 0
        elif not pipe.full(1):
            room += pipe.max_messages - len(pipe.messages) - pipe.spilled
    return room


def eligible(feed: Feed, avoid: Pipe | None = None) -> Join | None:
    """Rotator/service: the next join in round-robin order whose pipe can take one
    (other than ``avoid``, the pipe a redelivered message comes back from)."""
    joins = list(feed.joins.values())
    if not joins:
        return None
    for step in range(len(joins)):
        join = joins[(feed.rr + step) % len(joins)]
        pipe = join.pipe
        if pipe is avoid:
            continue
        ok = pipe.demand > 0 and not pipe.messages if pipe.type == "ondemand" else not pipe.full(1)
        if ok:
            feed.rr = (feed.rr + step + 1) % len(joins)
            return join
    return None
