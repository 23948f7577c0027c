"""The SSRF guard of AMQP 1.0 and ZeroMQ bridges made at run time (docs/AMQP.md and
docs/ZEROMQ.md, "Security"; gateway/admin/bridging.py).

A bridge made at run time (``POST /admin/bridges``, the admin CLI) makes the gateway
connect where its definition says. Whoever may define one (``restms:admin`` over its
feed) could otherwise have the gateway reach what only it can reach: loopback
services, the private network behind it, a cloud metadata endpoint; or open a port
on every interface; or, through ``ipc://``, replace any file the gateway may write
(libzmq removes what is at the path it binds). So such a bridge may:

* **connect** (AMQP ``urls``, ZeroMQ endpoints with ``bind = false``) only to public
  addresses, or to those ``bridge_allow`` names: the guard of webhook callbacks and
  federation links (gateway/webhooks/guard.py), its refused ranges and its syntax
  (networks, addresses, host names);
* **bind** (ZeroMQ, ``bind = true``) only on a loopback address, or on an address of
  this machine that a ``tcp://NETWORK`` entry holds (``tcp://10.0.0.5``: an entry of
  its own, so that allowing a bind on an address does not allow connecting to it); on
  every interface (``*``, ``0.0.0.0``, ``[::]``) only with the entry ``tcp://*``; never
  on an interface name (``eth0``: which address it stands for is not checked);
* use **ipc:// and inproc://** endpoints only where a ``bridge_allow`` entry of that
  scheme allows them: an entry ending in ``/`` allows every endpoint that begins with
  it (``ipc:///run/restms/``, ``inproc://``), any other that endpoint exactly. A path
  with a ``..`` segment is never allowed.

:meth:`BridgeGuard.admit` checks a definition when it is made (403 naming why; a name
that does not resolve yet is let through, as for federation links), and the bridges
ask :meth:`BridgeGuard.endpoint` and :meth:`BridgeGuard.addresses` again before each
connection (bridges.base.Reach), so a name that resolves elsewhere later, or a bridge
kept from a run under another configuration, is held to the guard of this run. The
bridges connect to the address the guard checked, never to the name: no DNS answer
comes between the check and the connection. Bridges of the configuration file are the
operator's and are not guarded.
"""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import socket
import urllib.parse
from dataclasses import dataclass

from bridges.checks import redact
from bridges.config import (
    ENDPOINT,
    TCP_ADDRESS,
    AmqpBridgeConfig,
    BridgeConfig,
    ZmqBridgeConfig,
)
from gateway.webhooks.guard import Guard, Network, RefusedAddress, split_allow
from restms.errors import Forbidden

SETTING = "bridge_allow"
WILDCARD = "tcp://*"  # the entry that lets run-time bridges bind on every interface
REACH = f"a bridge made at run time may reach only public addresses, or those {SETTING} names"
BIND = f"a bridge made at run time binds on loopback, or on what {SETTING} names"


@dataclass(frozen=True, slots=True)
class BridgeAllow:
    """``bridge_allow`` read: the guard's entries, and the endpoint entries."""

    hosts: tuple[str, ...]  # networks, addresses, host names (the guard's syntax)
    wildcard: bool  # tcp://*: binds on every interface
    binds: tuple[Network, ...]  # tcp://NETWORK: binds on its addresses of this machine
    local: tuple[str, ...]  # ipc:// and inproc:// entries


def parse_bridge_allow(value: str) -> BridgeAllow:
    """``bridge_allow``'s entries (ValueError naming the setting and the entry)."""
    hosts: list[str] = []
    local: list[str] = []
    binds: list[Network] = []
    wildcard = False
    for entry in split_allow(value):
        if entry == WILDCARD:
            wildcard = True
        elif entry.startswith(("ipc://", "inproc://")) and not _climbs(entry):
            local.append(entry)
        elif entry.startswith("tcp://") and (network := _network(entry[6:])) is not None:
            binds.append(network)
        elif "://" in entry:
            raise ValueError(
                f"{SETTING}: {entry!r} is not an endpoint entry ({WILDCARD}, "
                "tcp://NETWORK, ipc://PATH or inproc://NAME, with no '..')"
            )
        else:
            hosts.append(entry)
    Guard(hosts, setting=SETTING)  # checks the networks and names
    return BridgeAllow(tuple(hosts), wildcard, tuple(binds), tuple(local))


def _network(text: str) -> Network | None:
    try:
        return ipaddress.ip_network(text.strip("[]"), strict=False)
    except ValueError:
        return None


def _climbs(endpoint: str) -> bool:
    """Whether an ipc:// path has a ``..`` segment (it could leave an allowed folder)."""
    return ".." in endpoint.split("://", 1)[1].split("/")


