"""The HTTP client a federation link talks to a remote RestMS gateway with: the
gateway's implementation of :class:`bridges.federation.remote.Remote`, handed to the
bridges in their :class:`~bridges.base.Host` (bridges import no HTTP library).

Theory of operation
-------------------
Every request goes through the link's :class:`.session.RemoteSession`: one aiohttp
client session, its bounds (``timeout``, ``max_body``), the guard of a link made at
run time, and the credentials (a fixed bearer, or OAuth 2.0 client credentials kept
fresh). Every request sends and accepts ``application/restms+json`` (docs/PROTOCOL.md
§3-4).

**Outcomes** are those of :mod:`bridges.federation.remote` (Unavailable, Refused,
PipeGone); foreign exceptions are converted here (``raise ... from``).

**Streaming** (docs/EXTENSIONS.md §3). :meth:`HttpRemote.stream` opens the pipe's
event stream from a position on, and :class:`.events.EventStream` reads it as it comes: the
way a pull link reads a remote that offers it. A remote that answers the stream's
GET with anything but an event stream (the pipe document, 406) offers none: the link
reads as below.

**Reading** (docs/PROTOCOL.md §6, docs/EXTENSIONS.md §3 *Gaps*). A read GETs the
message at its position; while that is the pipe's asynclet the remote holds the
request until a message arrives, and the client gives up after ``wait`` seconds (or
the remote after its ``max_wait``: 503, ``Retry-After: 0``), which is an empty read.
It then lists the pipe and takes the messages held after that one, up to ``limit``,
from the pipe's event stream (docs/EXTENSIONS.md §3: one request for all of them,
left once the last came); from a server without event streams, or when the stream
fails before its first message, it GETs them, a few at a time. A position that is
gone (404 naming ``RestMS-Earliest-Position``) moves the read to the oldest position
held; a 404 without it sends the read to the pipe's listing, whose 404 is
:class:`PipeGone`. Linked contents are fetched, so every
message returned embeds its contents. The pipes :meth:`HttpRemote.create_pipe` makes are
durable (the remote stores every message they get) and have no lease (``lease="0"``:
a message read and not yet acknowledged stays at its position, in order, instead of
coming back later at another), which is what an in-order reader that acknowledges
after its own commit needs.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import urllib.parse
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import aiohttp
import orjson
from opentelemetry.trace import SpanKind, Tracer

from bridges import tracing
from bridges.checks import NAME, redact
from bridges.federation.remote import PipeGone, Unavailable
from restms import specs
from restms.document import Document, Element
from restms.errors import BadRequest, RestMSError
from restms.jsoncodec import to_json
from restms.specs import Content, EmbeddedContent, MessageSpec

from . import wire
from .events import EventStream
from .session import JSON, RemoteSession

log = logging.getLogger(__name__)

EVENTS = "text/event-stream"
EARLIEST = "RestMS-Earliest-Position"  # docs/EXTENSIONS.md §9
IDENTITY_PATH = "/.well-known/restms-gateway"  # where a gateway says its id
AT_ONCE = 8  # message GETs of one read in flight at a time
STREAM_IDLE = 1.0  # seconds a read from a pipe's event stream waits for its next line
TURNS = 4  # positions a read tries (each a gap or a hole skipped) before it says "none"
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class _Listing:
    """What a pipe's document says of its messages."""

    held: tuple[int, ...]  # positions of the messages listed, oldest first
    asynclet: int | None  # None when the listing is capped (docs/PROTOCOL.md §6)


