"""The ``dockflow`` command: serve, the separate parts, admin, simulate, consume, bench."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Callable, Sequence
from typing import Any, get_args

from core.errors import ConfigError, DatabaseUnavailable
from core.logs import configure_logging
from core.settings import EmbeddedEngine, Settings, load_settings, unknown_variables
from dockflow import __version__, demo, runtime
from dockflow.banner import print_started

log = logging.getLogger("dockflow")


def _settings(args: argparse.Namespace) -> Settings:
    overrides = {}
    for name in (
        "http_port",
        "grpc_port",
        "data_dir",
        "mongodb_url",
        "embedded_engine",
        "log_format",
    ):
        value = getattr(args, name, None)
        if value is not None:
            overrides[name] = value
    settings = load_settings(**overrides)
    if getattr(args, "demo", False):
        settings = demo.demo_settings(settings)
    configure_logging(settings.log_level, settings.log_format)
    for warning in unknown_variables():
        log.warning(warning)
    return settings


def _add_server_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--http-port", type=int, help="HTTP port (DOCKFLOW_HTTP_PORT)")
    parser.add_argument("--grpc-port", type=int, help="gRPC port (DOCKFLOW_GRPC_PORT)")
    parser.add_argument("--data-dir", help="data directory (DOCKFLOW_DATA_DIR)")
    parser.add_argument("--mongodb-url", help="MongoDB URL; unset: embedded (DOCKFLOW_MONGODB_URL)")
    parser.add_argument(
        "--embedded-engine",
        choices=get_args(EmbeddedEngine),
        help="the embedded server when no URL is set (DOCKFLOW_EMBEDDED_ENGINE)",
    )
    parser.add_argument("--log-format", choices=["json", "console"], help="DOCKFLOW_LOG_FORMAT")


def _run_parts(args: argparse.Namespace, parts: tuple[str, ...]) -> int:
    settings = _settings(args)
    on_started = demo.on_started if getattr(args, "demo", False) else print_started
    asyncio.run(runtime.serve(settings, parts, on_started=on_started))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dockflow",
        description="Integration service for warehouses with loading docks.",
    )
    parser.add_argument("--version", action="version", version=f"dockflow {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    serve = commands.add_parser("serve", help="run the gRPC edge, HTTP API and webhook worker")
    _add_server_options(serve)
    serve.add_argument("--demo", action="store_true", help="create a demo tenant and print it")
    serve.set_defaults(func=lambda a: _run_parts(a, runtime.PARTS))
    for name, help_text in (
        ("edge", "run only the gRPC edge for cameras"),
        ("api", "run only the HTTP API (REST, GraphQL, dashboard)"),
        ("webhooks", "run only the webhook delivery worker"),
    ):
        part = commands.add_parser(name, help=help_text)
        _add_server_options(part)
        part.set_defaults(func=lambda a, parts=(name,): _run_parts(a, parts))

    for register in _command_modules():
        register(commands)
    return parser


def _command_modules() -> list[Callable[[Any], None]]:
    """Feature commands (admin, simulate, consume, listen, bench, post-document) register here."""
    registers = []
    for module_name in (
        "dockflow.admin",
        "dockflow.post_document",
        "dockflow.simulate",
        "dockflow.consume",
        "dockflow.listen",
        "bench.cli",
    ):
        try:
            module = __import__(module_name, fromlist=["register"])
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            continue
        registers.append(module.register)
    return registers


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (ConfigError, DatabaseUnavailable) as exc:
        for line in exc.detail.splitlines():  # one line per problem (each invalid setting)
            print(f"dockflow: {line}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
