"""The authenticated, bounded HTTP exchanges of a federation link with one remote
gateway (:class:`RemoteSession`): what :class:`.client.HttpRemote` sends its RestMS
requests through.

Theory of operation
-------------------
One session per link holds one aiohttp client session, opened on first use (inside
the event loop; a CA file is read in a worker thread). Every request follows no
redirects, keeps no cookies and ignores proxy settings of the environment. It is
bounded twice: connecting by ``timeout`` seconds (aiohttp), the whole exchange by
``timeout`` seconds too, or, for a read's long-poll, by its ``wait`` until the reply's
head arrives and ``timeout`` more for its body. No reply body is read past
``max_body`` bytes: a larger one is :class:`Unavailable`, never a crash.

**The guard.** A link made at run time gets a :class:`~gateway.webhooks.guard.Guard`
(``federation_allow``; docs/FEDERATION.md, "Security"): its session resolves names
through :class:`~gateway.webhooks.guard.GuardedResolver`, which keeps only the
addresses the guard allows at each new connection (a name that later resolves to a
private address, DNS rebinding, is refused), and checks an address literal, which
aiohttp never resolves, as each request starts. Either refusal is
:class:`Unavailable` naming why: the link retries, in case the configuration changes.
A link of the configuration file has no guard.

**Credentials.** A fixed bearer token, or OAuth 2.0 client credentials at the
remote's token endpoint (docs/AUTH.md §2: a form POST, the client authenticated with
HTTP Basic, ``client_secret_basic``, id and secret form-encoded first as RFC 6749
§2.3.1 says). The token is fetched on first use, one fetch at a time, and again once
80 % of its ``expires_in`` has passed. A 401 with a token fetched before this
request makes one new fetch and sends the request again; a 401 with a token just
fetched (or a fixed one) is :class:`Unavailable`: a misconfiguration the link keeps
reporting, not a reason to give messages up. Secrets never appear in a ``repr``, a
log line or an error, and URLs in errors have their password redacted.

**Written.** A request may be given a future (``written``) that is done as its body is
written (:func:`_body_written`): a push link prepares its next batch from then on.
"""

from __future__ import annotations

import asyncio
import base64
import ssl
import urllib.parse
from typing import Any

import aiohttp

from bridges.checks import redact
from bridges.federation.remote import Auth, Unavailable
from gateway.server.bodies import read_at_most
from gateway.webhooks.guard import Guard, GuardedResolver, RefusedAddress

from . import wire

JSON = "application/restms+json"
USER_AGENT = "restms-gateway-federation/1"
REFRESH_AT = 0.8  # of a token's life: when a new one is fetched
UNKNOWN_LIFE = 300.0  # seconds a token without expires_in is kept


