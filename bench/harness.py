"""What every benchmark scenario shares: a real `dockflow serve` process on loopback ports with a
fresh database, a tenant made through core, and the figures (percentiles, RSS, tables)."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import statistics
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pymongo import AsyncMongoClient

from bench.commands import LOG_ENV, Command, dump_log
from core.settings import Settings
from core.tenancy import tenants
from core.tenancy.tenants import LabelFieldMapping
from dockflow.database import open_services

SIZES = ("tiny", "small", "full")


@dataclass
class Server:
    """A running `dockflow serve` child process and where it listens."""

    process: asyncio.subprocess.Process
    http: str
    grpc: str
    env: dict[str, str]
    output: list[str] = field(default_factory=list)
    command_log: Path | None = None  # where `bench.commands` writes the process's commands

    @property
    def db_name(self) -> str:
        return self.env["DOCKFLOW_MONGODB_DB"]

    @property
    def url(self) -> str | None:
        """The external server's URL; None when the process runs the embedded database."""
        return self.env.get("DOCKFLOW_MONGODB_URL") or None

    async def commands(self) -> list[Command]:
        """The database commands the process has sent so far (`record_commands`)."""
        assert self.command_log is not None, "started without record_commands"
        return await dump_log(self.process, self.command_log)

    @property
    def base_url(self) -> str:
        return f"http://{self.http}"

    def settings(self) -> Settings:
        """Settings for this process's database, for a driver that needs core directly."""
        return Settings(
            data_dir=Path(self.env["DOCKFLOW_DATA_DIR"]),
            mongodb_url=self.url,
            mongodb_db=self.db_name,
            public_base_url=self.env["DOCKFLOW_PUBLIC_BASE_URL"],
            log_level="WARNING",
        )


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@asynccontextmanager
async def running_server(
    parts: str = "serve",
    extra_env: dict[str, str] | None = None,
    data_dir: Path | None = None,
    *,
    record_commands: bool = False,
    db_name: str | None = None,
) -> AsyncIterator[Server]:
    """Start `dockflow <parts>` with a fresh embedded database (or a fresh database, dropped at
    the end, on the server of DOCKFLOW_MONGODB_URL). `record_commands`: run it under
    `bench.commands`, which logs every database command it sends. `db_name`: a database of
    this run to use again (a restart of the same process)."""
    with tempfile.TemporaryDirectory(prefix="dockflow-bench-") as tmp:
        http_port = free_port()
        env = {
            **os.environ,
            "DOCKFLOW_DATA_DIR": str(data_dir or Path(tmp)),
            # Unique per run, so that runs against one external server never meet.
            "DOCKFLOW_MONGODB_DB": db_name or fresh_db_name(),
            "DOCKFLOW_HTTP_HOST": "127.0.0.1",
            "DOCKFLOW_HTTP_PORT": str(http_port),
            "DOCKFLOW_GRPC_HOST": "127.0.0.1",
            "DOCKFLOW_GRPC_PORT": str(free_port()),
            "DOCKFLOW_OPS_PORT": "0",  # beside a running `make run` (which holds 9090)
            "DOCKFLOW_PUBLIC_BASE_URL": f"http://127.0.0.1:{http_port}",
            "DOCKFLOW_LOG_LEVEL": "WARNING",
            "DOCKFLOW_LOG_FORMAT": "console",
            "DOCKFLOW_WEBHOOK_ALLOW_HOSTS": '["127.0.0.1"]',
            # One client token opens every subscriber of the fan-out benchmarks, all at once.
            "DOCKFLOW_GRAPHQL_MAX_CONNECTIONS_PER_CLIENT": "100000",
            "DOCKFLOW_GRAPHQL_MAX_PENDING_CONNECTIONS": "100000",
            "DOCKFLOW_GRAPHQL_MAX_PENDING_CONNECTIONS_PER_SOURCE": "100000",
            **(extra_env or {}),
        }
        command_log = Path(tmp) / "commands.bson" if record_commands else None
        if command_log is not None:
            env[LOG_ENV] = str(command_log)
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bench.commands" if record_commands else "dockflow", parts,
            env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        assert process.stdout is not None
        output: list[str] = []
        try:
            async with asyncio.timeout(60):
                while not any("Press Ctrl-C" in line for line in output):
                    line = (await process.stdout.readline()).decode()
                    if not line:
                        raise RuntimeError("dockflow exited at start:\n" + "".join(output))
                    output.append(line)
            text = "".join(output)
            http = re.search(r"HTTP API\s+http://([\d.]+:\d+)", text)
            grpc_addr = re.search(r"gRPC edge\s+([\d.]+:\d+)", text)
            drain = asyncio.create_task(_drain(process.stdout, output))
            yield Server(
                process=process,
                http=http.group(1) if http else "",
                grpc=grpc_addr.group(1) if grpc_addr else "",
                env=env,
                output=output,
                command_log=command_log,
            )
        finally:
            if process.returncode is None:
                process.send_signal(signal.SIGINT)
                try:
                    await asyncio.wait_for(process.wait(), 30)
                except TimeoutError:
                    process.kill()
                    await process.wait()
            if "drain" in locals():
                drain.cancel()
            if db_name is None:
                await drop_databases(env.get("DOCKFLOW_MONGODB_URL"), env["DOCKFLOW_MONGODB_DB"])


