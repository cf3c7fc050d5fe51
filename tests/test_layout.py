"""The tests mirror the code: a test of a rule in `core/<capability>` lives in
`tests/core/<capability>/`, and what several test modules share lives in `tests/support/`, never
in a test module or a conftest another test imports (a test module imported by another runs its
tests twice and ties unrelated files together)."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
CAPABILITIES = {
    path.stem if path.is_file() else path.name
    for path in (ROOT / "core").iterdir()
    if (path.is_dir() and (path / "__init__.py").exists())
    or (path.suffix == ".py" and path.stem != "__init__")
}


def _test_sources() -> list[Path]:
    return sorted(p for p in TESTS.rglob("*.py") if "vendor" not in p.relative_to(TESTS).parts)


def _imported_modules(source: Path) -> set[str]:
    """Every module an import in `source` names: `import a.b`, `from a.b import c` (and
    `a.b.c`, in case `c` is a module)."""
    modules: set[str] = set()
    for node in ast.walk(ast.parse(source.read_text(), str(source))):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules.add(node.module)
            modules.update(f"{node.module}.{alias.name}" for alias in node.names)
    return modules


def _is_test_module(module: str) -> bool:
    parts = module.split(".")
    if parts[0] != "tests":
        return False
    path = ROOT.joinpath(*parts).with_suffix(".py")
    return path.is_file() and (path.stem.startswith("test_") or path.stem == "conftest")


def test_no_test_module_imports_another_test_module_or_a_conftest():
    offenders = [
        f"{source.relative_to(ROOT)} imports {module}"
        for source in _test_sources()
        for module in sorted(_imported_modules(source))
        if _is_test_module(module)
    ]
    assert offenders == [], "move what they share to tests/support/: " + "; ".join(offenders)


def test_every_core_test_is_in_the_folder_of_the_capability_it_tests():
    misplaced = [
        str(path.relative_to(ROOT))
        for path in sorted((TESTS / "core").rglob("test_*.py"))
        if len(path.relative_to(TESTS / "core").parts) != 2
        or path.relative_to(TESTS / "core").parts[0] not in CAPABILITIES
    ]
    assert misplaced == [], (
        f"tests/core/<capability>/ where <capability> is one of {sorted(CAPABILITIES)}: "
        + ", ".join(misplaced)
    )


def test_the_layout_checks_see_what_they_must_refuse(tmp_path: Path):
    """The checks above would pass on an empty tree: each would catch its defect."""
    source = tmp_path / "test_x.py"
    source.write_text(
        "from tests.webhooks.conftest import receiver\nfrom tests import test_layout\n"
        "import tests.support.factories\n"
    )
    flagged = sorted(m for m in _imported_modules(source) if _is_test_module(m))
    assert flagged == ["tests.test_layout", "tests.webhooks.conftest"]
    assert {"pallets", "outbox", "storage", "settings"} <= CAPABILITIES
    assert "__init__" not in CAPABILITIES
