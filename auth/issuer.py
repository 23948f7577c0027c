"""The built-in OAuth 2.0 authorization server's logic: client-credentials grant only.

Theory of operation. A client sends ``POST /oauth/token`` with
``grant_type=client_credentials``, its id and secret (HTTP Basic or form fields, RFC
6749 section 2.3.1) and optionally a ``scope``. :func:`parse_token_request` turns the
request's content type, body and ``Authorization`` header into a
:class:`TokenRequest` or an :class:`OAuthError`; the caller authenticates the client
(:meth:`auth.clients.ClientStore.authenticate`, in a thread) and :meth:`Issuer.token`
signs an access token: an RFC 9068 JWT (header ``typ: at+jwt``, ES256, ``kid`` = the
key's RFC 7638 thumbprint) carrying ``iss sub client_id aud iat nbf exp jti scope``.
Verifiers fetch the public key from the JWKS document (:meth:`Issuer.jwks`) named by
the RFC 8414 metadata (:meth:`Issuer.metadata`). Scopes are opaque strings here: a
request may narrow a client's scopes, never widen them. Nothing here does network
I/O; only :meth:`SigningKey.load_or_create` touches the disk.

Why hand-written rather than authlib's ``AuthorizationServer`` and grant classes:
those are built around a framework adapter (request wrappers, hooks, a client model,
token generators) and would put more glue than logic in this module for one grant
type, and authlib ships no type information for a strictly typed layer. Its RFC 8414
``AuthorizationServerMetadata`` validates :meth:`Issuer.metadata` in the tests. JOSE is
joserfc (authlib's own ``authlib.jose`` is deprecated in its favour).

The introspection and revocation endpoints (:mod:`auth.token_endpoints`) take the
same form and the same client authentication (:func:`parse_form`,
:func:`client_credentials`).

Errors, all mapped to an RFC 6749 section 5.2 JSON reply by ``gateway.auth.oauth``::

    OAuthError                   error code, description, HTTP status
     +-- InvalidRequest          400 invalid_request (malformed, repeated, mixed auth)
     +-- InvalidClient           401 invalid_client (unknown, wrong secret, none given)
     +-- UnsupportedGrantType    400 unsupported_grant_type
     +-- InvalidScope            400 invalid_scope (not a scope-token, not the client's)
     +-- TooManyChecks           429 temporarily_unavailable (past a secret-check bound)
     +-- Unavailable             503 temporarily_unavailable (shared state not answering)
"""

from __future__ import annotations

import base64
import logging
import os
import re
import secrets
import stat
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import parse_qsl, unquote_plus, urlsplit

from joserfc import jwt
from joserfc.errors import JoseError
from joserfc.jwk import ECKey

from .clients import Client, check_scope_token, write_private

log = logging.getLogger(__name__)

KEY_FILE = Path("oauth", "signing-key.pem")  # relative to the data directory
ALGORITHM = "ES256"
TOKEN_PATH = "/oauth/token"  # noqa: S105 (a path, not a password)
JWKS_PATH = "/.well-known/jwks.json"
METADATA_PATH = "/.well-known/oauth-authorization-server"
INTROSPECTION_PATH = "/oauth/introspect"  # RFC 7662
REVOCATION_PATH = "/oauth/revoke"  # RFC 7009
# RFC 6749 section 2.3.1, at the token, introspection and revocation endpoints alike
CLIENT_AUTH_METHODS = ("client_secret_basic", "client_secret_post")
FORM_TYPE = "application/x-www-form-urlencoded"
MAX_FORM = 8 * 1024  # bytes of token request body; a real one is a few hundred
_NOT_IN_DESCRIPTION = re.compile(r"[^\x20\x21\x23-\x5b\x5d-\x7e]")


class OAuthError(Exception):
    """A token request refused, with its RFC 6749 section 5.2 ``error`` code."""

    error: ClassVar[str] = "invalid_request"
    status: ClassVar[int] = 400

    def __init__(self, description: str) -> None:
        # RFC 6749 section 5.2 allows only printable ASCII but '"' and '\\' here, and a
        # description may quote what the client sent.
        description = _NOT_IN_DESCRIPTION.sub("?", description)
        super().__init__(f"{self.error}: {description}")
        self.description = description


class InvalidRequest(OAuthError):
    error = "invalid_request"


class InvalidClient(OAuthError):
    error = "invalid_client"
    status = 401


class UnsupportedGrantType(OAuthError):
    error = "unsupported_grant_type"


class InvalidScope(OAuthError):
    error = "invalid_scope"


class TooManyChecks(OAuthError):
    """Past a bound on secret checks (per client address or per account): 429 with
    ``Retry-After``. RFC 6749 has no code of its own for it; ``temporarily_unavailable``
    (its section 4.1.2.1) says to try again later, which is what the client should do."""

    error = "temporarily_unavailable"
    status = 429

    def __init__(self, description: str, retry_after: int) -> None:
        super().__init__(description)
        self.retry_after = retry_after


