"""The RestMS messaging patterns (digest §7) as operations, without I/O.

* **Housecat**, request and reply: :func:`request` publishes a message with its
  ``reply_to`` set to a pipe of the requester's (its name is its address on the
  default feed) and waits there for the message whose ``correlation_id`` is the
  request's ``message_id``; :func:`reply` answers a request through the default feed.
* **Wolfpack**, workers on a service feed: :func:`worker` makes the feed (creating a
  public feed again is harmless) and a pipe of the worker's joined to it; the feed
  hands each job to one worker's pipe.
* **Parrot**, topic subscribers: :func:`subscribe` makes the topic feed and a pipe
  joined to it for an address pattern.

A worker or subscriber reads its pipe with ``client.messages(pipe, auto_ack=True)``.
"""

from __future__ import annotations

import dataclasses
import time

from . import codec
from .errors import RestMSError, TransportError
from .ops import (
    Core,
    ack,
    create_feed,
    create_pipe,
    delete,
    join,
    pipe,
    publish,
)
from .ops import domain as domain_op
from .steps import Op, Retry, Sleep, new_id, retry_after, send
from .values import Delivery, Feed, Message, Pipe, Published

DEFAULT_FEED = "default"


def request(
    core: Core,
    /,
    feed: Feed | str,
    message: Message,
    *,
    timeout: float = 30.0,
    reply_pipe: Pipe | None = None,
) -> Op[Message]:
    """Publish ``message`` to ``feed`` as a request and return its reply.

    The reply comes to ``reply_pipe``, or to a pipe made for this request and deleted
    after it. Other messages that reach that pipe meanwhile are acknowledged and
    dropped. No reply within ``timeout`` seconds raises :class:`TransportError`.
    """
    deadline = time.monotonic() + timeout
    replies = reply_pipe or (yield from create_pipe(core, title="replies"))
    message_id = message.message_id or new_id()
    sent = dataclasses.replace(message, reply_to=replies.name, message_id=message_id)
    try:
        yield from publish(core, feed, sent)
        answer = yield from _reply_to(core, replies, message_id, deadline)
    except RestMSError:
        if reply_pipe is None:
            yield from delete(core, replies)
        raise
    if reply_pipe is None:
        yield from delete(core, replies)
    return answer


def _reply_to(core: Core, replies: Pipe, message_id: str, deadline: float) -> Op[Message]:
    """Read ``replies`` until the message answering ``message_id`` (acknowledged)."""
    listing = yield from pipe(core, replies)
    hrefs = [m.href for m in listing.messages]
    if listing.asynclet:
        hrefs.append(listing.asynclet)
    prefix, _, start = hrefs[0].rpartition(".")
    position = int(start)
    once = Retry(attempts=0)
    while (remaining := deadline - time.monotonic()) > 0:
        href = f"{prefix}.{position}"
        try:
            reply = yield from send(
                core.call("GET", href, timeout=remaining), once, ok=frozenset({404, 503})
            )
        except TransportError:
            continue  # a timeout: the loop ends at the deadline
        if reply.status_code == 404:
            position += 1  # gone (a lease moved it): the next one
            continue
        if reply.status_code == 503:  # the wait ran out, or the gateway is stopping
            yield Sleep(min(retry_after(reply) or 0.0, max(0.0, deadline - time.monotonic())))
            continue
        answer, _, _ = codec.read_message(
            codec.decode(reply.content, reply.headers.get("content-type", ""))
        )
        yield from ack(core, href)
        position += 1
        if answer.correlation_id == message_id:
            return answer
    raise TransportError(f"no reply to {message_id} in {replies.href} in time")


def reply(core: Core, /, request: Message | Delivery[object], message: Message) -> Op[Published]:
    """Answer ``request`` with ``message``, through the default feed to its
    ``reply_to`` pipe, with the request's ``message_id`` as ``correlation_id``."""
    asked = request.message if isinstance(request, Delivery) else request
    if not asked.reply_to:
        raise ValueError("the request has no reply_to")
    answer = dataclasses.replace(message, address=asked.reply_to, correlation_id=asked.message_id)
    listing = yield from domain_op(core)
    return (yield from publish(core, listing.feed(DEFAULT_FEED), answer))


def worker(
    core: Core, /, feed: str, *, type: str = "service", title: str | None = None
) -> Op[Pipe]:
    """A worker's pipe on the service (or rotator) feed ``feed``, made if need be."""
    jobs = yield from create_feed(core, feed, type)
    own = yield from create_pipe(core, title=title or f"worker of {feed}")
    yield from join(core, own, jobs, "*")
    return own


def subscribe(
    core: Core,
    /,
    feed: str,
    address: str = "#",
    *,
    type: str = "topic",
    title: str | None = None,
) -> Op[Pipe]:
    """A subscriber's pipe joined to the ``type`` feed ``feed`` for ``address``."""
    topic = yield from create_feed(core, feed, type)
    own = yield from create_pipe(core, title=title or f"subscriber of {feed}")
    yield from join(core, own, topic, address)
    return own
