"""`dockflow serve` as a child process for the fault tests: fixed loopback ports (a restart comes
back on the same addresses, as cameras expect), every log line kept in a file (scanned for
secrets), and the pid of its embedded MongoDB (killed in the database-loss scenario). It always
runs the embedded server, of the lane's engine (DOCKFLOW_EMBEDDED_ENGINE is inherited)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from dockflow.embedded.supervisor import engine_dir
from dockflow.liveness import running
from tests.support import backends
from tests.support.processes import free_port, interrupt

READY_LINE = "Press Ctrl-C"
START_LIMIT_S = 60.0


class ServeProcess:
    """One data directory and its ports; `start()` may be called again after a kill. On the
    embedded database, unless `mongodb_url` (with `mongodb_db`) names another."""

    def __init__(
        self,
        data_dir: Path,
        log_path: Path,
        *,
        mongodb_url: str | None = None,
        mongodb_db: str | None = None,
        command: str = "serve",
        **env: str,
    ) -> None:
        self.command = command  # serve, or one part: api, edge, webhooks
        self.data_dir = data_dir
        self.mongodb_url = mongodb_url
        self.mongodb_db = mongodb_db
        self.log_path = log_path
        self.http_port = free_port()
        self.grpc_port = free_port()
        self.env = {
            **os.environ,
            "DOCKFLOW_DATA_DIR": str(data_dir),
            "DOCKFLOW_HTTP_HOST": "127.0.0.1",
            "DOCKFLOW_HTTP_PORT": str(self.http_port),
            "DOCKFLOW_GRPC_HOST": "127.0.0.1",
            "DOCKFLOW_GRPC_PORT": str(self.grpc_port),
            "DOCKFLOW_PUBLIC_BASE_URL": f"http://127.0.0.1:{self.http_port}",
            "DOCKFLOW_LOG_FORMAT": "json",
            "DOCKFLOW_LOG_LEVEL": "INFO",
            "DOCKFLOW_WEBHOOK_ALLOW_HOSTS": '["127.0.0.1"]',
            "DOCKFLOW_SECRET_KEY": "kT0rKJ8D8k2m7aM5wXy3bq1c9Jw2s7QpVn0fHh4uLzE=",
            **env,
        }
        self.env.pop("DOCKFLOW_MONGODB_URL", None)  # the embedded database, unless given
        if mongodb_url is not None:
            self.env["DOCKFLOW_MONGODB_URL"] = mongodb_url
        if mongodb_db is not None:
            self.env["DOCKFLOW_MONGODB_DB"] = mongodb_db
        self.process: asyncio.subprocess.Process | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def grpc_target(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    async def start(self) -> None:
        """Start `dockflow <command>` and wait until it says it is ready."""
        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        with self.log_path.open("ab") as log:
            self.process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "dockflow", self.command,
                env=self.env, stdout=log, stderr=log, stdin=asyncio.subprocess.DEVNULL,
            )  # fmt: skip
        deadline = time.monotonic() + START_LIMIT_S
        while READY_LINE not in self.log_text(offset):
            if self.process.returncode is not None or time.monotonic() > deadline:
                output = self.log_text(offset)
                raise AssertionError(f"dockflow {self.command} did not start:\n{output}")
            await asyncio.sleep(0.1)

    def log_text(self, offset: int = 0) -> str:
        with self.log_path.open("rb") as log:
            log.seek(offset)
            return log.read().decode(errors="replace")

    def log_lines(self) -> list[dict[str, Any]]:
        """The JSON log lines written so far (other output skipped)."""
        lines = []
        for line in self.log_text().splitlines():
            if line.startswith("{"):
                try:
                    lines.append(json.loads(line))
                except ValueError:
                    continue
        return lines

    def database_pid(self) -> int:
        """The embedded server's pid (the lane's engine: the process inherits the setting)."""
        return int(self._database_server()["pid"])

    def database_url(self) -> str:
        """The embedded server's URL, for a client of its own beside dockflow's."""
        return str(self._database_server()["url"])

    def _database_server(self) -> dict[str, Any]:
        """What the embedded server wrote of itself when it started (its pid, its URL)."""
        server = engine_dir(self.data_dir, backends.ENGINE) / "server.json"
        state: dict[str, Any] = json.loads(server.read_text())
        return state

    async def kill(self) -> None:
        """SIGKILL: no shutdown code runs (the embedded database dies with it)."""
        assert self.process is not None
        self.process.kill()
        await self.process.wait()

    async def stop(self) -> None:
        """Ctrl-C and wait; SIGKILL if it hangs. Idempotent."""
        process, self.process = self.process, None
        await interrupt(process)


async def wait_for_exit(pid: int, limit_s: float = 30.0) -> None:
    deadline = time.monotonic() + limit_s
    while running(pid):
        if time.monotonic() > deadline:
            raise AssertionError(f"process {pid} did not exit")
        await asyncio.sleep(0.05)
