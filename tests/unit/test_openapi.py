"""The OpenAPI description stays in step with the routes the gateway serves."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from gateway.app import build_app
from gateway.config import Config
from gateway.resources import METHODS

SPEC = Path(__file__).resolve().parents[2] / "openapi" / "openapi.yaml"


def _spec() -> dict:  # type: ignore[type-arg]
    return yaml.safe_load(SPEC.read_text(encoding="utf-8"))


def _served_paths() -> set[str]:
    """Every path template the router serves."""
    paths = set()
    for resource in build_app(Config()).router.resources():
        paths.add(resource.canonical)
    return paths


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


def test_restms_resources_describe_every_method_the_table_answers() -> None:
    spec = _spec()["paths"]
    for path in ("/restms/domain/{name}", "/restms/feed/{name}", "/restms/resource/{hash}"):
        methods = {m.upper() for m in spec[path] if m in ("get", "put", "post", "delete", "head")}
        assert {"GET", "PUT", "POST", "DELETE", "HEAD"} <= methods, (path, methods)
    assert set(METHODS) == {"domain", "feed", "pipe", "join", "message", "content", "staged"}
