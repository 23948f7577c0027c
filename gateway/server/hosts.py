"""The hosts the gateway answers for, and the origin of the absolute URIs it writes.

Documents and ``Location`` headers carry absolute URIs (RestMS U4). Built from the
request's ``Host`` alone they would name whatever a client wrote there: ``Host:
evil.example:666`` came back as ``Location: http://evil.example:666/restms/...``, for
a cache or a shared link to send the next client to. So (docs/OPERATIONS.md, "Public
URL and allowed hosts"):

* ``public_url`` (``https://gw.example.com``), when set, is the origin of every URI
  the gateway writes, whatever the request says, and the built-in issuer's ``iss``
  unless ``oauth_issuer`` says otherwise.
* A request is served only when its host (``Host``, or a trusted proxy's
  ``X-Forwarded-Host``) names this gateway: ``public_url``'s host (any port), a
  pattern of ``allowed_hosts``, or one of the gateway's own addresses, below. Any
  other host is answered ``421 Misdirected Request``, the status RFC 9110 (7.4,
  15.5.20) gives a request for an authority the server is not configured to serve
  (a client may retry it on another connection; a ``400`` says the request itself was
  wrong, and ``Host: a/b``, which is no host, gets that).
* The gateway's own addresses, always served: the address and port the connection
  came in on, written as an address (``127.0.0.1:8080``, ``[::1]:8080``,
  ``192.0.2.10:8080`` on a ``0.0.0.0`` listener); on a loopback connection also
  ``localhost`` with that port; and the configured ``host`` when it is a name. A
  ``Host`` without a port means the scheme's (80, 443). The machine's public names are
  not known to it: a gateway reached by name needs ``public_url`` or ``allowed_hosts``.

``allowed_hosts`` patterns: ``name`` (any port), ``name:port``, ``*.example.com``
(any name under it), ``[::1]:8080``, or ``*`` for any host at all (the old behaviour,
for a proxy in front that checks ``Host`` itself; URIs then name the request's host).
"""

from __future__ import annotations

import ipaddress
import re
import urllib.parse

from aiohttp import web

from restms.errors import BadRequest, MisdirectedRequest
from restms.uris import Base

# A host as the Host header writes it: a name (dot-separated labels, one trailing dot
# allowed) or a bracketed IPv6 address, then an optional port. Labels are separated by
# exactly one dot so a failing match never backtracks over ways to split a label.
_AUTHORITY = re.compile(
    r"(?P<name>[A-Za-z0-9_-]+(?:\.[A-Za-z0-9_-]+)*\.?|\[[0-9A-Fa-f:.]+\])"
    r"(?::(?P<port>[0-9]{1,5}))?\Z"
)
MAX_HOST = 255
DEFAULT_PORTS = {"http": 80, "https": 443}
_KNOWN_MAX = 1024  # hosts remembered as served, at most


def split_host(text: str) -> tuple[str, int | None] | None:
    """``"Gw.Example.com.:8443"`` -> ``("gw.example.com", 8443)``; None if no host[:port].

    IPv6 addresses keep their brackets and are written as :mod:`ipaddress` writes them.
    """
    found = _AUTHORITY.match(text) if len(text) <= MAX_HOST else None
    if found is None:
        return None
    name, port = found["name"].lower().rstrip("."), found["port"]
    if name.startswith("["):
        try:
            name = f"[{ipaddress.IPv6Address(name[1:-1]).compressed}]"
        except ValueError:
            return None
    if port is not None and int(port) > 65535:
        return None
    return name, None if port is None else int(port)


def _pattern(entry: str) -> tuple[str, int | None]:
    """One ``allowed_hosts`` entry; ValueError names it when it is none."""
    wild = entry.startswith("*.")
    parsed = split_host(entry[2:] if wild else entry) if entry != "*" else ("*", None)
    if parsed is None or parsed[0] == "":
        raise ValueError(f"allowed_hosts: {entry!r} is not a host[:port] pattern")
    name, port = parsed
    return (f"*.{name}" if wild else name), port


