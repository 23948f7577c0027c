"""Who a request acts as, before OAuth exists (issue 2's rule; issue 4 replaces it).

A request from a loopback peer acts as the built-in ``guest`` principal; so does any
request when the operator started the gateway ``--insecure``. Anything else has no
principal and must be refused with 401. Framework-free: ``gateway`` asks, then answers.
"""

from __future__ import annotations

import functools
import ipaddress

GUEST = "guest"


@functools.lru_cache(maxsize=4096)
def is_loopback(host: str | None) -> bool:
    """True for loopback addresses (``127.0.0.0/8``, ``::1``, ``[::1]``, ``localhost``)
    and for Unix socket peers (a path); False for anything else or nothing."""
    if not host:
        return False
    if host == "localhost" or host.startswith("/"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def principal_for(peer: str | None, *, insecure: bool) -> str | None:
    """The principal a request from ``peer`` acts as, or None when it has none."""
    return GUEST if insecure or is_loopback(peer) else None