class Unavailable(OAuthError):
    """The client registry, the bounds or the revocation list did not answer: RFC 6749
    section 4.1.2.1's code for "try again later", with the gateway's 503."""

    error = "temporarily_unavailable"
    status = 503


@dataclass(frozen=True, slots=True, kw_only=True)
class TokenRequest:
    """A well-formed client-credentials token request; the secret is not yet checked."""

    client_id: str
    client_secret: str = field(repr=False)
    scope: str | None


def parse_token_request(content_type: str, body: bytes, authorization: str | None) -> TokenRequest:
    """Decode a token endpoint request (RFC 6749 sections 2.3.1, 3.2, 4.4.2).

    ``content_type`` is the media type without parameters. Raises an
    :class:`OAuthError` subclass for anything but a well-formed client-credentials
    request with exactly one client authentication method.
    """
    form = parse_form(content_type, body)
    grant_type = form.get("grant_type")
    if not grant_type:
        raise InvalidRequest("grant_type is missing")
    if grant_type != "client_credentials":
        raise UnsupportedGrantType("only the client_credentials grant is supported")
    client_id, secret = client_credentials(form, authorization)
    return TokenRequest(client_id=client_id, client_secret=secret, scope=form.get("scope") or None)


def parse_form(content_type: str, body: bytes) -> dict[str, str]:
    """The parameters of a form body (``content_type`` without parameters); an
    :class:`InvalidRequest` for another media type, a body over :data:`MAX_FORM`
    bytes, one that does not decode, or a parameter given twice (RFC 6749 section 3.2)."""
    if content_type.lower() != FORM_TYPE:
        raise InvalidRequest(f"the request body must be {FORM_TYPE}")
    if len(body) > MAX_FORM:
        raise InvalidRequest(f"the request body is larger than {MAX_FORM} bytes")
    try:
        pairs = parse_qsl(
            body.decode("utf-8"),
            keep_blank_values=True,
            strict_parsing=bool(body),
            errors="strict",
        )
    except (UnicodeDecodeError, ValueError) as exc:
        raise InvalidRequest("the request body is not a valid form") from exc
    form: dict[str, str] = {}
    for name, value in pairs:
        if name in form:
            raise InvalidRequest(f"parameter {name!r} appears more than once")
        form[name] = value
    return form


def client_credentials(form: dict[str, str], authorization: str | None) -> tuple[str, str]:
    """The client id and secret sent with HTTP Basic (``authorization``) or as the form
    fields ``client_id`` and ``client_secret`` (RFC 6749 section 2.3.1), unchecked; an
    :class:`OAuthError` when there are none, or both ways are used."""
    body_id, body_secret = form.get("client_id"), form.get("client_secret")
    if authorization is not None:
        client_id, secret = _basic_credentials(authorization)
        if body_secret is not None or (body_id is not None and body_id != client_id):
            raise InvalidRequest("use one client authentication method, not two")
        return client_id, secret
    if body_id is None:
        raise InvalidClient("client authentication is required")
    if body_secret is None:
        raise InvalidClient("client_secret is missing")
    return body_id, body_secret


def _basic_credentials(authorization: str) -> tuple[str, str]:
    scheme, _, credentials = authorization.strip().partition(" ")
    if scheme.lower() != "basic":
        raise InvalidClient(f"{scheme or 'that'} authentication is not supported here")
    try:
        decoded = base64.b64decode(credentials.strip(), validate=True).decode("utf-8")
    except ValueError as exc:  # bad base64, non-ASCII characters, bytes not UTF-8
        raise InvalidClient("malformed Basic credentials") from exc
    user, colon, password = decoded.partition(":")
    if not colon:
        raise InvalidClient("malformed Basic credentials")
    # RFC 6749 section 2.3.1: id and secret are form-urlencoded before Basic encoding.
    return unquote_plus(user), unquote_plus(password)


class SigningKey:
    """The EC P-256 key that signs access tokens (ES256), known by its thumbprint."""

    def __init__(self, key: ECKey) -> None:
        if not key.is_private or key.curve_name != "P-256":
            raise ValueError("the signing key must be a private EC P-256 key")
        self._key = key
        self.kid = key.thumbprint()  # RFC 7638, SHA-256

    @classmethod
    def load_or_create(cls, path: Path) -> SigningKey:
        """The key in the PEM file ``path``, made (0600, in a 0700 directory) if absent.

        Blocking file I/O: from an event loop, call it in a thread. Two processes
        starting at once end up with the same key: the file is created only if absent.
        """
        path = Path(path)
        if not path.exists():
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fresh = ECKey.generate_key("P-256", private=True)
            if write_private(path, fresh.as_pem(private=True), replace=False):
                log.info("generated a new token signing key in %s", path)
        mode = stat.S_IMODE(os.stat(path).st_mode)
        if mode & 0o077:
            log.warning("the signing key %s is readable by others (mode %o)", path, mode)
        try:
            key = ECKey.import_key(path.read_bytes())
        except (ValueError, JoseError) as exc:
            raise ValueError(f"{path} does not hold an EC private key: {exc}") from exc
        return cls(key)

    def public_jwks(self) -> dict[str, Any]:
        """The JWK Set of the public key: no private member, with kid, alg and use."""
        public = self._key.as_dict(private=False)
        return {"keys": [{**public, "kid": self.kid, "alg": ALGORITHM, "use": "sig"}]}

    def sign(self, claims: dict[str, Any], *, typ: str) -> str:
        """A compact JWS of ``claims`` signed with this key."""
        header = {"alg": ALGORITHM, "typ": typ, "kid": self.kid}
        return jwt.encode(header, claims, self._key, algorithms=[ALGORITHM])


