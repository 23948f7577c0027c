"""RestMS URI shapes (U1, U2, U4, U5).

Public resources: ``/restms/domain/{name}`` and ``/restms/feed/{name}``; everything
private: ``/restms/resource/{hash}``. URIs the server emits are absolute, built from
the configured public origin or the request's own scheme and ``Host`` (U4). URIs
clients send inside documents may be absolute or path-only and are resolved by path
alone (U5).
"""

from __future__ import annotations

from typing import Literal
from urllib.parse import quote, unquote, urlsplit

from .errors import BadRequest

PREFIX = "/restms/"
Kind = Literal["domain", "feed", "resource"]


def uri_path(uri: str) -> str:
    """The decoded path of an absolute or path-only URI (scheme, host, port ignored)."""
    try:
        parts = urlsplit(uri)
    except ValueError as exc:
        raise BadRequest(f"{uri!r} is not a URI") from exc
    return unquote(parts.path)


def split_path(path: str) -> tuple[Kind, str] | None:
    """``/restms/feed/x`` -> ``("feed", "x")``; None when not a RestMS resource path."""
    if not path.startswith(PREFIX):
        return None
    kind, sep, name = path[len(PREFIX) :].partition("/")
    if not sep or not name or "/" in name:
        return None
    if kind in ("domain", "feed", "resource"):
        return kind, name  # type: ignore[return-value]
    return None


class Base:
    """Builds absolute URIs for one request's scheme and authority (U4)."""

    __slots__ = ("root",)

    def __init__(self, scheme: str, host: str) -> None:
        self.root = f"{scheme}://{host}{PREFIX}"

    def domain(self, name: str) -> str:
        return f"{self.root}domain/{quote(name, safe='')}"

    def feed(self, name: str) -> str:
        return f"{self.root}feed/{quote(name, safe='')}"

    def resource(self, key: str) -> str:
        return f"{self.root}resource/{key}"
