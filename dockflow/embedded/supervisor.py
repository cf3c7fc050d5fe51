"""The embedded database: an ``nx-27017`` child process (MongoDB wire protocol over SQLite).

Started when ``DOCKFLOW_MONGODB_URL`` is unset. Its files live under ``DATA_DIR/mongo``, so data
survives restarts. A second dockflow process on the same data directory (``dockflow admin`` while
``dockflow serve`` runs) attaches to the running server instead of starting another one.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from pymongo import AsyncMongoClient

from core.errors import DatabaseUnavailable
from core.files import PRIVATE_FILE_MODE, ensure_private_dir, write_private_file
from core.running import Running

log = logging.getLogger(__name__)

# The server runs with fixes for its storage layer (dockflow/embedded/launcher.py).
_LAUNCHER_MODULE = "dockflow.embedded.launcher"
START_TIMEOUT_S = 30.0  # first start creates the SQLite files; generous for slow CI disks
STOP_TIMEOUT_S = 10.0
WATCH_INTERVAL_S = 0.2  # how often the supervisor looks at the child


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _die_with_parent() -> None:
    """In the child: ask Linux to SIGTERM it if dockflow dies, even by SIGKILL."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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


def _spawn(data_dir: Path, port: int, log_path: Path) -> subprocess.Popen[bytes]:
    """Start nx-27017 on 127.0.0.1:`port`, its output appended to `log_path`."""
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, PRIVATE_FILE_MODE)
    with os.fdopen(fd, "ab") as log_file:
        return subprocess.Popen(  # noqa: S603 - fixed argv, no shell
            [
                sys.executable,
                "-m",
                _LAUNCHER_MODULE,
                "--data-dir",
                str(data_dir),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--log-file",
                str(log_path),
                "--pid-file",
                str(data_dir / "nx-27017.pid"),
            ],
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=log_file,
            umask=0o077,  # its data, log and pid files are the owner's only
            start_new_session=True,  # Ctrl-C reaches dockflow, which stops the db in order
            preexec_fn=_die_with_parent,  # runs before any thread starts in the child
        )


class EmbeddedMongo(Running):
    """Owns (or attaches to) the nx-27017 server for one data directory."""

    def __init__(self, data_dir: Path, restart_delay_s: float = 1.0) -> None:
        self.data_dir = Path(data_dir).resolve() / "mongo"
        self.url = ""
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None
        self._state_file = self.data_dir / "server.json"
        self.restart_delay_s = restart_delay_s
        self.restarts = 0
        self._watcher: asyncio.Task[None] | None = None

    async def start(self) -> str:
        """Start the server (or attach to a running one) and return its URL once it answers."""
        ensure_private_dir(self.data_dir)
        attached = await self._attach()
        if attached:
            return attached
        self.port = _free_port()
        self.url = f"mongodb://127.0.0.1:{self.port}/?directConnection=true"
        await self._spawn_and_wait()
        return self.url

    async def _spawn_and_wait(self) -> None:
        """Start the child on `self.port` and wait until it answers ping."""
        self._remove_stale_pid_file()
        log_path = self.data_dir / "nx-27017.log"
        self.process = _spawn(self.data_dir, self.port, log_path)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            returncode = self.process.poll()
            if returncode is not None:
                tail = log_path.read_text(errors="replace")[-2000:]
                self.process = None
                raise DatabaseUnavailable(
                    f"embedded MongoDB (nx-27017) exited at start (code {returncode}); "
                    f"see {log_path}:\n{tail}"
                )
            if await _answers_ping(self.url, 0.5):
                state = {"pid": self.process.pid, "url": self.url}
                write_private_file(self._state_file, json.dumps(state).encode())
                log.info(
                    "embedded MongoDB started", extra={"url": self.url, "pid": self.process.pid}
                )
                return
            await asyncio.sleep(0.1)
        process, self.process = self.process, None
        process.kill()
        await asyncio.to_thread(process.wait)
        raise DatabaseUnavailable(
            f"embedded MongoDB did not answer ping within {START_TIMEOUT_S:.0f} s"
        )

    def _remove_stale_pid_file(self) -> None:
        """nx-27017 refuses to start while its pid file names a live process. A killed server
        leaves the file behind, and with pids reused quickly (threads take pids too) the number
        may by then belong to some other process: only a live nx-27017 keeps the file."""
        pid_file = self.data_dir / "nx-27017.pid"
        try:
            pid = int(pid_file.read_text().strip())
        except (OSError, ValueError):
            return
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            command = b""
        if not (_pid_alive(pid) and b"nx_27017" in command):
            with contextlib.suppress(OSError):
                pid_file.unlink()

    async def _attach(self) -> str | None:
        try:
            state = json.loads(self._state_file.read_text())
        except (OSError, ValueError):
            return None
        if not _pid_alive(int(state.get("pid", 0))):
            return None
        url = str(state["url"])
        if not await _answers_ping(url, 1.0):
            return None
        self.url = url
        log.info("attached to running embedded MongoDB", extra={"url": url, "pid": state["pid"]})
        return url

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