class Issuer:
    """Issues access tokens for authenticated clients and describes itself.

    ``issuer`` is the ``iss`` of every token and the base of the endpoint URLs: an
    http(s) URL without query, fragment or trailing slash. ``scopes`` are the scope
    values advertised in the metadata (RFC 8414 lets a server leave some out).
    """

    def __init__(
        self,
        issuer: str,
        audience: str,
        key: SigningKey,
        ttl: float,
        clock: Callable[[], float] = time.time,
        *,
        scopes: Sequence[str] = (),
    ) -> None:
        parts = urlsplit(issuer)
        if parts.scheme not in ("https", "http") or not parts.netloc:
            raise ValueError(f"issuer {issuer!r} must be an http(s) URL")
        if parts.query or parts.fragment or issuer.endswith(("/", "?", "#")):
            raise ValueError(f"issuer {issuer!r} must have no query, fragment or final /")
        if not audience:
            raise ValueError("audience must not be empty")
        if ttl < 1:
            raise ValueError("ttl must be at least one second")
        self.issuer = issuer
        self.audience = audience
        self.key = key
        self.ttl = int(ttl)
        self.clock = clock
        self.scopes = tuple(check_scope_token(s) for s in scopes)

    def token(self, client: Client, requested_scope: str | None) -> dict[str, Any]:
        """The RFC 6749 section 5.1 reply granting ``client`` a bearer token.

        ``requested_scope`` (space-separated) must name only scopes of the client,
        else :class:`InvalidScope`; None or "" grants all of the client's scopes.
        """
        granted = self._grant(client, requested_scope)
        now = int(self.clock())
        scope = " ".join(granted)
        claims = {
            "iss": self.issuer,
            "sub": client.client_id,
            "client_id": client.client_id,
            "aud": self.audience,
            "iat": now,
            "nbf": now,
            "exp": now + self.ttl,
            "jti": secrets.token_urlsafe(16),
            "scope": scope,
        }
        return {
            "access_token": self.key.sign(claims, typ="at+jwt"),
            "token_type": "Bearer",
            "expires_in": self.ttl,
            "scope": scope,
        }

    @staticmethod
    def _grant(client: Client, requested: str | None) -> tuple[str, ...]:
        if not requested:
            return client.scopes
        # RFC 6749 section 3.3: scope = scope-token *( SP scope-token )
        tokens = requested.split(" ")
        try:
            for token in tokens:
                check_scope_token(token)
        except ValueError as exc:
            raise InvalidScope("scope must be scope-tokens separated by single spaces") from exc
        unknown = [t for t in tokens if t not in client.scopes]
        if unknown:
            raise InvalidScope(f"scope not granted to this client: {' '.join(unknown)}")
        return tuple(dict.fromkeys(tokens))

    def jwks(self) -> dict[str, Any]:
        """The JWK Set document served at :data:`JWKS_PATH`."""
        return self.key.public_jwks()

    def metadata(self) -> dict[str, Any]:
        """The RFC 8414 authorization server metadata served at :data:`METADATA_PATH`.

        ``response_types_supported`` is required and empty: there is no authorization
        endpoint. ``grant_types_supported`` must be given, as its default
        (authorization_code, implicit) is wrong here. The introspection (RFC 7662) and
        revocation (RFC 7009) endpoints authenticate clients as the token endpoint does.
        """
        methods = list(CLIENT_AUTH_METHODS)
        document: dict[str, Any] = {
            "issuer": self.issuer,
            "token_endpoint": self.issuer + TOKEN_PATH,
            "jwks_uri": self.issuer + JWKS_PATH,
            "grant_types_supported": ["client_credentials"],
            "token_endpoint_auth_methods_supported": methods,
            "response_types_supported": [],
            "introspection_endpoint": self.issuer + INTROSPECTION_PATH,
            "introspection_endpoint_auth_methods_supported": methods,
            "revocation_endpoint": self.issuer + REVOCATION_PATH,
            "revocation_endpoint_auth_methods_supported": methods,
        }
        if self.scopes:
            document["scopes_supported"] = list(self.scopes)
        return document
