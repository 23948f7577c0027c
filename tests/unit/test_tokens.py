"""Bearer-token verification: JWTs against a JWKS we control, introspection, the cache.

The network is an in-process double: ``Jwks`` serves a key set we edit and counts its
fetches; ``Answers`` plays an RFC 7662 endpoint. Time is a ``Clock`` we move by hand.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import orjson
import pytest
from joserfc import jwt
from joserfc.errors import SecurityWarning
from joserfc.jwk import ECKey, Key, OKPKey, RSAKey
from joserfc.jws import JWSRegistry
from joserfc.registry import HeaderParameter

from auth import tokens
from auth.tokens import (
    JWKS_MAX_AGE,
    Claims,
    Introspector,
    JwtVerifier,
    TokenError,
    TrustedIssuer,
    Verifier,
)

NOW = 1_800_000_000.0
ISS = "https://id.example"
OTHER = "https://other.example"  # a second trusted issuer, RS256 only
AUD = "restms"
LEEWAY = 30.0
REFRESH = 30.0
DROP = object()  # a claim value meaning "leave this claim out"

RSA = RSAKey.generate_key(2048, parameters={"kid": "rsa-1"})
EC = ECKey.generate_key("P-256", parameters={"kid": "ec-1"})
ED = OKPKey.generate_key("Ed25519", parameters={"kid": "ed-1"})
EC_NEW = ECKey.generate_key("P-256", parameters={"kid": "ec-2"})  # published later
OTHER_RSA = RSAKey.generate_key(2048, parameters={"kid": "other-1"})
STRANGER = ECKey.generate_key("P-256", parameters={"kid": "ec-1"})  # never published


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def jose(header: Any, payload: Any, signature: bytes = b"") -> str:
    """A compact JWS put together by hand, for what joserfc would refuse to make."""
    parts = [
        orjson.dumps(part) if not isinstance(part, bytes) else part for part in (header, payload)
    ]
    return ".".join([b64(parts[0]), b64(parts[1]), b64(signature)])


def hs256(header: dict[str, Any], payload: dict[str, Any], secret: bytes) -> str:
    signing_input = f"{b64(orjson.dumps(header))}.{b64(orjson.dumps(payload))}"
    mac = hmac.new(secret, signing_input.encode(), hashlib.sha256).digest()
    return f"{signing_input}.{b64(mac)}"


def claims(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "iss": ISS,
        "aud": AUD,
        "sub": "alice",
        "exp": NOW + 300,
        "iat": NOW - 5,
        "scope": "restms:read restms:publish",
    }
    base.update(changes)
    return {name: value for name, value in base.items() if value is not DROP}


def signing(alg: str) -> JWSRegistry:
    """A registry that signs whatever header a test asks for (one critical extension known)."""
    extension = {"x-must": HeaderParameter("a made-up extension", "int")}
    return JWSRegistry(extension, algorithms=[alg], strict_check_header=False)


def sign(
    key: Key, alg: str = "ES256", header: Mapping[str, Any] | None = None, **changes: Any
) -> str:
    head = {"alg": alg, "kid": key.kid} if header is None else dict(header)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SecurityWarning)  # joserfc frowns on "EdDSA"
        return jwt.encode(head, claims(**changes), key, registry=signing(alg))


def public(*keys: Key) -> dict[str, Any]:
    return {"keys": [key.as_dict(private=False) for key in keys]}


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> float:
        return self.now


class Jwks:
    """A JWKS URL: serves ``keys`` (or fails), counts the fetches, URL by URL."""

    def __init__(self, *keys: Key) -> None:
        self.keys = list(keys)
        self.other = [OTHER_RSA]
        self.calls: list[str] = []
        self.fail = False
        self.body: bytes | None = None  # served instead of the keys when set

    async def __call__(self, url: str) -> bytes:
        self.calls.append(url)
        await asyncio.sleep(0)  # let concurrent verifications pile up behind this fetch
        if self.fail:
            raise OSError("connection refused")
        if self.body is not None:
            return self.body
        keys = self.other if url.startswith(OTHER) else self.keys
        return orjson.dumps(public(*keys))


def issuers() -> list[TrustedIssuer]:
    return [
        TrustedIssuer(issuer=ISS, audience=AUD, jwks_url=ISS + "/jwks"),
        TrustedIssuer(issuer=OTHER, audience=AUD, jwks_url=OTHER + "/jwks", algorithms=("RS256",)),
    ]


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def jwks() -> Jwks:
    return Jwks(RSA, EC, ED)


@pytest.fixture
def verifier(jwks: Jwks, clock: Clock) -> JwtVerifier:
    return JwtVerifier(issuers(), jwks, leeway=LEEWAY, refresh_interval=REFRESH, clock=clock)


async def refused(verify: Callable[[str], Any], token: str) -> TokenError:
    with pytest.raises(TokenError) as caught:
        await verify(token)
    error = caught.value
    assert error.error == "invalid_token"
    assert token[:40] not in error.description or len(token) < 12
    return error


# ---------------------------------------------------------------- accepted
@pytest.mark.parametrize(
    ("make", "scopes", "client_id"),
    [
        pytest.param(
            lambda: sign(RSA, "RS256"), ("restms:read", "restms:publish"), None, id="RS256"
        ),
        pytest.param(
            lambda: sign(EC, "ES256"), ("restms:read", "restms:publish"), None, id="ES256"
        ),
        pytest.param(
            lambda: sign(ED, "EdDSA"), ("restms:read", "restms:publish"), None, id="EdDSA"
        ),
        pytest.param(
            lambda: sign(EC, header={"alg": "ES256"}),
            ("restms:read", "restms:publish"),
            None,
            id="no kid: keys of the right type are tried",
        ),
        pytest.param(
            lambda: sign(RSA, "RS256", header={"alg": "RS256"}),
            ("restms:read", "restms:publish"),
            None,
            id="no kid, RSA",
        ),
        pytest.param(
            lambda: sign(EC, scope=DROP, scp=["a", "b", "a"]), ("a", "b"), None, id="scp list"
        ),
        pytest.param(lambda: sign(EC, scope=DROP, scp="a  b"), ("a", "b"), None, id="scp string"),
        pytest.param(lambda: sign(EC, scope=DROP), (), None, id="no scope"),
        pytest.param(
            lambda: sign(EC, aud=["elsewhere", AUD], client_id="app"),
            ("restms:read", "restms:publish"),
            "app",
            id="aud list, client_id",
        ),
        pytest.param(
            lambda: sign(EC, azp="spa"), ("restms:read", "restms:publish"), "spa", id="azp"
        ),
        pytest.param(
            lambda: sign(EC, exp=NOW - LEEWAY + 1),
            ("restms:read", "restms:publish"),
            None,
            id="expired within leeway",
        ),
        pytest.param(
            lambda: sign(EC, nbf=NOW + LEEWAY - 1, iat=NOW + LEEWAY - 1),
            ("restms:read", "restms:publish"),
            None,
            id="nbf and iat ahead within leeway",
        ),
        pytest.param(
            lambda: sign(EC, header={"alg": "ES256", "kid": "ec-1", "typ": "at+jwt", "x-note": 1}),
            ("restms:read", "restms:publish"),
            None,
            id="unknown header parameters, not critical",
        ),
    ],
)
async def test_accepted(
    verifier: JwtVerifier, make: Callable[[], str], scopes: tuple[str, ...], client_id: str | None
) -> None:
    token = make()
    got = await verifier.verify(token)
    payload = orjson.loads(base64.urlsafe_b64decode(token.split(".")[1] + "=="))
    assert got == Claims(
        subject="alice",
        issuer=ISS,
        scopes=scopes,
        expires=payload["exp"],
        client_id=client_id,
        issued=payload.get("iat"),
    )


async def test_second_issuer_uses_its_own_keys(verifier: JwtVerifier, jwks: Jwks) -> None:
    got = await verifier.verify(sign(OTHER_RSA, "RS256", iss=OTHER))
    assert got.issuer == OTHER
    assert jwks.calls == [OTHER + "/jwks"]


async def test_keys_given_directly_are_never_fetched(clock: Clock) -> None:
    async def no_fetch(url: str) -> bytes:
        raise AssertionError(url)

    given = TrustedIssuer(issuer=ISS, audience=AUD, keys=public(EC, RSA))
    verifier = JwtVerifier([given], no_fetch, clock=clock)
    assert (await verifier.verify(sign(EC))).subject == "alice"
    await refused(verifier.verify, sign(EC_NEW))  # unknown kid, nowhere to fetch it


# ---------------------------------------------------------------- refused
RSA_PEM = RSA.as_pem(private=False)
EC_PEM = EC.as_pem(private=False)
GOOD_HEAD = {"alg": "ES256", "kid": "ec-1"}


def _tampered() -> str:
    header, _, signature = sign(EC).split(".")
    return f"{header}.{b64(orjson.dumps(claims(sub='root')))}.{signature}"


REFUSED: list[Any] = [
    # algorithms
    pytest.param(lambda: jose({"alg": "none"}, claims()), "algorithm", id="alg none"),
    pytest.param(lambda: jose({"alg": "none"}, claims(), b"x"), "algorithm", id="alg none, signed"),
    pytest.param(lambda: jose({"alg": "None"}, claims()), "algorithm", id="alg None"),
    pytest.param(
        lambda: hs256({"alg": "HS256", "kid": "rsa-1"}, claims(), b"secret"),
        "algorithm",
        id="HS256",
    ),
    pytest.param(
        lambda: hs256({"alg": "HS256", "kid": "rsa-1"}, claims(), RSA_PEM),
        "algorithm",
        id="HS256 keyed with the RSA public key (confusion attack)",
    ),
    pytest.param(
        lambda: hs256({"alg": "HS256"}, claims(), EC_PEM),
        "algorithm",
        id="HS256 keyed with the EC public key, no kid",
    ),
    pytest.param(
        lambda: sign(EC, "ES256", iss=OTHER), "algorithm", id="ES256 from an RS256-only issuer"
    ),
    pytest.param(lambda: jose({"kid": "ec-1"}, claims()), "malformed", id="no alg"),
    pytest.param(lambda: jose({"alg": ["ES256"]}, claims()), "algorithm", id="alg not a string"),
    pytest.param(
        lambda: sign(EC, header={"alg": "ES256", "kid": "rsa-1"}),
        "unknown",
        id="kid of a key of another type",
    ),
    # signatures and keys
    pytest.param(lambda: sign(STRANGER), "signature", id="signed by another key, same kid"),
    pytest.param(
        lambda: sign(STRANGER, header={"alg": "ES256"}), "signature", id="another key, no kid"
    ),
    pytest.param(_tampered, "signature", id="payload changed after signing"),
    pytest.param(lambda: sign(EC)[:-4], "signature", id="signature truncated"),
    pytest.param(lambda: sign(EC).rsplit(".", 1)[0] + ".", "signature", id="signature removed"),
    pytest.param(lambda: sign(EC_NEW), "unknown", id="kid not published"),
    pytest.param(
        lambda: sign(RSA, "RS256", iss=OTHER),
        "unknown",
        id="another trusted issuer's key does not vouch for this one",
    ),
    pytest.param(
        lambda: jose({"alg": "ES256", "kid": 5}, claims(), b"x"), "header", id="kid a number"
    ),
    # issuer
    pytest.param(lambda: sign(EC, iss="https://evil.example"), "issuer", id="untrusted iss"),
    pytest.param(lambda: sign(EC, iss=ISS + "/"), "issuer", id="iss not exactly equal"),
    pytest.param(lambda: sign(EC, iss=DROP), "issuer", id="no iss"),
    pytest.param(lambda: sign(EC, iss=[ISS]), "issuer", id="iss a list"),
    # claims
    pytest.param(lambda: sign(EC, aud="someone-else"), "audience", id="wrong aud"),
    pytest.param(lambda: sign(EC, aud=["a", "b"]), "audience", id="aud list without us"),
    pytest.param(lambda: sign(EC, aud=DROP), "audience", id="no aud"),
    pytest.param(lambda: sign(EC, exp=DROP), "expiry", id="no exp"),
    pytest.param(lambda: sign(EC, exp=NOW - LEEWAY), "expired", id="expired beyond leeway"),
    pytest.param(lambda: sign(EC, exp="tomorrow"), "exp", id="exp a string"),
    pytest.param(lambda: sign(EC, exp=True), "exp", id="exp a boolean"),
    pytest.param(lambda: sign(EC, nbf=NOW + LEEWAY + 1), "not valid yet", id="nbf ahead"),
    pytest.param(lambda: sign(EC, iat=NOW + LEEWAY + 1), "future", id="iat ahead"),
    pytest.param(lambda: sign(EC, sub=DROP), "subject", id="no sub"),
    pytest.param(lambda: sign(EC, sub=""), "subject", id="empty sub"),
    pytest.param(lambda: sign(EC, scope=5), "scope", id="scope a number"),
    pytest.param(lambda: sign(EC, scope=DROP, scp=[1]), "scope", id="scp not strings"),
    # critical headers
    pytest.param(
        lambda: sign(EC, header={**GOOD_HEAD, "crit": ["x-must"], "x-must": 1}),
        "critical",
        id="crit unknown",
    ),
    pytest.param(
        lambda: jose({**GOOD_HEAD, "b64": False, "crit": ["b64"]}, {}).replace(
            ".e30.", '.{"sub":"x"}.'
        ),
        "critical",
        id="unencoded payload (RFC 7797)",
    ),
    # shapes
    pytest.param(lambda: "", "malformed", id="empty"),
    pytest.param(lambda: "garbage", "malformed", id="one part"),
    pytest.param(lambda: "a.b", "malformed", id="two parts"),
    pytest.param(lambda: sign(EC) + ".e30.e30", "malformed", id="five parts (JWE shape)"),
    pytest.param(lambda: sign(EC)[:50], "malformed", id="truncated"),
    pytest.param(lambda: "!!!.???.***", "malformed", id="not base64"),
    pytest.param(lambda: "é.é.é", "malformed", id="not ASCII"),
    pytest.param(lambda: "\ud800.a.b", "malformed", id="lone surrogate"),
    pytest.param(lambda: jose(b"not json", claims()), "malformed", id="header not JSON"),
    pytest.param(lambda: jose(b"[1]", claims()), "malformed", id="header not an object"),
    pytest.param(lambda: jose(GOOD_HEAD, b"not json"), "malformed", id="payload not JSON"),
    pytest.param(lambda: jose(GOOD_HEAD, [1, 2]), "malformed", id="payload not an object"),
    pytest.param(lambda: jose(GOOD_HEAD, b"[" * 5000), "malformed", id="payload nested deep"),
    pytest.param(lambda: jose(b"[" * 300, claims()), "malformed", id="header nested deep"),
    pytest.param(lambda: jose(GOOD_HEAD, claims(pad="x" * 9000)), "long", id="over 8 KiB"),
]


@pytest.mark.parametrize(("make", "reason"), REFUSED)
async def test_refused(verifier: JwtVerifier, make: Callable[[], str], reason: str) -> None:
    error = await refused(verifier.verify, make())
    assert reason in error.description


def test_every_refusal_says_why_without_secrets() -> None:
    assert TokenError("token has expired").error == "invalid_token"
    assert TokenError("x", "invalid_request").error == "invalid_request"
    assert str(TokenError("token has expired")) == "token has expired"


@pytest.mark.parametrize(
    "kwargs",
    [
        {"jwks_url": "https://id.example/jwks", "algorithms": ("HS256",)},
        {"jwks_url": "https://id.example/jwks", "algorithms": ("none",)},
        {"jwks_url": "https://id.example/jwks", "algorithms": ()},
        {"jwks_url": "https://id.example/jwks", "keys": {"keys": []}},
        {},
    ],
)
def test_trusted_issuer_is_validated(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=r"algorithms|exactly one"):
        TrustedIssuer(issuer=ISS, audience=AUD, **kwargs)


def test_an_issuer_is_listed_once(jwks: Jwks) -> None:
    with pytest.raises(ValueError, match="twice"):
        JwtVerifier([*issuers(), issuers()[0]], jwks)


# ---------------------------------------------------------------- keys: fetching, rotation
async def test_keys_are_fetched_lazily_once(verifier: JwtVerifier, jwks: Jwks) -> None:
    assert jwks.calls == []
    for _ in range(3):
        await verifier.verify(sign(EC))
    assert jwks.calls == [ISS + "/jwks"]


async def test_rotation_new_key_picked_up_old_key_dropped(
    verifier: JwtVerifier, jwks: Jwks, clock: Clock
) -> None:
    old = sign(EC)
    await verifier.verify(old)
    jwks.keys = [EC, EC_NEW]  # the issuer publishes its next key ...
    clock.now += REFRESH
    assert (await verifier.verify(sign(EC_NEW))).subject == "alice"  # ... first use fetches it
    assert len(jwks.calls) == 2
    jwks.keys = [EC_NEW]  # ... then retires the old one
    await verifier.verify(old)  # still known until the key set is fetched again
    clock.now += REFRESH
    await refused(verifier.verify, sign(STRANGER, header={"alg": "ES256", "kid": "ec-3"}))
    assert len(jwks.calls) == 3  # that unknown kid fetched the key set again
    assert "unknown" in (await refused(verifier.verify, old)).description


async def test_stale_key_set_is_fetched_again(
    verifier: JwtVerifier, jwks: Jwks, clock: Clock
) -> None:
    token = sign(EC, exp=NOW + 2 * JWKS_MAX_AGE)
    await verifier.verify(token)
    jwks.keys = [RSA]  # EC withdrawn: noticed only once the set is old
    clock.now += JWKS_MAX_AGE - 1
    await verifier.verify(token)
    assert len(jwks.calls) == 1
    clock.now += 1
    assert "unknown" in (await refused(verifier.verify, token)).description
    assert len(jwks.calls) == 2


async def test_unknown_kids_share_one_fetch(
    verifier: JwtVerifier, jwks: Jwks, clock: Clock
) -> None:
    await verifier.verify(sign(EC))
    clock.now += REFRESH
    unknown = [sign(STRANGER, header={"alg": "ES256", "kid": f"random-{n}"}) for n in range(50)]
    results = await asyncio.gather(*(verifier.verify(t) for t in unknown), return_exceptions=True)
    assert all(isinstance(r, TokenError) and "unknown" in r.description for r in results)
    assert len(jwks.calls) == 2


async def test_first_fetch_is_shared(verifier: JwtVerifier, jwks: Jwks) -> None:
    token = sign(RSA, "RS256")
    results = await asyncio.gather(*(verifier.verify(token) for _ in range(50)))
    assert {r.subject for r in results} == {"alice"}
    assert len(jwks.calls) == 1


async def test_unknown_kids_refetch_at_most_once_per_interval(
    verifier: JwtVerifier, jwks: Jwks, clock: Clock
) -> None:
    await verifier.verify(sign(EC))
    for step in range(10):  # an unknown kid a second for 10 s: none may fetch
        clock.now += 1
        await refused(verifier.verify, sign(STRANGER, header={"alg": "ES256", "kid": f"k{step}"}))
    assert len(jwks.calls) == 1
    clock.now += REFRESH - 10
    await refused(verifier.verify, sign(STRANGER, header={"alg": "ES256", "kid": "late"}))
    assert len(jwks.calls) == 2


async def test_a_cancelled_caller_does_not_cancel_the_fetch(
    verifier: JwtVerifier, jwks: Jwks
) -> None:
    token = sign(EC)
    first = asyncio.ensure_future(verifier.verify(token))
    second = asyncio.ensure_future(verifier.verify(token))
    await asyncio.sleep(0)
    first.cancel()
    assert (await second).subject == "alice"
    assert first.cancelled()
    assert len(jwks.calls) == 1


@pytest.mark.parametrize("failure", ["down", "not json", "not a jwks"])
async def test_fetch_failure(verifier: JwtVerifier, jwks: Jwks, clock: Clock, failure: str) -> None:
    def fail() -> None:
        jwks.fail = failure == "down"
        jwks.body = {"not json": b"<html>", "not a jwks": b'{"keys": 5}'}.get(failure)

    fail()
    assert "unavailable" in (await refused(verifier.verify, sign(EC))).description
    await refused(verifier.verify, sign(EC))
    assert len(jwks.calls) == 1  # a failing JWKS URL is not hammered either
    jwks.fail, jwks.body = False, None
    clock.now += REFRESH
    token = sign(EC, exp=NOW + 2 * JWKS_MAX_AGE)
    await verifier.verify(token)
    fail()
    clock.now += JWKS_MAX_AGE  # stale, and the refresh fails: the keys we had still serve
    assert (await verifier.verify(token)).subject == "alice"
    assert len(jwks.calls) == 3
    clock.now += REFRESH
    assert "unavailable" in (await refused(verifier.verify, sign(EC_NEW))).description


async def test_bad_entries_in_a_jwks_are_skipped(verifier: JwtVerifier, jwks: Jwks) -> None:
    entries = [
        {"kty": "oct", "k": b64(EC_PEM), "kid": "ec-1"},  # a secret: never a verification key
        {"kty": "EC", "crv": "P-256", "x": "AA", "kid": "broken"},
        {**EC.as_dict(private=False), "use": "enc"},
        "not a key",
        ED.as_dict(private=False),
    ]
    jwks.body = orjson.dumps({"keys": entries})
    await refused(verifier.verify, sign(EC))
    await refused(verifier.verify, hs256({"alg": "HS256", "kid": "ec-1"}, claims(), EC_PEM))
    assert (await verifier.verify(sign(ED, "EdDSA"))).subject == "alice"


# ---------------------------------------------------------------- introspection
class Answers:
    """An RFC 7662 endpoint: answers by token, records what it was asked."""

    def __init__(self, answers: dict[str, Any]) -> None:
        self.answers = answers
        self.asked: list[tuple[str, Mapping[str, str], tuple[str, str]]] = []
        self.status = 200
        self.fail = False

    async def __call__(
        self, url: str, form: Mapping[str, str], basic: tuple[str, str]
    ) -> tuple[int, bytes]:
        self.asked.append((url, form, basic))
        await asyncio.sleep(0)
        if self.fail:
            raise OSError("connection refused")
        answer = self.answers.get(form["token"], {"active": False})
        return self.status, answer if isinstance(answer, bytes) else orjson.dumps(answer)


URL = "https://id.example/introspect"
ACTIVE = {"active": True, "sub": "bob", "scope": "restms:read", "exp": NOW + 300, "iss": ISS}


def introspector(answers: Answers, clock: Clock) -> Introspector:
    return Introspector(URL, "gateway", "s3cret", answers, clock=clock)


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        (ACTIVE, Claims(subject="bob", issuer=ISS, scopes=("restms:read",), expires=NOW + 300)),
        (
            {"active": True, "username": "carol", "client_id": "app", "scope": "a b"},
            Claims(subject="carol", issuer="", scopes=("a", "b"), expires=None, client_id="app"),
        ),
        (
            {"active": True, "client_id": "app"},
            Claims(subject="app", issuer="", scopes=(), expires=None, client_id="app"),
        ),
    ],
)
async def test_introspection_accepts(clock: Clock, answer: Any, expected: Claims) -> None:
    answers = Answers({"opaque": answer})
    assert await introspector(answers, clock).verify("opaque") == expected
    assert answers.asked == [
        (URL, {"token": "opaque", "token_type_hint": "access_token"}, ("gateway", "s3cret"))
    ]


@pytest.mark.parametrize(
    ("answer", "status", "reason"),
    [
        ({"active": False}, 200, "not active"),
        ({**ACTIVE, "exp": NOW}, 200, "not active"),
        ({"active": "true", "sub": "bob"}, 200, "malformed"),
        ({"sub": "bob"}, 200, "malformed"),
        (b"<html>", 200, "malformed"),
        (b"[true]", 200, "malformed"),
        ({"active": True}, 200, "subject"),
        ({**ACTIVE, "exp": "soon"}, 200, "exp"),
        ({**ACTIVE, "scope": ["a", 1]}, 200, "scope"),
        (ACTIVE, 401, "failed"),
        (ACTIVE, 500, "failed"),
    ],
)
async def test_introspection_refuses(clock: Clock, answer: Any, status: int, reason: str) -> None:
    answers = Answers({"opaque": answer})
    answers.status = status
    error = await refused(introspector(answers, clock).verify, "opaque")
    assert reason in error.description


async def test_introspection_unreachable_is_not_remembered(clock: Clock) -> None:
    answers = Answers({"opaque": ACTIVE})
    answers.fail = True
    check = introspector(answers, clock)
    assert "unavailable" in (await refused(check.verify, "opaque")).description
    answers.fail = False
    assert (await check.verify("opaque")).subject == "bob"


async def test_inactive_answers_are_remembered_briefly(clock: Clock) -> None:
    answers = Answers({})
    check = introspector(answers, clock)
    for _ in range(5):
        await refused(check.verify, "garbage")
    assert len(answers.asked) == 1
    clock.now += tokens.INACTIVE_MEMORY
    await refused(check.verify, "garbage")
    assert len(answers.asked) == 2


async def test_inactive_memory_is_bounded(clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tokens, "INACTIVE_KEPT", 3)
    answers = Answers({})
    check = introspector(answers, clock)
    for name in ("a", "b", "c", "d", "a"):
        await refused(check.verify, name)
    assert len(answers.asked) == 5  # "a" was forgotten to make room for "d"


async def test_concurrent_introspections_of_one_token_share_a_call(clock: Clock) -> None:
    answers = Answers({"opaque": ACTIVE})
    check = introspector(answers, clock)
    results = await asyncio.gather(*(check.verify("opaque") for _ in range(20)))
    assert {r.subject for r in results} == {"bob"}
    assert len(answers.asked) == 1


async def test_introspection_refuses_oversized_tokens(clock: Clock) -> None:
    answers = Answers({})
    await refused(introspector(answers, clock).verify, "x" * (tokens.MAX_TOKEN + 1))
    assert answers.asked == []


# ---------------------------------------------------------------- the entry point and its cache
@pytest.fixture
def answers() -> Answers:
    return Answers({"opaque": ACTIVE, "untimed": {"active": True, "sub": "dave"}})


@pytest.fixture
def both(verifier: JwtVerifier, answers: Answers, clock: Clock) -> Verifier:
    return Verifier(verifier, introspector(answers, clock), cache_size=3, clock=clock)


async def test_cache_hit_needs_no_parsing(
    both: Verifier, jwks: Jwks, monkeypatch: pytest.MonkeyPatch
) -> None:
    token = sign(EC)
    assert both.cached(token) is None
    claims = await both.verify(token)

    def no_parsing(token: str) -> Any:
        raise AssertionError("parsed again")

    monkeypatch.setattr(tokens, "_parse", no_parsing)
    assert both.cached(token) is claims
    assert await both.verify(token) is claims
    assert len(jwks.calls) == 1


async def test_cache_forgets_at_exp(both: Verifier, clock: Clock) -> None:
    token = sign(EC, exp=NOW + 100)
    await both.verify(token)
    clock.now = NOW + 99.9
    assert both.cached(token) is not None
    clock.now = NOW + 100
    assert both.cached(token) is None  # the JWT check would still allow the leeway
    await both.verify(token)
    assert both.cached(token) is None  # and is not remembered past exp


async def test_cache_is_bounded_lru(both: Verifier) -> None:
    made = [sign(EC, sub=f"user{n}") for n in range(4)]
    for token in made[:3]:
        await both.verify(token)
    assert both.cached(made[0]) is not None  # used: now the most recent
    await both.verify(made[3])  # pushes out the least recently used: made[1]
    assert [both.cached(t) is not None for t in made] == [True, False, True, True]


async def test_introspected_tokens_are_cached(
    both: Verifier, answers: Answers, clock: Clock
) -> None:
    assert (await both.verify("opaque")).subject == "bob"
    assert (await both.verify("untimed")).subject == "dave"
    await both.verify("opaque")
    await both.verify("untimed")
    assert len(answers.asked) == 2
    clock.now += tokens.UNTIMED_MEMORY  # without exp: remembered a while, then asked again
    assert both.cached("untimed") is None
    assert both.cached("opaque") is not None
    clock.now = NOW + 300
    assert both.cached("opaque") is None


@pytest.mark.parametrize(
    ("with_jwt", "with_introspection", "token", "outcome"),
    [
        (True, True, "opaque", "bob"),
        (True, False, "opaque", "not a JWT"),
        (False, True, "opaque", "bob"),
        (False, True, "jwt", "not active"),  # a JWT shape goes to introspection if only that
        (True, True, "jwt", "alice"),
        (False, False, "jwt", "not a JWT"),
        (True, True, "x" * 9000, "too long"),
    ],
)
async def test_dispatch(
    verifier: JwtVerifier,
    answers: Answers,
    clock: Clock,
    with_jwt: bool,
    with_introspection: bool,
    token: str,
    outcome: str,
) -> None:
    check = Verifier(
        verifier if with_jwt else None,
        introspector(answers, clock) if with_introspection else None,
        clock=clock,
    )
    token = sign(EC) if token == "jwt" else token
    try:
        result = (await check.verify(token)).subject
    except TokenError as exc:
        result = exc.description
    assert outcome in result


async def test_empty_token_is_a_malformed_request(both: Verifier) -> None:
    with pytest.raises(TokenError) as caught:
        await both.verify("")
    assert caught.value.error == "invalid_request"
