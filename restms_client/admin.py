"""The ``/admin`` resources (docs/ADMIN.md) as operations, without I/O.

Their bodies are plain JSON (``application/json``), not RestMS documents, so the
replies are returned as the gateway's JSON objects (``dict``), read-only by
convention. Every call needs a token with a ``restms:admin`` scope.
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Mapping, Sequence
from typing import Any

from . import codec
from .errors import ProtocolError
from .ops import USER_AGENT, Core
from .steps import Call, Op, Reply, new_id, send
from .values import Pipe

JSON = "application/json"


def _call(core: Core, method: str, path: str, body: bytes | None = None, kind: str = JSON) -> Call:
    headers = {"Accept": JSON, "User-Agent": USER_AGENT}
    if body is not None:
        headers["Content-Type"] = kind
    if method == "POST":
        headers["Idempotency-Key"] = new_id()
    return Call(method, core.url + path, headers, body)


def _json(reply: Reply) -> dict[str, Any]:
    try:
        value = json.loads(reply.content)
    except ValueError as exc:
        raise ProtocolError(f"the admin reply is not JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise ProtocolError("the admin reply is not a JSON object")
    return value


def _quote(name: str) -> str:
    return urllib.parse.quote(name, safe="")


def _do(core: Core, method: str, path: str, body: object = None) -> Op[dict[str, Any]]:
    payload = None if body is None else json.dumps(body).encode()
    reply = yield from send(_call(core, method, path, payload), core.retry)
    return _json(reply)


def bridges(core: Core, /) -> Op[list[dict[str, Any]]]:
    """Every bridge you administer, with its status."""
    reply = yield from _do(core, "GET", "/admin/bridges")
    return list(reply.get("bridges", []))


def bridge(core: Core, /, name: str) -> Op[dict[str, Any]]:
    """One bridge's status."""
    return (yield from _do(core, "GET", f"/admin/bridges/{_quote(name)}"))


def add_bridge(core: Core, /, definition: Mapping[str, Any]) -> Op[dict[str, Any]]:
    """Create and start a bridge from its definition (``BridgeDefinition``)."""
    return (yield from _do(core, "POST", "/admin/bridges", dict(definition)))


def delete_bridge(core: Core, /, name: str, *, discard: bool = False) -> Op[dict[str, Any]]:
    """Stop and forget a run-time bridge (``discard``: drop what waits to be sent)."""
    query = "?discard=true" if discard else ""
    return (yield from _do(core, "DELETE", f"/admin/bridges/{_quote(name)}{query}"))


def pipes(core: Core, /) -> Op[list[dict[str, Any]]]:
    """Every pipe you administer, summarised."""
    reply = yield from _do(core, "GET", "/admin/pipes")
    return list(reply.get("pipes", []))


def inspect_pipe(core: Core, /, name: str) -> Op[dict[str, Any]]:
    """One pipe: its settings and joins."""
    return (yield from _do(core, "GET", f"/admin/pipes/{_quote(name)}"))


def purge_pipe(core: Core, /, name: str) -> Op[dict[str, Any]]:
    """Drop every message waiting in a pipe."""
    return (yield from _do(core, "DELETE", f"/admin/pipes/{_quote(name)}/messages"))


def delete_pipe(core: Core, /, name: str) -> Op[dict[str, Any]]:
    """Delete a pipe, whoever owns it, with its joins and messages."""
    return (yield from _do(core, "DELETE", f"/admin/pipes/{_quote(name)}"))


def create_pipe(
    core: Core,
    /,
    owner: str,
    *,
    type: str = "",
    title: str | None = None,
    domain: str = "default",
    **settings: object,
) -> Op[Pipe]:
    """Provision a pipe for principal ``owner``; give its ``href`` (or ``name``) to
    the owner, whose pipe it is."""
    query = urllib.parse.urlencode({"owner": owner, "domain": domain})
    tree = codec.pipe_tree(type=type, title=title, settings=settings)
    body = codec.encode(tree, codec.JSON)
    call = _call(core, "POST", f"/admin/pipes?{query}", body, codec.JSON)
    reply = yield from send(call, core.retry)
    location = reply.headers.get("location")
    if not location:
        raise ProtocolError("the gateway gave no Location for the pipe")
    document = codec.decode(reply.content, reply.headers.get("content-type", codec.JSON))
    return codec.read_pipe(document, location)


def clients(core: Core, /) -> Op[list[dict[str, Any]]]:
    """The built-in issuer's clients: ids and scopes, never secrets."""
    reply = yield from _do(core, "GET", "/admin/clients")
    return list(reply.get("clients", []))


def add_client(core: Core, /, client_id: str, scopes: Sequence[str]) -> Op[dict[str, Any]]:
    """Add a client; the reply holds its ``client_secret``, shown this once."""
    body = {"client_id": client_id, "scopes": list(scopes)}
    return (yield from _do(core, "POST", "/admin/clients", body))


def revoke_client(core: Core, /, client_id: str) -> Op[dict[str, Any]]:
    """Remove a client and refuse the tokens it holds."""
    return (yield from _do(core, "DELETE", f"/admin/clients/{_quote(client_id)}"))


def stats(core: Core, /) -> Op[dict[str, Any]]:
    """What the gateway counts now and since it started."""
    return (yield from _do(core, "GET", "/admin/stats"))
