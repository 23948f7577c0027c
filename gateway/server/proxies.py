"""Requests relayed by a trusted reverse proxy: who sent them, and how.

Behind a proxy that terminates TLS, the gateway sees the proxy's address, ``http``
and whatever host the proxy connects to. Documents carry absolute URIs and per-address
limits need the client's address, so a proxy named in ``trusted_proxies`` may say
what it saw, in the de facto headers every proxy can send::

    X-Forwarded-For: <client>, <proxy 1>, ...   (each hop appends the address it saw)
    X-Forwarded-Proto: https                    (the last value: what our proxy saw)
    X-Forwarded-Host: gateway.example.com       (the last value)

The rules (docs/OPERATIONS.md, "Behind a reverse proxy"):

* Only the *peer* decides: a request whose connection does not come from a trusted
  address has its forwarding headers ignored, as when ``trusted_proxies`` is empty
  (the default). A client can therefore never claim another address by sending them.
* The client is the right-most ``X-Forwarded-For`` address that is not itself a
  trusted proxy (the left-most when all are); what a client wrote further left is
  never believed.
* A forwarding header the trusted proxy got wrong is a 400 naming it (it is a
  misconfiguration, better seen at once than guessed around): an address that is
  not one, a scheme other than ``http`` or ``https``, a host that is not
  ``name[:port]``, or the header given twice. A host that is one must still be served
  here (``public_url``, ``allowed_hosts``: :mod:`gateway.server.hosts`), as a ``Host`` must.

A relayed request is never the loopback guest, whoever relays it
(:mod:`gateway.auth.authn` looks at the same headers). Connection limits
(``max_connections_per_ip``) count connections, which are the proxy's.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from aiohttp import web
from multidict import CIMultiDictProxy

from gateway.server.hosts import split_host
from restms.errors import BadRequest

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address

SCHEMES = frozenset(("http", "https"))
_MAX_HOPS = 32  # X-Forwarded-For entries read at most (the rest, further left, ignored)


def parse_trusted(value: str | Iterable[str]) -> tuple[Network, ...]:
    """``trusted_proxies``: addresses or networks, apart by commas or spaces
    (ValueError names the first that is neither)."""
    entries = value.replace(",", " ").split() if isinstance(value, str) else list(value)
    networks = []
    for entry in entries:
        try:
            networks.append(ipaddress.ip_network(entry, strict=False))
        except ValueError:
            raise ValueError(f"trusted_proxies: {entry!r} is not an address or network") from None
    return tuple(networks)


class Proxies:
    """The trusted proxies, and what a request they relay says of its client."""

    __slots__ = ("_known", "networks")

    def __init__(self, networks: tuple[Network, ...]) -> None:
        self.networks = networks
        self._known: dict[str, bool] = {}  # peer address text -> trusted (bounded)

    def trusts(self, peer: str | None) -> bool:
        if peer is None:
            return False
        found = self._known.get(peer)
        if found is None:
            found = self._trusted(_address(peer))
            if len(self._known) < 4096:
                self._known[peer] = found
        return found

    def _trusted(self, ip: Address | None) -> bool:
        if ip is None:
            return False
        v4 = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None
        return any(ip in net or (v4 is not None and v4 in net) for net in self.networks)

    def overrides(self, headers: CIMultiDictProxy[str]) -> dict[str, str]:
        """What a trusted proxy's headers change: ``remote``, ``scheme``, ``host``."""
        found: dict[str, str] = {}
        hops = _single(headers, "X-Forwarded-For")
        if hops is not None:
            addresses = []
            for text in hops.split(",")[-_MAX_HOPS:]:
                ip = _address(text.strip())
                if ip is None:
                    raise BadRequest(f"X-Forwarded-For: {text.strip()[:64]!r} is not an address")
                addresses.append(ip)
            client = next((ip for ip in reversed(addresses) if not self._trusted(ip)), None)
            found["remote"] = str(client if client is not None else addresses[0])
        proto = _single(headers, "X-Forwarded-Proto")
        if proto is not None:
            scheme = proto.split(",")[-1].strip().lower()
            if scheme not in SCHEMES:
                raise BadRequest(f"X-Forwarded-Proto: {scheme[:16]!r} is neither http nor https")
            found["scheme"] = scheme
        host = _single(headers, "X-Forwarded-Host")
        if host is not None:
            name = host.split(",")[-1].strip()
            if split_host(name) is None:
                raise BadRequest(f"X-Forwarded-Host: {name[:64]!r} is not a host[:port]")
            found["host"] = name
        return found


def _single(headers: CIMultiDictProxy[str], name: str) -> str | None:
    values = headers.getall(name, ())
    if len(values) > 1:
        raise BadRequest(f"{name} given {len(values)} times: the proxy must send it once")
    return values[0] if values else None


def _address(text: str) -> Address | None:
    if text.startswith("[") and "]" in text:  # "[::1]:port", as some proxies write it
        text = text[1 : text.index("]")]
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def relayed(request: web.Request, proxies: Proxies) -> web.Request:
    """``request`` as its client made it, when a trusted proxy relays it; else itself."""
    if not proxies.trusts(request.remote):
        return request
    found = proxies.overrides(request.headers)
    return request.clone(**found) if found else request  # type: ignore[arg-type]


PROXIES = web.AppKey("proxies", Proxies)  # absent from apps with no trusted proxies


def install(app: web.Application, trusted_proxies: str) -> None:
    """Trust the configured proxies' forwarding headers (none configured: nothing)."""
    networks = parse_trusted(trusted_proxies)
    if networks:
        app[PROXIES] = Proxies(networks)
