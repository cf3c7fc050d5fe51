"""The embedded database: a MongoDB-wire server as a child process, supervised.

Started when ``DOCKFLOW_MONGODB_URL`` is unset; ``DOCKFLOW_EMBEDDED_ENGINE`` picks the server:
``nx-27017`` (over SQLite, run through dockflow/embedded/launcher.py with its fixes) or
``secantusdb`` (over WiredTiger; GPL-2.0-only, so only ever its own ``secantusd-py`` program,
never imported here). Its files live under ``DATA_DIR/mongo/<engine>``, so data survives restarts
and switching engines never mixes files. A second dockflow process on the same data directory
(``dockflow admin`` while ``dockflow serve`` runs) attaches to the running server instead of
starting another one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import site
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from pymongo import AsyncMongoClient

from core.errors import DatabaseUnavailable
from core.files import PRIVATE_FILE_MODE, ensure_private_dir, write_private_file
from core.running import Running
from core.settings import EmbeddedEngine, Settings
from dockflow import liveness

log = logging.getLogger(__name__)

# nx-27017 runs with fixes for its storage layer (dockflow/embedded/launcher.py).
_LAUNCHER_MODULE = "dockflow.embedded.launcher"
# Where this dockflow's packages are: the launcher imports them from here, not from wherever the
# interpreter would find a `dockflow` from the data directory (an installed or other checkout).
CODE_ROOT = Path(__file__).resolve().parents[2]
SECANTUSD = "secantusd-py"  # SecantusDB's server program (dev lock: pip install SecantusDB)
START_TIMEOUT_S = 30.0  # a first start creates the database files; generous for slow CI disks
STOP_TIMEOUT_S = 10.0
STOPPED_POLL_S = 0.1  # how often a start looks whether the previous server has exited
WATCH_INTERVAL_S = 0.2  # how often the supervisor looks at the child
# nx-27017 aborts a transaction idle this long, and one older than this, unless set otherwise.
TRANSACTION_IDLE_S: float = Settings.model_fields["embedded_transaction_idle_s"].default
TRANSACTION_LIFETIME_S: float = Settings.model_fields["embedded_transaction_lifetime_s"].default


@dataclass(frozen=True)
class TransactionLimits:
    """How long the server lets a transaction hold its database, where the server is ours to
    set it: SQLite has one writer, so every other write waits meanwhile."""

    idle_s: float = TRANSACTION_IDLE_S  # its client said nothing for this long
    lifetime_s: float = TRANSACTION_LIFETIME_S  # this old, however chatty its client


def _site_folders() -> set[Path]:
    folders = [*site.getsitepackages(), site.getusersitepackages()]
    return {Path(folder).resolve() for folder in folders}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def _answers_ping(url: str, timeout_s: float) -> bool:
    client: AsyncMongoClient[dict[str, object]] = AsyncMongoClient(
        url, serverSelectionTimeoutMS=int(timeout_s * 1000), connectTimeoutMS=500
    )
    try:
        await client.admin.command("ping")
        return True
    except Exception:
        return False
    finally:
        await client.close()


class _Engine:
    """How one server program is started in its own directory, and what it leaves behind."""

    name: EmbeddedEngine
    log_name: str

    def command(
        self, data_dir: Path, port: int, log_path: Path, limits: TransactionLimits
    ) -> list[str]:
        """The program's command line; `limits`: when the server aborts a transaction, where
        the server is ours to set it."""
        raise NotImplementedError

    def environment(self) -> dict[str, str]:
        """The program's environment: dockflow's own."""
        return dict(os.environ)

    def prepare(self, data_dir: Path) -> None:
        """Before a start: clear what a killed server left that would stop the next one."""


class _Nx27017(_Engine):
    name: EmbeddedEngine = "nx-27017"
    log_name = "nx-27017.log"

    def command(
        self, data_dir: Path, port: int, log_path: Path, limits: TransactionLimits
    ) -> list[str]:
        return [
            # -P: its working directory (the data directory) is not put first on its path.
            sys.executable, "-P", "-m", _LAUNCHER_MODULE,
            "--data-dir", str(data_dir),
            "--host", "127.0.0.1",
            "--port", str(port),
            # Its own log handler would write each line a second time: its output goes to
            # `log_path` already (`_spawn`).
            "--log-file", os.devnull,
            "--pid-file", str(data_dir / "nx-27017.pid"),
            "--transaction-idle-s", f"{limits.idle_s:g}",
            "--transaction-lifetime-s", f"{limits.lifetime_s:g}",
        ]  # fmt: skip

    def environment(self) -> dict[str, str]:
        """The launcher and its fixes come from the code of the dockflow starting it: a
        checkout run beside an installed release (an A/B benchmark, a deploy) otherwise starts
        the installed release's server. An installed dockflow is found where it is already (a
        site-packages folder first on the path would come before the standard library)."""
        env = dict(os.environ)
        if CODE_ROOT not in _site_folders():
            given = env.get("PYTHONPATH")  # kept as it is, empty entries and all
            env["PYTHONPATH"] = os.pathsep.join(
                [str(CODE_ROOT), given] if given else [str(CODE_ROOT)]
            )
        return env

    def prepare(self, data_dir: Path) -> None:
        """nx-27017 refuses to start while its pid file names a live process. A killed server
        leaves the file behind, and with pids reused quickly (threads take pids too) the number
        may by then belong to some other process: only a live nx-27017 keeps the file."""
        pid_file = data_dir / "nx-27017.pid"
        try:
            pid = int(pid_file.read_text().strip())
        except (OSError, ValueError):
            return
        if not liveness.recorded_alive(pid, None, "nx_27017"):
            with contextlib.suppress(OSError):
                pid_file.unlink()


class _SecantusDB(_Engine):
    """``secantusd-py`` (WiredTiger). Its lock (WiredTiger.lock) is a kernel file lock, released
    when the process dies, so a killed server leaves nothing to clear. SIGTERM stops it cleanly
    (WiredTiger closed, exit 0) within a few seconds."""

    name: EmbeddedEngine = "secantusdb"
    log_name = "secantusd.log"

    def command(
        self, data_dir: Path, port: int, log_path: Path, limits: TransactionLimits
    ) -> list[str]:
        # An empty config file of our own: secantusd-py would otherwise read a secantusd.toml
        # from its working directory, ~/.secantus or /etc/secantus.
        config = data_dir / "secantusd.toml"
        if not config.exists():
            write_private_file(config, b"# dockflow passes every setting as a flag\n")
        return [
            str(find_secantusd()),
            "--config", str(config),
            "--host", "127.0.0.1",
            "--port", str(port),
            "--storage-path", str(data_dir / "data"),
            "--log-level", "WARNING",  # INFO adds a line per connection
        ]  # fmt: skip


ENGINES: dict[EmbeddedEngine, _Engine] = {
    engine.name: engine for engine in (_Nx27017(), _SecantusDB())
}


def engine_dir(data_dir: Path, engine: EmbeddedEngine) -> Path:
    """Where one engine keeps its files, log and server.json for a data directory."""
    return Path(data_dir).resolve() / "mongo" / engine


def nx_database_file(data_dir: Path, database: str) -> Path:
    """The SQLite file in which nx-27017 keeps `database` (one file per database)."""
    return engine_dir(data_dir, "nx-27017") / f"{database}.db"


def has_database(data_dir: Path, engine: EmbeddedEngine) -> bool:
    """Whether `data_dir` holds files of `engine`'s server (a start made them), in its folder
    or, for nx-27017, in the folder of the older single-folder layout. Reads only."""
    mongo_dir = Path(data_dir).resolve() / "mongo"
    folders = [engine_dir(data_dir, engine)]
    if engine == "nx-27017":
        folders.append(mongo_dir)
    for folder in folders:
        try:
            if any(path.is_file() for path in folder.iterdir()):
                return True
        except OSError:
            continue
    return running_server_pid(data_dir, engine) is not None


@dataclass(frozen=True)
class _ServerState:
    """What server.json records of the running embedded server of a folder."""

    pid: int
    started: int | None  # its start time (dockflow/liveness.py); None in older records
    url: str
    owner: int | None = None  # the dockflow process that started it; None in older records
    owner_started: int | None = None

    def alive(self, folder: Path) -> bool:
        """Whether the recorded server still runs; a record without a start time is believed
        when the process's command names `folder` (every engine's command does)."""
        return liveness.recorded_alive(self.pid, self.started, str(folder))

    def orphaned(self) -> bool:
        """Whether the dockflow that started the server is gone. Its server was told to stop
        then (`with_parent`), and may still answer while it stops, or never stop (SecantusDB
        0.7.0b3 deadlocked in its signal handler once): never to be joined."""
        if self.owner is None:
            return False
        return not liveness.recorded_alive(self.owner, self.owner_started, "dockflow")


def _server_state(folder: Path) -> _ServerState | None:
    """`folder`'s server.json, or None when it is missing or unreadable."""
    try:
        state = json.loads((folder / "server.json").read_text())
        started, owner, owner_started = (
            state.get(k) for k in ("started", "owner", "owner_started")
        )
        return _ServerState(
            pid=int(state.get("pid", 0)),
            started=None if started is None else int(started),
            url=str(state.get("url", "")),
            owner=None if owner is None else int(owner),
            owner_started=None if owner_started is None else int(owner_started),
        )
    except (OSError, ValueError, TypeError, AttributeError):
        return None


