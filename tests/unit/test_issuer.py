"""The built-in authorization server's logic: keys, tokens, scopes, metadata, requests."""

from __future__ import annotations

import base64
import hashlib
import json
import stat
from pathlib import Path
from typing import Any

import pytest
from authlib.oauth2.rfc8414 import AuthorizationServerMetadata
from joserfc import jwt
from joserfc.errors import BadSignatureError, InvalidKeyIdError
from joserfc.jwk import ECKey, KeySet

from auth.clients import Client
from auth.issuer import (
    InvalidClient,
    InvalidRequest,
    InvalidScope,
    Issuer,
    OAuthError,
    SigningKey,
    TokenRequest,
    UnsupportedGrantType,
    parse_token_request,
)

NOW = 1_750_000_000.0
FORM = "application/x-www-form-urlencoded"
CLIENT = Client(
    client_id="app",
    secret_hash="unused-here",
    scopes=("restms:read", "restms:publish:feed/weather.*"),
)


@pytest.fixture
def key(tmp_path: Path) -> SigningKey:
    return SigningKey.load_or_create(tmp_path / "oauth" / "signing-key.pem")


@pytest.fixture
def issuer(key: SigningKey) -> Issuer:
    return Issuer("https://gw.example", "restms", key, 600.0, clock=lambda: NOW)


def decode(issuer: Issuer, token: str) -> jwt.Token:
    """Verify as a resource server would: with nothing but the published JWKS."""
    return jwt.decode(token, KeySet.import_key_set(issuer.jwks()), algorithms=["ES256"])


# -- the signing key ----------------------------------------------------------------


