"""The online admin verbs of ``python main.py``: they drive a running gateway's HTTP API.

::

    feeds    add NAME [--type T] [--title T] [--domain D] | list [--domain D] | delete NAME
    pipes    list | inspect PIPE | purge PIPE | delete PIPE
             | create --owner P [--type T] [--title T] [--domain D]
    joins    list PIPE | add PIPE FEED [--address A] [--type T] | delete JOIN
    bridges  add FILE | list | status NAME | delete NAME [--discard]
    clients  add ID --scopes "..." | list | revoke ID
    stats

Feeds and joins are RestMS resources (``application/restms+json`` documents, acting as
the token's principal: joins of its own pipes); the rest are the admin resources of
docs/ADMIN.md. Every verb takes ``--url`` (``RESTMS_URL``), a bearer token (``--token``
or ``RESTMS_TOKEN``) or a client of the built-in issuer to get one
(``--client-id``/``--client-secret`` or ``RESTMS_CLIENT_ID``/``RESTMS_CLIENT_SECRET``),
``--json``, ``--timeout`` and ``--cacert``. Tokens and secrets are never printed or
logged: error messages name the URL and the gateway's reason only.

Exit codes: 0 done; 1 the gateway refused (its ``text/plain`` reason on stderr);
2 a usage or input error; 3 the gateway could not be reached (or answered garbage).

This module runs in the CLI's process, never in the gateway: plain blocking
``urllib`` is right here, and no request is sent anywhere but ``--url``.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import ssl
import sys
import tomllib
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

DEFAULT_URL = "http://127.0.0.1:8080"
RESTMS_JSON = "application/restms+json"
MAX_REPLY = 16 * 1024 * 1024  # bytes of a reply read at most
MAX_FILE = 1024 * 1024  # bytes of a bridge definition file

VERBS = ("feeds", "pipes", "joins", "bridges", "clients", "stats")


class Failure(Exception):
    """Why a verb stopped, and the exit code to stop with."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def refused(message: str) -> Failure:
    return Failure(message, 1)


def usage(message: str) -> Failure:
    return Failure(message, 2)


def unreachable(message: str) -> Failure:
    return Failure(message, 3)


# ---------------------------------------------------------------- HTTP
class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A redirect is an error here: the token must go to ``--url`` and nowhere else."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


