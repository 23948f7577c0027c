"""Typed keys for application and request state (``web.AppKey``, never strings)."""

from __future__ import annotations

from aiohttp import web

from auth.clients import Clients
from auth.issuer import Issuer
from auth.limits import SecretChecks
from feeds.service import EngineService
from gateway.restms.idempotency import ReplyStore
from gateway.server.config import Config

CONFIG = web.AppKey("config", Config)
# The engine, reached only through its service (feeds/service.py, docs/ARCHITECTURE.md).
SERVICE = web.AppKey("service", EngineService)
REPLIES: web.AppKey[ReplyStore] = web.AppKey("replies")  # one node's, or shared
# The built-in authorization server's (gateway.auth.oauth), when it runs.
ISSUER = web.AppKey("oauth_issuer", Issuer)
CLIENTS: web.AppKey[Clients] = web.AppKey("oauth_clients")  # (a Protocol: no type object)
# Bounds on secret checks (the gateway's; an authorization server alone has none).
CHECKS = web.AppKey("oauth_secret_checks", SecretChecks)
