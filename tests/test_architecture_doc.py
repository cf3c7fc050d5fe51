"""docs/architecture.md lists the layers of core's capabilities exactly as the layering contract
has them, in order, and the contract lets no upward import through: a reader of the document
sees exactly what `lint-imports` enforces."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# A row of the document's table of layers: | `exceptions` | what | or | `a`, `b` | what |
ROW = re.compile(r"^\s*\|\s*(`[\w.]+`(?:,\s*`[\w.]+`)*)\s*\|", re.MULTILINE)
NAME = re.compile(r"`([\w.]+)`")


def _layers_contract() -> dict[str, Any]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    [layers] = [
        contract
        for contract in config["tool"]["importlinter"]["contracts"]
        if contract["type"] == "layers" and contract.get("containers") == ["core"]
    ]
    return layers


def _documented_layers() -> list[list[str]]:
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text[text.index("## Layers") :]
    table = section[section.index("| layer |") :]
    table = table[: table.index("\n\n")]
    return [NAME.findall(cells) for cells in ROW.findall(table)]


def test_the_architecture_doc_lists_the_contracts_layers_in_order():
    contract = [
        [name.strip() for name in re.split(r"[|:]", layer)]
        for layer in _layers_contract()["layers"]
    ]

    assert _documented_layers() == contract


def test_the_layers_contract_ignores_no_import():
    assert _layers_contract().get("ignore_imports", []) == []