@dataclass
class Api:
    """One gateway, reached at ``base`` with a bearer token (got once, when first needed)."""

    base: str
    timeout: float
    token: str | None = field(default=None, repr=False)
    client: tuple[str, str] | None = field(default=None, repr=False)
    context: ssl.SSLContext | None = None

    def __post_init__(self) -> None:
        parts = urllib.parse.urlsplit(self.base)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise usage(f"--url {self.base!r} must be an http:// or https:// URL")
        self.base = self.base.rstrip("/")
        handlers: list[urllib.request.BaseHandler] = [_NoRedirects()]
        if self.context is not None:
            handlers.append(urllib.request.HTTPSHandler(context=self.context))
        self._opener = urllib.request.build_opener(*handlers)

    def send(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        *,
        auth: bool = True,
    ) -> tuple[int, Mapping[str, str], bytes]:
        """(status, headers, body) of one request; 4xx and 5xx are :class:`Failure`."""
        sent = dict(headers or {})
        if auth:
            token = self.bearer()
            if token:
                sent["Authorization"] = f"Bearer {token}"
        url = self.base + path
        # S310: the scheme is http or https, checked when the Api was made
        request = urllib.request.Request(url, data=body, headers=sent, method=method)  # noqa: S310
        try:
            with self._opener.open(request, timeout=self.timeout) as reply:
                return reply.status, reply.headers, reply.read(MAX_REPLY)
        except urllib.error.HTTPError as exc:
            reason = exc.read(4096).decode("utf-8", "replace").strip() or exc.reason
            if 300 <= exc.code < 400:
                reason = f"redirected to {exc.headers.get('Location', '?')}; not followed"
            raise refused(f"{method} {url}: {exc.code} {reason}") from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            why = getattr(exc, "reason", exc)
            raise unreachable(f"{method} {url}: {why}") from None

    def json(self, method: str, path: str, document: object = None) -> Any:
        """A JSON admin request and its parsed reply."""
        body = None if document is None else json.dumps(document).encode()
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        return self._parse(method, path, self.send(method, path, body, headers)[2])

    def restms(self, method: str, path: str, document: object = None) -> tuple[int, Any]:
        """A RestMS request with a JSON document: (status, parsed reply or None)."""
        status, _, reply = self.restms_reply(method, path, document)
        return status, reply

    def restms_reply(
        self, method: str, path: str, document: object = None
    ) -> tuple[int, Mapping[str, str], Any]:
        """:meth:`restms` with the reply's headers."""
        body = None if document is None else json.dumps({"restms": document}).encode()
        headers = {"Accept": RESTMS_JSON}
        if body is not None:
            headers["Content-Type"] = RESTMS_JSON
        status, got, data = self.send(method, path, body, headers)
        return status, got, self._parse(method, path, data) if data.strip() else None

    def _parse(self, method: str, path: str, data: bytes) -> Any:
        try:
            return json.loads(data)
        except ValueError:
            raise unreachable(f"{method} {self.base}{path}: the reply is not JSON") from None

    def bearer(self) -> str | None:
        if self.token is None and self.client is not None:
            self.token = self._fetch_token(*self.client)
        return self.token

    def _fetch_token(self, client_id: str, secret: str) -> str:
        """A client-credentials token from the gateway's built-in issuer (RFC 6749 4.4)."""
        quoted = ":".join(urllib.parse.quote(part, safe="") for part in (client_id, secret))
        headers = {
            "Authorization": "Basic " + base64.b64encode(quoted.encode()).decode(),
            "Content-Type": "application/x-www-form-urlencoded",
        }
        form = b"grant_type=client_credentials"
        try:
            _, _, data = self.send("POST", "/oauth/token", form, headers, auth=False)
        except Failure as exc:  # a refusal's reason is RFC 6749 JSON: show its description
            reason = _oauth_reason(exc) if exc.code == 1 else str(exc)
            raise Failure(f"no token for client {client_id!r}: {reason}", exc.code) from None
        token = self._parse("POST", "/oauth/token", data).get("access_token")
        if not isinstance(token, str):
            raise unreachable("the token endpoint answered without an access_token")
        return token


def _oauth_reason(exc: Failure) -> str:
    text = str(exc)
    start = text.find("{")
    try:
        reply = json.loads(text[start:]) if start >= 0 else None
    except ValueError:
        reply = None
    if isinstance(reply, dict):
        return f"{reply.get('error')}: {reply.get('error_description', '')}"
    return text


def _leaf(reference: str) -> str:
    """A pipe or join hash from a hash, a path or an absolute URI (only its path is
    used: requests go to ``--url`` whatever host a URI names)."""
    leaf = urllib.parse.urlsplit(reference).path.rstrip("/").rsplit("/", 1)[-1]
    if not leaf or leaf in (".", ".."):
        raise usage(f"{reference!r} names no resource")
    return urllib.parse.quote(leaf, safe="")


def _name(text: str) -> str:
    return urllib.parse.quote(text, safe="")


# ---------------------------------------------------------------- output
def table(rows: Sequence[Sequence[object]], header: Sequence[str]) -> str:
    """Left-aligned columns under an upper-case header; None is shown as ``-``."""
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [len(h) for h in header]
    for row in cells:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
    lines = [[h.upper() for h in header], *cells]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in lines
    )


def _cell(value: object) -> str:
    if value is None or value in ("", {}):
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list | tuple):
        return " ".join(_cell(v) for v in value) or "-"
    return str(value).replace("\n", " ")


def fields(document: Mapping[str, Any], prefix: str = "") -> str:
    """Nested JSON as ``key  value`` lines, nested keys joined with dots."""
    pairs = list(_flatten(document, prefix))
    width = max((len(k) for k, _ in pairs), default=0)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in pairs)


