"""The committed gRPC code matches `protos/` (run `make proto` after editing the .proto)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from dockflow import protogen


def test_generated_code_is_current(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    protogen.generate(tmp_path)

    committed = protogen.ROOT / "dockflow" / "edge" / "v1"
    for name in ("edge_pb2.py", "edge_pb2_grpc.py", "edge_pb2.pyi"):
        fresh = (tmp_path / "dockflow" / "edge" / "v1" / name).read_text()
        assert (committed / name).read_text() == fresh, f"{name} is stale: run `make proto`"


def test_service_is_importable_under_its_proto_package():
    from dockflow.edge.v1 import edge_pb2, edge_pb2_grpc

    assert edge_pb2.DESCRIPTOR.package == "dockflow.edge.v1"
    assert hasattr(edge_pb2_grpc, "PalletIngestServicer")
    assert [m.name for m in edge_pb2.DESCRIPTOR.services_by_name["PalletIngest"].methods] == [
        "StreamReadings",
        "SubmitReading",
        "ReportDockEvent",
    ]
