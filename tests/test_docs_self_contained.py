"""The repository explains itself: nothing points at a file a person who clones it does not have,
and every citation of a product decision names one that `docs/decisions.md` records."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
THIS = Path(__file__).resolve().relative_to(ROOT).as_posix()
# Files outside the repository that earlier text pointed to.
OUTSIDE = (b"DESIGN.md", b"../shared")
CITATION = re.compile(r"decisions\.md, (D\d+)(?:(?:,| and) (D\d+))?")


def _tracked() -> list[str]:
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout
    return [name for name in listed.decode().split("\0") if name and (ROOT / name).is_file()]


def test_no_tracked_file_points_outside_the_repository():
    found = [
        f"{name}: {needle.decode()}"
        for name in _tracked()
        if name != THIS
        for needle in OUTSIDE
        if needle in (ROOT / name).read_bytes()
    ]
    assert found == []


def test_every_cited_decision_is_recorded():
    recorded = set(re.findall(r"^## (D\d+)\. ", (ROOT / "docs/decisions.md").read_text(), re.M))
    assert len(recorded) >= 10
    cited: dict[str, set[str]] = {}
    for name in _tracked():
        if not name.endswith((".py", ".md")):
            continue
        for match in CITATION.finditer((ROOT / name).read_text(encoding="utf-8")):
            for decision in filter(None, match.groups()):
                cited.setdefault(decision, set()).add(name)
    # The contract cites decisions by number alone.
    for decision in re.findall(r"\b(D\d+)\b", (ROOT / "docs/contract.md").read_text()):
        cited.setdefault(decision, set()).add("docs/contract.md")
    unknown = {
        decision: sorted(names) for decision, names in cited.items() if decision not in recorded
    }
    assert unknown == {}
    assert len(cited) >= 5  # the pattern still finds the citations
