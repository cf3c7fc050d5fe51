"""What every ``dockflow admin`` command shares: its options (``--json``, ``--data-dir``,
``--mongodb-url``), the runner that opens the database ``dockflow serve`` uses and prints the
output or one error line (exit 2; exit 3 when the database cannot be reached), and the rendering
of entities for people. The command modules (dockflow/admin.py, admin_apply.py,
admin_webhooks.py, admin_gs1.py) import it; it imports none of them."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.errors import ConfigError, DockflowError
from core.services import Services
from core.settings import Settings, load_settings, unknown_variables
from core.storage import UNAVAILABLE_ERRORS
from dockflow.database import open_services
from dockflow.embedded.supervisor import has_database

EXIT_USAGE = 2  # bad input: duplicates, unknown references, invalid values
EXIT_UNAVAILABLE = 3  # the database cannot be reached


@dataclass(frozen=True)
class Output:
    """What a command prints: `data` with --json, else `text`."""

    data: Any
    text: str


Handler = Callable[[Services, argparse.Namespace], Awaitable[Output]]


class AdminError(Exception):
    """A one-line error from the command line itself (not from core)."""


@dataclass(frozen=True)
class Arg:
    """One argument of a command: its name or flags and `add_argument`'s keywords."""

    flags: tuple[str, ...]
    options: Mapping[str, Any]


def arg(*flags: str, **options: Any) -> Arg:
    return Arg(flags, options)


@dataclass(frozen=True)
class Command:
    """One ``dockflow admin`` command as a row of a table: name, handler, help, arguments."""

    name: str
    handler: Handler
    help: str
    args: tuple[Arg, ...] = field(default=())


def add_commands(admin_subparsers: Any, commands: Iterable[Command]) -> None:
    """Add each command of a table, its arguments in their order."""
    for command in commands:
        parser = add_command(admin_subparsers, command.name, command.handler, command.help)
        for argument in command.args:
            parser.add_argument(*argument.flags, **argument.options)


def add_command(
    admin_subparsers: Any, name: str, handler: Handler, help_text: str
) -> argparse.ArgumentParser:
    """Add `dockflow admin NAME`, run by `run` with the options every admin command takes."""
    parser: argparse.ArgumentParser = admin_subparsers.add_parser(
        name, help=help_text, description=help_text
    )
    parser.add_argument("--json", action="store_true", help="print JSON for scripts")
    parser.add_argument("--data-dir", help="data directory (DOCKFLOW_DATA_DIR)")
    parser.add_argument("--mongodb-url", help="MongoDB URL; unset: embedded (DOCKFLOW_MONGODB_URL)")
    parser.set_defaults(func=lambda args: run(handler, args))
    return parser


def _settings(args: argparse.Namespace) -> Settings:
    overrides: dict[str, Any] = {}
    if getattr(args, "data_dir", None):
        overrides["data_dir"] = args.data_dir
    if getattr(args, "mongodb_url", None):
        overrides["mongodb_url"] = args.mongodb_url
    settings = load_settings(**overrides)
    for warning in unknown_variables():
        print(f"dockflow admin: warning: {warning}", file=sys.stderr)
    return settings


def _require_database(settings: Settings) -> None:
    """Refuse to work on an embedded database that does not exist: run from another directory,
    a command would otherwise start a new, empty one there and answer from it (a list showing
    "(none)", a client created where no server reads it)."""
    if settings.mongodb_url is not None:
        return
    engine = settings.embedded_engine
    if has_database(settings.data_dir, engine):
        return
    raise AdminError(
        f"no dockflow database in {Path(settings.data_dir).resolve()} (no running server, no "
        f"{engine} files under mongo/); run this where dockflow serve runs (its ./var), or give "
        "--data-dir, DOCKFLOW_DATA_DIR or DOCKFLOW_MONGODB_URL"
    )


def run(handler: Handler, args: argparse.Namespace) -> int:
    """Run one admin command: print its output, or one error line and exit code 2."""
    try:
        settings = _settings(args)
        _require_database(settings)
        output = asyncio.run(_call(handler, settings, args))
    except (DockflowError, AdminError) as exc:
        for line in _lines_of(exc):
            print(f"dockflow admin: {line}", file=sys.stderr)
        return EXIT_USAGE
    except UNAVAILABLE_ERRORS as exc:
        print(f"dockflow admin: the database is unavailable: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    if getattr(args, "json", False):
        print(json.dumps(output.data, indent=2, default=str))
    else:
        print(output.text)
    return 0


async def _call(handler: Handler, settings: Settings, args: argparse.Namespace) -> Output:
    async with open_services(settings, check_feed=False) as services:
        return await handler(services, args)


def _lines_of(exc: Exception) -> list[str]:
    """An error as printed: one line, or one per invalid setting."""
    if isinstance(exc, ConfigError) and not exc.errors:
        return [" ".join(line.split()) for line in exc.detail.splitlines()]
    return [_one_line(exc)]


def _one_line(exc: Exception) -> str:
    if isinstance(exc, DockflowError):
        text = exc.detail
        if exc.errors:
            text += ": " + "; ".join(f"{e.path}: {e.detail}" for e in exc.errors)
    else:
        text = str(exc)
    return " ".join(text.split())


# --- rendering ----------------------------------------------------------------------------


def _shown(value: Any, separator: str) -> str:
    """A value for people: None means no restriction ("all"), an empty list "none"."""
    if value is None:
        return "all"
    if isinstance(value, list):
        return separator.join(value) if value else "none"
    return str(value)


def field_lines(data: dict[str, Any]) -> str:
    width = max(len(k) for k in data)
    return "\n".join(f"  {key.ljust(width)}  {_shown(value, ', ')}" for key, value in data.items())


def table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    if not rows:
        return "(none)"
    cells = [[_shown(r[c], ",") for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=True))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(line.rstrip() for line in lines)


SHOWN_ONCE = "(the secret is shown only now: store it)"


def read_stdin_secret() -> str:
    value = sys.stdin.readline().rstrip("\r\n")
    if not value:
        raise AdminError("nothing was read from stdin")
    return value