def fresh_db_name() -> str:
    return f"bench_{uuid.uuid4().hex[:16]}"


async def drop_databases(url: str | None, prefix: str) -> None:
    """Drop the run's database and the ones named after it (copies for replays) on an external
    server; the embedded one goes with its temporary data directory."""
    if not url:
        return
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(url, serverSelectionTimeoutMS=5000)
    try:
        for name in await client.list_database_names():
            if name == prefix or name.startswith(prefix + "_"):
                await client.drop_database(name)
    finally:
        await client.close()


async def _drain(stream: asyncio.StreamReader, into: list[str]) -> None:
    while line := await stream.readline():
        into.append(line.decode())
        del into[:-200]  # keep the tail for error reports


@dataclass
class BenchTenant:
    business: str
    facility: str
    docks: list[str]
    client_id: str
    client_secret: str
    token: str
    camera_tokens: list[str]


async def make_tenant(
    server: Server, docks: int = 8, webhook_url: str | None = None
) -> BenchTenant:
    """Create a business, facility, client and one camera per dock through core functions."""
    return (await make_tenants(server, ["bench"], docks, webhook_url))[0]


async def make_tenants(
    server: Server, businesses: list[str], docks: int = 1, webhook_url: str | None = None
) -> list[BenchTenant]:
    """`make_tenant` for each of `businesses` (slugs), on one connection to the database."""
    from core.auth.crypto import SecretBox
    from core.endpoints.webhook_endpoints import create_endpoint

    settings = server.settings()
    dock_slugs = [f"D{i + 1}" for i in range(docks)]
    made = []
    async with open_services(settings) as services:
        storage = services.storage
        for business in businesses:
            await tenants.create_business(storage, business, f"{business.title()} Co")
            await tenants.create_facility(
                storage, business, "dc1", docks=dock_slugs,
                label_fields=[LabelFieldMapping("lpn", "licensePlate"),
                              LabelFieldMapping("sku", "skus", multiple=True)],
            )  # fmt: skip
            client = await tenants.create_client(storage, business)
            token = (await services.tokens.issue(client.entity)).access_token
            cameras = [
                (await tenants.create_camera(storage, business, "dc1", dock=d)).secret
                for d in dock_slugs
            ]
            if webhook_url:
                await create_endpoint(storage, SecretBox(settings), business, webhook_url)
            client_id = client.entity.client_id
            made.append(
                BenchTenant(business, "dc1", dock_slugs, client_id, client.secret, token, cameras)
            )
    return made


def rss_mb(pid: int) -> float:
    """Resident set size of a process in MiB (Linux)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def percentile(values: Sequence[float], pct: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(pct / 100 * (len(ordered) - 1))))
    return ordered[index]


def summarize_ms(values: Sequence[float]) -> dict[str, float]:
    """p50/p99/max of latencies given in seconds, in milliseconds."""
    return {
        "p50_ms": percentile(values, 50) * 1000,
        "p99_ms": percentile(values, 99) * 1000,
        "max_ms": max(values) * 1000 if values else float("nan"),
        "mean_ms": statistics.fmean(values) * 1000 if values else float("nan"),
    }


def print_table(title: str, rows: list[tuple[str, Any]]) -> None:
    width = max(len(name) for name, _ in rows)
    print(f"\n{title}")
    print("-" * (width + 24))
    for name, value in rows:
        if isinstance(value, float):
            shown = f"{value:,.1f}" if abs(value) >= 10 else f"{value:.3f}"
        else:
            shown = str(value)
        print(f"{name:<{width}}  {shown:>20}")


def final_line(scenario: str, **figures: Any) -> str:
    parts = []
    for key, value in figures.items():
        if isinstance(value, float):
            shown = f"{value:.1f}" if abs(value) >= 10 else f"{value:.3f}"
        else:
            shown = str(value)
        parts.append(f"{key}={shown}")
    line = f"{scenario}: " + " ".join(parts)
    print(line, flush=True)
    return line