class HttpRemote:
    """A client of one remote RestMS gateway (module docstring), the gateway's
    :class:`bridges.federation.remote.Remote`."""

    def __init__(self, http: RemoteSession, *, tracer: Tracer | None = None) -> None:
        self._http = http  # every request goes through it (module docstring)
        self._tracer = tracer  # None: tracing is off (docs/TRACING.md)

    def __repr__(self) -> str:
        http = self._http
        return f"<HttpRemote token_url={redact(http.auth.token_url)!r} timeout={http.timeout:g}>"

    async def close(self) -> None:
        await self._http.close()

    # ------------------------------------------------------------ the operations
    def encode(self, messages: Sequence[MessageSpec]) -> bytes:
        """The JSON message document :meth:`publish` sends."""
        return wire.message_document(messages)

    async def publish(
        self,
        feed_url: str,
        messages: Sequence[MessageSpec],
        encoded: bytes | None = None,
        written: asyncio.Future[None] | None = None,
    ) -> list[bool]:
        """POST one JSON message document (contents embedded), ``encoded`` when given;
        one entry per message: True when the remote said it was a duplicate
        (duplicate="1"), False otherwise. ``written`` is done as the body is written
        (:mod:`.session`). With tracing on, ``encoded`` is not used: each message
        is sent with the context of its own hop's span."""
        if not messages:
            return []
        if self._tracer is not None:  # each message's hop a span, its context carried on
            attributes = {"messaging.destination.name": redact(feed_url)}
            messages = [
                tracing.hop(self._tracer, "federation send", SpanKind.PRODUCER, spec, attributes)
                for spec in messages
            ]
            encoded = None  # made before the spans: it carries the contexts they replace
        where = f"POST {redact(feed_url)}"
        document = wire.message_document(messages) if encoded is None else encoded
        reply = await self._http.call("POST", feed_url, document, written=written)
        wire.check(reply, where)
        entries = wire.publish_reply(reply, where)
        if len(entries) != len(messages):
            raise Unavailable(
                f"{where}: the reply lists {len(entries)} messages for {len(messages)} sent"
            )
        return [entry.get("duplicate") == "1" for entry in entries]

    async def create_pipe(
        self, feed_url: str, title: str, max_messages: int = 0, max_bytes: int = 0
    ) -> str:
        """A new durable pipe without lease (module docstring) in the domain of the
        remote feed ``feed_url`` (``default`` when its document names none), asked for
        these limits (0: the remote's defaults; docs/EXTENSIONS.md §4); its URL."""
        where = f"GET {redact(feed_url)}"
        reply = await self._http.call("GET", feed_url)
        wire.check(reply, where)
        feed = next(wire.parse_reply(reply, where).iter("feed"), None)
        if feed is None:
            raise Unavailable(f"{where}: the reply holds no feed")
        domain = feed.get("domain") or "default"
        root, found, _ = feed_url.rpartition("/feed/")
        if not found:
            raise ValueError(f"{redact(feed_url)} is not a RestMS feed URL (…/restms/feed/<name>)")
        domain_url = f"{root}/domain/{urllib.parse.quote(domain, safe='')}"
        pipe = {"title": title, "durable": "1", "lease": "0"}
        if max_messages:
            pipe["max_messages"] = str(max_messages)
        if max_bytes:
            pipe["max_bytes"] = str(max_bytes)
        return await self._create(domain_url, Element("pipe", pipe), pipe_url=None)

    async def create_join(
        self, pipe_url: str, feed_url: str, address: str, headers: tuple[tuple[str, str], ...]
    ) -> str:
        """A join of the remote pipe to the remote feed (the existing one when the pipe
        has an identical join); its URL. :class:`PipeGone` when the pipe is gone."""
        join = Element(
            "join", {"feed": feed_url, "address": address}, wire.header_elements(headers)
        )
        return await self._create(pipe_url, join, pipe_url=pipe_url)

    async def pipe_joins(
        self, pipe_url: str
    ) -> list[tuple[str, str, tuple[tuple[str, str], ...]]] | None:
        """(feed URL, address, headers) of each join; None when the pipe is gone (404).
        The pipe's own join to the remote's ``default`` feed is listed too."""
        where = f"GET {redact(pipe_url)}"
        reply = await self._http.call("GET", pipe_url)
        if reply.status == 404:
            return None
        wire.check(reply, where)
        pipe = next(wire.parse_reply(reply, where).iter("pipe"), None)
        if pipe is None:
            raise Unavailable(f"{where}: the reply holds no pipe")
        try:
            return [
                (
                    join.attrs.get("feed", ""),
                    join.attrs.get("address", ""),
                    tuple(specs.header(h.attrs) for h in join.iter("header")),
                )
                for join in pipe.iter("join")
            ]
        except BadRequest as exc:
            raise Unavailable(f"{where}: the reply is not understood: {exc}") from exc

    async def read(
        self, pipe_url: str, position: int, limit: int, wait: float, *, streams: bool = True
    ) -> list[tuple[int, MessageSpec]]:
        """Messages at ``position`` and after (up to ``limit``), waiting up to ``wait`` s
        when none; [] after the wait (or the remote's ``max_wait``, when shorter).

        The first position returned is later than ``position`` when the messages
        between are gone (a gap the caller may report), or the pipe's next position
        when ``position`` is past every position the remote has issued. Without
        ``streams`` (the remote is known to have no event streams) the messages after
        the first are not asked of the pipe's event stream."""
        if limit < 1:
            raise ValueError("a read needs a limit of at least 1")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        first: MessageSpec | None = None
        for _ in range(TURNS):
            left = deadline - loop.time()
            if left <= 0:  # no waiting left: only a message held now
                listing = await self._listing(pipe_url)
                held = next((p for p in listing.held if p >= position), None)
                if held is None:
                    return []
                position = held
                found = await self._message(pipe_url, position, None)
            else:
                found = await self._message(pipe_url, position, left)
            if isinstance(found, MessageSpec):
                first = found
                break
            if found is None:
                return []
            position = found
        if first is None:
            return []
        out = [(position, first)]
        if limit > 1:
            listing = await self._listing(pipe_url)
            after = [p for p in listing.held if p > position][: limit - 1]
            if not after:
                return out
            streamed = await self._streamed(pipe_url, position, after[-1]) if streams else None
            if streamed is not None:
                return out + streamed
            gate = asyncio.Semaphore(AT_ONCE)

            async def one(p: int) -> MessageSpec | int | None:
                async with gate:
                    return await self._message(pipe_url, p, None)

            for p, got in zip(after, await _all([one(p) for p in after]), strict=True):
                if not isinstance(got, MessageSpec):
                    break  # gone meanwhile: the next read goes on from there
                out.append((p, got))
        return out

    async def stream(self, pipe_url: str, after: int, room: int, idle: float) -> EventStream | None:
        """The pipe's event stream (docs/EXTENSIONS.md §3) from the message after
        position ``after`` on, read as it comes (:class:`EventStream`, holding at most
        ``room`` messages not taken yet, given up after ``idle`` seconds without a
        line); None when the remote does not stream the pipe (a RestMS server
        without the extension answers with the pipe document): the caller reads
        with :meth:`read` then. :class:`PipeGone` when the pipe is gone."""
        where = f"GET {redact(pipe_url)} (event stream)"
        headers = {"Accept": EVENTS, "Last-Event-ID": str(after)}
        token, fresh = await self._http.bearer()
        for _ in range(2):
            if token:
                headers["Authorization"] = f"Bearer {token}"
            session = await self._http.open()
            reply = await self._http.opened(session, pipe_url, headers, where)
            if reply.status == 200 and reply.content_type == EVENTS:
                general = functools.partial(self._delivered, pipe_url)
                return EventStream(
                    general,
                    pipe_url,
                    reply,
                    after=after,
                    room=room,
                    idle=idle,
                    limit=self._http.max_body,
                )
            try:
                answer = wire.Reply(
                    reply.status, reply.headers, await self._http.read(reply, where)
                )
            finally:
                reply.release()
            if answer.status == 401 and self._http.auth.token_url and not fresh:
                token, fresh = await self._http.bearer(stale=token)
                continue
            break
        if answer.status == 404:
            raise PipeGone(f"{where}: the pipe is gone")
        if 200 <= answer.status < 300 or answer.status == 406:
            return None  # no event streams here
        wire.check(answer, where)
        raise Unavailable(f"{where}: unexpected status {answer.status}")

    async def gateway_id(self, feed_url: str) -> str | None:
        """The remote gateway's id (docs/FEDERATION.md, "Gateway ids"), asked at the
        feed's origin; None from a RestMS server that does not say."""
        parts = urllib.parse.urlsplit(feed_url)
        url = f"{parts.scheme}://{parts.netloc}{IDENTITY_PATH}"
        where = f"GET {redact(url)}"
        reply = await self._http.call("GET", url, accept="application/json")
        if reply.status in (404, 405):
            return None
        wire.check(reply, where)
        try:
            said = orjson.loads(reply.body).get("gateway_id")
        except (orjson.JSONDecodeError, AttributeError):
            return None
        return said if isinstance(said, str) and NAME.fullmatch(said) else None

    async def ack(self, pipe_url: str, position: int) -> None:
        """DELETE pipe.position: the message and every older one go (D4). A DELETE is
        answered 200 even when the pipe is gone (R4): the next read tells."""
        url = f"{pipe_url}.{position}"
        wire.check(await self._http.call("DELETE", url), f"DELETE {redact(url)}")

    async def delete_pipe(self, pipe_url: str) -> None:
        """DELETE the pipe; a pipe gone already is no error (R4)."""
        wire.check(await self._http.call("DELETE", pipe_url), f"DELETE {redact(pipe_url)}")

    # ------------------------------------------------------------ reading
    async def _message(
        self, pipe_url: str, position: int, wait: float | None
    ) -> MessageSpec | int | None:
        """The message at ``position`` (waiting up to ``wait`` s while it is the
        asynclet; None: held now, answered at once); else the position to try next,
        or None for nothing (the wait ran out)."""
        url = f"{pipe_url}.{position}"
        where = f"GET {redact(url)}"
        reply = await self._http.send("GET", url, None, JSON, wait)
        if reply is None:
            return None
        if reply.status == 200:
            return await self._delivered(pipe_url, url, reply)
        if reply.status == 404:
            earliest = wire.position(reply.headers.get(EARLIEST))
            if earliest is not None and earliest > position:
                return earliest  # gone: acknowledged, or lost (a gap)
            listing = await self._listing(pipe_url)  # PipeGone when the pipe went
            held = next((p for p in listing.held if p >= position), None)
            if held is not None:
                return held
            if listing.asynclet is not None and listing.asynclet != position:
                return listing.asynclet
            return None
        if reply.status == 503 and reply.headers.get("Retry-After", "").strip() == "0":
            return None  # the remote's own max_wait ran out first
        wire.check(reply, where)
        raise Unavailable(f"{where}: unexpected status {reply.status}")

    async def _delivered(self, pipe_url: str, url: str, reply: wire.Reply) -> MessageSpec:
        """The message a GET answered, its linked contents fetched and embedded."""
        where = f"GET {redact(url)}"
        element = next(wire.parse_reply(reply, where).iter("message"), None)
        if element is None:
            raise Unavailable(f"{where}: the reply holds no message")
        try:
            headers = [specs.header(h.attrs) for h in element.iter("header")]
            contents: list[Content] = []
            for part in element.iter("content"):
                href = part.get("href")
                if href is None:
                    attrs = part.attrs
                    contents.append(
                        specs.content(None, attrs.get("type"), attrs.get("encoding"), part.text)
                    )
                    continue
                content_url = wire.beside(url, href, where)
                fetched = await self._content(pipe_url, content_url, part)
                if fetched is not None:
                    contents.append(fetched)
            return specs.build_message(element.attrs, headers, contents, wire.READ_LIMITS)
        except RestMSError as exc:
            raise Unavailable(f"{where}: the message is not understood: {exc}") from exc

    async def _streamed(
        self, pipe_url: str, after: int, upto: int
    ) -> list[tuple[int, MessageSpec]] | None:
        """The messages held after position ``after``, up to ``upto``, read in one
        request from the pipe's event stream (docs/EXTENSIONS.md §3) instead of a GET
        each. None when the remote does not stream the pipe (a RestMS server without
        that extension answers with the pipe document) or the stream fails before its
        first message: the caller GETs each message then. The stream is left once
        ``upto`` came, or when no line came for :data:`STREAM_IDLE` seconds (a message
        gone meanwhile): what came by then is returned."""
        token, _ = await self._http.bearer()
        headers = {"Accept": "text/event-stream", "Last-Event-ID": str(after)}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        session = await self._http.open()
        out: list[tuple[int, MessageSpec]] = []
        try:
            async with asyncio.timeout(self._http.timeout):
                async with session.get(pipe_url, headers=headers, allow_redirects=False) as reply:
                    if reply.status != 200 or reply.content_type != "text/event-stream":
                        return None
                    lines = wire.EventLines()
                    while True:
                        async with asyncio.timeout(STREAM_IDLE):
                            raw = await reply.content.readline(max_line_length=self._http.max_body)
                        if not raw:
                            break  # the stream ended (stream_max, or the pipe was deleted)
                        event = lines.line(raw)
                        if event is None or event[0] != "message":
                            continue
                        found = wire.position(event[1])
                        if found is None or found <= after or (out and found <= out[-1][0]):
                            break  # not a position this read asked for
                        url = f"{pipe_url}.{found}"
                        got = wire.Reply(200, {}, event[2].encode())
                        out.append((found, await self._delivered(pipe_url, url, got)))
                        if found >= upto:
                            break
        except (TimeoutError, aiohttp.ClientError, OSError, ValueError, Unavailable):
            if not out:
                return None  # the GETs say what is wrong, if anything still is
        return out

    async def _content(self, pipe_url: str, url: str, part: Element) -> EmbeddedContent | None:
        """A delivered content's bytes, embedded; None when it was deleted from the pipe's
        copy of the message (then the message's document no longer lists it)."""
        where = f"GET {redact(url)}"
        reply = await self._http.call("GET", url, accept="*/*")
        if reply.status == 404:
            await self._listing(pipe_url)  # PipeGone when the whole pipe went
            return None
        wire.check(reply, where)
        kind = part.get("type") or reply.headers.get("Content-Type") or "application/octet-stream"
        return EmbeddedContent.of(reply.body, kind)

    async def _listing(self, pipe_url: str) -> _Listing:
        where = f"GET {redact(pipe_url)}"
        reply = await self._http.call("GET", pipe_url)
        if reply.status == 404:
            raise PipeGone(f"{where}: the pipe is gone")
        wire.check(reply, where)
        pipe = next(wire.parse_reply(reply, where).iter("pipe"), None)
        if pipe is None:
            raise Unavailable(f"{where}: the reply holds no pipe")
        held: list[int] = []
        asynclet = None
        for message in pipe.iter("message"):
            found = wire.position(message.attrs.get("href", "").rpartition(".")[2])
            if found is None:
                raise Unavailable(f"{where}: a message has no position in its href")
            if message.attrs.get("async") == "1":
                asynclet = found
            else:
                held.append(found)
        return _Listing(tuple(sorted(held)), asynclet)

    async def _create(self, url: str, element: Element, *, pipe_url: str | None) -> str:
        """POST a document of one element; the Location of what it made (or found)."""
        where = f"POST {redact(url)}"
        reply = await self._http.call("POST", url, to_json(Document(elements=(element,))))
        if reply.status == 404 and pipe_url is not None:
            raise PipeGone(f"{where}: the pipe is gone")
        wire.check(reply, where)
        location = reply.headers.get("Location")
        if not location:
            raise Unavailable(f"{where}: the reply has no Location")
        return wire.beside(url, location, where)

    # ------------------------------------------------------------ requests


# ---------------------------------------------------------------- values
async def _all(calls: list[Coroutine[Any, Any, T]]) -> list[T]:
    """Every result in order; the first failure cancels the rest and is raised."""
    tasks = [asyncio.ensure_future(call) for call in calls]
    try:
        return await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
