"""Real dockflow processes on one given database: `dockflow edge`, `dockflow api`,
`dockflow webhooks` (or `serve`) as children of the test, each on free loopback ports, for the
tests that need several processes to share a database as they do in production.

    async with DockflowProcess("edge", settings, tmp_path / "edge-a.log") as edge_a:
        channel = grpc.aio.insecure_channel(edge_a.grpc_target)

The process gets the test's database (`settings.mongodb_url`, `settings.mongodb_db`), its data
directory and secret key; `args` follow the part (`("--demo",)`); keyword `env` entries
(``DOCKFLOW_*``) override the rest.
"""

from __future__ import annotations

import asyncio
import os
import re
import resource
import signal
import socket
import sys
import time
from pathlib import Path
from types import TracebackType

from core.settings import Settings

PARTS = ("edge", "api", "webhooks", "serve")
READY_LINE = "Press Ctrl-C"  # dockflow's started banner ends with it (dockflow/cli.py)
START_LIMIT_S = 60.0  # two cores shared by several test runs: starting may be slow
STOP_LIMIT_S = 30.0  # a Ctrl-C'd process that has not exited by then is killed
COMMAND_LIMIT_S = 120.0  # guards a command against a hang (shared machine); not a timing assertion
# The banner's address lines (not the log lines that also name the listeners).
_GRPC_LINE = re.compile(r"^  gRPC edge +(\S+:\d+)$", re.MULTILINE)
_HTTP_LINE = re.compile(r"^  HTTP API +(http://\S+:\d+)", re.MULTILINE)
_OPS_LINE = re.compile(r"^  Ops +(http://\S+:\d+)", re.MULTILINE)


async def interrupt(process: asyncio.subprocess.Process | None) -> None:
    """Ctrl-C a child process and wait for it; SIGKILL if it has not exited within
    `STOP_LIMIT_S`. Nothing to do for none, or one that has exited."""
    if process is None or process.returncode is not None:
        return
    process.send_signal(signal.SIGINT)
    try:
        await asyncio.wait_for(process.wait(), STOP_LIMIT_S)
    except TimeoutError:
        process.kill()
        await process.wait()


class DockflowProcess:
    """One `dockflow <part>` child process on the test's database; start again after a stop."""

    def __init__(
        self,
        part: str,
        settings: Settings,
        log_path: Path,
        *,
        args: tuple[str, ...] = (),
        **env: str,
    ) -> None:
        if part not in PARTS:
            raise ValueError(f"part must be one of {PARTS}")
        assert settings.mongodb_url is not None, "a process shares the test's database"
        self.part = part
        self.args = args  # after the part, e.g. ("--demo",)
        self.log_path = log_path
        self.env = {
            **os.environ,
            "DOCKFLOW_MONGODB_URL": settings.mongodb_url,
            "DOCKFLOW_MONGODB_DB": settings.mongodb_db,
            "DOCKFLOW_DATA_DIR": str(settings.data_dir),
            "DOCKFLOW_SECRET_KEY": str(settings.secret_key),
            "DOCKFLOW_HTTP_HOST": "127.0.0.1",
            "DOCKFLOW_HTTP_PORT": "0",
            "DOCKFLOW_GRPC_HOST": "127.0.0.1",
            "DOCKFLOW_GRPC_PORT": "0",
            "DOCKFLOW_OPS_HOST": "127.0.0.1",
            "DOCKFLOW_OPS_PORT": "0",
            "DOCKFLOW_WEBHOOK_ALLOW_HOSTS": '["127.0.0.1"]',
            "DOCKFLOW_LOG_FORMAT": "console",
            **env,
        }
        self.process: asyncio.subprocess.Process | None = None
        self.grpc_target = ""  # host:port of the edge, once started (edge, serve)
        self.base_url = ""  # http://host:port of the API, once started (api, serve)
        self.ops_url = ""  # http://host:port of the ops listener, once started (edge, webhooks)

    async def start(self, *, within: float = START_LIMIT_S) -> None:
        """Start the process and return once it says it is ready (its ports are bound), failing
        if it has not within `within` seconds (more for a start that first settles much data)."""
        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        with self.log_path.open("ab") as log:
            self.process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "dockflow", self.part, *self.args,
                env=self.env, stdout=log, stderr=log, stdin=asyncio.subprocess.DEVNULL,
            )  # fmt: skip
        deadline = time.monotonic() + within
        while READY_LINE not in (output := self.log_text(offset)):
            if self.process.returncode is not None or time.monotonic() > deadline:
                await self.stop()
                raise AssertionError(f"dockflow {self.part} did not start:\n{output}")
            await asyncio.sleep(0.05)
        if grpc := _GRPC_LINE.search(output):
            self.grpc_target = grpc.group(1)
        if http := _HTTP_LINE.search(output):
            self.base_url = http.group(1)
        if ops := _OPS_LINE.search(output):
            self.ops_url = ops.group(1)

    def log_text(self, offset: int = 0) -> str:
        with self.log_path.open("rb") as log:
            log.seek(offset)
            return log.read().decode(errors="replace")

    async def kill(self) -> None:
        """SIGKILL: no shutdown code runs."""
        process, self.process = self.process, None
        if process is not None and process.returncode is None:
            process.kill()
            await process.wait()

    def signal(self, signum: int) -> None:
        """Send a signal (SIGTERM: a graceful shutdown) without waiting for the exit."""
        assert self.process is not None
        self.process.send_signal(signum)

    async def stop(self) -> None:
        """Ctrl-C and wait; SIGKILL if it hangs. Idempotent."""
        process, self.process = self.process, None
        await interrupt(process)

    async def __aenter__(self) -> DockflowProcess:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.stop()


