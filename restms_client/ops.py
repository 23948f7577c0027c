"""Every RestMS operation of the library, written once as a generator of steps.

See ``steps.py`` for how the clients run them. Each operation follows the URIs the
gateway gave (a ``Location``, an ``href``); the only URIs it makes are the entry
points the gateway documents (``/restms/domain/{name}``) and the next position of a
pipe that is being read, made from the gateway's own asynclet URI as RestMS defines
message URIs (``{pipe}.{n}``, docs/PROTOCOL.md §1).
"""

from __future__ import annotations

import dataclasses
import json
import urllib.parse
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from . import codec
from .codec import Tree
from .errors import GapError, ProtocolError
from .steps import Call, Emit, Op, Received, Reply, Retry, new_id, send
from .values import Content, Domain, Feed, Gap, Join, Message, Pipe, Published

USER_AGENT = "restms-client/0.1"
EARLIEST = "restms-earliest-position"

Resource = Feed | Pipe | Join | Content | str


@dataclass(frozen=True, slots=True, kw_only=True)
class Core:
    """What every operation needs to know of its client: where, which format, how
    patiently. ``max_wait`` bounds a wait on an asynclet from this side (the gateway
    ends its own at its ``max_wait``, 300 s by default, with a 503 asked again)."""

    url: str
    media_type: str = codec.JSON
    retry: Retry = field(default_factory=Retry)
    max_wait: float = 330.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "url", self.url.rstrip("/"))

    def call(
        self,
        method: str,
        url: str,
        tree: Tree | None = None,
        *,
        timeout: float | None = None,
        anonymous: bool = False,
    ) -> Call:
        headers = {"Accept": self.media_type, "User-Agent": USER_AGENT}
        body = None
        if tree is not None:
            headers["Content-Type"] = self.media_type
            body = codec.encode(tree, self.media_type)
        if method == "POST":
            headers["Idempotency-Key"] = new_id()
        return Call(method, url, headers, body, timeout, anonymous)


def href_of(resource: Resource) -> str:
    if isinstance(resource, str):
        return resource
    if resource.href is None:
        raise ValueError("this content has no href")
    return resource.href


def _tree(reply: Reply) -> Tree:
    return codec.decode(reply.content, reply.headers.get("content-type", ""))


def _location(reply: Reply) -> str:
    location = reply.headers.get("location")
    if not location:
        raise ProtocolError("the gateway gave no Location for what it made")
    return location


def _earliest(reply: Reply) -> int | None:
    value = reply.headers.get(EARLIEST)
    return int(value) if value and value.isdigit() else None


def domain_href(core: Core, name: str) -> str:
    return f"{core.url}/restms/domain/{urllib.parse.quote(name, safe='')}"


# ---------------------------------------------------------------- resources
def domain(core: Core, /, name: str = "default") -> Op[Domain]:
    """The domain ``name``: its profiles and public feeds."""
    href = domain_href(core, name)
    reply = yield from send(core.call("GET", href), core.retry)
    return codec.read_domain(_tree(reply), href)


def create_feed(
    core: Core,
    /,
    name: str | None,
    type: str = "fanout",
    *,
    title: str | None = None,
    license: str | None = None,
    domain: str = "default",
) -> Op[Feed]:
    """Create a feed (``name=None``: a private one); a public feed that exists already
    is returned as it is (RestMS makes that create idempotent)."""
    tree = codec.feed_tree(name=name, type=type, title=title, license=license)
    reply = yield from send(core.call("POST", domain_href(core, domain), tree), core.retry)
    made = codec.read_feed(_tree(reply), _location(reply))
    return dataclasses.replace(made, created=reply.status_code == 201)


def feed(core: Core, /, name: str) -> Op[Feed]:
    """The public feed ``name`` (at ``/restms/feed/{name}``: public feed names are
    unique across the gateway's domains, docs/PROTOCOL.md §1)."""
    href = f"{core.url}/restms/feed/{urllib.parse.quote(name, safe='')}"
    reply = yield from send(core.call("GET", href), core.retry)
    return codec.read_feed(_tree(reply), href)


def create_pipe(
    core: Core,
    /,
    *,
    type: str = "",
    title: str | None = None,
    domain: str = "default",
    **settings: object,
) -> Op[Pipe]:
    """Create a pipe. ``settings`` are the delivery settings of docs/EXTENSIONS.md §4
    (``durable``, ``lease``, ``max_deliveries``, ``dead_letter``, ``max_messages``,
    ``max_bytes``, ``overflow``)."""
    tree = codec.pipe_tree(type=type, title=title, settings=settings)
    reply = yield from send(core.call("POST", domain_href(core, domain), tree), core.retry)
    return codec.read_pipe(_tree(reply), _location(reply))


def pipe(core: Core, /, pipe: Pipe | str) -> Op[Pipe]:
    """The pipe as it is now: joins, held messages, asynclet, oldest position."""
    href = href_of(pipe)
    reply = yield from send(core.call("GET", href), core.retry)
    return codec.read_pipe(_tree(reply), href, _earliest(reply))


