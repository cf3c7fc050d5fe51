"""Regenerate the Python gRPC code from `protos/` (``make proto``).

The generated modules are committed under ``dockflow/edge/v1`` so that the import path matches
the proto package (``dockflow.edge.v1``); ``tests/dockflow/test_proto_current.py``
fails when they are stale.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "protos"
PROTO_FILES = ["dockflow/edge/v1/edge.proto"]


def generate(out_dir: Path) -> None:
    """Run protoc (from grpcio-tools) with mypy stubs into `out_dir`."""
    import grpc_tools
    from grpc_tools import protoc

    include = Path(grpc_tools.__file__).parent / "_proto"
    args = [
        "protoc",
        f"-I{PROTO_DIR}",
        f"-I{include}",
        f"--python_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        f"--mypy_out={out_dir}",
        *PROTO_FILES,
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")


def main() -> None:
    generate(ROOT)
    sys.stdout.write(f"generated {', '.join(PROTO_FILES)}\n")


if __name__ == "__main__":
    main()
