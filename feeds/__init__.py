"""The embedded engine: feeds, pipes, joins, routing and delivery. No HTTP here."""

from .config import DEFAULT_DOMAIN, DEFAULT_FEED, Counters, EngineConfig, FeedConfig
from .engine import Engine

__all__ = ["DEFAULT_DOMAIN", "DEFAULT_FEED", "Counters", "Engine", "EngineConfig", "FeedConfig"]