def running_server_pid(data_dir: Path, engine: EmbeddedEngine) -> int | None:
    """The pid of a live embedded server of `engine` on `data_dir`, from the server.json its
    owner wrote, or None."""
    folder = engine_dir(data_dir, engine)
    state = _server_state(folder)
    return state.pid if state is not None and state.alive(folder) else None


def find_secantusd() -> Path:
    """SecantusDB's server program: beside this Python (the venv's bin, where the dev lock puts
    it), else on PATH."""
    beside = Path(sys.executable).parent / SECANTUSD
    if beside.is_file() and os.access(beside, os.X_OK):
        return beside
    found = shutil.which(SECANTUSD)
    if found:
        return Path(found)
    raise DatabaseUnavailable(
        f"embedded engine secantusdb: {SECANTUSD} not found beside {sys.executable} or on "
        f"PATH; install the dev lock (make, from requirements-dev.txt) or "
        f"pip install SecantusDB==0.7.0b3"
    )


def _spawn(
    argv: list[str], cwd: Path, log_path: Path, env: dict[str, str]
) -> subprocess.Popen[bytes]:
    """Start the server program `argv` in `cwd` with `env`, its output appended to `log_path`."""
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, PRIVATE_FILE_MODE)
    with os.fdopen(fd, "ab") as log_file:
        return subprocess.Popen(  # noqa: S603 - fixed argv, no shell
            # Dies with dockflow, even by SIGKILL (dockflow/embedded/with_parent.py).
            [sys.executable, "-m", "dockflow.embedded.with_parent", *argv],
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=log_file,
            umask=0o077,  # its data, log and pid files are the owner's only
            start_new_session=True,  # Ctrl-C reaches dockflow, which stops the db in order
        )


