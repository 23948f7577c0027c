"""The OpenAPI description stays in step with the routes the gateway serves."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from openapi_spec_validator import validate

from auth.issuer import INTROSPECTION_PATH, REVOCATION_PATH, TOKEN_PATH
from auth.scopes import ACTIONS, PREFIX
from gateway.admin.bridging import IDENTITY_PATH
from gateway.auth.authn import PUBLIC, UNCHECKED_UNDER
from gateway.auth.oauth import PUBLIC_PATHS
from gateway.restms.resources import METHODS
from gateway.server.app import build_app
from gateway.server.config import Config
from gateway.server.middleware import UNROUTED
from main import open_engine

OAUTH_POSTS = (TOKEN_PATH, INTROSPECTION_PATH, REVOCATION_PATH)
SPEC = Path(__file__).resolve().parents[2] / "openapi" / "openapi.yaml"
VERBS = ("get", "put", "post", "delete", "head", "options", "patch", "trace")


def _spec() -> dict[str, Any]:
    spec: dict[str, Any] = yaml.safe_load(SPEC.read_text(encoding="utf-8"))
    return spec


def _served_paths() -> set[str]:
    """Every path template the router serves."""
    return set(_served_methods())


def _served_methods() -> dict[str, set[str]]:
    """Every path template the router serves, with its methods ("*": any)."""
    served: dict[str, set[str]] = {}
    config = Config()
    for resource in build_app(config, open_engine(config)).router.resources():
        if resource.name == UNROUTED:  # every path: the router's 404 and 405, not an API
            continue
        served.setdefault(resource.canonical, set()).update(r.method for r in resource)
    return served


def _normalise(path: str) -> str:
    return re.sub(r"\{[^}]+\}", "{}", path)


def test_every_served_route_is_described() -> None:
    described = {_normalise(p) for p in _spec()["paths"]}
    missing = {p for p in _served_paths() if _normalise(p) not in described}
    assert not missing, f"routes the OpenAPI file lacks: {sorted(missing)}"


def test_every_described_route_is_served() -> None:
    served = {_normalise(p) for p in _served_paths()}
    extra = {p for p in _spec()["paths"] if _normalise(p) not in served}
    assert not extra, f"OpenAPI paths nothing serves: {sorted(extra)}"


def test_the_description_is_valid_openapi_3_1() -> None:
    spec = _spec()
    assert spec["openapi"].startswith("3.1.")
    validate(spec)  # raises with the first error; the 3.1 schema is chosen by "openapi"


def test_every_served_method_is_described_and_nothing_more() -> None:
    """Per path, the router's methods and the description's operations are the same.

    HEAD comes with every GET in aiohttp; the description documents it inside the GET
    ("Also served for HEAD") unless it has its own operation. Catch-all routes ("*")
    answer every method themselves (405 with Allow): the RestMS test below covers them.
    """
    described = {_normalise(path): item for path, item in _spec()["paths"].items()}
    for path, methods in _served_methods().items():
        if "*" in methods:
            continue
        ops = {verb.upper() for verb in VERBS if verb in described[_normalise(path)]}
        served = set(methods)
        if "GET" in served and "HEAD" not in ops:
            served.discard("HEAD")
        assert served == ops, (path, sorted(served), sorted(ops))


def test_restms_resources_describe_every_method_the_table_answers() -> None:
    spec = _spec()["paths"]
    for path in ("/restms/domain/{name}", "/restms/feed/{name}", "/restms/resource/{hash}"):
        methods = {m.upper() for m in spec[path] if m in ("get", "put", "post", "delete", "head")}
        assert {"GET", "PUT", "POST", "DELETE", "HEAD"} <= methods, (path, methods)
    assert set(METHODS) == {"domain", "feed", "pipe", "join", "message", "content", "staged"}


def _operations(spec: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (path, verb, item[verb])
        for path, item in spec["paths"].items()
        for verb in VERBS
        if verb in item
    ]


def _refs(node: Any) -> list[str]:
    if isinstance(node, dict):
        own = [node["$ref"]] if isinstance(node.get("$ref"), str) else []
        return own + [r for value in node.values() for r in _refs(value)]
    if isinstance(node, list):
        return [r for value in node for r in _refs(value)]
    return []


def test_every_reference_resolves() -> None:
    spec = _spec()
    for ref in _refs(spec):
        assert ref.startswith("#/"), ref
        node: Any = spec
        for part in ref[2:].split("/"):
            node = node.get(part) if isinstance(node, dict) else None
            assert node is not None, f"dangling $ref {ref}"


def test_every_restms_operation_documents_authentication_and_rate_limits() -> None:
    spec = _spec()
    for path, verb, operation in _operations(spec):
        if not path.startswith("/restms/"):
            continue
        responses = operation["responses"]
        for status, name in (("401", "Unauthorized"), ("429", "TooManyRequests")):
            wanted = {"$ref": f"#/components/responses/{name}"}
            assert responses.get(status) == wanted, (path, verb, status)
    replies = spec["components"]["responses"]
    assert "WWW-Authenticate" in replies["Unauthorized"]["headers"]
    assert "WWW-Authenticate" in replies["Forbidden"]["headers"]
    assert "Retry-After" in replies["TooManyRequests"]["headers"]


def test_only_public_routes_waive_credentials() -> None:
    """The routes the middleware does not authenticate: PUBLIC, and every path under
    UNCHECKED_UNDER (the built-in issuer's endpoints, the gateway's id)."""
    spec = _spec()
    assert PUBLIC | PUBLIC_PATHS | {IDENTITY_PATH} <= set(spec["paths"])
    for path, verb, operation in _operations(spec):
        if path in PUBLIC or path.startswith(UNCHECKED_UNDER):
            assert operation.get("security") == [], (path, verb)
        else:
            assert "security" not in operation, (path, verb)  # the top-level one applies


def test_security_schemes_match_the_gateway() -> None:
    spec = _spec()
    schemes = spec["components"]["securitySchemes"]
    assert schemes["bearerToken"]["type"] == "http"
    assert schemes["bearerToken"]["scheme"] == "bearer"
    assert schemes["basicAuth"]["type"] == "http"
    assert schemes["basicAuth"]["scheme"] == "basic"
    flow = schemes["oauth2"]["flows"]["clientCredentials"]
    assert flow["tokenUrl"] == TOKEN_PATH
    assert set(flow["scopes"]) == {PREFIX + action for action in ACTIONS}
    # any scheme, or none at all (the loopback guest)
    assert sorted(spec["security"], key=str) == sorted(
        [{name: []} for name in schemes] + [{}], key=str
    )


def _resolved(spec: dict[str, Any], node: Any) -> Any:
    while isinstance(node, dict) and "$ref" in node:
        target: Any = spec
        for part in node["$ref"][2:].split("/"):
            target = target[part]
        node = target
    return node


def test_restms_documents_are_described_in_both_media_types() -> None:
    spec = _spec()
    both = {"application/restms+xml", "application/restms+json"}
    for path, verb, operation in _operations(spec):
        if not path.startswith("/restms/"):
            continue
        if "requestBody" in operation:
            body = _resolved(spec, operation["requestBody"])
            assert both <= set(body["content"]), (path, verb)
        for status, reply in operation["responses"].items():
            content = set(_resolved(spec, reply).get("content", {}))
            if status.startswith("2") and content:
                assert both <= content, (path, verb, status)


def test_every_error_is_described_as_text_plain() -> None:
    """4xx and 5xx bodies are one text/plain line, but the 400, 401, 429 and 503 of the
    token, introspection and revocation endpoints (RFC 6749 section 5.2: JSON)."""
    spec = _spec()
    for path, verb, operation in _operations(spec):
        for status, reply in operation["responses"].items():
            if status[0] not in "45":
                continue
            content = set(_resolved(spec, reply).get("content", {}))
            rfc6749 = path in OAUTH_POSTS and status in ("400", "401", "429", "503")
            expected = {"application/json"} if rfc6749 else {"text/plain"}
            assert content == expected, (path, verb, status, content)
