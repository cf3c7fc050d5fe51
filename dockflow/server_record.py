"""Where a running dockflow can be reached, recorded in its data directory for the commands
that talk to it (`admin`, `post-document`, `consume`, `simulate`).

Each server process (`serve`, `api`, `edge`, `webhooks`) writes ``DATA_DIR/run/<pid>.json`` once
its listeners are bound, and removes it when it stops: its public base URL (the one its tokens
name as audience and its messages link to), and its gRPC and ops addresses. A command run from
the same directory (or with the same ``--data-dir`` / ``DOCKFLOW_DATA_DIR``) reads the records of
live processes (a pid that runs with the start time recorded), the newest first, so a server
started on other ports than the defaults is found without repeating them. A server starting
removes the records that killed processes left behind. The embedded database
records its own address the same way (``mongo/<engine>/server.json``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from core.files import write_private_file
from core.settings import Settings, listener_url
from dockflow.liveness import recorded_alive, start_time

log = logging.getLogger(__name__)

RECORD_FOLDER = "run"


@dataclass(frozen=True)
class ServerRecord:
    """What one running process serves, as clients on this machine reach it."""

    pid: int
    parts: tuple[str, ...]
    public_base_url: str | None = None  # with the API
    graphql_url: str | None = None  # the token audience (with the API)
    grpc_target: str | None = None  # host:port (with the edge)
    ops_url: str | None = None
    # The hosts its webhook deliveries may reach despite the egress rules (with webhooks), so
    # that `admin create-webhook` judges a target by the allow-list of the server delivering.
    webhook_allow_hosts: tuple[str, ...] | None = None
    # When the process started (clock ticks after boot, /proc/<pid>/stat): a pid taken again
    # by another process after a kill has another start time, so its record is not believed.
    started: int | None = None


def _folder(data_dir: Path) -> Path:
    return Path(data_dir).resolve() / RECORD_FOLDER


def _client_address(bound: str) -> str:
    """host:port a client on this machine dials for a listener bound to `bound`."""
    host, _, port = bound.rpartition(":")
    return listener_url(host, port).split("://", 1)[1]


def record_for(
    settings: Settings, parts: tuple[str, ...], addresses: dict[str, str]
) -> ServerRecord:
    """This process's record from its bound `addresses` (dockflow/runtime.py)."""
    api = "http" in addresses
    return ServerRecord(
        pid=os.getpid(),
        parts=parts,
        public_base_url=settings.public_base_url if api else None,
        graphql_url=settings.graphql_url if api else None,
        grpc_target=_client_address(addresses["grpc"]) if "grpc" in addresses else None,
        ops_url=f"http://{_client_address(addresses['ops'])}" if "ops" in addresses else None,
        webhook_allow_hosts=settings.webhook_allow_hosts if "webhooks" in parts else None,
        started=start_time(os.getpid()),
    )


@contextlib.contextmanager
def recorded(data_dir: Path, record: ServerRecord) -> Iterator[None]:
    """Keep `record` in the data directory while the block runs. A data directory that cannot
    be written (a read-only container) is logged, not fatal: commands then use their defaults."""
    path = _folder(data_dir) / f"{record.pid}.json"
    _remove_dead_records(data_dir)
    try:
        write_private_file(path, json.dumps(asdict(record)).encode())
    except OSError as exc:
        log.warning(
            "cannot record this server's addresses", extra={"path": str(path), "error": str(exc)}
        )
        yield
        return
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            path.unlink()


def _records(data_dir: Path) -> list[tuple[Path, ServerRecord]]:
    """Every readable record of `data_dir`, newest first."""
    try:
        paths = sorted(_folder(data_dir).glob("*.json"), key=lambda p: p.stat().st_mtime)
    except OSError:
        return []
    found = []
    for path in reversed(paths):
        try:
            data = json.loads(path.read_text())
            record = ServerRecord(**{**data, "parts": tuple(data.get("parts", ()))})
        except (OSError, ValueError, TypeError):
            continue
        if record.webhook_allow_hosts is not None:
            record = replace(record, webhook_allow_hosts=tuple(record.webhook_allow_hosts))
        found.append((path, record))
    return found


def _remove_dead_records(data_dir: Path) -> None:
    """Remove the records of processes that are gone (killed before they could remove their
    own), so that the folder holds only servers that run."""
    for path, record in _records(data_dir):
        if not _alive(record):
            with contextlib.suppress(OSError):
                path.unlink()
                log.info("removed the record of a stopped server", extra={"path": str(path)})


def _alive(record: ServerRecord) -> bool:
    """Whether the process that wrote `record` still runs (a killed server's pid may be another
    program's now): the rule of dockflow/liveness.py."""
    return recorded_alive(record.pid, record.started, "dockflow")


def running_servers(data_dir: Path) -> list[ServerRecord]:
    """The records of the live dockflow processes of `data_dir`, newest first (the server
    started last is the one meant; a record left by a killed process is skipped). Reads only:
    nothing is created."""
    return [r for _, r in _records(data_dir) if _alive(r)]


def running_api(data_dir: Path) -> ServerRecord | None:
    """A live process of `data_dir` serving the API, if any."""
    return next((r for r in running_servers(data_dir) if r.public_base_url), None)


def running_edge(data_dir: Path) -> ServerRecord | None:
    """A live process of `data_dir` serving the camera edge, if any."""
    return next((r for r in running_servers(data_dir) if r.grpc_target), None)


def running_webhooks(data_dir: Path) -> ServerRecord | None:
    """A live process of `data_dir` delivering webhooks, if any."""
    return next((r for r in running_servers(data_dir) if r.webhook_allow_hosts is not None), None)


def none_running(command: str, data_dir: Path, using: str, options: str) -> str:
    """The one line a client command prints on stderr when no live server is recorded where it
    looked, so that a default address is never used silently: where it looked, what it uses
    instead, and how to name another server."""
    return (
        f"dockflow {command}: no running dockflow recorded in {_folder(data_dir)}; "
        f"using {using} (name another with {options})"
    )
