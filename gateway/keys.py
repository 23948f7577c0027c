"""Typed keys for application and request state (``web.AppKey``, never strings)."""

from __future__ import annotations

from aiohttp import web

from feeds.engine import Engine
from feeds.store import Store

from .config import Config
from .idempotency import Replies

CONFIG = web.AppKey("config", Config)
ENGINE = web.AppKey("engine", Engine)
STORE = web.AppKey("store", Store)
REPLIES = web.AppKey("replies", Replies)
