"""Command line: ``python main.py serve [--host H] [--port P] [--data-dir D] [--config F]``."""

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
        help="allow listening on a non-loopback address without OAuth",
    )
    serve.add_argument("--log-level", help="DEBUG, INFO, WARNING or ERROR (default INFO)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
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