def _flatten(document: Mapping[str, Any], prefix: str) -> Iterable[tuple[str, str]]:
    for key, value in document.items():
        if isinstance(value, Mapping) and value:
            yield from _flatten(value, f"{prefix}{key}.")
        elif isinstance(value, list) and value and isinstance(value[0], Mapping):
            continue  # lists of objects are shown as tables by the verbs that have them
        else:
            yield prefix + key, _cell(value)


@dataclass
class Out:
    """What a verb prints: the JSON value for ``--json``, else the text."""

    value: object
    text: str


# ---------------------------------------------------------------- feeds
def _feeds(api: Api, args: argparse.Namespace) -> Out:
    if args.action == "delete":
        path = f"/restms/feed/{_name(args.name)}"
        api.restms("GET", path)  # DELETE of what is not there is 200 (R4): say so instead
        api.restms("DELETE", path)
        return Out({"deleted": args.name}, f"deleted feed {args.name}")
    domain = f"/restms/domain/{_name(args.domain)}"
    if args.action == "list":
        _, reply = api.restms("GET", domain)
        found = _children(reply, "domain")
        items = _children(found[0] if found else {}, "feed")
        feeds = [
            {"name": f.get("name"), "type": f.get("type", ""), "title": f.get("title", "")}
            | {"uri": f.get("href")}
            for f in items
        ]
        rows = [(f["name"], f["type"] or "(default)", f["title"]) for f in feeds]
        return Out(feeds, table(rows, ("name", "type", "title")))
    spec = {"name": args.name, "type": args.type}
    if args.title:
        spec["title"] = args.title
    status, reply = api.restms("POST", domain, {"feed": [spec]})
    feed = _children(reply, "feed")[0] if reply else spec
    made = {"name": args.name, "type": feed.get("type", ""), "created": status == 201}
    verb = "created" if status == 201 else "exists already:"
    return Out(made, f"{verb} feed {args.name} (type {made['type'] or '(default)'})")


def _children(document: Any, kind: str) -> list[dict[str, Any]]:
    """The ``kind`` elements of a RestMS JSON document (J1: always an array)."""
    if not isinstance(document, dict):
        return []
    root = document.get("restms", document)
    items = root.get(kind) if isinstance(root, dict) else None
    if isinstance(items, dict):
        items = [items]
    return [i for i in items or [] if isinstance(i, dict)]


# ---------------------------------------------------------------- pipes
PIPE_COLUMNS = ("type", "domain", "owner", "messages", "joins", "waiting", "title")


def _pipes(api: Api, args: argparse.Namespace) -> Out:
    if args.action == "list":
        reply = api.json("GET", "/admin/pipes")
        pipes = reply.get("pipes", [])
        named = any("name" in p for p in pipes)
        first = "name" if named else "digest"
        rows = [[p.get(first), *(p.get(c) for c in PIPE_COLUMNS)] for p in pipes]
        return Out(reply, table(rows, (first, *PIPE_COLUMNS)))
    if args.action == "create":
        return _provision(api, args)
    path = f"/admin/pipes/{_leaf(args.pipe)}"
    if args.action == "purge":
        reply = api.json("DELETE", path + "/messages")
        return Out(reply, f"purged {reply.get('purged')} messages from pipe {args.pipe}")
    if args.action == "delete":
        reply = api.json("DELETE", path)
        text = (
            f"deleted pipe {reply.get('deleted')} of {reply.get('owner')}: "
            f"{reply.get('messages')} messages, {reply.get('joins')} joins"
        )
        return Out(reply, text)
    reply = api.json("GET", path)
    joined = reply.get("joined") or []
    links = [(j.get("feed"), j.get("type"), j.get("address"), j.get("default")) for j in joined]
    text = fields(reply)
    if links:
        text += "\n\n" + table(links, ("feed", "type", "address", "default"))
    return Out(reply, text)


