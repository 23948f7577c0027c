"""Command line.

``python main.py serve [--host H] [--port P] [--data-dir D] [--config F]`` runs the gateway;
``client add|list|remove`` manages the built-in OAuth server's clients;
``user hash`` prints the scrypt hash of a password for a ``[[users]]`` entry.
"""

from __future__ import annotations

import argparse
import logging
import sys

from gateway.config import ConfigError, load


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
    client = verbs.add_parser("client", help="manage the built-in OAuth server's clients")
    client_verbs = client.add_subparsers(dest="action", required=True)
    add = client_verbs.add_parser("add", help="add a client and print its secret once")
    add.add_argument("name", help="client id: 1 to 64 of A-Z a-z 0-9 . _ -")
    add.add_argument("--scopes", required=True, help='space-separated, e.g. "restms:read"')
    client_verbs.add_parser("list", help="list client ids and their scopes")
    remove = client_verbs.add_parser("remove", help="remove a client (its tokens live on)")
    remove.add_argument("name")
    for action in client_verbs.choices.values():
        action.add_argument("--data-dir", help="data directory (default ./var)")
        action.add_argument("--config", help="TOML configuration file")
    user = verbs.add_parser("user", help="HTTP Basic users (for older RestMS clients)")
    user_verbs = user.add_subparsers(dest="action", required=True)
    user_verbs.add_parser(
        "hash", help="read a password (prompt, or stdin) and print its hash for [[users]]"
    )
    return parser


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
    """``client add|list|remove``: edit ``<data_dir>/oauth/clients.json``; a running
    gateway sees the change on its next token request."""
    from pathlib import Path

    from auth.clients import CLIENTS_FILE, ClientStore, parse_scopes

    try:
        config = load(args.config, overrides={"data_dir": args.data_dir})
        store = ClientStore(Path(config.data_dir) / CLIENTS_FILE)
        if args.action == "add":
            if args.name == "guest":
                raise ValueError("'guest' is the loopback guest: choose another client id")
            secret = store.add(args.name, parse_scopes(args.scopes))
            print(f"client_id: {args.name}")
            print(f"client_secret: {secret}")
            print("Keep the secret now: only its hash is stored, it cannot be shown again.")
        elif args.action == "remove":
            try:
                store.remove(args.name)
            except KeyError:
                raise ValueError(f"no client {args.name!r} in {store.path}") from None
            print(f"removed client {args.name}; tokens it holds stay valid until they expire")
        else:
            clients = store.clients()
            for client in clients:
                print(client.client_id, " ".join(client.scopes), sep="\t")
            if not clients:
                print(f"main.py: no clients in {store.path}", file=sys.stderr)
    except (ConfigError, ValueError, OSError) as exc:
        print(f"main.py: {exc}", file=sys.stderr)
        return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.verb == "client":
        return _client(args)
    if args.verb == "user":
        return _user_hash()
    overrides = {
        "host": args.host,
        "port": args.port,
        "data_dir": args.data_dir,
        "insecure": args.insecure,
        "log_level": args.log_level,
    }
    try:
        config = load(args.config, overrides=overrides)
    except ConfigError as exc:
        print(f"main.py: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=config.log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    from gateway.server import run

    run(config)
    return 0


if __name__ == "__main__":
    sys.exit(main())
