"""The SSRF guard of webhook pipes: callbacks may only reach public addresses.

A webhook pipe makes the gateway send requests to a URL a client chose. Without a
guard, any client could make the gateway reach what only it can reach: its own
loopback services, cloud metadata endpoints, the private network behind it. So a
callback's host must resolve to public addresses only, unless the configuration
allows it (``webhook_allow``: CIDRs, addresses and host names).

The check runs twice:

* **when the pipe is created or its callback changed** (:meth:`Guard.admit`): 400
  with the reason when the host is a refused address, or resolves to one, or does not
  resolve at all;
* **at every connection** (:class:`GuardedResolver`, the resolver of the gateway's
  webhook client session, and :meth:`Guard.check_literal` for address literals, which
  aiohttp never resolves): the addresses a name resolves to *now* are filtered, so a
  name that resolved to a public address at creation and to a private one later (DNS
  rebinding) still cannot reach it.

Refused (:func:`refusal`): unspecified, loopback, link-local, multicast, private
(RFC 1918 and the like), unique-local (fc00::/7), site-local, reserved and every other
non-global range, for IPv4 and IPv6. An IPv6 address that carries an IPv4 address
(IPv4-mapped ``::ffff:a.b.c.d``, NAT64 ``64:ff9b::/96``, 6to4 ``2002::/16``, Teredo)
is judged by the IPv4 address it carries as well. Names are resolved with the loop's
``getaddrinfo``, which runs in a worker thread: the loop never blocks.

Federation links defined at run time are held to the same guard, with their own
setting (``federation_allow``; gateway/federation/session.py, docs/FEDERATION.md): a
:class:`Guard` names what it guards (``what``) and the setting that widens it.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Iterable
from urllib.parse import urlsplit

from aiohttp.abc import AbstractResolver, ResolveResult

from restms.errors import BadRequest

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

_UNIQUE_LOCAL = ipaddress.IPv6Network("fc00::/7")
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
RESOLVE_TIMEOUT = 10.0  # seconds a creation may wait for the callback's host to resolve
LITERALS = 4096  # hosts whose verdict is remembered (the policy is fixed for a run)


def carried(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address carries, if any."""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip in _NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip.teredo is not None:
        return ip.teredo[1]
    return None


def refusal(ip: Address) -> str | None:
    """Why a callback may not reach this address (None: it may)."""
    if isinstance(ip, ipaddress.IPv6Address):
        inner = carried(ip)
        if inner is not None:
            reason = refusal(inner)
            if reason is not None:
                return f"{reason} (carried in {ip})"
            if ip.ipv4_mapped is not None or ip in _NAT64:
                return None  # the IPv4 address is where it goes
    checks = (
        ("unspecified", ip.is_unspecified),
        ("loopback", ip.is_loopback),
        ("link-local", ip.is_link_local),
        ("multicast", ip.is_multicast),
        ("unique-local", isinstance(ip, ipaddress.IPv6Address) and ip in _UNIQUE_LOCAL),
        ("site-local", isinstance(ip, ipaddress.IPv6Address) and ip.is_site_local),
        ("private", ip.is_private),
        ("reserved", ip.is_reserved or not ip.is_global),
    )
    for reason, hit in checks:
        if hit:
            return reason
    return None


def parse_allow(
    entries: Iterable[str], setting: str = "webhook_allow"
) -> tuple[tuple[Network, ...], frozenset[str]]:
    """``setting``'s entries: networks and addresses, or host names (ValueError)."""
    networks: list[Network] = []
    hosts: set[str] = set()
    for entry in entries:
        try:
            networks.append(ipaddress.ip_network(entry, strict=False))
            continue
        except ValueError:
            pass
        name = entry.lower().removesuffix(".")
        labels = name.split(".")
        if not name or not all(label and label.replace("-", "").isalnum() for label in labels):
            raise ValueError(f"{setting}: {entry!r} is neither a CIDR nor a host name")
        hosts.add(name)
    return tuple(networks), frozenset(hosts)


def split_allow(value: str) -> list[str]:
    """A configured allow string (``webhook_allow``): entries apart by commas or spaces."""
    return value.replace(",", " ").split()


