"""Command line.

``python main.py serve [--host H] [--port P] [--data-dir D] [--config F] [--engine E]
[--redis-url URL] [--workers N]`` runs the gateway;
``client add|list|remove|revoke`` manages the built-in OAuth server's clients;
``user hash`` prints the scrypt hash of a password for a ``[[users]]`` entry;
``analytics QUERY [--since S] [--until U] [--feed F] [--bucket B] [--limit N] [--json]``
runs one analytics query with Spark in this process over the configured lake and
prints a table (docs/ANALYTICS.md). ``feeds``, ``pipes``, ``joins``, ``bridges``,
``clients`` and ``stats`` drive a running gateway over HTTP (:mod:`admincli.commands`,
docs/ADMIN.md).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from feeds.service import EngineService
    from gateway.server.config import Config


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="main.py", description="RestMS messaging gateway")
    verbs = parser.add_subparsers(dest="verb", required=True)
    serve = verbs.add_parser("serve", help="run the gateway")
    serve.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port to listen on (default 8080; 0 picks one)")
    serve.add_argument("--data-dir", help="data directory (default ./var)")
    serve.add_argument("--config", help="TOML configuration file")
    serve.add_argument(
        "--insecure",
        action="store_true",
        default=None,
        help="honour anonymous and guest/guest requests from any address (unsafe)",
    )
    serve.add_argument("--log-level", help="DEBUG, INFO, WARNING or ERROR (default INFO)")
    serve.add_argument("--engine", help="embedded (default) or redis (docs/CLUSTER.md)")
    serve.add_argument(
        "--redis-url", help="a seed node of the Redis Cluster, or several, comma-separated"
    )
    serve.add_argument(
        "--workers", type=int, help="gateway processes on one port (default 1; needs redis)"
    )
    serve.add_argument(
        "--cors-origins",
        help="origins whose pages may call, comma-separated (docs/BROWSER.md; default none)",
    )
    client = verbs.add_parser("client", help="manage the built-in OAuth server's clients")
    client_verbs = client.add_subparsers(dest="action", required=True)
    add = client_verbs.add_parser("add", help="add a client and print its secret once")
    add.add_argument("name", help="client id: 1 to 64 of A-Z a-z 0-9 . _ -")
    add.add_argument("--scopes", required=True, help='space-separated, e.g. "restms:read"')
    client_verbs.add_parser("list", help="list client ids and their scopes")
    remove = client_verbs.add_parser(
        "remove", help="remove a client (its tokens live on: see client revoke)"
    )
    remove.add_argument("name")
    revoke = client_verbs.add_parser(
        "revoke", help="remove a client and refuse the tokens it holds (a running gateway too)"
    )
    revoke.add_argument("name")
    for action in client_verbs.choices.values():
        action.add_argument("--data-dir", help="data directory (default ./var)")
        action.add_argument("--config", help="TOML configuration file")
    user = verbs.add_parser("user", help="HTTP Basic users (for older RestMS clients)")
    user_verbs = user.add_subparsers(dest="action", required=True)
    user_verbs.add_parser(
        "hash", help="read a password (prompt, or stdin) and print its hash for [[users]]"
    )
    analytics = verbs.add_parser(
        "analytics", help="run an analytics query over the lake and print a table"
    )
    from spark_sink.params import QUERIES, ROLLING

    analytics.add_argument("query", choices=[q for q in QUERIES if q != ROLLING])
    analytics.add_argument("--since", help="ISO 8601 time or span back from now (default 1h)")
    analytics.add_argument("--until", help="ISO 8601 time or span back from now (default now)")
    analytics.add_argument("--feed", help="only this feed")
    analytics.add_argument("--bucket", help="bucket size: 30s, 1m, 5m, 1h, 1d (default 1m)")
    analytics.add_argument("--limit", help="rows of addresses and principals (default 20)")
    analytics.add_argument("--json", action="store_true", help="print the JSON answer")
    analytics.add_argument("--lake", help="the lake (default: mirror_lake from the config)")
    analytics.add_argument("--data-dir", help="data directory (default ./var)")
    analytics.add_argument("--config", help="TOML configuration file")
    from admincli import commands

    commands.add_parsers(verbs)  # feeds, pipes, joins, bridges, clients, stats (docs/ADMIN.md)
    return parser


def _analytics(args: argparse.Namespace) -> int:
    """``analytics QUERY``: Spark in this process (``analytics_master``) over the lake."""
    import json

    from gateway.server.config import ConfigError, load
    from spark_sink import params, queries, session

    try:
        config = load(args.config, overrides={"data_dir": args.data_dir})
        keys = ("since", "until", "feed", "bucket", "limit")
        raw = {k: getattr(args, k) for k in keys if getattr(args, k) is not None}
        checked = params.parse(raw)
        session.check_java()
    except (ConfigError, ValueError, RuntimeError) as exc:
        print(f"main.py: {exc}", file=sys.stderr)
        return 2
    from admincli.progress import Progress

    with Progress(sys.stderr, "starting Spark") as progress:  # shown on a terminal only
        spark = session.build(
            config.analytics_master,
            shuffle_partitions=config.analytics_partitions,
            memory=config.analytics_memory,
        )
        progress.step(f"running the {args.query} query")
        result = queries.run(spark, args.lake or config.lake, args.query, checked)
    print(json.dumps(result.wire(), indent=2) if args.json else result.table())
    return 0


def _user_hash() -> int:
    """``user hash``: the password from a prompt (or one line of stdin), hashed with scrypt."""
    import getpass

    from auth.clients import hash_secret

    if sys.stdin.isatty():
        password = getpass.getpass("password: ")
        if getpass.getpass("again: ") != password:
            print("main.py: the two passwords differ", file=sys.stderr)
            return 2
    else:
        password = sys.stdin.readline().rstrip("\r\n")
    if not password:
        print("main.py: an empty password is refused", file=sys.stderr)
        return 2
    print(hash_secret(password))
    return 0


def _client(args: argparse.Namespace) -> int:
    """``client add|list|remove|revoke``: edit the client registry, the file
    ``<data_dir>/oauth/clients.json`` or, with ``engine = "redis"``, the one every node
    shares (docs/AUTH.md, section 16); a running gateway sees the change on its next
    token request."""
    import asyncio

    from gateway.server.config import ConfigError, load

    try:
        config = load(args.config, overrides={"data_dir": args.data_dir})
        asyncio.run(_client_verb(args, config))
    except (ConfigError, ValueError, OSError) as exc:
        print(f"main.py: {exc}", file=sys.stderr)
        return 2
    return 0


async def _client_verb(args: argparse.Namespace, config: Config) -> None:
    from pathlib import Path

    from auth import cluster
    from auth.clients import CLIENTS_FILE, Clients, ClientStore, FileClients, parse_scopes
    from auth.revocations import REVOKED_FILE, RevocationList, Revocations

    keep = config.token_ttl + config.token_leeway
    shared = cluster.for_settings(config)
    store: Clients
    revocations: RevocationList
    if shared is None:
        where = str(Path(config.data_dir) / CLIENTS_FILE)
        store = FileClients(ClientStore(Path(config.data_dir) / CLIENTS_FILE))
        revocations = Revocations(Path(config.data_dir) / REVOKED_FILE, keep)
    else:
        where = "the shared client registry"
        store, revocations = cluster.RedisClients(shared), cluster.RedisRevocations(shared, keep)
    try:
        if args.action == "add":
            if args.name == "guest":
                raise ValueError("'guest' is the loopback guest: choose another client id")
            secret = await store.add(args.name, parse_scopes(args.scopes))
            print(f"client_id: {args.name}")
            print(f"client_secret: {secret}")
            print("Keep the secret now: only its hash is stored, it cannot be shown again.")
        elif args.action == "remove":
            try:
                await store.remove(args.name)
            except KeyError:
                raise ValueError(f"no client {args.name!r} in {where}") from None
            print(
                f"removed client {args.name}; tokens it holds stay valid until they expire"
                " (main.py client revoke also refuses them)"
            )
        elif args.action == "revoke":
            # Recorded, removed, recorded again, as DELETE /admin/clients/{id} does; a
            # running gateway (every node) reads it within a second and ends what the
            # client's tokens hold open. A client removed before can still be revoked.
            if any(c.client_id == args.name for c in config.clients):
                raise ValueError(
                    f"client {args.name!r} is in the configuration file: remove it there"
                )
            await revocations.record(args.name)
            with contextlib.suppress(KeyError):
                await store.remove(args.name)
            await revocations.record(args.name)
            print(f"revoked client {args.name}: removed, and its tokens are refused")
        else:
            clients = await store.clients()
            for client in clients:
                print(client.client_id, " ".join(client.scopes), sep="\t")
            if not clients:
                print(f"main.py: no clients in {where}", file=sys.stderr)
    finally:
        if shared is not None:
            await shared.close()


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.verb == "client":
        return _client(args)
    if args.verb == "user":
        return _user_hash()
    if args.verb == "analytics":
        return _analytics(args)
    from admincli import commands

    if args.verb in commands.VERBS:
        return commands.run(args)
    from gateway.server.config import ConfigError, load  # aiohttp and more: not for the CLI verbs
    from gateway.server.datadir import prepare

    overrides = {
        "host": args.host,
        "port": args.port,
        "data_dir": args.data_dir,
        "insecure": args.insecure,
        "log_level": args.log_level,
        "engine": args.engine,
        "redis_url": args.redis_url,
        "workers": args.workers,
        "cors_origins": args.cors_origins,
    }
    try:
        config = load(args.config, overrides=overrides)
        prepare(config.data_dir)  # private modes and checks, before anything is written
    except ConfigError as exc:
        print(f"main.py: {exc}", file=sys.stderr)
        return 2
    from gateway.server.requestid import configure_logging

    configure_logging(config.log_level)  # on standard error, with request ids
    from gateway.server.datalock import DataDirError
    from gateway.server.run import run

    try:
        return run(config, open_engine)
    except DataDirError as exc:  # held by another gateway, or not writable
        print(f"main.py: {exc}", file=sys.stderr)
        return 1


def open_engine(config: Config) -> EngineService:
    """The engine the gateway runs on: the composition root's one choice. The embedded
    engine (memory, and SQLite in the data directory) by default; the Redis Cluster's
    with ``engine = "redis"``."""
    if config.engine == "redis":
        from auth import cluster
        from feeds.redis import RedisEngine

        url, seeds = cluster.seeds(config.redis_url)
        return RedisEngine.open(
            config.engine_config(), url, namespace=config.redis_namespace, seeds=seeds
        )
    from feeds.embedded import EmbeddedEngine

    return EmbeddedEngine.open(
        config.engine_config(),
        config.data_dir if config.store == "sqlite" else None,
        synchronous=config.store_sync.upper(),
        busy_timeout=config.store_busy_timeout,
        journal_interval=config.journal_interval,
        sweep_interval=config.sweep_interval,
    )


if __name__ == "__main__":
    sys.exit(main())
