"""docs/architecture.md lists every upward import the layering contract still ignores, and no
other: a reader of the document sees exactly what `lint-imports` lets through."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# A row of the document's table of ignored imports: | `core.a.b -> core.c.*` | why |
ROW = re.compile(r"^\s*\|\s*`(core\.[\w.*]+ -> core\.[\w.*]+)`\s*\|", re.MULTILINE)


def _ignored_by_the_layers_contract() -> set[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    [layers] = [
        contract
        for contract in config["tool"]["importlinter"]["contracts"]
        if contract["type"] == "layers" and contract.get("containers") == ["core"]
    ]
    return set(layers.get("ignore_imports", []))


def test_the_architecture_doc_lists_exactly_the_ignored_upward_imports():
    documented = ROW.findall((ROOT / "docs" / "architecture.md").read_text())
    ignored = _ignored_by_the_layers_contract()

    assert len(documented) == len(set(documented)), "a row is listed twice"
    assert sorted(ignored - set(documented)) == [], "ignored but not in docs/architecture.md"
    assert sorted(set(documented) - ignored) == [], "in docs/architecture.md but not ignored"
