"""The words of RestTL documents the specs check against (§6, docs/EXTENSIONS.md).

Profiles, feed, pipe and join types, the AMQP9 message properties, content encodings,
pipe overflow policies and the bound on free text: constants only, and the one check
every spec runs on its free-text attributes.
"""

from __future__ import annotations

from ..errors import BadRequest

DEFAULTS_PROFILE = ("3/Defaults", "http://www.restms.org/spec:3/Defaults")
AMQP9_PROFILE = ("4/AMQP9", "http://www.restms.org/spec:4/AMQP9")
EXTENSION_PROFILE = "x-gateway/Extensions"

# Feed types: "" (3/Defaults), the six of 4/AMQP9 (F13), regexp (our extension, F12).
FEED_TYPES = frozenset({"", "fanout", "direct", "topic", "headers", "rotator", "service", "regexp"})
QUEUEING_FEED_TYPES = frozenset({"rotator", "service"})
# Pipe types: "" (3/Defaults), ondemand (4/AMQP9, P3), stream (our extension, P6) and
# webhook (our extension: the gateway POSTs each message to a callback).
PIPE_TYPES = frozenset({"", "ondemand", "stream", "webhook"})
PIPE_TYPE_ALIASES = {"fifo": ""}  # draft/3 name (P2, L2)
# What a pipe with a max_messages or max_bytes bound does when full (our extension).
OVERFLOW_POLICIES = frozenset({"skip", "reject", "drop-oldest"})
JOIN_TYPES = frozenset({""})  # F9

# AMQP9 message properties besides address, in the order they are written out (§6.6).
MESSAGE_PROPERTIES = (
    "message_id",
    "reply_to",
    "correlation_id",
    "delivery_mode",
    "priority",
    "expiration",
    "timestamp",
    "type",
    "user_id",
    "app_id",
    "sender_id",
)
ENCODINGS = frozenset({"plain", "base64"})
DEFAULT_CONTENT_TYPE = "text/plain"


# The most characters a free-text attribute may hold: titles, licenses, join header
# names and values, message properties, content types. A domain listing repeats every
# feed's title and license, so one long title would make every listing long; 1,024 is
# the bound addresses already have (restms.names.MAX_ADDRESS), room for a sentence, a
# licence's name or URL, or an AMQP message or correlation id. Names (200 characters),
# addresses, webhook callbacks and secrets have bounds of their own.
MAX_TEXT = 1024


def check_text(value: str | None, element: str, attribute: str) -> None:
    """400 when the ``attribute`` of an ``<element>`` is longer than :data:`MAX_TEXT`."""
    if value is not None and len(value) > MAX_TEXT:
        raise BadRequest(
            f"<{element}> {attribute} is longer than {MAX_TEXT} characters ({len(value)})"
        )