def _move_legacy_nx_files(mongo_dir: Path, nx_dir: Path) -> None:
    """Before engines had folders, nx-27017's files lay in DATA_DIR/mongo itself: move them
    into its folder once, unless a server of that layout still runs there."""
    if nx_dir.exists():
        return
    legacy = [path for path in mongo_dir.iterdir() if path.is_file()]
    if not legacy:
        return
    state = _server_state(mongo_dir)
    if state is not None and state.alive(mongo_dir):
        return
    ensure_private_dir(nx_dir)
    for path in legacy:
        if path.name == "server.json":
            path.unlink()
        else:
            path.rename(nx_dir / path.name)
    log.info("moved nx-27017's files into their folder", extra={"path": str(nx_dir)})


class EmbeddedMongo(Running):
    """Owns (or attaches to) the embedded server of one engine for one data directory."""

    def __init__(
        self,
        data_dir: Path,
        restart_delay_s: float = 1.0,
        engine: EmbeddedEngine = "nx-27017",
        transaction_limits: TransactionLimits = TransactionLimits(),
    ) -> None:
        self.engine = engine
        self.transaction_limits = transaction_limits
        self._engine = ENGINES[engine]
        self.data_dir = engine_dir(data_dir, engine)
        self._mongo_dir = self.data_dir.parent
        self.url = ""
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None
        self._state_file = self.data_dir / "server.json"
        self.restart_delay_s = restart_delay_s
        self.restarts = 0
        self._watcher: asyncio.Task[None] | None = None

    async def start(self) -> str:
        """Start the server (or attach to a running one) and return its URL once it answers."""
        ensure_private_dir(self._mongo_dir)
        if self.engine == "nx-27017":
            _move_legacy_nx_files(self._mongo_dir, self.data_dir)
        ensure_private_dir(self.data_dir)
        attached = await self._attach()
        if attached:
            return attached
        await self._previous_stopped()
        self.port = _free_port()
        self.url = f"mongodb://127.0.0.1:{self.port}/?directConnection=true"
        await self._spawn_and_wait()
        return self.url

    async def _spawn_and_wait(self) -> None:
        """Start the child on `self.port` and wait until it answers ping."""
        self._engine.prepare(self.data_dir)
        log_path = self.data_dir / self._engine.log_name
        argv = self._engine.command(self.data_dir, self.port, log_path, self.transaction_limits)
        self.process = _spawn(argv, self.data_dir, log_path, self._engine.environment())
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            returncode = self.process.poll()
            if returncode is not None:
                tail = log_path.read_text(errors="replace")[-2000:]
                self.process = None
                raise DatabaseUnavailable(
                    f"embedded MongoDB ({self.engine}) exited at start (code {returncode}); "
                    f"see {log_path}:\n{tail}"
                )
            if await _answers_ping(self.url, 0.5):
                state = {
                    "pid": self.process.pid,
                    "started": liveness.start_time(self.process.pid),
                    "url": self.url,
                    "engine": self.engine,
                    "owner": os.getpid(),
                    "owner_started": liveness.start_time(os.getpid()),
                }
                write_private_file(self._state_file, json.dumps(state).encode())
                log.info(
                    "embedded MongoDB started",
                    extra={"url": self.url, "pid": self.process.pid, "engine": self.engine},
                )
                return
            await asyncio.sleep(0.1)
        process, self.process = self.process, None
        process.kill()
        await asyncio.to_thread(process.wait)
        raise DatabaseUnavailable(
            f"embedded MongoDB ({self.engine}) did not answer ping within "
            f"{START_TIMEOUT_S:.0f} s; see {log_path}"
        )

    async def _previous_stopped(self) -> None:
        """Stop a server of these files that still runs but is not joined (`_attach`): one whose
        dockflow died (a crash, SIGKILL) and that is stopping on the SIGTERM that death sent it,
        or did not stop on it. It holds its files while it runs (SecantusDB's lock refused the new
        server). As `stop` does: SIGTERM, STOP_TIMEOUT_S, then SIGKILL; only a process whose
        command names these files (a pid taken again by another program is left alone)."""
        state = _server_state(self.data_dir)
        # Killed only if its command also names these files, whatever the record says.
        if state is None or not state.alive(self.data_dir):
            return
        if not liveness.command_names(state.pid, str(self.data_dir)):
            return
        pid = state.pid
        log.warning(
            "stopping the previous embedded MongoDB: its dockflow is gone or it does not answer",
            extra={"pid": pid},
        )
        for sig, wait_s in ((signal.SIGTERM, STOP_TIMEOUT_S), (signal.SIGKILL, STOP_TIMEOUT_S)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
            for _ in range(int(wait_s / STOPPED_POLL_S)):
                await asyncio.sleep(STOPPED_POLL_S)
                if not liveness.running(pid):
                    return

    async def _attach(self) -> str | None:
        state = _server_state(self.data_dir)
        if state is None or not state.alive(self.data_dir) or not state.url:
            return None
        if state.orphaned():
            return None  # stopped by `_previous_stopped`, then started afresh
        if not await _answers_ping(state.url, 1.0):
            return None
        self.url = state.url
        log.info("attached to running embedded MongoDB", extra={"url": state.url, "pid": state.pid})
        return state.url

    def supervise(self) -> None:
        """Restart the child whenever it exits unexpectedly (killed, crashed), on the same port
        and files, so the driver reconnects by itself. Only for a server this object started."""
        if self.process is not None and self._watcher is None:
            self._watcher = asyncio.create_task(self._watch(), name="embedded-mongo-watch")

    async def _watch(self) -> None:
        while self.process is not None:
            await asyncio.sleep(WATCH_INTERVAL_S)
            process = self.process
            if process is None or process.poll() is None:
                continue
            log.error(
                "embedded MongoDB exited; restarting it",
                extra={"pid": process.pid, "returncode": process.returncode},
            )
            await asyncio.sleep(self.restart_delay_s)
            while self.process is process:  # not stopped meanwhile
                try:
                    await self._spawn_and_wait()
                    self.restarts += 1
                except DatabaseUnavailable:
                    log.exception("embedded MongoDB did not restart; trying again")
                    self.process = process  # still ours to bring back
                    await asyncio.sleep(WATCH_INTERVAL_S)

    async def stop(self) -> None:
        """Stop the server if this object started it. Idempotent."""
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
        process, self.process = self.process, None
        if process is None:
            return
        if process.poll() is None:
            process.terminate()
            try:
                await asyncio.to_thread(process.wait, STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                await asyncio.to_thread(process.wait)
        with contextlib.suppress(OSError):
            self._state_file.unlink()
        log.info("embedded MongoDB stopped", extra={"pid": process.pid})

    def stop_now(self) -> None:
        """Synchronous last resort (atexit, signal paths): never leave the child orphaned."""
        process = self.process
        if process is not None and process.poll() is None:
            process.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(STOP_TIMEOUT_S)
            if process.poll() is None:
                process.kill()
