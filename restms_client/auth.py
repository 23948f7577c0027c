"""Credentials: OAuth 2.0 client credentials, a bearer token, HTTP Basic.

With :class:`ClientCredentials` the client's HTTP session is authlib's httpx
integration (``OAuth2Client``): it fetches a token from the gateway's token
endpoint (found in its RFC 8414 metadata unless ``token_url`` is given), keeps it,
and fetches a new one ``leeway`` seconds before it expires (the gateway issues no
refresh tokens: docs/AUTH.md §2). Secrets never appear in a ``repr``.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any

import httpx2

METADATA = "/.well-known/oauth-authorization-server"


@dataclass(frozen=True, slots=True)
class Bearer:
    """An access token given as it is (the caller renews it)."""

    token: str = field(repr=False)


@dataclass(frozen=True, slots=True)
class Basic:
    """HTTP Basic, for gateways with ``[[users]]`` (docs/AUTH.md §8)."""

    username: str
    password: str = field(repr=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class ClientCredentials:
    """An OAuth 2.0 client of the gateway's (or another) authorization server."""

    client_id: str
    client_secret: str = field(repr=False)
    scope: str | None = None
    token_url: str | None = None
    leeway: float = 60.0


Credentials = Bearer | Basic | ClientCredentials


class _BearerAuth(httpx2.Auth):
    def __init__(self, token: str) -> None:
        self._header = f"Bearer {token}"

    def auth_flow(self, request: httpx2.Request) -> Generator[httpx2.Request, httpx2.Response]:
        request.headers["Authorization"] = self._header
        yield request


def _plain_auth(credentials: Credentials | None) -> httpx2.Auth | None:
    if isinstance(credentials, Bearer):
        return _BearerAuth(credentials.token)
    if isinstance(credentials, Basic):
        return httpx2.BasicAuth(credentials.username, credentials.password)
    return None


def _oauth_kwargs(credentials: ClientCredentials) -> dict[str, Any]:
    return {
        "client_id": credentials.client_id,
        "client_secret": credentials.client_secret,
        "scope": credentials.scope,
        "grant_type": "client_credentials",
        "leeway": credentials.leeway,
    }


def sync_session(credentials: Credentials | None, **options: Any) -> httpx2.Client:
    """The HTTP session of a synchronous client with these credentials."""
    if isinstance(credentials, ClientCredentials):
        from authlib.integrations.httpx_client import OAuth2Client  # type: ignore[import-untyped]

        session: httpx2.Client = OAuth2Client(**_oauth_kwargs(credentials), **options)
        return session
    return httpx2.Client(auth=_plain_auth(credentials), **options)


def async_session(credentials: Credentials | None, **options: Any) -> httpx2.AsyncClient:
    """The HTTP session of an asyncio client with these credentials."""
    if isinstance(credentials, ClientCredentials):
        from authlib.integrations.httpx_client import AsyncOAuth2Client

        session: httpx2.AsyncClient = AsyncOAuth2Client(**_oauth_kwargs(credentials), **options)
        return session
    return httpx2.AsyncClient(auth=_plain_auth(credentials), **options)
