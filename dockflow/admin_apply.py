"""`dockflow admin apply FILE.yaml`: create or update the tenants a YAML declaration names
(core/provisioning.py). `dockflow/admin.py` calls `register(admin_subparsers)`; the
command shares the runner of dockflow/admin_runner.py (`--json`, `--data-dir`, `--mongodb-url`,
one error line and exit 2)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

import yaml

from core import provisioning
from core.auth.crypto import SecretBox
from core.services import Services
from dockflow.admin_runner import SHOWN_ONCE, AdminError, Output, add_command

SECRET_KEYS = ("secret", "token", "password")  # `<key>_env: VAR` in a declaration reads $VAR


def register(admin_subparsers: Any) -> None:
    """Add the apply command to `dockflow admin`."""
    p = add_command(
        admin_subparsers,
        "apply",
        apply_declaration,
        "create or update the tenants declared in a YAML file",
    )
    p.add_argument("file", metavar="FILE.yaml", type=Path)


def load_declaration(path: Path, environ: dict[str, str] | None = None) -> Any:
    """Read a YAML declaration; ``secret_env: VAR`` (also ``token_env``, ``password_env``)
    stands for ``secret: $VAR`` so that files in version control need no secrets."""
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise AdminError(f"cannot read {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise AdminError(f"{path} is not valid YAML: {' '.join(str(exc).split())}") from None
    return _expand_env(data, os.environ if environ is None else environ, "")


def _expand_env(node: Any, environ: Any, where: str) -> Any:
    if isinstance(node, list):
        return [_expand_env(v, environ, f"{where}[{i}]") for i, v in enumerate(node)]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        path = f"{where}.{key}" if where else str(key)
        base = str(key).removesuffix("_env")
        if str(key).endswith("_env") and base in SECRET_KEYS:
            if base in node:
                raise AdminError(f"{path}: give {base} or {key}, not both")
            if not isinstance(value, str) or value not in environ:
                raise AdminError(f"{path}: environment variable {value!r} is not set")
            out[base] = environ[value]
        else:
            out[key] = _expand_env(value, environ, path)
    return out


async def apply_declaration(services: Services, args: argparse.Namespace) -> Output:
    declaration = provisioning.parse_declaration(load_declaration(args.file))
    changes = await provisioning.apply_declaration(
        services.storage, SecretBox(services.settings), declaration
    )
    counts = {
        action: sum(1 for c in changes if c.action == action)
        for action in ("created", "updated", "unchanged")
    }
    data = {
        **counts,
        "changes": [
            {
                "kind": c.kind,
                "key": c.key,
                "action": c.action,
                **({c.secret_name: c.secret} if c.secret else {}),
            }
            for c in changes
        ],
    }
    lines = [f"{c.action:<9}  {c.kind:<8}  {c.key}" for c in changes]
    secrets = [c for c in changes if c.secret]
    if secrets:
        lines.append(f"generated secrets {SHOWN_ONCE}:")
        lines += [f"  {c.kind} {c.key.split()[0]}  {c.secret_name}: {c.secret}" for c in secrets]
    lines.append(", ".join(f"{n} {action}" for action, n in counts.items()))
    return Output(data, "\n".join(lines))
