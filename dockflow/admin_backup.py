"""``dockflow admin backup PATH`` and ``dockflow admin restore PATH``: the embedded database
copied while dockflow serves, and put back into a data directory no server runs on (how, per
engine: dockflow/embedded/backup.py). A MongoDB given by ``DOCKFLOW_MONGODB_URL`` is backed up
with MongoDB's own tools (docs/deploy.md)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from core.errors import ConfigError
from core.logs import configure_logging
from core.settings import Settings, load_settings
from dockflow.embedded import backup
from dockflow.embedded.restore_credentials import CredentialChanges

EXIT_USAGE = 2


def register(sub: Any) -> None:
    """Add ``backup`` and ``restore`` to ``dockflow admin``."""
    for name, help_text in (
        ("backup", "copy the embedded database into the new folder PATH, while dockflow serves"),
        ("restore", "put the backup in PATH back (refused while dockflow runs on the data dir)"),
    ):
        parser = sub.add_parser(name, help=help_text, description=help_text)
        parser.add_argument("path", type=Path, metavar="PATH")
        parser.add_argument("--data-dir", help="data directory (DOCKFLOW_DATA_DIR)")
        parser.add_argument("--json", action="store_true", help="print JSON for scripts")
        if name == "restore":
            parser.add_argument(
                "--no-reapply-revocations",
                dest="reapply_revocations",
                action="store_false",
                help="restore credentials exactly as backed up: signing keys, API clients, "
                "cameras and operators revoked, disabled or re-keyed after the backup work "
                "again (by default those steps are taken again on the restored database)",
            )
        parser.set_defaults(func=lambda args, name=name: run(name, args))


def _settings(args: argparse.Namespace) -> Settings:
    overrides: dict[str, Any] = {}
    if args.data_dir:
        overrides["data_dir"] = args.data_dir
    settings = load_settings(**overrides)
    configure_logging(settings.log_level, settings.log_format)
    if settings.mongodb_url is not None:
        raise ConfigError(
            "DOCKFLOW_MONGODB_URL is set: back up that MongoDB with mongodump or its snapshots "
            "(docs/deploy.md); dockflow admin backup copies the embedded database"
        )
    return settings


def run(command: str, args: argparse.Namespace) -> int:
    try:
        settings = _settings(args)
        kept = None
        if command == "backup":
            info = asyncio.run(
                backup.backup(
                    settings.data_dir, settings.embedded_engine, settings.mongodb_db, args.path
                )
            )
        else:
            restored = asyncio.run(
                backup.restore(
                    settings.data_dir,
                    settings.embedded_engine,
                    settings.mongodb_db,
                    args.path,
                    reapply_revocations=args.reapply_revocations,
                )
            )
            info, kept, credentials = restored.backup, restored.kept, restored.credentials
    except ConfigError as exc:
        print(f"dockflow admin: {exc.detail}", file=sys.stderr)
        return EXIT_USAGE
    data: dict[str, Any] = {
        "path": str(info.path),
        "engine": info.engine,
        "database": info.database,
        "created_at": info.created_at,
        "collections": info.collections,
    }
    if command == "restore":
        data["kept"] = None if kept is None else str(kept)
        data["credentials_changed_since_backup"] = [step.line for step in credentials.steps]
        data["credentials_reapplied"] = credentials.reapplied
        data["credentials_unreadable"] = credentials.unreadable
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    done = "backed up into" if command == "backup" else "restored from"
    print(f"{info.database} ({info.engine}) {done} {info.path} (taken {info.created_at})")
    if kept is not None:
        original = kept.name.removesuffix(backup.KEPT_SUFFIX)
        undo = "restore that folder" if kept.is_dir() else f"rename it {original}"
        print(f"the database it replaced is kept as {kept} (undo, with dockflow stopped: {undo})")
    if command == "restore":
        _tell_credentials(credentials)
    return 0


def _tell_credentials(credentials: CredentialChanges) -> None:
    """What the operator must know about credentials after a restore (stderr: a warning)."""
    if credentials.unreadable is not None:
        print(
            "warning: the replaced database could not be read "
            f"({credentials.unreadable}): credentials revoked, disabled or re-keyed after the "
            "backup may work again; revoke them again (dockflow admin rotate-signing-key "
            "--revoke, disable or re-key clients, cameras and operators)",
            file=sys.stderr,
        )
        return
    if not credentials.steps:
        print("credentials: none revoked, disabled or re-keyed after the backup")
        return
    if credentials.reapplied:
        print("credentials changed after the backup, done again on the restored database:")
    else:
        print(
            "warning: credentials changed after the backup and NOT done again "
            "(--no-reapply-revocations): they work as at the backup",
            file=sys.stderr,
        )
    out = sys.stdout if credentials.reapplied else sys.stderr
    for step in credentials.steps:
        print(f"  {step.line}", file=out)