class BridgeGuard:
    """The policy of one run (module docstring); one object serves every bridge, from
    the loop and from the AMQP bridges' threads."""

    def __init__(self, value: str) -> None:
        allow = parse_bridge_allow(value)
        self._guard = Guard(allow.hosts, what="peer", setting=SETTING)
        self._wildcard = allow.wildcard
        self._binds = allow.binds
        self._local = allow.local

    # ------------------------------------------------------------ bridges.base.Reach
    def endpoint(self, endpoint: str, *, bind: bool) -> str | None:
        """Why a run-time ZeroMQ bridge may not use ``endpoint`` (None: it may, or it
        connects to a host name, which :meth:`addresses` checks as it connects)."""
        matched = ENDPOINT.fullmatch(endpoint)
        if matched is None:
            return f"{endpoint!r} is not an endpoint"
        scheme, rest = matched.groups()
        if scheme != "tcp":
            if self._local_allowed(endpoint):
                return None
            return (
                f"a bridge made at run time uses {scheme}:// endpoints only where "
                f"{SETTING} allows them"
            )
        address = TCP_ADDRESS.fullmatch(rest)
        if address is None:
            return f"{endpoint!r} is not tcp://HOST:PORT"
        host = address.group(1)
        if bind:
            return self._bind(host)
        try:
            self._guard.check_literal(host)
        except RefusedAddress as exc:
            return f"{exc}: {REACH}"
        return None

    def addresses(self, host: str, port: int, family: int) -> list[str]:
        """The addresses a connection to ``host`` may go to now, in the resolver's order
        (RefusedAddress: none, saying why; another ``OSError``: ``host`` does not
        resolve). Blocking: call it from a thread."""
        bare = host.strip("[]")
        try:
            ip = ipaddress.ip_address(bare)
        except ValueError:
            pass
        else:  # (not check_literal: its memo is the loop's alone)
            reason = self._guard.why_not(ip)
            if reason is not None:
                raise RefusedAddress(f"the peer address is {reason}: {REACH}")
            return [bare]
        infos = socket.getaddrinfo(host, port, family, socket.SOCK_STREAM)
        found = list(dict.fromkeys(str(info[4][0]) for info in infos))
        try:
            return self._guard.kept(host, found)
        except RefusedAddress as exc:
            raise RefusedAddress(f"{exc}: {REACH}") from None

    # ------------------------------------------------------------ at creation
    async def admit(self, config: BridgeConfig) -> None:
        """403 when a run-time AMQP or ZeroMQ definition reaches or binds where the
        guard refuses (module docstring); after the admin check, so who may not make
        the bridge learns nothing of where names lead."""
        where = f"bridge {config.name}"
        if isinstance(config, AmqpBridgeConfig):
            for url in config.urls:
                reason = await self._examine(urllib.parse.urlsplit(url).hostname or "")
                if reason is not None:
                    raise Forbidden(f"{where}: urls: {redact(url)}: {reason}: {REACH}")
        elif isinstance(config, ZmqBridgeConfig):
            for endpoint in config.endpoints:
                reason = await self._examine_endpoint(endpoint, bind=config.bind)
                if reason is not None:
                    raise Forbidden(f"{where}: endpoints: {endpoint}: {reason}")

    async def _examine(self, host: str) -> str | None:
        try:
            return await self._guard.examine(host)
        except (OSError, TimeoutError):
            return None  # not resolvable yet: each connection is checked

    async def _examine_endpoint(self, endpoint: str, *, bind: bool) -> str | None:
        reason = self.endpoint(endpoint, bind=bind)
        if reason is not None or not endpoint.startswith("tcp://"):
            return reason
        host = endpoint.removeprefix("tcp://").rsplit(":", 1)[0].strip("[]")
        if bind:
            if host == "*" or await asyncio.to_thread(_local, host):
                return None
            return f"{host} is not an address of this machine"
        reason = await self._examine(host)
        return None if reason is None else f"{reason}: {REACH}"

    # ------------------------------------------------------------ binds
    def _bind(self, host: str) -> str | None:
        if host == "*":
            return None if self._wildcard else f"binds on every interface: {BIND} ({WILDCARD})"
        try:
            ip = ipaddress.ip_address(host.strip("[]"))
        except ValueError:
            return f"binds on the interface {host!r}: a bridge made at run time binds on an address"
        if ip.is_unspecified:
            return None if self._wildcard else f"binds on every interface: {BIND} ({WILDCARD})"
        if ip.is_loopback or any(ip in network for network in self._binds):
            return None
        return f"binds on {ip}, which is not loopback: {BIND} (tcp://{ip})"

    def _local_allowed(self, endpoint: str) -> bool:
        if _climbs(endpoint):
            return False
        return any(
            endpoint.startswith(entry) if entry.endswith("/") else endpoint == entry
            for entry in self._local
        )


def _local(host: str) -> bool:
    """Whether ``host`` (an address literal) is an address of this machine: one a
    socket may bind on."""
    ip = ipaddress.ip_address(host)
    family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((host, 0))
        except OSError as exc:  # another failure is for the bind itself to report
            return exc.errno != errno.EADDRNOTAVAIL
    return True