def limit_writes(pid: int, limit: int) -> None:
    """Set the file-size limit of the running process `pid` (the embedded database server, to
    give it a full disk without root): a write past `limit` bytes into any file then fails with
    EFBIG, as one past a quota fails with EDQUOT (Python ignores SIGXFSZ, which would kill it).
    `resource.RLIM_INFINITY` gives the room back."""
    _, hard = resource.prlimit(pid, resource.RLIMIT_FSIZE)
    resource.prlimit(pid, resource.RLIMIT_FSIZE, (limit, hard))


def free_port() -> int:
    """A port free on loopback now (for a process that must be given a fixed one)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class DemoServer:
    """`dockflow serve --demo` as a newcomer runs it: in `directory` (its data in ./var there),
    on the embedded database of the test lane's engine, on the given fixed ports (0: any), with
    no DOCKFLOW_* variable of the suite's but the engine's; or with `env` instead (its
    DOCKFLOW_DATA_DIR, say), still on the given ports.

        async with DemoServer(tmp_path, http_port=free_port(), ...) as server:
            server.banner  # what it printed up to "Press Ctrl-C"
    """

    def __init__(
        self,
        directory: Path,
        *,
        http_port: int = 0,
        grpc_port: int = 0,
        ops_port: int = 0,
        env: dict[str, str] | None = None,
        log_path: Path | None = None,
    ) -> None:
        self.directory = directory
        self.ports = {"http": http_port, "grpc": grpc_port, "ops": ops_port}
        self.env = {
            **(newcomer_environment() if env is None else env),
            "DOCKFLOW_HTTP_PORT": str(http_port),
            "DOCKFLOW_GRPC_PORT": str(grpc_port),
            "DOCKFLOW_OPS_PORT": str(ops_port),
            "DOCKFLOW_LOG_FORMAT": "console",
        }
        self.log_path = log_path or directory / "serve.log"
        self.process: asyncio.subprocess.Process | None = None
        self.banner = ""

    @property
    def data_dir(self) -> Path:
        """Where it keeps its data: DOCKFLOW_DATA_DIR, else ./var of its directory."""
        return Path(self.env.get("DOCKFLOW_DATA_DIR") or self.directory / "var")

    def find(self, pattern: str) -> str:
        """The first group of `pattern` in the banner (an address, a credential)."""
        found = re.search(pattern, self.banner)
        assert found is not None, self.banner
        return found.group(1)

    async def __aenter__(self) -> DemoServer:
        await self.start()
        return self

    async def start(self, **ports: int) -> None:
        """Start (again, after a stop: on new `ports` if given, e.g. ``http=free_port()``)."""
        for name, port in ports.items():
            self.ports[name] = port
            self.env[f"DOCKFLOW_{name.upper()}_PORT"] = str(port)
        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        with self.log_path.open("ab") as log:
            self.process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "dockflow", "serve", "--demo",
                cwd=self.directory, env=self.env, stdout=log, stderr=log,
                stdin=asyncio.subprocess.DEVNULL,
            )  # fmt: skip
        deadline = time.monotonic() + START_LIMIT_S
        while READY_LINE not in (output := self._log_from(offset)):
            if self.process.returncode is not None or time.monotonic() > deadline:
                await self.stop()
                raise AssertionError(f"dockflow serve --demo did not start:\n{output}")
            await asyncio.sleep(0.05)
        self.banner = output

    def _log_from(self, offset: int) -> str:
        with self.log_path.open("rb") as log:
            log.seek(offset)
            return log.read().decode(errors="replace")

    async def stop(self) -> None:
        """Ctrl-C and wait; SIGKILL if it hangs. Idempotent."""
        process, self.process = self.process, None
        await interrupt(process)

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()


async def run_dockflow(
    *argv: str, cwd: Path | None = None, env: dict[str, str] | None = None
) -> tuple[int, str, str]:
    """`dockflow ARGV` run to its end (in `cwd`; with `env`, else `newcomer_environment()`):
    its exit code, stdout and stderr. Killed if it hangs past COMMAND_LIMIT_S."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "dockflow", *argv,
        cwd=cwd, env=newcomer_environment() if env is None else env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        stdin=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    try:
        out, err = await asyncio.wait_for(process.communicate(), COMMAND_LIMIT_S)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


def newcomer_environment() -> dict[str, str]:
    """This environment without the suite's DOCKFLOW_* variables, but with its lane's engine:
    what a user's shell holds."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("DOCKFLOW_")}
    if "DOCKFLOW_EMBEDDED_ENGINE" in os.environ:
        env["DOCKFLOW_EMBEDDED_ENGINE"] = os.environ["DOCKFLOW_EMBEDDED_ENGINE"]
    return env