def _address(name: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The address ``name`` writes (an IPv4 one mapped into IPv6 as itself); None if a name."""
    try:
        found = ipaddress.ip_address(name.strip("[]"))
    except ValueError:
        return None
    mapped = found.ipv4_mapped if isinstance(found, ipaddress.IPv6Address) else None
    return mapped or found


class Hosts:
    """The hosts served (:meth:`check`) and the origin URIs are written with (:meth:`base`)."""

    __slots__ = ("_known", "_listen_name", "_patterns", "anything", "public", "public_base")

    def __init__(self, public_url: str, allowed_hosts: str, host: str) -> None:
        """``allowed_hosts``: patterns apart by commas or spaces. ValueError names a bad
        pattern or ``public_url``."""
        self._patterns = [_pattern(entry) for entry in allowed_hosts.replace(",", " ").split()]
        self.anything = ("*", None) in self._patterns
        self.public, self.public_base = "", None
        if public_url:
            scheme, name = _public(public_url)
            self.public = f"{scheme}://{name}"
            self.public_base = Base(scheme, name)
            parsed = split_host(name)  # never None: _public checked it
            self._patterns.append((parsed[0] if parsed else name, None))  # any port
        self._known: set[str] = set()  # Host values served (never those refused)
        # The configured listening host, when it is a name rather than an address.
        self._listen_name = "" if _address(host) is not None else host.lower().rstrip(".")

    @property
    def configured(self) -> bool:
        """Whether any name besides the gateway's own addresses is served."""
        return bool(self._patterns)

    def describe(self) -> str:
        """The start-up log line: which hosts requests may name."""
        if self.anything:
            return "any Host is served (allowed_hosts has *): URIs name the request's host"
        names = ", ".join(f"{n}:{p}" if p is not None else n for n, p in self._patterns)
        if self.public:
            return f"URIs name {self.public}; Host served: {names} and the gateway's addresses"
        if names:
            return f"Host served: {names} and the gateway's addresses; any other is 421"
        return (
            "Host served: the gateway's own addresses only (the address connected to, "
            "localhost on loopback); any other is 421: set public_url or allowed_hosts "
            "for the names clients use"
        )

    def check(self, request: web.BaseRequest) -> None:
        """Raise 421 unless ``request`` names a host served here (400 if none at all)."""
        host = request.host
        if host in self._known or self.anything:
            return
        parsed = split_host(host)
        if parsed is None:
            raise BadRequest(f"Host: {host[:64]!r} is not a host[:port]")
        name, port = parsed
        served, cacheable = self._matches(name, port, request)
        if not served:
            raise MisdirectedRequest(f"Host {host[:64]!r} is not served here")
        if cacheable and len(self._known) < _KNOWN_MAX:
            self._known.add(host)

    def _matches(self, name: str, port: int | None, request: web.BaseRequest) -> tuple[bool, bool]:
        """Whether the host is served, and whether that holds whatever the scheme."""
        default = DEFAULT_PORTS.get(request.scheme)
        for pattern, wanted in self._patterns:
            if pattern != name and not (pattern[0] == "*" and name.endswith(pattern[1:])):
                continue
            if wanted is None or wanted == port:
                return True, True
            if port is None and wanted == default:
                return True, False
        transport = request.transport
        local = transport.get_extra_info("sockname") if transport is not None else None
        if not isinstance(local, tuple):
            return False, False
        if (port if port is not None else default) != local[1]:
            return False, False
        here = _address(str(local[0]))
        if here is None:
            return False, False
        named = _address(name)
        if named is not None:
            ours = named == here or (here.is_loopback and named.is_loopback)
        else:
            ours = name == self._listen_name or (name == "localhost" and here.is_loopback)
        return ours, port is not None


def _public(url: str) -> tuple[str, str]:
    """``public_url``'s scheme and ``host[:port]``; ValueError says what is wrong."""
    parts = urllib.parse.urlsplit(url)
    if (
        parts.scheme not in DEFAULT_PORTS
        or split_host(parts.netloc) is None
        or parts.path not in ("", "/")
        or parts.query
        or parts.fragment
    ):
        raise ValueError(
            f"public_url {url!r} must be http(s)://host[:port], without user, path or query"
        )
    return parts.scheme, parts.netloc.lower()
