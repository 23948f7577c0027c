"""Pages on other origins: CORS for HTTP, and the ``Origin`` check of WebSocket upgrades.

A browser lets a page read a reply from another origin only when the reply says that
origin may (the Fetch standard's CORS protocol); before a request a page could not
have made with a plain form (a JSON body, an ``Authorization`` header, PUT, DELETE)
it asks first with a preflight ``OPTIONS``. Who may is ``cors_origins``
(docs/BROWSER.md, "Pages on other origins"): none by default, so only the gateway's
own pages (the live page, the API page) read its replies.

* **Origins.** Exact origins (``https://app.example.com``, ``http://localhost:3000``),
  patterns with a ``*`` for the leftmost labels of the host (``https://*.example.com``:
  any name under it, not the name itself) or for the port (``http://localhost:*``),
  or ``*`` for any origin. A listed origin is answered with itself in
  ``Access-Control-Allow-Origin`` and ``Vary: Origin``; ``*`` with ``*``.
* **Credentials.** With ``cors_credentials`` pages may send cookies and HTTP
  authentication with their requests (``credentials: "include"``), and the replies
  say ``Access-Control-Allow-Credentials: true``. That is never combined with ``*``:
  the configuration is refused, as a ``*`` that echoed every origin with credentials
  would let any site act as a logged-in user. A bearer token in ``Authorization``
  needs no credentials mode: it is a header the preflight allows.
* **Preflight.** An ``OPTIONS`` with ``Origin`` and ``Access-Control-Request-Method``
  on any path is answered here, before authentication (a browser sends none with it):
  ``204`` with the methods and the requested headers allowed, for ``cors_max_age``
  seconds; ``403`` with a ``text/plain`` reason for an origin not allowed. Any other
  ``OPTIONS`` is an undefined method, ``405`` as before (RestMS U11).
* **Replies.** Every reply to an allowed origin, whatever its status, streams and
  errors included, gets its headers as it is prepared (aiohttp's
  ``on_response_prepare``, installed only when origins are configured), with
  ``Access-Control-Expose-Headers`` naming the headers clients read.
* **WebSocket.** Browsers do not apply CORS to WebSocket, and a page on any site can
  open one to the gateway, with the loopback guest's rights on the gateway's own
  machine. So an upgrade whose ``Origin`` is neither the gateway's own nor allowed by
  ``websocket_origins`` (by default: ``cors_origins``) is refused with ``403`` before
  it happens. Clients other than browsers send no ``Origin`` and are not affected.

Why not aiohttp-cors (0.8.1): it finds origins by exact string only (no patterns),
echoes every origin with credentials for ``*``, sets no ``Vary: Origin``, and answers
preflights from routes it adds, which would pass through authentication here.
"""

from __future__ import annotations

import re
import urllib.parse

from aiohttp import hdrs, web

from restms.errors import Forbidden

# The methods the gateway serves on some path; a preflight is told all of them and
# the real request gets 405 where its path does not serve it.
METHODS = "GET, HEAD, POST, PUT, DELETE"
# Response headers a page may read besides the CORS-safelisted ones (Fetch standard).
EXPOSED = ", ".join(
    (
        "Location",
        "ETag",
        "Last-Modified",
        "Retry-After",
        "RestMS-Earliest-Position",  # gateway.restms.views.EARLIEST: where a pipe's gap ends
        "Idempotent-Replayed",
        "X-Request-ID",
        "WWW-Authenticate",
        "Allow",
    )
)
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # an HTTP field name (RFC 9110 5.6.2)
_MAX_REQUESTED = 2048  # characters of Access-Control-Request-Headers echoed at most
_DEFAULT_PORTS = {"http": 80, "https": 443}


