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

This module runs in the CLI's process, never in the gateway: it is a user of the
project's client library, :mod:`restms_client`, synchronous and without retries (a
verb is one attempt: its exit code says what happened). No request is sent anywhere
but ``--url``: pipes and joins given by URI are reached at their path on ``--url``,
and tokens come from ``--url``'s own ``/oauth/token``.
"""

from __future__ import annotations

import argparse
import json
import os
import ssl
import sys
import tomllib
import urllib.parse
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from restms_client import (
    Bearer,
    Client,
    ClientCredentials,
    ProtocolError,
    Retry,
    StatusError,
    TransportError,
)

DEFAULT_URL = "http://127.0.0.1:8080"
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


# ---------------------------------------------------------------- the gateway
@dataclass
class Api:
    """One gateway: the library's client for it, and its base URL (``--url``)."""

    client: Client
    base: str

    def resource(self, reference: str) -> str:
        """A pipe's or join's URI on ``--url``, from its hash, path or URI."""
        return f"{self.base}/restms/resource/{urllib.parse.quote(_leaf(reference), safe='')}"


def _leaf(reference: str) -> str:
    """A pipe or join hash from a hash, a path or an absolute URI (only its path is
    used: requests go to ``--url`` whatever host a URI names)."""
    leaf = urllib.parse.urlsplit(reference).path.rstrip("/").rsplit("/", 1)[-1]
    leaf = urllib.parse.unquote(leaf)
    if not leaf or leaf in (".", ".."):
        raise usage(f"{reference!r} names no resource")
    return leaf


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
    client = api.client
    if args.action == "delete":
        feed = client.feed(args.name)  # DELETE of what is not there is 200 (R4): say so instead
        client.delete(feed)
        return Out({"deleted": args.name}, f"deleted feed {args.name}")
    if args.action == "list":
        listed = client.domain(args.domain).feeds
        feeds = [
            {"name": f.name, "type": f.type, "title": f.title or "", "uri": f.href} for f in listed
        ]
        rows = [(f["name"], f["type"] or "(default)", f["title"]) for f in feeds]
        return Out(feeds, table(rows, ("name", "type", "title")))
    feed = client.create_feed(args.name, args.type, title=args.title or None, domain=args.domain)
    made = {"name": args.name, "type": feed.type, "created": bool(feed.created)}
    verb = "created" if feed.created else "exists already:"
    return Out(made, f"{verb} feed {args.name} (type {made['type'] or '(default)'})")


# ---------------------------------------------------------------- pipes
PIPE_COLUMNS = ("type", "domain", "owner", "messages", "joins", "waiting", "title")


def _pipes(api: Api, args: argparse.Namespace) -> Out:
    admin = api.client.admin
    if args.action == "list":
        reply = {"pipes": admin.pipes()}
        pipes = reply["pipes"]
        named = any("name" in p for p in pipes)
        first = "name" if named else "digest"
        rows = [[p.get(first), *(p.get(c) for c in PIPE_COLUMNS)] for p in pipes]
        return Out(reply, table(rows, (first, *PIPE_COLUMNS)))
    if args.action == "create":
        return _provision(api, args)
    name = _leaf(args.pipe)
    if args.action == "purge":
        reply = admin.purge_pipe(name)
        return Out(reply, f"purged {reply.get('purged')} messages from pipe {args.pipe}")
    if args.action == "delete":
        reply = admin.delete_pipe(name)
        text = (
            f"deleted pipe {reply.get('deleted')} of {reply.get('owner')}: "
            f"{reply.get('messages')} messages, {reply.get('joins')} joins"
        )
        return Out(reply, text)
    reply = admin.inspect_pipe(name)
    joined = reply.get("joined") or []
    links = [(j.get("feed"), j.get("type"), j.get("address"), j.get("default")) for j in joined]
    text = fields(reply)
    if links:
        text += "\n\n" + table(links, ("feed", "type", "address", "default"))
    return Out(reply, text)


def _provision(api: Api, args: argparse.Namespace) -> Out:
    """A pipe for ``--owner``, provisioned through /admin/pipes."""
    pipe = api.client.admin.create_pipe(
        args.owner, type=args.type, title=args.title or None, domain=args.domain
    )
    made = {
        "name": pipe.name,
        "uri": pipe.href,
        "owner": args.owner,
        "domain": args.domain,
        "type": pipe.type or "fifo",
        "title": pipe.title or "",
    }
    return Out(made, f"created pipe {made['name']} for {args.owner} (type {made['type']})")


