"""Files dockflow writes that hold secrets or data: created private (owner only) from the first
byte, never widened later by a chmod, and replaced atomically so no reader sees half a file."""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import stat
from pathlib import Path

log = logging.getLogger(__name__)

PRIVATE_DIR_MODE = 0o700  # the data directory: database files, secret key, pid and log files
PRIVATE_FILE_MODE = 0o600  # secret.key, demo credentials


def ensure_private_dir(path: Path) -> Path:
    """Create `path` (and missing parents) readable by the owner only; an existing directory
    that others may read is narrowed to the owner, with a warning."""
    path.mkdir(mode=PRIVATE_DIR_MODE, parents=True, exist_ok=True)
    narrow_to_owner(path, PRIVATE_DIR_MODE)
    return path


def narrow_to_owner(path: Path, mode: int) -> None:
    """Take group and other permissions off `path` (made before dockflow kept it private, or
    copied in); a warning names it, and one that cannot be changed (another owner) stays."""
    current = stat.S_IMODE(path.stat().st_mode)
    if not current & 0o077:
        return
    try:
        path.chmod(mode)
    except OSError as exc:
        log.warning(
            "private path is readable by others and cannot be narrowed",
            extra={"path": str(path), "mode": oct(current), "error": str(exc)},
        )
        return
    log.warning(
        "private path was readable by others; now owner only",
        extra={"path": str(path), "mode": oct(current)},
    )


def _write_temporary(directory: Path, data: bytes) -> Path:
    temporary = directory / f".{secrets.token_hex(8)}.tmp"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_FILE_MODE)
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    return temporary


def write_private_file(path: Path, data: bytes) -> None:
    """Write `data` to `path` with mode 0600 from the start, replacing it atomically."""
    ensure_private_dir(path.parent)
    temporary = _write_temporary(path.parent, data)
    try:
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def create_private_file(path: Path, data: bytes) -> bool:
    """Create `path` holding `data` (mode 0600, complete or absent) unless it exists; False
    when another process created it first (then its content is the one to use)."""
    ensure_private_dir(path.parent)
    temporary = _write_temporary(path.parent, data)
    try:
        os.link(temporary, path)  # fails if the file exists: the first writer wins
    except FileExistsError:
        return False
    finally:
        with contextlib.suppress(FileNotFoundError):
            temporary.unlink()
    return True
