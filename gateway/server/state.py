"""What every request reads of its app, in one object: ``request[STATE]``."""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web

from feeds.service import EngineService
from gateway.auth.authn import Authenticator
from gateway.server.config import Config


@dataclass(frozen=True, slots=True)
class State:
    """What every request reads of its app, in one object: ``request[STATE]``.

    ``request.app`` is a chain of two properties in aiohttp and each ``app[KEY]`` a
    Python-level method, so a publish that read its app key by key paid for some twenty
    calls; the concerns around every handler (:mod:`gateway.server.middleware`) put this on
    the request once and the request's path reads its attributes.
    """

    config: Config
    auth: Authenticator
    service: EngineService  # the engine (keys.SERVICE)


STATE = web.RequestKey("state", State)
