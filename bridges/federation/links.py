"""The federation link a definition asks for (its ``direction``)."""

from __future__ import annotations

from ..base import Host
from .config import FederationConfig
from .link import FederationLink
from .pull import PullLink
from .push import PushLink


def federation_link(
    config: FederationConfig, host: Host, *, configured: bool, gateway_id: str
) -> FederationLink:
    kind = PushLink if config.direction == "out" else PullLink
    return kind(config, host, configured=configured, gateway_id=gateway_id)
