"""What the built-in authorization server says about its own tokens: RFC 7662
introspection and RFC 7009 revocation, framework-free (docs/AUTH.md, section 2).

Theory of operation. A client authenticates as it does at the token endpoint (HTTP
Basic or the ``client_id``/``client_secret`` form fields; the caller checks the secret)
and names a token: :func:`parse_token_query` turns the request into a
:class:`TokenQuery`. :class:`OwnTokens` then checks the token as a resource route would
(signature, issuer, audience, expiry: a :class:`auth.tokens.JwtVerifier` that trusts
the built-in issuer alone) and against the revocation list
(:mod:`auth.revocations`).

* **Introspection** answers ``{"active": false}`` for every token that is not an
  active one of this issuer (unknown, malformed, expired, revoked, another issuer's)
  and for a token of another client unless the asking client is registered with the
  scope :data:`INTROSPECT_SCOPE`: RFC 7662 section 2.2 lets a server answer so when the
  caller "is not allowed to introspect this particular token", and section 4 asks that
  a resource server be specifically authorized. One answer for every refusal, so the
  endpoint tells a client nothing about tokens it may not see. An active token gets the
  section 2.2 fields. Unlike the resource routes, no clock leeway: a token past its
  ``exp`` is inactive.
* **Revocation** revokes the token when it is an unexpired one of this issuer issued
  to the asking client (its ``client_id``), by recording ``<client id>:<jti>`` in the
  revocation list; then ``on_revoked`` is told, so what the token holds open is ended.
  Any other token (unknown, expired, another issuer's, another client's) is left as it
  is, and the answer is the same 200: RFC 7009 section 2.2 answers 200 for a token the
  server does not take as valid, and telling "another client's" apart from "unknown"
  would let a client probe tokens it does not hold.
* ``token_type_hint`` is read and ignored, whatever its value (RFC 7009 section 2.1 and
  RFC 7662 section 2.1 let a server ignore it): the gateway issues one kind of token
  and recognises it without a hint, so no hint is ever ``unsupported_token_type``.

Why not authlib's ``IntrospectionEndpoint`` and ``RevocationEndpoint``: both are
synchronous methods of its ``AuthorizationServer``, which would authenticate the client
(scrypt, a shared registry) on the event loop through a framework adapter; and authlib's
revocation answers another client's token with ``invalid_grant`` and an unknown hint
with ``unsupported_token_type``, which are the two answers decided against above.

Errors are the :class:`auth.issuer.OAuthError` tree; a revocation list that is too old
to judge by (several nodes, docs/AUTH.md section 16) is :class:`auth.issuer.Unavailable`,
never a guess.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .clients import Client
from .issuer import InvalidRequest, Unavailable, client_credentials, parse_form
from .revocations import RevocationList, token_entry
from .tokens import Claims, JwtVerifier, TokenError

INTROSPECT_SCOPE = "restms:introspect"  # a client that may introspect others' tokens
INACTIVE: dict[str, Any] = {"active": False}


@dataclass(frozen=True, slots=True, kw_only=True)
class TokenQuery:
    """A well-formed introspection or revocation request; the secret is not yet checked."""

    client_id: str
    client_secret: str = field(repr=False)
    token: str = field(repr=False)


def parse_token_query(content_type: str, body: bytes, authorization: str | None) -> TokenQuery:
    """Decode an introspection (RFC 7662 section 2.1) or revocation (RFC 7009 section
    2.1) request: a form with ``token`` and optionally ``token_type_hint`` (ignored),
    and one client authentication method. An :class:`auth.issuer.OAuthError` else."""
    form = parse_form(content_type, body)
    client_id, secret = client_credentials(form, authorization)
    token = form.get("token")
    if not token:
        raise InvalidRequest("token is missing")
    return TokenQuery(client_id=client_id, client_secret=secret, token=token)


class OwnTokens:
    """Introspects and revokes the tokens of the built-in issuer.

    ``verifier`` trusts that issuer alone; ``revocations`` is the list every route
    checks; ``on_revoked`` is called with each entry recorded (the gateway ends what
    the token holds open).
    """

    def __init__(
        self,
        verifier: JwtVerifier,
        audience: str,
        revocations: RevocationList,
        on_revoked: Callable[[str], object],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._verifier = verifier
        self._audience = audience
        self._revocations = revocations
        self._on_revoked = on_revoked
        self._clock = clock

    async def _claims(self, token: str) -> Claims | None:
        """The claims of a token this issuer signed and that has not expired (with the
        verifier's leeway), or None."""
        try:
            return await self._verifier.verify(token)
        except TokenError:
            return None

    async def introspect(self, client: Client, token: str) -> dict[str, Any]:
        """The RFC 7662 section 2.2 answer about ``token`` for ``client``."""
        claims = await self._claims(token)
        if claims is None or claims.expires is None or claims.expires <= self._clock():
            return INACTIVE
        if claims.client_id != client.client_id and INTROSPECT_SCOPE not in client.scopes:
            return INACTIVE
        revocations = self._revocations
        if revocations.stale():
            raise Unavailable("the revocation list cannot be read; retry later")
        issued = -math.inf if claims.issued is None else claims.issued  # none: refused
        if revocations.refuses(claims.subject, issued, claims.token_id):
            return INACTIVE
        answer: dict[str, Any] = {
            "active": True,
            "scope": " ".join(claims.scopes),
            "client_id": claims.client_id,
            "sub": claims.subject,
            "iss": claims.issuer,
            "aud": self._audience,
            "exp": int(claims.expires),
            "token_type": "Bearer",
        }
        if claims.issued is not None:
            answer["iat"] = int(claims.issued)
        if claims.token_id is not None:
            answer["jti"] = claims.token_id
        return answer

    async def revoke(self, client: Client, token: str) -> bool:
        """Revoke ``token`` if it is an unexpired one issued to ``client``; whether it
        was (the caller answers 200 either way). The revocation is recorded before this
        returns (an OSError when the list cannot be written: retry)."""
        claims = await self._claims(token)
        if claims is None or claims.client_id != client.client_id or claims.token_id is None:
            return False
        try:
            entry = token_entry(client.client_id, claims.token_id)
        except ValueError:  # a jti this issuer never makes
            return False
        await self._revocations.record(entry)
        self._on_revoked(entry)
        return True