def join(
    core: Core,
    /,
    pipe: Pipe | str,
    feed: Feed | str,
    address: str = "*",
    *,
    type: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> Op[Join]:
    """Join ``pipe`` to ``feed``: messages whose address matches reach the pipe."""
    tree = codec.join_tree(
        feed=href_of(feed), address=address, type=type or "", headers=headers or {}
    )
    if type is None:
        del tree["join"][0]["type"]
    reply = yield from send(core.call("POST", href_of(pipe), tree), core.retry)
    made = codec.read_join(_tree(reply), _location(reply))
    return dataclasses.replace(made, created=reply.status_code == 201)


def delete(core: Core, /, resource: Resource) -> Op[None]:
    """Delete a feed, pipe, join, message or content (idempotent: 200 when gone)."""
    yield from send(core.call("DELETE", href_of(resource)), core.retry)


def ack(core: Core, /, message: str) -> Op[None]:
    """Acknowledge the message at ``message`` (its href) and every older one."""
    yield from send(core.call("DELETE", message), core.retry)


def publish(
    core: Core,
    /,
    feed: Feed | str,
    messages: Message | Iterable[Message],
    *,
    persistent: bool | None = None,
) -> Op[Published]:
    """Publish one message or a batch to ``feed``, in one request.

    A message without ``message_id`` gets a random one, and the request an
    ``Idempotency-Key``, so that a retried publish is never routed twice.
    ``persistent`` is the default for messages that do not say.
    """
    batch = (messages,) if isinstance(messages, Message) else tuple(messages)
    # one random stem a request, numbered: unique ids without a random draw each
    stem = new_id()
    ids = tuple(m.message_id or f"{stem}.{i}" for i, m in enumerate(batch))
    tree = codec.publish_tree(batch, ids, persistent)
    reply = yield from send(core.call("POST", href_of(feed), tree), core.retry)
    replayed = reply.headers.get("idempotent-replayed") == "true"
    return codec.read_published(_tree(reply), ids, replayed=replayed)


def stage(core: Core, /, feed: Feed | str, body: bytes, content_type: str) -> Op[Content]:
    """Stage ``body`` on ``feed`` for a later publish to refer to (docs/PROTOCOL.md §9)."""
    call = Call(
        "POST",
        href_of(feed),
        {"Content-Type": content_type, "Idempotency-Key": new_id(), "User-Agent": USER_AGENT},
        body,
    )
    reply = yield from send(call, core.retry)
    return Content(type=content_type, href=_location(reply))


def content(core: Core, /, content: Content | str) -> Op[Content]:
    """A linked content with its bytes fetched."""
    href = href_of(content)
    reply = yield from send(Call("GET", href, {"User-Agent": USER_AGENT}), core.retry)
    kind = reply.headers.get("content-type", "application/octet-stream")
    return Content(type=kind, body=reply.content, href=href)


def token_endpoint(core: Core, /) -> Op[str]:
    """The token endpoint the gateway's RFC 8414 metadata names (docs/AUTH.md §2)."""
    url = core.url + "/.well-known/oauth-authorization-server"
    call = Call(
        "GET", url, {"Accept": "application/json", "User-Agent": USER_AGENT}, anonymous=True
    )
    reply = yield from send(call, core.retry)
    try:
        endpoint = json.loads(reply.content)["token_endpoint"]
    except (ValueError, KeyError, TypeError) as exc:
        raise ProtocolError(f"{url} names no token_endpoint") from exc
    if not isinstance(endpoint, str):
        raise ProtocolError(f"{url} names no token_endpoint")
    return endpoint


# ---------------------------------------------------------------- reading
@dataclass(slots=True)
class Cursor:
    """A reader's own state: the highest position it has handed out (``seen``) and
    the last one it told a gap of (``told``)."""

    seen: int = 0
    told: int = 0


GapHandler = Callable[[Gap], None] | None


def _gap(cursor: Cursor, first: int, earliest: int | None, on_gap: GapHandler) -> Op[None]:
    """Tell of positions ``first``..``earliest - 1`` gone before this reader read them.

    Only positions past the last one handed out count, and only once this reader
    has handed out something: a new reader cannot tell a gap from messages that an
    earlier reader acknowledged.
    """
    first = max(first, cursor.told + 1)
    if earliest is None or cursor.seen == 0 or earliest <= first or first <= cursor.seen:
        return
    gap = Gap(first=first, last=earliest - 1, earliest=earliest)
    cursor.told = gap.last
    if on_gap is None:
        raise GapError(gap)
    on_gap(gap)
    yield from ()


def poll(
    core: Core, pipe_: Pipe | str, *, auto_ack: bool = False, on_gap: GapHandler = None
) -> Op[None]:
    """Read a pipe by long-poll for ever (until the caller stops), oldest first.

    The pipe is listed once; its held messages are read in order, then the asynclet,
    which the gateway holds until the next message arrives. A reader goes on from one
    position to the next, so across a gateway restart (the requests retried) it
    neither skips nor repeats. A position found gone sends it back to the listing,
    and a gone position it had not yet read is a gap. With ``auto_ack`` a message is
    acknowledged when the caller asks for the next one, i.e. after its handler ran.
    """
    cursor = Cursor()
    pending: list[int] = []
    prefix = ""
    position: int | None = None
    while True:
        if position is None:
            listing = yield from pipe(core, pipe_)
            first = listing.asynclet or (listing.messages[0].href if listing.messages else "")
            if not first:
                raise ProtocolError(f"pipe {listing.href} lists neither messages nor asynclet")
            prefix = first.rpartition(".")[0] + "."
            pending = [m.position for m in listing.messages if m.position > cursor.seen]
            position = pending.pop(0) if pending else codec.position(first)
            yield from _gap(cursor, cursor.seen + 1, listing.earliest, on_gap)
        href = prefix + str(position)
        reply = yield from send(
            core.call("GET", href, timeout=core.max_wait), core.retry, ok=frozenset({404})
        )
        if reply.status_code == 404:
            yield from _gap(cursor, position, _earliest(reply), on_gap)
            position = None  # gone (or the pipe is): list the pipe again
            continue
        message, count, _ = codec.read_message(_tree(reply))
        cursor.seen = max(cursor.seen, position)
        yield Emit(Received(message, href, position, count))
        if auto_ack:
            yield from ack(core, href)
        position = pending.pop(0) if pending else position + 1