def test_key_is_created_private_and_persisted(tmp_path: Path) -> None:
    path = tmp_path / "var" / "oauth" / "signing-key.pem"
    first = SigningKey.load_or_create(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert path.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")
    again = SigningKey.load_or_create(path)
    assert again.kid == first.kid
    assert again.public_jwks() == first.public_jwks()
    assert [p.name for p in path.parent.iterdir()] == ["signing-key.pem"]  # no temp files


def test_a_file_that_is_not_an_ec_private_key_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "signing-key.pem"
    path.write_bytes(b"not a key")
    with pytest.raises(ValueError, match="EC private key"):
        SigningKey.load_or_create(path)
    path.write_bytes(ECKey.generate_key("P-256").as_pem(private=False))
    with pytest.raises(ValueError, match="private EC P-256"):
        SigningKey.load_or_create(path)
    path.write_bytes(ECKey.generate_key("P-384").as_pem(private=True))
    with pytest.raises(ValueError, match="P-256"):
        SigningKey.load_or_create(path)


def test_jwks_has_the_public_key_only_with_its_thumbprint(key: SigningKey) -> None:
    (jwk,) = key.public_jwks()["keys"]
    assert "d" not in jwk
    assert (jwk["kty"], jwk["crv"]) == ("EC", "P-256")
    assert (jwk["alg"], jwk["use"]) == ("ES256", "sig")
    # RFC 7638 section 3.2: SHA-256 of the required members, sorted, no whitespace
    required = {"crv": jwk["crv"], "kty": "EC", "x": jwk["x"], "y": jwk["y"]}
    canonical = json.dumps(required, sort_keys=True, separators=(",", ":")).encode()
    digest = hashlib.sha256(canonical).digest()
    assert jwk["kid"] == base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


# -- tokens -------------------------------------------------------------------------


def test_token_reply_and_claims(issuer: Issuer) -> None:
    reply = issuer.token(CLIENT, None)
    assert reply["token_type"] == "Bearer"
    assert reply["expires_in"] == 600
    assert reply["scope"] == "restms:read restms:publish:feed/weather.*"
    token = decode(issuer, reply["access_token"])
    assert token.header["typ"] == "at+jwt"
    assert token.header["kid"] == issuer.key.kid
    claims = token.claims
    assert claims["iss"] == "https://gw.example"
    assert claims["sub"] == claims["client_id"] == "app"
    assert claims["aud"] == "restms"
    assert claims["iat"] == claims["nbf"] == int(NOW)
    assert claims["exp"] == int(NOW) + 600
    assert claims["scope"] == reply["scope"]
    assert len(claims["jti"]) >= 16
    assert issuer.token(CLIENT, None)["access_token"] != reply["access_token"]
    other = decode(issuer, issuer.token(CLIENT, None)["access_token"])
    assert other.claims["jti"] != claims["jti"]


def test_ttl_follows_the_clock(key: SigningKey) -> None:
    times = iter([100.0, 250.9])
    issuer = Issuer("https://gw.example", "restms", key, 30, clock=lambda: next(times))
    first = decode(issuer, issuer.token(CLIENT, None)["access_token"]).claims
    second = decode(issuer, issuer.token(CLIENT, None)["access_token"]).claims
    assert (first["iat"], first["exp"]) == (100, 130)
    assert (second["iat"], second["exp"]) == (250, 280)


def test_a_token_from_another_key_does_not_verify(tmp_path: Path, issuer: Issuer) -> None:
    stranger = SigningKey.load_or_create(tmp_path / "other.pem")
    forged = Issuer("https://gw.example", "restms", stranger, 60).token(CLIENT, None)
    with pytest.raises(InvalidKeyIdError):  # the JWKS has no key with that kid
        decode(issuer, forged["access_token"])
    header, payload, _ = forged["access_token"].split(".")
    _, _, signature = issuer.token(CLIENT, None)["access_token"].split(".")
    spliced = f"{header}.{payload}.{signature}"
    jwks = issuer.jwks()
    jwks["keys"][0]["kid"] = stranger.kid  # the right kid, the wrong key
    with pytest.raises(BadSignatureError):
        jwt.decode(spliced, KeySet.import_key_set(jwks), algorithms=["ES256"])


@pytest.mark.parametrize(
    ("requested", "granted"),
    [
        (None, "restms:read restms:publish:feed/weather.*"),
        ("", "restms:read restms:publish:feed/weather.*"),
        ("restms:read", "restms:read"),
        ("restms:publish:feed/weather.* restms:read", "restms:publish:feed/weather.* restms:read"),
        ("restms:read restms:read", "restms:read"),
    ],
)
def test_scope_may_narrow(issuer: Issuer, requested: str | None, granted: str) -> None:
    reply = issuer.token(CLIENT, requested)
    assert reply["scope"] == granted
    assert decode(issuer, reply["access_token"]).claims["scope"] == granted


@pytest.mark.parametrize(
    "requested",
    [
        "restms:admin",
        "restms:read restms:admin",
        "restms:publish",  # a prefix of a granted scope is another scope
        "restms:publish:feed/weather.x",  # scopes are opaque: no pattern matching here
        "restms:read  restms:read",  # two spaces
        " restms:read",
        'restms:"read"',
        "restms:read\trestms:read",
    ],
)
def test_scope_may_not_widen_or_be_malformed(issuer: Issuer, requested: str) -> None:
    with pytest.raises(InvalidScope) as caught:
        issuer.token(CLIENT, requested)
    assert (caught.value.error, caught.value.status) == ("invalid_scope", 400)


@pytest.mark.parametrize(
    "url", ["gw.example", "ftp://gw.example", "https://gw.example/", "https://gw.example?a=1"]
)
def test_issuer_must_be_a_plain_url(key: SigningKey, url: str) -> None:
    with pytest.raises(ValueError, match="issuer"):
        Issuer(url, "restms", key, 60)


# -- metadata -----------------------------------------------------------------------


def test_metadata_is_valid_rfc_8414(key: SigningKey) -> None:
    issuer = Issuer("https://gw.example/base", "restms", key, 60, scopes=["restms:read"])
    document = issuer.metadata()
    assert document["issuer"] == "https://gw.example/base"
    assert document["token_endpoint"] == "https://gw.example/base/oauth/token"
    assert document["jwks_uri"] == "https://gw.example/base/.well-known/jwks.json"
    assert document["grant_types_supported"] == ["client_credentials"]
    assert document["token_endpoint_auth_methods_supported"] == [
        "client_secret_basic",
        "client_secret_post",
    ]
    assert document["scopes_supported"] == ["restms:read"]
    assert document["introspection_endpoint"] == "https://gw.example/base/oauth/introspect"
    assert document["revocation_endpoint"] == "https://gw.example/base/oauth/revoke"
    for endpoint in ("introspection", "revocation"):  # as the token endpoint's
        assert document[f"{endpoint}_endpoint_auth_methods_supported"] == [
            "client_secret_basic",
            "client_secret_post",
        ]
    # RFC 8414 requires the member; no authorization endpoint means no response types.
    # authlib's validator reads an empty list as absent, so it checks everything else.
    assert document["response_types_supported"] == []
    checked = AuthorizationServerMetadata({**document, "response_types_supported": ["none"]})
    checked.validate()
    json.dumps(document)  # plain JSON types only


def test_metadata_leaves_scopes_out_when_none_are_advertised(issuer: Issuer) -> None:
    assert "scopes_supported" not in issuer.metadata()


# -- token requests -----------------------------------------------------------------


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_client_secret_post() -> None:
    body = b"grant_type=client_credentials&client_id=app&client_secret=s%26x&scope=restms%3Aread"
    assert parse_token_request(FORM, body, None) == TokenRequest(
        client_id="app", client_secret="s&x", scope="restms:read"
    )


def test_client_secret_basic_is_form_decoded() -> None:
    # RFC 6749 section 2.3.1: id and secret are form-urlencoded before Basic encoding
    body = b"grant_type=client_credentials"
    got = parse_token_request(FORM, body, basic("my.app", "a%2Bb+c%3Ad"))
    assert got == TokenRequest(client_id="my.app", client_secret="a+b c:d", scope=None)
    assert "a+b" not in repr(got)  # a secret stays out of logs and tracebacks
    same_id = body + b"&client_id=my.app"  # some clients repeat the id: harmless
    assert parse_token_request(FORM, same_id, basic("my.app", "pw")).client_id == "my.app"


@pytest.mark.parametrize(
    ("content_type", "body", "authorization", "error"),
    [
        ("application/json", b'{"grant_type":"client_credentials"}', None, InvalidRequest),
        ("text/plain", b"grant_type=client_credentials", None, InvalidRequest),
        (FORM, b"client_id=app&client_secret=x", None, InvalidRequest),  # no grant_type
        (FORM, b"grant_type=password&client_id=a&client_secret=x", None, UnsupportedGrantType),
        (FORM, b"grant_type=authorization_code&code=x", basic("a", "x"), UnsupportedGrantType),
        (
            FORM,
            b"grant_type=client_credentials&grant_type=client_credentials",
            None,
            InvalidRequest,
        ),
        (FORM, b"grant_type=client_credentials&client_id=a&client_id=b", None, InvalidRequest),
        (FORM, b"grant_type=client_credentials&%ff=1", None, InvalidRequest),
        (FORM, b"grant_type=client_credentials&&x", None, InvalidRequest),
        (FORM, b"grant_type=client_credentials&" + b"x" * 9000, None, InvalidRequest),
        # both methods at once, or a different id in the body
        (FORM, b"grant_type=client_credentials&client_secret=x", basic("a", "x"), InvalidRequest),
        (FORM, b"grant_type=client_credentials&client_id=b", basic("a", "x"), InvalidRequest),
        # no client authentication, or not one we take
        (FORM, b"grant_type=client_credentials", None, InvalidClient),
        (FORM, b"grant_type=client_credentials&client_id=app", None, InvalidClient),
        (FORM, b"grant_type=client_credentials", "Bearer abc", InvalidClient),
        (FORM, b"grant_type=client_credentials", "Basic !!!", InvalidClient),
        (
            FORM,
            b"grant_type=client_credentials",
            "Basic " + base64.b64encode(b"nocolon").decode(),
            InvalidClient,
        ),
    ],
)
def test_bad_token_requests(
    content_type: str, body: bytes, authorization: str | None, error: type[OAuthError]
) -> None:
    with pytest.raises(error) as caught:
        parse_token_request(content_type, body, authorization)
    assert type(caught.value) is error
    expected: dict[type[OAuthError], Any] = {
        InvalidRequest: ("invalid_request", 400),
        UnsupportedGrantType: ("unsupported_grant_type", 400),
        InvalidClient: ("invalid_client", 401),
    }
    assert (caught.value.error, caught.value.status) == expected[error]
    assert caught.value.description


def test_descriptions_keep_to_the_rfc_6749_charset() -> None:
    body = b'grant_type=client_credentials&%C3%A9"\\=1&%C3%A9"\\=2'
    with pytest.raises(InvalidRequest) as caught:
        parse_token_request(FORM, body, None)
    # the name is é, " and \, which repr doubles: four characters outside the charset
    assert caught.value.description == "parameter '????' appears more than once"