def _provision(api: Api, args: argparse.Namespace) -> Out:
    """A pipe for ``--owner``: a RestMS pipe document, posted to /admin/pipes."""
    spec = {"type": args.type}
    if args.title:
        spec["title"] = args.title
    query = urllib.parse.urlencode({"owner": args.owner, "domain": args.domain})
    _, headers, reply = api.restms_reply("POST", f"/admin/pipes?{query}", {"pipe": [spec]})
    found = _children(reply, "pipe")
    pipe = found[0] if found else {}
    made = {
        "name": pipe.get("name"),
        "uri": headers.get("Location"),
        "owner": args.owner,
        "domain": args.domain,
        "type": pipe.get("type") or "fifo",
        "title": pipe.get("title", ""),
    }
    return Out(made, f"created pipe {made['name']} for {args.owner} (type {made['type']})")


# ---------------------------------------------------------------- joins
def _joins(api: Api, args: argparse.Namespace) -> Out:
    if args.action == "delete":
        api.restms("DELETE", f"/restms/resource/{_leaf(args.join)}")
        return Out({"deleted": args.join}, f"deleted join {args.join}")
    pipe = f"/restms/resource/{_leaf(args.pipe)}"
    if args.action == "add":
        spec = {"feed": f"{api.base}/restms/feed/{_name(args.feed)}", "address": args.address}
        if args.type:
            spec["type"] = args.type
        status, headers, reply = api.restms_reply("POST", pipe, {"join": [spec]})
        found = _children(reply, "join")
        join = found[0] if found else {}
        made = {
            "uri": headers.get("Location"),
            "feed": args.feed,
            "type": join.get("type", ""),
            "address": join.get("address", args.address),
            "created": status == 201,
        }
        verb = "created" if status == 201 else "exists already:"
        return Out(made, f"{verb} join {made['uri']}")
    joins = _join_list(api, pipe)
    rows = [(j["uri"], j["feed"], j["type"], j["address"]) for j in joins]
    return Out(joins, table(rows, ("join", "feed", "type", "address")))


def _join_list(api: Api, pipe: str) -> list[dict[str, Any]]:
    _, reply = api.restms("GET", pipe)
    found = _children(reply, "pipe")
    return [
        {
            "uri": j.get("href"),
            "feed": urllib.parse.unquote(str(j.get("feed", "")).rsplit("/", 1)[-1]),
            "type": j.get("type", ""),
            "address": j.get("address", ""),
        }
        for j in _children(found[0] if found else {}, "join")
    ]


# ---------------------------------------------------------------- bridges
BRIDGE_COLUMNS = ("name", "kind", "direction", "state", "backlog", "last_error")


def _bridges(api: Api, args: argparse.Namespace) -> Out:
    if args.action == "list":
        reply = api.json("GET", "/admin/bridges")
        rows = [
            [b.get(c) for c in BRIDGE_COLUMNS[:3]]
            + [(b.get("definition") or {}).get("feed")]
            + [b.get(c) for c in BRIDGE_COLUMNS[3:]]
            for b in reply.get("bridges", [])
        ]
        header = (*BRIDGE_COLUMNS[:3], "feed", *BRIDGE_COLUMNS[3:])
        return Out(reply, table(rows, header))
    if args.action == "add":
        reply = api.json("POST", "/admin/bridges", _definition(args.file))
        return Out(reply, f"bridge {reply.get('name')}: {reply.get('state')}")
    path = f"/admin/bridges/{_name(args.name)}"
    if args.action == "delete":
        reply = api.json("DELETE", path + ("?discard=true" if args.discard else ""))
        dropped = reply.get("discarded", 0)
        return Out(reply, f"deleted bridge {args.name}; {dropped} waiting messages discarded")
    reply = api.json("GET", path)
    return Out(reply, fields(reply))


