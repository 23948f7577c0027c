"""The Redis Cluster engine (issue 24): any gateway node serves any pipe."""

from .service import RedisEngine

__all__ = ["RedisEngine"]
