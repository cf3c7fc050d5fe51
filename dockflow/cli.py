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
from dockflow import __version__, demo
from dockflow.banner import print_started
from dockflow.parts import EVERY_LISTENER, LISTENERS

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


def _run_parts(args: argparse.Namespace, parts: tuple[str, ...] | None) -> int:
    """Run the listeners `parts` names (None: every one) until stopped."""
    # The listeners' code (aiohttp, GraphQL, gRPC, the worker) is loaded by the commands that
    # run them only: `dockflow admin` and the customer commands start without it.
    from dockflow import runtime

    settings = _settings(args)
    on_started = demo.on_started if getattr(args, "demo", False) else print_started
    asyncio.run(runtime.serve(settings, parts or EVERY_LISTENER, on_started=on_started))
    return 0


SERVE = "serve"


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The command line's parser; given the `command` a process runs, with the feature commands
    it needs only (every command's parser when None)."""
    parser = argparse.ArgumentParser(
        prog="dockflow",
        description="Integration service for warehouses with loading docks.",
    )
    parser.add_argument("--version", action="version", version=f"dockflow {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    serve = commands.add_parser(SERVE, help="run the gRPC edge, HTTP API and webhook worker")
    _add_server_options(serve)
    serve.add_argument("--demo", action="store_true", help="create a demo tenant and print it")
    serve.set_defaults(func=lambda a: _run_parts(a, None))
    for name, help_text in LISTENERS.items():
        part = commands.add_parser(name, help=help_text)
        _add_server_options(part)
        part.set_defaults(func=lambda a, parts=(name,): _run_parts(a, parts))

    for register in _command_modules(command):
        register(commands)
    return parser


# The command each feature module registers (its `register`): a process imports the module of
# its own command only (none for the listeners' commands), every one for `--help`, for an
# unknown command or for none.
COMMAND_MODULES = {
    "admin": "dockflow.admin",
    "post-document": "dockflow.post_document",
    "simulate": "dockflow.simulate",
    "consume": "dockflow.consume",
    "listen": "dockflow.listen",
    "bench": "bench.cli",  # absent from an installation without the bench package
}


def _command_modules(command: str | None) -> list[Callable[[Any], None]]:
    """The `register` functions of the feature commands `command` needs (see COMMAND_MODULES)."""
    if command in COMMAND_MODULES:
        names = [COMMAND_MODULES[command]]
    elif command == SERVE or command in LISTENERS:
        names = []
    else:
        names = list(COMMAND_MODULES.values())
    registers = []
    for module_name in names:
        try:
            module = __import__(module_name, fromlist=["register"])
        except ModuleNotFoundError as exc:
            # The module itself or its package missing (an installation without bench), not
            # something it imports.
            if exc.name is None or not f"{module_name}.".startswith(f"{exc.name}."):
                raise
            continue
        registers.append(module.register)
    return registers


def main(argv: Sequence[str] | None = None) -> int:
    arguments = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(arguments[0] if arguments else None)
    args = parser.parse_args(arguments)
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
