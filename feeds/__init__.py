"""The engine: feeds, pipes, joins, routing and delivery. No HTTP here.

The layers above use :mod:`feeds.service` (the engine service and its values); the
embedded engine is :mod:`feeds.engine` and :mod:`feeds.embedded`. Importing this
package loads neither, so another engine implements the service without them.
"""

from .config import DEFAULT_DOMAIN, DEFAULT_FEED, Counters, EngineConfig, FeedConfig

__all__ = ["DEFAULT_DOMAIN", "DEFAULT_FEED", "Counters", "EngineConfig", "FeedConfig"]
