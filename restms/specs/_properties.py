"""The properties each element type has (§2, docs/EXTENSIONS.md): what tells the codecs
an attribute from a child element."""

from __future__ import annotations

from ..webhook import ATTRIBUTES as WEBHOOK_ATTRIBUTES
from ._resources import PipeOptions
from ._vocabulary import MESSAGE_PROPERTIES

# Written or read: a JSON object or array under one of these keys is a malformed
# property, never a child (J3).
PROPERTIES: dict[str, frozenset[str]] = {
    "domain": frozenset({"name", "title", "href"}),
    "profile": frozenset({"name", "href"}),
    "feed": frozenset({"name", "type", "title", "license", "href"}),
    "pipe": frozenset(
        {"name", "type", "title", "href", "secret", *WEBHOOK_ATTRIBUTES}
        | {name for name in PipeOptions.__slots__ if name != "webhook"}
        | {"state", "pending", "attempts", "next_attempt", "last_attempt", "last_status"}
        | {"last_error", "failures", "delivered", "dead_lettered"}  # a webhook's state
    ),
    "join": frozenset({"href", "type", "address", "feed"}),
    "message": frozenset(
        {"href", "address", "async", "count", "duplicate", "delivery_count", "feed"}
        | set(MESSAGE_PROPERTIES)
    ),
    "header": frozenset({"name", "value"}),
    "content": frozenset({"href", "type", "encoding"}),
}