class RemoteSession:
    """The exchanges of one link with its remote (module docstring)."""

    def __init__(
        self,
        auth: Auth,
        *,
        timeout: float,
        tls_ca: str = "",
        tls_verify: bool = True,
        max_body: int = 8 << 20,
        guard: Guard | None = None,
    ) -> None:
        if not timeout > 0 or max_body < 1:
            raise ValueError("timeout and max_body must be positive")
        self.auth = auth
        self.timeout = timeout
        self.max_body = max_body
        self._tls_ca = tls_ca
        self._tls_verify = tls_verify
        self._guard = guard  # None: any address (a link of the configuration file)
        self._session: aiohttp.ClientSession | None = None
        self._opening = asyncio.Lock()
        self._closed = False
        self._token = ""
        self._refresh_at = 0.0  # loop time
        self._fetching = asyncio.Lock()

    async def close(self) -> None:
        self._closed = True
        async with self._opening:
            if self._session is not None:
                await self._session.close()
                self._session = None

    async def call(
        self,
        method: str,
        url: str,
        document: bytes | None = None,
        *,
        accept: str = JSON,
        written: asyncio.Future[None] | None = None,
    ) -> wire.Reply:
        """One request that does not wait (:meth:`send`)."""
        reply = await self.send(method, url, document, accept, None, written)
        if reply is None:  # only a wait runs out without an answer
            raise Unavailable(f"{method} {redact(url)}: no answer")
        return reply

    async def send(
        self,
        method: str,
        url: str,
        document: bytes | None,
        accept: str,
        wait: float | None,
        written: asyncio.Future[None] | None = None,
    ) -> wire.Reply | None:
        """One request with the link's credentials, sent again once with a new token
        after a 401 of one fetched earlier; None when ``wait`` ran out."""
        headers = {"Accept": accept}
        if document is not None:
            headers["Content-Type"] = JSON
        token, fresh = await self.bearer()
        reply = await self._exchange(method, url, document, headers, token, wait, written)
        if reply is not None and reply.status == 401 and self.auth.token_url and not fresh:
            token, _ = await self.bearer(stale=token)
            reply = await self._exchange(method, url, document, headers, token, wait)
        return reply

    async def bearer(self, stale: str = "") -> tuple[str, bool]:
        """The token to send, and whether this call fetched it; ``stale`` is one the
        remote has just refused (another request may have replaced it already)."""
        auth = self.auth
        if not auth.token_url:
            return auth.bearer, False
        loop = asyncio.get_running_loop()
        async with self._fetching:
            if self._token and self._token != stale and loop.time() < self._refresh_at:
                return self._token, False
            self._token = ""
            token, life = await self._fetch_token()
            self._token, self._refresh_at = token, loop.time() + REFRESH_AT * life
            return token, True

    async def _fetch_token(self) -> tuple[str, float]:
        """A new access token and its life in seconds (client credentials grant)."""
        auth = self.auth
        where = f"token endpoint {redact(auth.token_url)}"
        form = {"grant_type": "client_credentials"}
        if auth.scope:
            form["scope"] = auth.scope
        pair = f"{wire.form(auth.client_id)}:{wire.form(auth.client_secret)}"
        headers = {
            "Authorization": "Basic " + base64.b64encode(pair.encode()).decode("ascii"),
            "Accept": "application/json",
            "Content-Type": "application/x-www-form-urlencoded",
        }
        body = urllib.parse.urlencode(form).encode()
        reply = await self._exchange("POST", auth.token_url, body, headers, "", None)
        if reply is None:  # only a wait runs out without an answer
            raise Unavailable(f"{where}: no answer")
        return wire.token_reply(reply, where, auth.client_id, UNKNOWN_LIFE)

    async def _exchange(
        self,
        method: str,
        url: str,
        body: bytes | None,
        headers: dict[str, str],
        token: str,
        wait: float | None,
        written: asyncio.Future[None] | None = None,
    ) -> wire.Reply | None:
        """One HTTP exchange, bounded (module docstring); None when ``wait`` ran out
        before the reply's head came. ``written``: done as the body is written."""
        where = f"{method} {redact(url)}"
        if token:
            headers = {**headers, "Authorization": f"Bearer {token}"}
        session = await self.open()
        loop = asyncio.get_running_loop()
        answered = False
        try:
            async with asyncio.timeout(self.timeout if wait is None else wait) as bound:
                async with session.request(
                    method,
                    url,
                    data=body,
                    headers=headers,
                    allow_redirects=False,
                    trace_request_ctx=written,
                ) as reply:
                    answered = True
                    bound.reschedule(loop.time() + self.timeout)
                    data = await self.read(reply, where)
                    return wire.Reply(reply.status, reply.headers, data)
        except aiohttp.ClientConnectorError as exc:  # before TimeoutError: some are both
            cause = exc.os_error.strerror or type(exc.os_error).__name__
            raise Unavailable(f"{where}: cannot connect ({cause})") from exc
        except aiohttp.ConnectionTimeoutError as exc:
            raise Unavailable(f"{where}: no connection within {self.timeout:g} s") from exc
        except TimeoutError as exc:
            if answered:
                raise Unavailable(f"{where}: the reply did not come whole in time") from exc
            if wait is not None:
                return None
            raise Unavailable(f"{where}: no answer within {self.timeout:g} s") from exc
        except RefusedAddress as exc:  # an address literal the guard refuses (_open)
            raise Unavailable(f"{where}: cannot connect ({exc})") from exc
        except (aiohttp.ClientError, OSError, ValueError) as exc:  # ValueError: a bad URL
            raise Unavailable(f"{where}: the exchange failed ({type(exc).__name__})") from exc

    async def read(self, reply: aiohttp.ClientResponse, where: str) -> bytes:
        """The body, at most ``max_body`` bytes; the connection is dropped past them."""
        limit = self.max_body
        if reply.content_length is not None and reply.content_length > limit:
            reply.close()
            raise Unavailable(f"{where}: the reply of {reply.content_length} bytes is too large")
        body, more = await read_at_most(reply.content, limit)
        if more:
            reply.close()
            raise Unavailable(f"{where}: the reply is larger than {limit} bytes")
        return body

    async def open(self) -> aiohttp.ClientSession:
        async with self._opening:
            if self._closed:
                raise Unavailable("the remote client is closed")
            if self._session is None:
                context: ssl.SSLContext | bool = self._tls_verify
                if self._tls_verify and self._tls_ca:
                    try:  # reads the file: not on the loop
                        context = await asyncio.to_thread(
                            ssl.create_default_context, cafile=self._tls_ca
                        )
                    except (OSError, ssl.SSLError) as exc:
                        raise Unavailable(f"cannot load tls_ca {self._tls_ca}: {exc}") from exc
                resolver: aiohttp.abc.AbstractResolver | None = None
                traces = [_body_written()]
                if self._guard is not None:  # a run-time link (module docstring)
                    resolver = GuardedResolver(self._guard, aiohttp.ThreadedResolver())
                    traces.append(_literal_check(self._guard))
                self._session = aiohttp.ClientSession(
                    connector=aiohttp.TCPConnector(ssl=context, resolver=resolver),
                    cookie_jar=aiohttp.DummyCookieJar(),
                    trust_env=False,
                    timeout=aiohttp.ClientTimeout(total=None, connect=self.timeout),
                    headers={"User-Agent": USER_AGENT},
                    trace_configs=traces,
                )
            return self._session

    async def opened(
        self, session: aiohttp.ClientSession, url: str, headers: dict[str, str], where: str
    ) -> aiohttp.ClientResponse:
        """A GET whose reply's head came within ``timeout`` (its body is read later)."""
        try:
            async with asyncio.timeout(self.timeout):
                return await session.get(url, headers=headers, allow_redirects=False)
        except aiohttp.ClientConnectorError as exc:  # before TimeoutError: some are both
            cause = exc.os_error.strerror or type(exc.os_error).__name__
            raise Unavailable(f"{where}: cannot connect ({cause})") from exc
        except TimeoutError as exc:
            raise Unavailable(f"{where}: no answer within {self.timeout:g} s") from exc
        except RefusedAddress as exc:  # an address literal the guard refuses (_open)
            raise Unavailable(f"{where}: cannot connect ({exc})") from exc
        except (aiohttp.ClientError, OSError, ValueError) as exc:  # ValueError: a bad URL
            raise Unavailable(f"{where}: the exchange failed ({type(exc).__name__})") from exc


def _literal_check(guard: Guard) -> aiohttp.TraceConfig:
    """Checks each request's host when it is an address literal (RefusedAddress):
    aiohttp connects to a literal without asking the resolver."""

    async def check(
        session: aiohttp.ClientSession, context: Any, params: aiohttp.TraceRequestStartParams
    ) -> None:
        guard.check_literal(params.url.host or "")

    traces = aiohttp.TraceConfig()
    traces.on_request_start.append(check)
    return traces


def _body_written() -> aiohttp.TraceConfig:
    """Makes done the future a request was given as its ``trace_request_ctx``, as its
    body is written: aiohttp writes a body in a task of its own, on a later turn of the
    event loop, so a caller that went on working without a pause would hold the request
    back (the remote idle meanwhile). The hook runs just before the write, in the same
    step of that task: the caller resumes only after it."""

    async def chunk(
        session: aiohttp.ClientSession, context: Any, params: aiohttp.TraceRequestChunkSentParams
    ) -> None:
        written = context.trace_request_ctx
        if isinstance(written, asyncio.Future) and not written.done():
            written.set_result(None)

    traces = aiohttp.TraceConfig()
    traces.on_request_chunk_sent.append(chunk)
    return traces
