"""Robustness of the embedded database engines, measured the same way for each.

    python -m bench.engines kill-restart --engine secantusdb
    python -m bench.engines disk-full --engine nx-27017        (root: mounts a small tmpfs)
    python -m bench.engines large --engine secantusdb --gib 10

Each scenario starts the engine's server itself (as the embedded supervisor would: a child
process on a free loopback port, its files in a directory of its own), drives it with pymongo
and prints one JSON line of figures. Nothing of dockflow's service runs: these measure the
server the service would stand on.

- kill-restart: a writer inserts acknowledged documents one by one; the server is SIGKILLed at
  a random moment, restarted on the same files, and every acknowledged document must be there.
  Figures: rounds, acknowledged documents lost (must be 0), seconds to answer again.
- disk-full: the data directory is a small tmpfs; the writer goes on until writes fail. Figures:
  what the client was told, whether the server stayed up and kept answering reads, whether
  writes work again once a few MiB are freed, and whether every acknowledged document survived
  a restart once the disk is made twice as large.
- large: fills the data directory to `--gib` GiB of 64 KiB documents with an index, then
  restarts. Figures: fill rate, start-up time, resident memory, an indexed lookup's median.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pymongo import MongoClient, WriteConcern
from pymongo.errors import PyMongoError

from bench.harness import free_port
from core.settings import EmbeddedEngine
from dockflow.embedded import supervisor

ENGINES = tuple(supervisor.ENGINES)
START_TIMEOUT_S = 900.0  # a large data directory may take minutes to open
WRITE_CONCERNS = {
    "w1": WriteConcern(w=1),
    "journal": WriteConcern(w=1, j=True),
    "majority": WriteConcern(w="majority"),
}


class Server:
    """One engine's server on a free port over `data_dir`, restartable on the same files."""

    def __init__(
        self,
        engine: EmbeddedEngine,
        data_dir: Path,
        *,
        extra: tuple[str, ...] = (),
        log_dir: Path | None = None,
    ) -> None:
        self.engine = engine
        self.log_path = (log_dir or data_dir.parent) / f"{engine}.log"
        self.extra = extra
        self.data_dir = data_dir
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        data_dir.mkdir(parents=True, exist_ok=True)

    @property
    def url(self) -> str:
        return f"mongodb://127.0.0.1:{self.port}/?directConnection=true"

    def argv(self) -> list[str]:
        """The command the embedded supervisor starts the engine with, plus `extra`."""
        command = supervisor.ENGINES[self.engine].command(
            self.data_dir, self.port, self.log_path, supervisor.TransactionLimits()
        )
        return [*command, *self.extra]

    def start(self) -> float:
        """Start and wait until it answers ping; returns the seconds that took."""
        supervisor.ENGINES[self.engine].prepare(self.data_dir)
        began = time.monotonic()
        log = open(self.log_path, "ab")  # noqa: SIM115
        self.process = subprocess.Popen(
            self.argv(), stdout=log, stderr=log, stdin=subprocess.DEVNULL
        )
        log.close()
        while time.monotonic() - began < START_TIMEOUT_S:
            if self.process.poll() is not None:
                tail = self.log_path.read_text(errors="replace")[-1500:]
                raise RuntimeError(
                    f"{self.engine} exited at start ({self.process.returncode}): {tail}"
                )
            with contextlib.suppress(PyMongoError), self.client(500) as client:
                client.admin.command("ping")
                return time.monotonic() - began
            time.sleep(0.05)
        raise RuntimeError(f"{self.engine} did not answer within {START_TIMEOUT_S} s")

    @contextlib.contextmanager
    def client(self, timeout_ms: int = 10_000) -> Iterator[MongoClient[dict[str, Any]]]:
        client: MongoClient[dict[str, Any]] = MongoClient(
            self.url, serverSelectionTimeoutMS=timeout_ms, connectTimeoutMS=timeout_ms
        )
        try:
            yield client
        finally:
            client.close()

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def rss_mib(self) -> float:
        assert self.process is not None
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return 0.0


def _writer(
    server: Server, acked: list[int], stop: threading.Event, size: int, concern: str
) -> None:
    """Insert documents one by one, recording each id the server acknowledged."""
    payload = "x" * size
    with server.client(2000) as client:
        collection = client.robust.get_collection("docs", write_concern=WRITE_CONCERNS[concern])
        next_id = max(acked, default=0) + 1
        while not stop.is_set():
            try:
                collection.insert_one({"_id": next_id, "payload": payload})
            except PyMongoError:
                return
            acked.append(next_id)
            next_id += 1


def kill_restart(
    engine: EmbeddedEngine, work: Path, rounds: int, concern: str, extra: tuple[str, ...]
) -> dict[str, Any]:
    server = Server(engine, work / "data", extra=extra)
    server.start()
    acked: list[int] = []
    restart_s: list[float] = []
    for _ in range(rounds):
        stop = threading.Event()
        thread = threading.Thread(target=_writer, args=(server, acked, stop, 512, concern))
        thread.start()
        time.sleep(random.uniform(1.0, 3.0))
        server.kill()
        stop.set()
        thread.join()
        restart_s.append(server.start())
    with server.client() as client:
        stored = {d["_id"] for d in client.robust.docs.find({}, {"_id": 1})}
    server.stop()
    lost = sorted(set(acked) - stored)
    return {
        "scenario": "kill-restart",
        "engine": engine,
        "server_options": " ".join(extra),
        "write_concern": concern,
        "rounds": rounds,
        "acknowledged": len(acked),
        "lost": len(lost),
        "restart_s_median": round(statistics.median(restart_s), 2),
        "restart_s_max": round(max(restart_s), 2),
    }