# ---------------------------------------------------------------- joins
def _joins(api: Api, args: argparse.Namespace) -> Out:
    client = api.client
    if args.action == "delete":
        client.delete(api.resource(args.join))
        return Out({"deleted": args.join}, f"deleted join {args.join}")
    pipe = api.resource(args.pipe)
    if args.action == "add":
        # the feed by its URI on --url: an unknown one is the gateway's 400, as a join says
        feed = f"{api.base}/restms/feed/{urllib.parse.quote(args.feed, safe='')}"
        join = client.join(pipe, feed, args.address, type=args.type or None)
        made = {
            "uri": join.href,
            "feed": args.feed,
            "type": join.type,
            "address": join.address or args.address,
            "created": bool(join.created),
        }
        verb = "created" if join.created else "exists already:"
        return Out(made, f"{verb} join {made['uri']}")
    joins = [
        {
            "uri": j.href,
            "feed": urllib.parse.unquote(j.feed.rsplit("/", 1)[-1]),
            "type": j.type,
            "address": j.address,
        }
        for j in client.pipe(pipe).joins
    ]
    rows = [(j["uri"], j["feed"], j["type"], j["address"]) for j in joins]
    return Out(joins, table(rows, ("join", "feed", "type", "address")))


# ---------------------------------------------------------------- bridges
BRIDGE_COLUMNS = ("name", "kind", "direction", "state", "backlog", "last_error")


def _bridges(api: Api, args: argparse.Namespace) -> Out:
    admin = api.client.admin
    if args.action == "list":
        reply = {"bridges": admin.bridges()}
        rows = [
            [b.get(c) for c in BRIDGE_COLUMNS[:3]]
            + [(b.get("definition") or {}).get("feed")]
            + [b.get(c) for c in BRIDGE_COLUMNS[3:]]
            for b in reply["bridges"]
        ]
        header = (*BRIDGE_COLUMNS[:3], "feed", *BRIDGE_COLUMNS[3:])
        return Out(reply, table(rows, header))
    if args.action == "add":
        made = admin.add_bridge(_definition(args.file))
        return Out(made, f"bridge {made.get('name')}: {made.get('state')}")
    if args.action == "delete":
        gone = admin.delete_bridge(args.name, discard=args.discard)
        dropped = gone.get("discarded", 0)
        return Out(gone, f"deleted bridge {args.name}; {dropped} waiting messages discarded")
    status = admin.bridge(args.name)
    return Out(status, fields(status))


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
    admin = api.client.admin
    if args.action == "list":
        reply = {"clients": admin.clients()}
        rows = [
            (c.get("client_id"), c.get("configured"), c.get("scopes")) for c in reply["clients"]
        ]
        return Out(reply, table(rows, ("client_id", "configured", "scopes")))
    if args.action == "add":
        made = admin.add_client(args.id, args.scopes.split())
        text = (
            f"client_id: {made.get('client_id')}\nclient_secret: {made.get('client_secret')}\n"
            "Keep the secret now: only its hash is stored, it cannot be shown again."
        )
        return Out(made, text)
    revoked = admin.revoke_client(args.id)
    return Out(revoked, f"revoked client {args.id}: removed, and its tokens are refused")


def _stats(api: Api, args: argparse.Namespace) -> Out:
    reply = api.client.admin.stats()
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
    parts = urllib.parse.urlsplit(args.url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise usage(f"--url {args.url!r} must be an http:// or https:// URL")
    base = args.url.rstrip("/")
    verify: ssl.SSLContext | bool = True
    if args.cacert:
        try:
            verify = ssl.create_default_context(cafile=args.cacert)
        except (OSError, ssl.SSLError) as exc:
            raise usage(f"cannot read {args.cacert}: {exc}") from None
    auth: Bearer | ClientCredentials | None = None
    if token:
        auth = Bearer(token)
    elif client_id and secret:
        # the token endpoint of --url itself, not one its metadata might name elsewhere
        auth = ClientCredentials(
            client_id=client_id, client_secret=secret, token_url=f"{base}/oauth/token"
        )
    client = Client(base, auth=auth, retry=Retry(attempts=0), timeout=args.timeout, verify=verify)
    return Api(client, base)


TOKEN_REFUSED = "token request refused: "  # noqa: S105 (restms_client's reason, no secret)


def _failure(
    exc: StatusError | TransportError | ProtocolError, args: argparse.Namespace
) -> Failure:
    """The exit code and message of the library's error (never a token or secret)."""
    if isinstance(exc, StatusError) and exc.reason.startswith(TOKEN_REFUSED):
        client_id = args.client_id or os.environ.get("RESTMS_CLIENT_ID")
        return refused(f"no token for client {client_id!r}: {exc.reason[len(TOKEN_REFUSED) :]}")
    if isinstance(exc, StatusError):
        return refused(f"{exc.method} {exc.url}: {exc.status} {exc.reason}")
    return unreachable(str(exc))


def run(args: argparse.Namespace) -> int:
    """Run one online verb; print its result or the reason it failed."""
    try:
        api = _api(args)
        try:
            out = HANDLERS[args.verb](api, args)
        except (StatusError, TransportError, ProtocolError) as exc:
            raise _failure(exc, args) from None
        finally:
            api.client.close()
    except Failure as exc:
        print(f"main.py: {exc}", file=sys.stderr)
        return exc.code
    print(json.dumps(out.value, indent=2) if args.json else out.text)
    return 0