class RefusedAddress(OSError):
    """A connection the guard does not allow (an ``OSError``: aiohttp reports it as a
    failed connection, never as an answer of the receiver). Its ``strerror`` is the
    reason too, for clients that report a failed connection by its ``strerror``."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.strerror = reason


class Guard:
    """The policy: what is refused, and what the configuration allows anyway.

    ``what`` names the target in reasons ("the callback address is loopback"),
    ``setting`` the configuration key ``allow`` comes from."""

    def __init__(
        self, allow: Iterable[str] = (), *, what: str = "callback", setting: str = "webhook_allow"
    ) -> None:
        self.networks, self.hosts = parse_allow(allow, setting)
        self.what = what
        self._literals: dict[str, str | None] = {}  # host -> why_not, for hosts seen

    def why_not(self, ip: Address) -> str | None:
        """Why the guard refuses ``ip`` (None: allowed, by policy or by configuration)."""
        reason = refusal(ip)
        if reason is None:
            return None
        v4 = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None
        if any(ip in net or (v4 is not None and v4 in net) for net in self.networks):
            return None
        return reason

    def host_allowed(self, host: str) -> bool:
        return host.lower().removesuffix(".") in self.hosts

    def check_literal(self, host: str) -> None:
        """At connect time: an address literal host must be allowed (RefusedAddress)."""
        if host in self._literals:
            reason = self._literals[host]
        else:
            try:
                ip = ipaddress.ip_address(host.strip("[]"))
            except ValueError:
                reason = None  # a name: the resolver checks what it resolves to
            else:
                reason = self.why_not(ip)
            if len(self._literals) >= LITERALS:
                self._literals.clear()
            self._literals[host] = reason
        if reason is not None:
            raise RefusedAddress(f"the {self.what} address is {reason}")

    def kept(self, host: str, addresses: Iterable[str]) -> list[str]:
        """At connect time: the addresses ``host`` resolved to that the guard allows, in
        their order (all of them for a host the configuration names); RefusedAddress
        when none is."""
        found = list(addresses)
        if self.host_allowed(host):
            return found
        kept: list[str] = []
        reasons: list[str] = []
        for address in found:
            reason = self.why_not(ipaddress.ip_address(address))
            if reason is None:
                kept.append(address)
            else:
                reasons.append(reason)
        if not kept:
            raise RefusedAddress(
                f"the {self.what} host resolves only to refused addresses ({', '.join(reasons)})"
            )
        return kept

    async def admit(self, url: str) -> None:
        """At creation: 400 unless every address the callback's host has is allowed."""
        host = urlsplit(url).hostname or ""
        try:
            reason = await self.examine(host)
        except (OSError, TimeoutError) as exc:
            raise BadRequest(f"the callback host {host!r} does not resolve") from exc
        if reason is not None:
            raise BadRequest(f"{reason}: webhook callbacks may only reach public addresses")

    async def examine(self, host: str) -> str | None:
        """Why ``host`` may not be reached now (None: it may): an address literal the
        guard refuses, or a name with an address it refuses. ``OSError`` or
        ``TimeoutError`` when the name does not resolve within RESOLVE_TIMEOUT."""
        try:
            self.check_literal(host)
        except RefusedAddress as exc:
            return str(exc)
        try:
            ipaddress.ip_address(host)
        except ValueError:
            pass
        else:
            return None
        if self.host_allowed(host):
            return None
        async with asyncio.timeout(RESOLVE_TIMEOUT):
            infos = await asyncio.get_running_loop().getaddrinfo(
                host, None, type=socket.SOCK_STREAM
            )
        for _, _, _, _, sockaddr in infos:
            reason = self.why_not(ipaddress.ip_address(sockaddr[0]))
            if reason is not None:
                return f"the {self.what} host {host!r} resolves to a {reason} address"
        return None


class GuardedResolver(AbstractResolver):
    """A resolver that keeps only the addresses the guard allows (connect time)."""

    def __init__(self, guard: Guard, inner: AbstractResolver) -> None:
        self._guard = guard
        self._inner = inner

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        found = await self._inner.resolve(host, port, family)
        allowed = self._guard.kept(host, [result["host"] for result in found])
        return [result for result in found if result["host"] in allowed]

    async def close(self) -> None:
        await self._inner.close()
