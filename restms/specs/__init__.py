"""Typed, validated resource specs read out of RestTL documents.

These are what clients send: a feed or pipe to create (C1-C10), a join (G14, F9,
F10), feed and pipe updates (R2, R3, L8) and messages to publish (M5, M6, §6.6).
Each is a frozen value that is valid once built; anything a client can get wrong
raises :class:`~restms.errors.BadRequest` (400) or, for counts over a configured
limit, :class:`~restms.errors.PayloadTooLarge` (413). Unknown elements and
properties are ignored (G6).

The package is read bottom up, each module about one thing:

* ``_vocabulary``: types, profiles, message property names, encodings, the text bound.
* ``_resources``: the feed, pipe, join and update values.
* ``_messages``: the message and content values, the publish limits, duplicates.
* ``_properties``: the properties each element type has (what the codecs need).
* ``_read_resources``: documents -> feed, pipe, join and update specs (with a pipe's
  extension and webhook attributes).
* ``_read_messages``: documents and decoded parts -> message specs, the one place
  every decoder's messages are checked.

Every public name is re-exported here: import from ``restms.specs``.
"""

from ._messages import (
    Content,
    ContentHead,
    Duplicate,
    EmbeddedContent,
    LinkedContent,
    MessageLimits,
    MessageSpec,
    head_size,
)
from ._properties import PROPERTIES
from ._read_messages import (
    Head,
    build_message,
    checked_message,
    content,
    content_head,
    embedded,
    header,
    message,
    message_head,
    messages,
    with_message_id,
)
from ._read_resources import creation, join, pipe_options, update, webhook_options
from ._resources import FeedSpec, JoinSpec, PipeOptions, PipeSpec, Update
from ._vocabulary import (
    AMQP9_PROFILE,
    DEFAULT_CONTENT_TYPE,
    DEFAULTS_PROFILE,
    ENCODINGS,
    EXTENSION_PROFILE,
    FEED_TYPES,
    JOIN_TYPES,
    MAX_TEXT,
    MESSAGE_PROPERTIES,
    OVERFLOW_POLICIES,
    PIPE_TYPE_ALIASES,
    PIPE_TYPES,
    QUEUEING_FEED_TYPES,
    check_text,
)

__all__ = [
    "AMQP9_PROFILE",
    "DEFAULTS_PROFILE",
    "DEFAULT_CONTENT_TYPE",
    "ENCODINGS",
    "EXTENSION_PROFILE",
    "FEED_TYPES",
    "JOIN_TYPES",
    "MAX_TEXT",
    "MESSAGE_PROPERTIES",
    "OVERFLOW_POLICIES",
    "PIPE_TYPES",
    "PIPE_TYPE_ALIASES",
    "PROPERTIES",
    "QUEUEING_FEED_TYPES",
    "Content",
    "ContentHead",
    "Duplicate",
    "EmbeddedContent",
    "FeedSpec",
    "Head",
    "JoinSpec",
    "LinkedContent",
    "MessageLimits",
    "MessageSpec",
    "PipeOptions",
    "PipeSpec",
    "Update",
    "build_message",
    "check_text",
    "checked_message",
    "content",
    "content_head",
    "creation",
    "embedded",
    "head_size",
    "header",
    "join",
    "message",
    "message_head",
    "messages",
    "pipe_options",
    "update",
    "webhook_options",
    "with_message_id",
]