def _definition(path: str) -> dict[str, Any]:
    """One bridge definition: a JSON object, or a TOML table (a file with one
    ``[[bridges]]`` entry is read as that entry), from a file or ``-`` (stdin)."""
    try:
        if path == "-":
            data = sys.stdin.buffer.read(MAX_FILE + 1)
        else:
            with open(path, "rb") as handle:
                data = handle.read(MAX_FILE + 1)
    except OSError as exc:
        raise usage(f"cannot read {path}: {exc.strerror}") from None
    if len(data) > MAX_FILE:
        raise usage(f"{path} is over {MAX_FILE} bytes")
    text = data.decode("utf-8", "replace")
    toml = path.endswith(".toml") or (path != "-" and not text.lstrip().startswith("{"))
    try:
        entry = tomllib.loads(text) if toml else json.loads(text)
    except (tomllib.TOMLDecodeError, ValueError) as exc:
        raise usage(f"{path} is not valid {'TOML' if toml else 'JSON'}: {exc}") from None
    if isinstance(entry, dict) and set(entry) == {"bridges"}:
        listed = entry["bridges"]
        if not isinstance(listed, list) or len(listed) != 1:
            raise usage(f"{path} must hold one bridge, not {len(listed)}")
        entry = listed[0]
    if not isinstance(entry, dict):
        raise usage(f"{path} must hold one bridge definition (a table / JSON object)")
    return entry


# ---------------------------------------------------------------- clients, stats
def _clients(api: Api, args: argparse.Namespace) -> Out:
    if args.action == "list":
        reply = api.json("GET", "/admin/clients")
        rows = [
            (c.get("client_id"), c.get("configured"), c.get("scopes"))
            for c in reply.get("clients", [])
        ]
        return Out(reply, table(rows, ("client_id", "configured", "scopes")))
    if args.action == "add":
        scopes = args.scopes.split()
        reply = api.json("POST", "/admin/clients", {"client_id": args.id, "scopes": scopes})
        text = (
            f"client_id: {reply.get('client_id')}\nclient_secret: {reply.get('client_secret')}\n"
            "Keep the secret now: only its hash is stored, it cannot be shown again."
        )
        return Out(reply, text)
    reply = api.json("DELETE", f"/admin/clients/{_name(args.id)}")
    return Out(reply, f"revoked client {args.id}: removed, and its tokens are refused")


def _stats(api: Api, args: argparse.Namespace) -> Out:
    reply = api.json("GET", "/admin/stats")
    return Out(reply, fields(reply))


HANDLERS: dict[str, Callable[[Api, argparse.Namespace], Out]] = {
    "feeds": _feeds,
    "pipes": _pipes,
    "joins": _joins,
    "bridges": _bridges,
    "clients": _clients,
    "stats": _stats,
}


# ---------------------------------------------------------------- the parser
def _common() -> argparse.ArgumentParser:
    """The options every online verb takes (a parent parser)."""
    parser = argparse.ArgumentParser(add_help=False)
    group = parser.add_argument_group("connection")
    group.add_argument(
        "--url", default=os.environ.get("RESTMS_URL", DEFAULT_URL), help="the gateway's base URL"
    )
    group.add_argument("--token", help="bearer token (default: $RESTMS_TOKEN)")
    group.add_argument("--client-id", help="get a token from the built-in issuer as this client")
    group.add_argument("--client-secret", help="its secret (default: $RESTMS_CLIENT_SECRET)")
    group.add_argument("--json", action="store_true", help="print JSON instead of a table")
    group.add_argument("--timeout", type=float, default=10.0, help="seconds per request")
    group.add_argument("--cacert", help="CA bundle to verify an https:// gateway with")
    return parser