def _entry(entry: str, key: str) -> str | re.Pattern[str]:
    """One origin of ``key``: the origin itself, or the pattern it writes."""
    try:
        parts = urllib.parse.urlsplit(entry)
    except ValueError as exc:  # a bracketed host that is no IPv6 address
        raise ValueError(f"{key}: {entry!r} is not an origin: {exc}") from None
    netloc = parts.netloc.lower()
    if (
        parts.scheme.lower() not in _DEFAULT_PORTS
        or not netloc
        or parts.path not in ("", "/")
        or parts.query
        or parts.fragment
        or "@" in netloc
    ):
        raise ValueError(f"{key}: {entry!r} is not an origin such as https://app.example.com")
    scheme = parts.scheme.lower()
    host, _, port = netloc.rpartition(":") if not netloc.endswith("]") else (netloc, "", "")
    if not host:
        host, port = netloc, ""
    if port and port != "*" and not (port.isdigit() and 0 < int(port) <= 65535):
        raise ValueError(f"{key}: {entry!r} has no valid port")
    if port.isdigit() and int(port) == _DEFAULT_PORTS[scheme]:
        port = ""  # browsers leave the scheme's own port out of Origin
    wild = host.startswith("*.")
    name = host[2:] if wild else host
    if not name.isascii():  # browsers send the name's ASCII (IDNA) form in Origin
        try:
            ascii_name = name.encode("idna").decode("ascii")
        except UnicodeError:
            ascii_name = "xn--..."
        written = f"{scheme}://{'*.' if wild else ''}{ascii_name}" + (f":{port}" if port else "")
        raise ValueError(f"{key}: {entry!r}: write the name as browsers send it: {written}")
    if "*" in name or not re.fullmatch(r"[a-z0-9.-]+|\[[0-9a-f:.]+\]", name):
        raise ValueError(f"{key}: {entry!r}: a * may stand only for leftmost labels or the port")
    if not wild and port != "*":
        return f"{scheme}://{host}" + (f":{port}" if port else "")
    pattern = re.escape(f"{scheme}://")
    pattern += r"(?:[a-z0-9-]+\.)+" + re.escape(name) if wild else re.escape(name)
    pattern += r"(?::[0-9]{1,5})?" if port == "*" else (re.escape(f":{port}") if port else "")
    return re.compile(pattern)


def _serialized(origin: str) -> str:
    """``scheme://host[:port]`` as a browser's ``Origin`` says it: in lower case, without
    the scheme's own port (``public_url`` or ``Host`` may name it)."""
    lowered = origin.lower()
    scheme = lowered.partition("://")[0]
    default = f":{_DEFAULT_PORTS.get(scheme)}"
    return lowered.removesuffix(default)


class Origins:
    """The origins of ``cors_origins`` (or ``websocket_origins``): which are allowed."""

    __slots__ = ("any", "exact", "patterns")

    def __init__(self, entries: str, key: str = "cors_origins") -> None:
        """``entries``: origins and patterns apart by commas or spaces (ValueError names
        a bad one)."""
        listed = entries.replace(",", " ").split()
        parsed = [_entry(entry, key) for entry in listed if entry != "*"]
        self.any = "*" in listed
        self.exact = frozenset(p for p in parsed if isinstance(p, str))
        self.patterns = tuple(p for p in parsed if not isinstance(p, str))

    @property
    def configured(self) -> bool:
        return self.any or bool(self.exact) or bool(self.patterns)

    def allows(self, origin: str) -> bool:
        """Whether a page of ``origin`` (an ``Origin`` header's value) may call."""
        if self.any or origin in self.exact:
            return True
        return any(p.fullmatch(origin) for p in self.patterns)


