"""`dockflow admin` run in-process against a test's database: the one helper every admin test
uses (in a thread, since the command runs its own event loop)."""

from __future__ import annotations

import asyncio
import io
import json
import os
import sys
from collections.abc import Awaitable, Callable, Mapping
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from core.settings import Settings
from dockflow import cli


class Run(NamedTuple):
    """What a command did: its exit code and what it printed (unpacks as a tuple too)."""

    code: int
    out: str
    err: str

    @property
    def json(self) -> Any:
        return json.loads(self.out)


Admin = Callable[..., Awaitable[Run]]


def admin_runner(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, *, workers_key: bool = False
) -> Admin:
    """``await admin(*argv, stdin="")``: ``dockflow admin ARGV`` on the settings' database and
    public URL; with `workers_key`, the secret key the test's served processes use (else the
    command's own, kept in the data directory, as an operator's shell has it)."""
    assert settings.mongodb_url is not None
    monkeypatch.setenv("DOCKFLOW_MONGODB_DB", settings.mongodb_db)
    monkeypatch.setenv("DOCKFLOW_PUBLIC_BASE_URL", settings.public_base_url)
    if workers_key and settings.secret_key is not None:
        monkeypatch.setenv("DOCKFLOW_SECRET_KEY", settings.secret_key)
    monkeypatch.delenv("DOCKFLOW_CONFIG_FILE", raising=False)
    database = ["--mongodb-url", settings.mongodb_url, "--data-dir", str(settings.data_dir)]

    async def run(*argv: str, stdin: str = "") -> Run:
        return await _run_cli(["admin", *argv, *database], stdin)

    return run


async def run_in_process(
    monkeypatch: pytest.MonkeyPatch,
    env: Mapping[str, str],
    *argv: str,
    stdin: str = "",
    cwd: Path | None = None,
) -> Run:
    """``dockflow ARGV`` run by this process with the DOCKFLOW_* variables of `env` (and no
    others), in `cwd` if given (the test's working directory then stays there): for a command
    whose exit code and output are the point, where starting an interpreter for it would prove
    nothing more. One at a time: the command's output is caught by swapping sys.stdout."""
    if cwd is not None:
        monkeypatch.chdir(cwd)
    for name in [name for name in os.environ if name.startswith("DOCKFLOW_")]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        if name.startswith("DOCKFLOW_"):
            monkeypatch.setenv(name, value)
    return await _run_cli(list(argv), stdin)


async def _run_cli(argv: list[str], stdin: str) -> Run:
    """`dockflow.cli.main(argv)` in a thread (it runs its own event loop), its output caught."""

    def call() -> Run:
        out, err = io.StringIO(), io.StringIO()
        saved_stdin = sys.stdin
        sys.stdin = io.StringIO(stdin)
        try:
            with redirect_stdout(out), redirect_stderr(err):
                try:
                    code = cli.main(argv)
                except SystemExit as exc:  # argparse usage errors
                    code = int(exc.code or 0)
        finally:
            sys.stdin = saved_stdin
        return Run(code, out.getvalue(), err.getvalue())

    return await asyncio.to_thread(call)