def add_parsers(verbs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The online verbs, on the main parser's sub-parsers."""
    common = [_common()]

    def actions_of(verb: str, help: str) -> Callable[[str, str], argparse.ArgumentParser]:
        actions = verbs.add_parser(verb, help=help).add_subparsers(dest="action", required=True)
        return lambda name, help: actions.add_parser(name, help=help, parents=common)

    action = actions_of("feeds", "public feeds of a running gateway")
    add = action("add", "create a public feed")
    add.add_argument("name")
    add.add_argument("--type", default="", help="fanout, topic, direct, headers, rotator, ...")
    add.add_argument("--title", default="")
    listing = action("list", "list a domain's public feeds")
    delete = action("delete", "delete a feed (its joins go with it)")
    delete.add_argument("name")
    for parser in (add, listing):  # public feed names are unique across domains (U8)
        parser.add_argument("--domain", default="default", help="domain (default: default)")

    action = actions_of("pipes", "every pipe of a running gateway (admin)")
    action("list", "list pipes with depth, joins and waiting readers")
    action("inspect", "one pipe, with its joins").add_argument("pipe")
    action("purge", "drop every message waiting in a pipe").add_argument("pipe")
    action("delete", "delete anyone's pipe with its joins and messages").add_argument("pipe")
    create = action("create", "make a pipe for a principal (provisioning)")
    create.add_argument("--owner", required=True, help="the principal the pipe is for")
    create.add_argument("--type", default="", help="fifo (default), ondemand, stream, webhook")
    create.add_argument("--title", default="")
    create.add_argument("--domain", default="default", help="domain (default: default)")

    action = actions_of("joins", "joins of your own pipes (RestMS documents)")
    action("list", "a pipe's joins").add_argument("pipe")
    add = action("add", "join a pipe to a feed")
    add.add_argument("pipe", help="the pipe's name or URI")
    add.add_argument("feed", help="a public feed's name")
    add.add_argument("--address", default="", help="address or pattern to match")
    add.add_argument("--type", default="", help="join type (default: the feed's)")
    action("delete", "delete a join by its URI").add_argument("join")

    action = actions_of("bridges", "AMQP and ZeroMQ bridges at run time (admin)")
    add = action("add", "create a bridge from a JSON or TOML file")
    add.add_argument("file", help="definition file (.json or .toml), or - for JSON on stdin")
    action("list", "every bridge you administer")
    action("status", "one bridge's status").add_argument("name")
    delete = action("delete", "stop and forget a run-time bridge")
    delete.add_argument("name")
    delete.add_argument("--discard", action="store_true", help="drop messages still waiting")

    action = actions_of("clients", "the built-in issuer's clients (admin, online)")
    add = action("add", "add a client and print its secret once")
    add.add_argument("id", help="client id: 1 to 64 of A-Z a-z 0-9 . _ -")
    add.add_argument("--scopes", required=True, help='space-separated, e.g. "restms:read"')
    action("list", "client ids and scopes (never secrets)")
    action("revoke", "remove a client and refuse its tokens").add_argument("id")

    verbs.add_parser("stats", help="the gateway's counts and totals (admin)", parents=common)


def _api(args: argparse.Namespace) -> Api:
    token = args.token or os.environ.get("RESTMS_TOKEN") or None
    client_id = args.client_id or os.environ.get("RESTMS_CLIENT_ID") or None
    secret = args.client_secret or os.environ.get("RESTMS_CLIENT_SECRET") or None
    if token and client_id:
        raise usage("give a token or a client, not both")
    if client_id and not secret:
        raise usage("--client-id needs --client-secret (or $RESTMS_CLIENT_SECRET)")
    if args.timeout <= 0:
        raise usage("--timeout must be positive")
    context = None
    if args.cacert:
        try:
            context = ssl.create_default_context(cafile=args.cacert)
        except (OSError, ssl.SSLError) as exc:
            raise usage(f"cannot read {args.cacert}: {exc}") from None
    client = (client_id, secret) if client_id and secret else None
    return Api(args.url, args.timeout, token, client, context)


def run(args: argparse.Namespace) -> int:
    """Run one online verb; print its result or the reason it failed."""
    try:
        out = HANDLERS[args.verb](_api(args), args)
    except Failure as exc:
        print(f"main.py: {exc}", file=sys.stderr)
        return exc.code
    print(json.dumps(out.value, indent=2) if args.json else out.text)
    return 0
