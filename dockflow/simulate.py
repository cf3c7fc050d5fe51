"""``dockflow simulate``: a dock camera over gRPC, for demos, load checks and tests.

Streams pallet readings to an edge (``--target host:port``) with a camera token, optionally for
the LPNs of an intake document, over several streams at a given rate; can add load/unload pairs,
dock events around the run, and a resend of everything (which must answer DUPLICATE). Shows a
progress bar on stderr and prints on stdout the exceptions the acks carried (one line each, as a
dock display would show them), then the acks per status, the exceptions per priority and code,
and readings/s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

import grpc
from google.protobuf.timestamp_pb2 import Timestamp

from core.errors import DockflowError
from core.shipments import directions
from dockflow import server_record
from dockflow.customer_client import add_data_dir_option, data_dir
from dockflow.edge.v1 import edge_pb2, edge_pb2_grpc
from dockflow.post_document import content_type_of
from public_api.xml_documents import document_from_xml

DEFAULT_TARGET = "localhost:50051"

STATUS_NAMES = {
    edge_pb2.ACCEPTED: "ACCEPTED",
    edge_pb2.DUPLICATE: "DUPLICATE",
    edge_pb2.REJECTED: "REJECTED",
}
MAX_EXCEPTION_LINES = 200  # exceptions printed one per line; beyond, only counted


@dataclass
class SimulateOptions:
    target: str
    camera_token: str
    pallets: int = 10
    rate: float = 0.0  # readings per second over all streams; 0: as fast as acks come
    streams: int = 1
    direction: str = "LOADING"
    dock: str = ""
    lpns: list[str] = field(default_factory=list)
    # The SKUs an intake document lists per LPN, read as one `sku` label each; an LPN without
    # any gets an invented one.
    skus: dict[str, list[str]] = field(default_factory=dict)
    unload_pairs: int = 0
    dock_events: bool = False
    resend: bool = False
    run_id: str = ""
    ca_file: Path | None = None
    progress: bool = True


@dataclass
class SimulateReport:
    acks: Counter[str] = field(default_factory=Counter)
    dock_events: Counter[str] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0
    # The exceptions the acks carried: one line each (the first MAX_EXCEPTION_LINES), counts.
    exception_lines: list[str] = field(default_factory=list)
    exceptions_by_priority: Counter[str] = field(default_factory=Counter)
    exceptions_by_code: Counter[str] = field(default_factory=Counter)

    @property
    def readings(self) -> int:
        return sum(self.acks.values())

    @property
    def exceptions(self) -> int:
        return sum(self.exceptions_by_code.values())

    def record(self, ack: edge_pb2.ReadingAck) -> None:
        """Count one ack and the exceptions it carried."""
        self.acks[STATUS_NAMES.get(ack.status, "UNKNOWN")] += 1
        for exception in ack.exceptions:
            self.exceptions_by_priority[exception.priority] += 1
            self.exceptions_by_code[exception.code] += 1
            if len(self.exception_lines) < MAX_EXCEPTION_LINES:
                self.exception_lines.append(exception_line(ack.reading_id, exception))

    def summary(self) -> list[str]:
        """What the command prints on stdout: the exceptions, then the counts."""
        lines = list(self.exception_lines)
        if self.exceptions > len(self.exception_lines):
            lines.append(f"... {self.exceptions - len(self.exception_lines)} more exceptions")
        lines += [f"{status} {self.acks.get(status, 0)}" for status in STATUS_NAMES.values()]
        line = f"exceptions {self.exceptions}"
        if self.exceptions:
            priorities = ", ".join(
                f"{p} {n}" for p, n in sorted(self.exceptions_by_priority.items())
            )
            codes = ", ".join(f"{c} {n}" for c, n in sorted(self.exceptions_by_code.items()))
            line += f" ({priorities}; {codes})"
        lines.append(line)
        return lines


def exception_line(reading_id: str, exception: edge_pb2.ReadingException) -> str:
    """One exception of an ack, as a dock display would show it."""
    return (
        f"exception {exception.code} {exception.priority} {' '.join(exception.detail.split())} "
        f"(id {exception.exception_id}, reading {reading_id})"
    )


@dataclass(frozen=True)
class DocumentPallets:
    """What an intake document expects at the dock: its LPNs in order, each LPN's SKUs, and
    the reading direction its direction implies (None when it names none)."""

    lpns: list[str]
    skus: dict[str, list[str]]
    direction: str | None


def pallets_from_document(path: Path) -> DocumentPallets:
    """The pallets of an intake document, JSON or XML (read by the API's own XML reader):
    every item's LPN with the SKUs listed for it."""
    body = path.read_bytes()
    document: dict[str, Any]
    if content_type_of(path, body) == "application/xml":
        document = document_from_xml(body)
    else:
        document = json.loads(body)
    orders = document.get("orders") or [document]
    skus: dict[str, list[str]] = {}
    for order in orders:
        for item in order.get("items") or []:
            if not item.get("lpn"):
                continue
            listed = skus.setdefault(item["lpn"], [])
            if item.get("sku") and item["sku"] not in listed:
                listed.append(item["sku"])
    shipment_direction = document.get("direction")
    direction = None
    if shipment_direction in directions.SHIPMENT_DIRECTIONS:
        direction = directions.reading_direction(shipment_direction)
    return DocumentPallets(list(skus), skus, direction)


def _now() -> Timestamp:
    stamp = Timestamp()
    stamp.FromDatetime(datetime.now(UTC))
    return stamp


def build_readings(options: SimulateOptions) -> list[edge_pb2.PalletReading]:
    run_id = options.run_id or secrets.token_hex(4)
    lpns = list(options.lpns[: options.pallets])
    lpns += [f"SIM-{run_id}-{i:06d}" for i in range(len(lpns), options.pallets)]
    direction = edge_pb2.LOADING if options.direction == "LOADING" else edge_pb2.UNLOADING
    opposite = edge_pb2.UNLOADING if direction == edge_pb2.LOADING else edge_pb2.LOADING
    moves = [(lpn, direction) for lpn in lpns]
    moves += [(lpn, opposite) for lpn in lpns[: options.unload_pairs]]
    readings = []
    for number, (lpn, move) in enumerate(moves):
        readings.append(
            edge_pb2.PalletReading(
                reading_id=f"sim-{run_id}-{number}",
                dock_id=options.dock,
                direction=move,
                labels=[
                    edge_pb2.LabelField(name="lpn", value=lpn, confidence=0.99),
                    *(
                        edge_pb2.LabelField(name="sku", value=sku, confidence=0.95)
                        for sku in options.skus.get(lpn) or [f"SKU-{lpn}"]
                    ),
                ],
            )
        )
    return readings


class _Progress:
    def __init__(self, total: int, out: TextIO | None) -> None:
        self.total, self.out, self.done = total, out, 0
        self.started = self.shown = time.monotonic()

    def step(self, force: bool = False) -> None:
        self.done += 1
        now = time.monotonic()
        if self.out is None or (not force and now - self.shown < 0.2 and self.done < self.total):
            return
        self.shown = now
        width = 30
        filled = int(width * self.done / max(self.total, 1))
        rate = self.done / max(now - self.started, 1e-6)
        self.out.write(
            f"\r[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} acks "
            f"{rate:,.0f}/s"
        )
        if self.done >= self.total:
            self.out.write("\n")
        self.out.flush()


async def _stream(
    stub: edge_pb2_grpc.PalletIngestStub,
    metadata: tuple[tuple[str, str], ...],
    readings: Sequence[edge_pb2.PalletReading],
    interval_s: float,
    report: SimulateReport,
    progress: _Progress,
) -> None:
    call: Any = None

    async def requests() -> AsyncIterator[edge_pb2.PalletReading]:
        # Write only once the edge has accepted the stream: a grpc.aio client whose write fails
        # on a refused stream reports INTERNAL instead of the edge's status (grpc/grpc#36066).
        await call.initial_metadata()
        if call.done():
            return
        for reading in readings:
            reading.occurred_at.CopyFrom(_now())
            yield reading
            if interval_s:
                await asyncio.sleep(interval_s)

    call = stub.StreamReadings(requests(), metadata=metadata)
    try:
        async for ack in call:
            report.record(ack)
            progress.step()
    except grpc.aio.AioRpcError as error:
        report.errors.append(f"{error.code().name}: {error.details()}")


async def _dock_event(
    stub: edge_pb2_grpc.PalletIngestStub,
    metadata: tuple[tuple[str, str], ...],
    options: SimulateOptions,
    kind: int,
    report: SimulateReport,
) -> None:
    event = edge_pb2.DockEvent(
        event_id=f"sim-{options.run_id}-{edge_pb2.DockEventType.Name(kind)}",  # type: ignore[arg-type]
        dock_id=options.dock,
        type=kind,  # type: ignore[arg-type]
        occurred_at=_now(),
    )
    try:
        ack = await stub.ReportDockEvent(event, metadata=metadata)
        report.dock_events[STATUS_NAMES.get(ack.status, "UNKNOWN")] += 1
    except grpc.aio.AioRpcError as error:
        report.errors.append(f"{error.code().name}: {error.details()}")


async def simulate(options: SimulateOptions, out: TextIO | None = None) -> SimulateReport:
    """Run the simulation; `out` receives the progress bar (None: quiet)."""
    options.run_id = options.run_id or secrets.token_hex(4)
    readings = build_readings(options)
    metadata = (("authorization", f"Bearer {options.camera_token}"),)
    report = SimulateReport()
    # Pallets move first; the reversed moves (unload pairs) only once every first move is acked,
    # as at a real dock: spread over concurrent streams, a pair's second half could otherwise
    # be read before its first.
    reversals = min(options.unload_pairs, options.pallets)
    phases = [readings[: len(readings) - reversals], readings[len(readings) - reversals :]]
    rounds = [phase for phase in phases if phase] * (2 if options.resend else 1)
    progress = _Progress(sum(len(r) for r in rounds), out if options.progress else None)
    streams = max(1, options.streams)
    interval_s = streams / options.rate if options.rate > 0 else 0.0
    if options.ca_file is not None:
        credentials = grpc.ssl_channel_credentials(options.ca_file.read_bytes())
        channel = grpc.aio.secure_channel(options.target, credentials)
    else:
        channel = grpc.aio.insecure_channel(options.target)
    started = time.monotonic()
    async with channel:
        stub = edge_pb2_grpc.PalletIngestStub(channel)
        if options.dock_events:
            for kind in (edge_pb2.TRAILER_ARRIVED, edge_pb2.DOOR_OPENED):
                await _dock_event(stub, metadata, options, kind, report)
        for batch in rounds:
            await asyncio.gather(
                *(
                    _stream(stub, metadata, batch[n::streams], interval_s, report, progress)
                    for n in range(streams)
                )
            )
        if options.dock_events:
            for kind in (edge_pb2.DOOR_CLOSED, edge_pb2.TRAILER_DEPARTED):
                await _dock_event(stub, metadata, options, kind, report)
    report.seconds = time.monotonic() - started
    return report


def _run(args: argparse.Namespace) -> int:
    token = args.camera_token or os.environ.get("DOCKFLOW_CAMERA_TOKEN", "")
    if not token:
        print(
            "dockflow simulate: --camera-token (or DOCKFLOW_CAMERA_TOKEN) is required",
            file=sys.stderr,
        )
        return 2
    lpns: list[str] = []
    skus: dict[str, list[str]] = {}
    direction = args.direction
    document = args.shipment or args.lpns_from
    if document is not None:
        try:
            expected = pallets_from_document(Path(document))
        except (OSError, ValueError, DockflowError) as exc:
            reason = exc.detail if isinstance(exc, DockflowError) else exc
            print(f"dockflow simulate: cannot read {document}: {reason}", file=sys.stderr)
            return 2
        lpns, skus = expected.lpns, expected.skus
        direction = direction or expected.direction
    pallets = args.pallets if args.pallets is not None else (len(lpns) or 10)
    target = args.target or _recorded_target(data_dir(args))
    options = SimulateOptions(
        target=target,
        camera_token=token,
        pallets=pallets,
        rate=args.rate,
        streams=args.streams,
        direction=direction or "LOADING",
        dock=args.dock,
        lpns=lpns,
        skus=skus,
        unload_pairs=args.unload_pairs,
        dock_events=args.dock_events,
        resend=args.resend,
        run_id=args.run_id,
        ca_file=Path(args.ca_file) if args.ca_file else None,
        progress=not args.quiet,
    )
    report = asyncio.run(simulate(options, sys.stderr))
    for line in report.summary():
        print(line)
    if options.dock_events:
        events = ", ".join(f"{k} {v}" for k, v in sorted(report.dock_events.items()))
        print(f"dock events: {events}")
    rate = report.readings / report.seconds if report.seconds else 0.0
    print(f"{report.readings} readings in {report.seconds:.2f} s ({rate:,.0f} readings/s)")
    for error in report.errors:
        print(f"error: {error}", file=sys.stderr)
    return 1 if report.errors else 0


def _recorded_target(data_dir: Path) -> str:
    """The edge of the running dockflow recorded in `data_dir`; else the default, said."""
    running = server_record.running_edge(data_dir)
    if running is not None and running.grpc_target:
        return running.grpc_target
    line = server_record.none_running(
        "simulate", data_dir, DEFAULT_TARGET, "--target or --data-dir"
    )
    print(line, file=sys.stderr)
    return DEFAULT_TARGET


def register(commands: Any) -> None:
    parser = commands.add_parser("simulate", help="simulate a dock camera streaming pallets")
    parser.add_argument(
        "--target",
        help="edge address host:port (default: the running dockflow of the data directory, "
        f"else {DEFAULT_TARGET})",
    )
    add_data_dir_option(parser)
    parser.add_argument("--camera-token", help="camera bearer token (DOCKFLOW_CAMERA_TOKEN)")
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--shipment", metavar="FILE", help="intake document (JSON or XML): its LPNs"
    )
    source.add_argument("--lpns-from", metavar="FILE", help="same as --shipment")
    parser.add_argument("--pallets", type=int, help="pallets to load (default: the LPNs, or 10)")
    parser.add_argument("--rate", type=float, default=0.0, help="readings/s in all (0: no limit)")
    parser.add_argument("--streams", type=int, default=1, help="concurrent streams")
    parser.add_argument("--direction", choices=["LOADING", "UNLOADING"], help="default: LOADING")
    parser.add_argument("--dock", default="", help="dock id (default: the camera's dock)")
    parser.add_argument(
        "--unload-pairs", type=int, default=0, metavar="N", help="unload N pallets again after"
    )
    parser.add_argument(
        "--dock-events", action="store_true", help="trailer arrival/door open before, close after"
    )
    parser.add_argument("--resend", action="store_true", help="send every reading twice")
    parser.add_argument("--run-id", default="", help="reading id prefix (default: random)")
    parser.add_argument("--ca-file", help="CA certificate for a TLS edge")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.set_defaults(func=_run)
