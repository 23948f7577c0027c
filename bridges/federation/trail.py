"""Where a federated message has been, and the rules that end loops and duplicates.

Every gateway has an id (``gateway_id``, shared by every node of a cluster). A message
a link forwards carries the header :data:`TRAIL`: the gateways and feeds it left, oldest
first, as ``<gateway>/<feed>`` entries separated by commas (the feed's name
percent-encoded). Its length is the message's hop count.

A link on gateway G forwards a message to gateway R only when the trail names neither
R (the message came from there) nor G (it went round a loop back here), and holds fewer
than ``max_hops`` entries; it then adds ``G/<feed>``. With the default ``max_hops =
1`` only messages published on G itself travel, one hop.

Repeats end at the receiver: its feed's ``message_id`` window drops a message it routed
already (docs/EXTENSIONS.md §6). A message published without a ``message_id`` gets one
when it first leaves its origin, made of the origin's id, the feed and the engine's
stamp of that published message (:attr:`feeds.service.Message.stamp`), which is the same
in every pipe the publish reached. So a retry, or the same message reaching a gateway by
two paths (a diamond), carries the same id every time.
"""

from __future__ import annotations

import functools
import urllib.parse

TRAIL = "x-restms-trail"
MESSAGE_ID = "message_id"
MAX_TRAIL = 4096  # characters: a trail past this is not one of ours, and not forwarded


Headers = tuple[tuple[str, str], ...]
Props = tuple[tuple[str, str], ...]


def trail(headers: Headers) -> list[tuple[str, str]]:
    """The (gateway, feed) entries of the trail in a message's ``headers``, oldest first."""
    for name, value in headers:
        if name == TRAIL:
            entries = []
            for entry in value.split(","):
                gateway, _, feed = entry.strip().partition("/")
                entries.append((gateway, urllib.parse.unquote(feed)))
            return entries
    return []


def onward(
    headers: Headers, *, own: str, feed: str, remote: str | None, max_hops: int
) -> Headers | None:
    """A message's ``headers`` as gateway ``own`` sends it on from its ``feed`` to
    gateway ``remote`` (None: not known yet), the trail extended; None when it must not
    go there (see the module docstring)."""
    held = None
    for name, value in headers:
        if name == TRAIL:
            held = value
            break
    if held is None:  # published here, the commonest by far: no trail to read
        return (*headers, (TRAIL, entry(own, feed))) if max_hops > 0 else None
    if len(held) > MAX_TRAIL:
        return None
    passed = trail(headers)
    if len(passed) >= max_hops:
        return None
    if any(gateway in (own, remote) for gateway, _ in passed):
        return None
    extended = f"{held},{entry(own, feed)}" if held else entry(own, feed)
    return (*((n, v) for n, v in headers if n != TRAIL), (TRAIL, extended))


def with_origin_id(props: Props, *, own: str, feed: str, stamp: str) -> Props:
    """A message's properties with a ``message_id`` made at its origin when they have
    none (the module docstring); ``message_id`` is the first property in their order."""
    for name, _ in props:
        if name == "message_id":
            return props
    return ((MESSAGE_ID, f"{entry(own, feed)}/{stamp}"), *props)


@functools.lru_cache(maxsize=256)
def entry(gateway: str, feed: str) -> str:
    """``<gateway>/<feed>``, the feed's name percent-encoded: a trail entry, and the
    start of the ids made at an origin (a link asks for its own on every message)."""
    return f"{gateway}/{urllib.parse.quote(feed, safe='')}"
