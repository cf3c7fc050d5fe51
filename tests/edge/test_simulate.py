"""`dockflow simulate` against a real edge, run as the command a user types."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import grpc
import pytest

from core.storage import Storage
from edge.server import EdgeServer
from public_api.xml_documents import document_to_xml
from tests.support.camera import reading, stream
from tests.support.documents import post_shipment
from tests.support.factories import Tenant


async def _simulate(*args: str) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "dockflow", "simulate", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        stdout, stderr = await asyncio.wait_for(process.communicate(), 100)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode is not None
    return process.returncode, stdout.decode(), stderr.decode()


def _counts(stdout: str) -> dict[str, int]:
    counts = {}
    for line in stdout.splitlines():
        name, _, value = line.partition(" ")
        if name in ("ACCEPTED", "DUPLICATE", "REJECTED"):
            counts[name] = int(value)
    return counts


async def test_simulate_streams_pairs_dock_events_and_resends(
    edge_server: EdgeServer, tenant: Tenant, storage: Storage
):
    code, stdout, stderr = await _simulate(
        "--target", edge_server.address, "--camera-token", tenant.camera_tokens["D1"],
        "--pallets", "40", "--streams", "4", "--unload-pairs", "5", "--dock-events", "--resend",
    )  # fmt: skip

    assert code == 0, stderr
    assert _counts(stdout) == {"ACCEPTED": 45, "DUPLICATE": 45, "REJECTED": 0}
    assert "readings/s" in stdout
    assert "acks" in stderr  # the progress bar
    assert await storage.pallets.count_documents({}) == 45
    [complete] = await storage.push_messages.find({"type": "SHIPMENT_COMPLETE"}).to_list()
    assert len(complete["message"]["pallets"]) == 35  # 40 loaded, 5 of them unloaded again
    shipment = await storage.shipments.find_one({"_id": complete["shipment_id"]})
    assert shipment is not None
    assert shipment["status"] == "DEPARTED"


@pytest.mark.parametrize("suffix", [".json", ".xml"])
async def test_simulate_reads_the_lpns_of_a_document(
    edge_server: EdgeServer, tenant: Tenant, storage: Storage, tmp_path: Path, suffix: str
):
    shipment_id = await post_shipment(storage, tenant, {"O-1": ["A", "B"], "O-2": ["C"]})
    document = {
        "business": "acme", "facility": "dc1", "direction": "OUTBOUND", "shipmentNumber": "SHP-1",
        "orders": [{"orderNumber": "O-1", "items": [{"lpn": "A"}, {"lpn": "B"}]},
                   {"orderNumber": "O-2", "items": [{"lpn": "C"}]}],
    }  # fmt: skip
    path = tmp_path / f"shipment{suffix}"  # XML: as the API reads it (the same reader)
    path.write_text(json.dumps(document) if suffix == ".json" else document_to_xml(document))

    code, stdout, stderr = await _simulate(
        "--target", edge_server.address, "--camera-token", tenant.camera_tokens["D2"],
        "--lpns-from", str(path), "--quiet",
    )  # fmt: skip

    assert code == 0, stderr
    assert _counts(stdout)["ACCEPTED"] == 3
    assert await storage.pallets.count_documents({"shipment_id": shipment_id}) == 3
    shipment = await storage.shipments.find_one({"_id": shipment_id})
    assert shipment is not None
    assert shipment["completion_reason"] == "ALL_LPNS_OBSERVED"


async def test_simulate_with_a_bad_token_fails_with_the_status(edge_server: EdgeServer):
    code, _, stderr = await _simulate(
        "--target", edge_server.address, "--camera-token", "cam_x.nope", "--pallets", "2",
        "--quiet",
    )  # fmt: skip
    assert code == 1
    assert "UNAUTHENTICATED" in stderr


async def test_simulate_prints_the_exceptions_of_its_acks(
    edge_server: EdgeServer, tenant: Tenant, storage: Storage, channel: grpc.aio.Channel
):
    # A shipment expecting L1 and L2 is loading at D1: pallets it does not expect are unexpected.
    await post_shipment(storage, tenant, {"SO-1": ["L1", "L2"]})
    await stream(channel, tenant.camera_metadata("D1"), [reading("L1")])

    code, stdout, stderr = await _simulate(
        "--target", edge_server.address, "--camera-token", tenant.camera_tokens["D1"],
        "--pallets", "3", "--run-id", "x", "--quiet",
    )  # fmt: skip

    assert code == 0, stderr
    records = await storage.exceptions.find({"code": "UNEXPECTED_PALLET"}).to_list()
    assert len(records) == 3
    lines = [line for line in stdout.splitlines() if line.startswith("exception ")]
    assert sorted(lines) == sorted(
        f"exception UNEXPECTED_PALLET LOW {r['detail']} (id {r['_id']}, reading sim-x-{n})"
        for n, r in enumerate(sorted(records, key=lambda r: r["lpns"][0]))
    )
    assert stdout.splitlines()[-2] == "exceptions 3 (LOW 3; UNEXPECTED_PALLET 3)"