class Cors:
    """What the gateway tells pages of other origins: ``config.cors``."""

    __slots__ = ("credentials", "max_age", "origins", "public", "sockets")

    def __init__(
        self, origins: Origins, sockets: Origins, *, credentials: bool, max_age: int, public: str
    ) -> None:
        if credentials and origins.any:
            raise ValueError(
                'cors_credentials cannot be combined with "*" in cors_origins: list the '
                "origins whose pages may send credentials"
            )
        self.origins, self.sockets, self.public = origins, sockets, _serialized(public)
        self.credentials, self.max_age = credentials, max_age

    def _granted(self, origin: str) -> dict[str, str]:
        if self.origins.any:
            return {hdrs.ACCESS_CONTROL_ALLOW_ORIGIN: "*"}
        granted: dict[str, str] = {hdrs.ACCESS_CONTROL_ALLOW_ORIGIN: origin}
        if self.credentials:
            granted[hdrs.ACCESS_CONTROL_ALLOW_CREDENTIALS] = "true"
        return granted

    def preflight(self, request: web.Request) -> web.Response:
        """The answer to a preflight ``OPTIONS`` (it has ``Origin`` and
        ``Access-Control-Request-Method``): 204, or 403 for an origin not allowed."""
        origin = request.headers[hdrs.ORIGIN]
        if not self.origins.allows(origin):
            raise Forbidden(f"pages of {origin[:200]} may not call this gateway (cors_origins)")
        headers = self._granted(origin)
        headers[hdrs.ACCESS_CONTROL_ALLOW_METHODS] = METHODS
        headers[hdrs.ACCESS_CONTROL_MAX_AGE] = str(self.max_age)
        asked = request.headers.get(hdrs.ACCESS_CONTROL_REQUEST_HEADERS, "")
        listed = asked[:_MAX_REQUESTED].split(",")
        if len(asked) > _MAX_REQUESTED:
            listed.pop()  # the name the cut fell in: none is echoed in part
        names = [name.strip() for name in listed if name.strip()]
        if names and all(_TOKEN.fullmatch(name) for name in names):
            headers[hdrs.ACCESS_CONTROL_ALLOW_HEADERS] = ", ".join(names)
        # Chromium asks this before a public page may call an address on a private network.
        if request.headers.get("Access-Control-Request-Private-Network") == "true":
            headers["Access-Control-Allow-Private-Network"] = "true"
        return web.Response(status=204, headers=headers)

    async def on_prepare(self, request: web.Request, response: web.StreamResponse) -> None:
        """Every reply, as it is prepared: the CORS headers for an allowed origin."""
        headers = response.headers
        if not self.origins.any:
            headers.add(hdrs.VARY, "Origin")  # caches keep one reply per origin
        origin = request.headers.get(hdrs.ORIGIN)
        if (
            origin is None
            or hdrs.ACCESS_CONTROL_ALLOW_ORIGIN in headers  # a preflight's, complete
            or not self.origins.allows(origin)
        ):
            return
        headers.update(self._granted(origin))
        headers[hdrs.ACCESS_CONTROL_EXPOSE_HEADERS] = EXPOSED

    def check_socket(self, request: web.Request) -> None:
        """403 for a WebSocket upgrade from a page of an origin not allowed: neither the
        gateway's own (the request's scheme and host, or ``public_url``) nor listed."""
        origin = request.headers.get(hdrs.ORIGIN)
        if origin is None or self.sockets.allows(origin):
            return
        lowered = origin.lower()
        if lowered == self.public or lowered == _serialized(f"{request.scheme}://{request.host}"):
            return
        raise Forbidden(
            f"pages of {origin[:200]} may not open a WebSocket here (websocket_origins)"
        )


def make(
    cors_origins: str, websocket_origins: str, *, credentials: bool, max_age: int, public: str
) -> Cors:
    """The settings' :class:`Cors` (``websocket_origins`` "": as ``cors_origins``);
    ValueError names a bad entry or combination."""
    origins = Origins(cors_origins)
    sockets = Origins(websocket_origins, "websocket_origins") if websocket_origins else origins
    return Cors(origins, sockets, credentials=credentials, max_age=max_age, public=public)


def install(app: web.Application, cors: Cors) -> None:
    """Add the CORS headers to every reply, when any origin is allowed: with none, a
    reply costs nothing more."""
    if cors.origins.configured:
        app.on_response_prepare.append(cors.on_prepare)