def disk_full(engine: EmbeddedEngine, work: Path, size_mib: int) -> dict[str, Any]:
    mount = work / "small"
    mount.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_mib}m", "tmpfs", str(mount)],
        check=True,
    )
    try:
        filler = mount / "filler"
        filler.write_bytes(b"\0" * (4 * 1024 * 1024))  # freed later, to see writes recover
        server = Server(engine, mount / "data", log_dir=work)
        server.start()
        acked: list[int] = []
        error = ""
        began = time.monotonic()
        with server.client(5000) as client:
            collection = client.robust.docs
            payload = "y" * 4096
            while time.monotonic() - began < 300:
                try:
                    collection.insert_one({"_id": len(acked) + 1, "payload": payload})
                except PyMongoError as exc:
                    error = f"{type(exc).__name__}: {str(exc)[:200]}"
                    break
                acked.append(len(acked) + 1)
            alive_after = server.alive()
            reads_ok = False
            with contextlib.suppress(PyMongoError):
                reads_ok = collection.count_documents({}) >= 0
            filler.unlink()
            recovered = False
            with contextlib.suppress(PyMongoError):
                collection.insert_one({"_id": -1, "payload": "after"})
                recovered = True
        server.stop()
        # The operator's fix: more disk. Then the server must come back with every acknowledged
        # document.
        subprocess.run(
            ["mount", "-o", f"remount,size={size_mib * 2}m", str(mount)],
            check=True,
        )
        restarted = True
        try:
            server.start()
            with server.client() as client:
                stored = {d["_id"] for d in client.robust.docs.find({}, {"_id": 1})}
            server.stop()
        except Exception as exc:  # the figure is whether it comes back at all
            restarted, stored = False, set()
            error += f" / restart: {exc}"
            server.kill()
        return {
            "scenario": "disk-full",
            "engine": engine,
            "tmpfs_mib": size_mib,
            "acknowledged": len(acked),
            "client_told": error,
            "server_alive_when_full": alive_after,
            "reads_when_full": reads_ok,
            "writes_after_freeing": recovered,
            "restarted_with_more_disk": restarted,
            "lost_after_restart": len(set(acked) - stored) if restarted else None,
        }
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def large(engine: EmbeddedEngine, work: Path, gib: float) -> dict[str, Any]:
    server = Server(engine, work / "data")
    server.start()
    doc_bytes = 64 * 1024
    count = int(gib * 1024**3 / doc_bytes)
    batch = 16
    began = time.monotonic()
    with server.client(60_000) as client:
        collection = client.robust.docs
        collection.create_index("key")
        payload = os.urandom(doc_bytes // 2).hex()
        for start in range(0, count, batch):
            ids = range(start, start + batch)
            collection.insert_many([{"_id": i, "key": f"k{i}", "payload": payload} for i in ids])
    fill_s = time.monotonic() - began
    server.stop()
    on_disk = sum(f.stat().st_size for f in (work / "data").rglob("*") if f.is_file())
    start_s = server.start()
    rss_start = server.rss_mib()
    lookups: list[float] = []
    with server.client(60_000) as client:
        collection = client.robust.docs
        for _ in range(100):
            key = f"k{random.randrange(count)}"
            t = time.perf_counter()
            found = collection.find_one({"key": key}, {"payload": 0})
            lookups.append(time.perf_counter() - t)
            assert found is not None
        t = time.perf_counter()
        counted = collection.estimated_document_count()
        count_s = time.perf_counter() - t
    rss_after = server.rss_mib()
    server.stop()
    return {
        "scenario": "large",
        "engine": engine,
        "documents": count,
        "logical_gib": round(count * doc_bytes / 1024**3, 2),
        "on_disk_gib": round(on_disk / 1024**3, 2),
        "fill_mib_s": round(count * doc_bytes / 1024**2 / fill_s, 1),
        "start_s": round(start_s, 2),
        "rss_mib_after_start": round(rss_start),
        "rss_mib_after_lookups": round(rss_after),
        "indexed_lookup_ms_median": round(statistics.median(lookups) * 1000, 2),
        "estimated_count_ms": round(count_s * 1000, 2),
        "counted": counted,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.engines", description=__doc__)
    parser.add_argument("scenario", choices=("kill-restart", "disk-full", "large"))
    parser.add_argument("--engine", choices=ENGINES, required=True)
    parser.add_argument("--rounds", type=int, default=10, help="kill-restart rounds")
    parser.add_argument(
        "--write-concern", choices=sorted(WRITE_CONCERNS), default="w1", help="kill-restart's"
    )
    parser.add_argument(
        "--server-option", action="append", default=[], help="passed to secantusd-py"
    )
    parser.add_argument("--tmpfs-mib", type=int, default=64, help="disk-full's disk size")
    parser.add_argument("--gib", type=float, default=10.0, help="large's data size")
    parser.add_argument("--work", type=Path, help="working directory (default: a new temp dir)")
    args = parser.parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix=f"engines-{args.engine}-"))
    try:
        if args.scenario == "kill-restart":
            result = kill_restart(
                args.engine, work, args.rounds, args.write_concern, tuple(args.server_option)
            )
        elif args.scenario == "disk-full":
            result = disk_full(args.engine, work, args.tmpfs_mib)
        else:
            result = large(args.engine, work, args.gib)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
