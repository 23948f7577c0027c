"""Typed keys for application and request state (``web.AppKey``, never strings)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from aiohttp import web

from feeds.engine import Engine
from feeds.store import Store

from .config import Config
from .idempotency import Replies

if TYPE_CHECKING:
    from .authn import Authenticator

CONFIG = web.AppKey("config", Config)
ENGINE = web.AppKey("engine", Engine)
STORE = web.AppKey("store", Store)
REPLIES = web.AppKey("replies", Replies)


@dataclass(frozen=True, slots=True)
class State:
    """What every request reads of its app, in one object: ``request[STATE]``.

    ``request.app`` is a chain of two properties in aiohttp and each ``app[KEY]`` a
    Python-level method, so a publish that read its app key by key paid for some twenty
    calls; the concerns around every handler (:mod:`gateway.middleware`) put this on
    the request once and the request's path reads its attributes.
    """

    config: Config
    engine: Engine
    auth: Authenticator


STATE = web.RequestKey("state", State)
