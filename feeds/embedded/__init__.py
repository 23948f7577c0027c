"""The embedded engine behind the engine service: state in memory, a journal in SQLite
(theory of operation in :mod:`feeds.embedded.service` and :mod:`feeds.engine`)."""

from .cursor import EmbeddedCursor
from .service import EmbeddedEngine

__all__ = ["EmbeddedCursor", "EmbeddedEngine"]
