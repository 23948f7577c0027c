"""The authentication state a gateway starts with (docs/AUTH.md): the built-in
issuer's signing key, clients and revocation list (this node's, in its data directory,
or those every node shares), the trusted issuers' keys, the introspection client, and
the watch on revocations others write. :func:`auth_context` sets them on the app's
:class:`~gateway.auth.authn.Authenticator` at start and stops what it started."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import urllib.parse
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from joserfc.jwk import ECKey

from auth import ACTIONS, cluster
from auth.clients import CLIENTS_FILE, Clients, ClientStore, FileClients
from auth.issuer import KEY_FILE, Issuer, SigningKey
from auth.revocations import REVOKED_FILE, RevocationList, Revocations
from auth.token_endpoints import OwnTokens
from auth.tokens import Introspector, JwtVerifier, TrustedIssuer, Verifier
from gateway.auth.authn import AUTH, Authenticator
from gateway.auth.oauth import OWN_TOKENS
from gateway.server.bodies import read_at_most
from gateway.server.config import Config
from gateway.server.keys import CHECKS, CLIENTS, CONFIG, ISSUER

log = logging.getLogger(__name__)

FETCH_LIMIT = 1024 * 1024  # bytes of a JWKS or introspection answer at most
FETCH_TIMEOUT = 5.0  # seconds for a JWKS or introspection call
REVOCATIONS_POLL = 0.5  # seconds between looks at the revocation list for others' writes


def issuer_url(config: Config) -> str:
    if config.oauth_issuer:
        return config.oauth_issuer.rstrip("/")
    if config.hosts.public:
        return config.hosts.public
    scheme = "https" if config.tls_cert else "http"
    host = f"[{config.host}]" if ":" in config.host else config.host
    return f"{scheme}://{host}:{config.port}"


def oauth_dir(config: Config) -> Path:
    return Path(config.data_dir) / "oauth"


def _read_json(path: str) -> Mapping[str, Any]:
    with open(path, encoding="utf-8") as handle:
        data = json.load(handle)
    if not isinstance(data, dict) or not isinstance(data.get("keys"), list):
        raise ValueError(f"{path} is not a JWKS document")
    return data


async def auth_context(app: web.Application) -> AsyncIterator[None]:
    """Read keys and clients (in threads), start the HTTP client for JWKS and introspection."""
    config = app[CONFIG]
    authenticator = app[AUTH]
    shared = authenticator.shared
    builtin = None
    if config.builtin_issuer:  # first: a start that fails here leaves nothing open
        builtin = await _builtin_state(config, shared)
        await builtin[2].update()  # the revocations as they stand at start
    session = aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(total=FETCH_TIMEOUT),
        headers={"User-Agent": "restms-gateway"},
    )

    async def fetch(url: str) -> bytes:
        async with session.get(url, allow_redirects=False) as reply:
            if reply.status != 200:
                raise OSError(f"{url} answered {reply.status}")
            body, more = await read_at_most(reply.content, FETCH_LIMIT)
        if more:
            raise OSError(f"{url} answered more than {FETCH_LIMIT} bytes")
        return body

    async def post(url: str, form: Mapping[str, str], basic: tuple[str, str]) -> tuple[int, bytes]:
        # RFC 6749 2.3.1: the id and secret are form-encoded before the Basic encoding.
        user, password = (urllib.parse.quote(part, safe="") for part in basic)
        headers = {"Authorization": aiohttp.encode_basic_auth(user, password)}
        async with session.post(
            url, data=dict(form), headers=headers, allow_redirects=False
        ) as reply:
            body, _ = await read_at_most(reply.content, FETCH_LIMIT)
            return reply.status, body

    trusted: list[TrustedIssuer] = []
    if builtin is not None:
        key, clients, revocations = builtin
        issuer = Issuer(
            issuer_url(config),
            config.audience,
            key,
            config.token_ttl,
            scopes=[f"restms:{action}" for action in ACTIONS],
        )
        app[ISSUER] = issuer
        app[CLIENTS] = clients
        app[CHECKS] = authenticator.secret_checks
        authenticator.revocations, authenticator.builtin = revocations, issuer.issuer
        own = TrustedIssuer(issuer=issuer.issuer, audience=config.audience, keys=key.public_jwks())
        trusted.append(own)
        authenticator.prefixes[issuer.issuer] = ""
        # Introspection and revocation (/oauth/introspect, /oauth/revoke) judge the
        # issuer's own tokens only: a verifier that trusts no other issuer.
        app[OWN_TOKENS] = OwnTokens(
            JwtVerifier([own], fetch, leeway=config.token_leeway),
            config.audience,
            revocations,
            authenticator.end_revoked,
        )
    for entry in config.issuers:
        keys = await asyncio.to_thread(_read_json, entry.jwks_file) if entry.jwks_file else None
        trusted.append(
            TrustedIssuer(
                issuer=entry.issuer,
                audience=entry.audience or config.audience,
                jwks_url=entry.jwks_url or None,
                keys=keys,
                algorithms=entry.algorithms,
            )
        )
        authenticator.prefixes[entry.issuer] = entry.principal_prefix
    jwt = (
        JwtVerifier(
            trusted, fetch, leeway=config.token_leeway, refresh_interval=config.jwks_refresh
        )
        if trusted
        else None
    )
    introspector = (
        Introspector(
            config.introspection_url,
            config.introspection_client_id,
            config.introspection_client_secret,
            post,
        )
        if config.introspection_url
        else None
    )
    if jwt is not None or introspector is not None:
        authenticator.verifier = Verifier(jwt, introspector, cache_size=config.token_cache)
    watcher = None
    revoked = authenticator.revocations
    # Others write the list: other nodes, or the CLI on this data directory (a file).
    if revoked is not None and (shared is not None or config.store != "memory"):
        watcher = asyncio.create_task(watch_revocations(authenticator, revoked), name="revocations")
    try:
        yield
    finally:
        if watcher is not None:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
        await session.close()


async def _builtin_state(
    config: Config, shared: cluster.Shared | None
) -> tuple[SigningKey, Clients, RevocationList]:
    """The built-in issuer's signing key, clients and revocation list: those every node
    shares, or this node's (in its data directory; in memory for ``store = "memory"``)."""
    keep = config.token_ttl + config.token_leeway
    if shared is not None:
        key = await cluster.signing_key(shared)
        clients = cluster.RedisClients(shared, config.clients)
        return key, clients, cluster.RedisRevocations(shared, keep)
    directory = oauth_dir(config)
    if config.store == "memory":  # nothing on disk: tokens end with the process
        key = SigningKey(await asyncio.to_thread(ECKey.generate_key, "P-256", private=True))
    else:
        key = await asyncio.to_thread(SigningKey.load_or_create, directory / KEY_FILE.name)
    store = FileClients(ClientStore(directory / CLIENTS_FILE.name, config.clients))
    revoked_file = None if config.store == "memory" else directory / REVOKED_FILE.name
    return key, store, Revocations(revoked_file, keep)


async def watch_revocations(authenticator: Authenticator, revocations: RevocationList) -> None:
    """Learn of revocations written by others (``main.py client revoke``, another
    process on this data directory, another node): the list is looked at every
    :data:`REVOCATIONS_POLL` seconds (a file: in a thread, a stat, and a read when it
    changed) and what holds a newly refused token is ended."""
    failing = False
    while True:
        await asyncio.sleep(REVOCATIONS_POLL)
        try:
            revoked = await revocations.update()
        except (OSError, ValueError) as exc:  # what was read before stays in force
            if not failing:  # once a streak, not twice a second
                log.warning("revocation list not read: %s", exc)
            failing = True
            continue
        if failing:
            log.info("revocation list read again")
            failing = False
        for entry in revoked:  # a client, or one token of it
            authenticator.end_revoked(entry)
