"""Bridges between gateway feeds and other messaging fabrics (docs/AMQP.md).

The gateway sees :class:`Bridge` and builds them through :class:`Registry`; bridges
reach the engine only through the engine service, which the gateway hands them in a
:class:`Host`.
"""

from .amqp import AmqpBridge
from .amqp_map import Unmappable, from_amqp, to_amqp
from .base import Bridge, Counters, Host
from .config import AmqpBridgeConfig, BridgeConfig, parse
from .registry import Registry

__all__ = [
    "AmqpBridge",
    "AmqpBridgeConfig",
    "Bridge",
    "BridgeConfig",
    "Counters",
    "Host",
    "Registry",
    "Unmappable",
    "from_amqp",
    "parse",
    "to_amqp",
]
