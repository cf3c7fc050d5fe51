"""The server processes' garbage-collection policy (dockflow/runtime.py, HeapFreezer)."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from dockflow.runtime import HeapFreezer


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


def _cycle() -> _Node:
    first, second = _Node(), _Node()
    first.other, second.other = second, first
    return first


@pytest.fixture(autouse=True)
def _only_explicit_collections() -> Iterator[None]:
    # Automatic collections while the test allocates would freeze or thaw at moments the
    # assertions do not expect (the suite's heap is large); callbacks still run for gc.collect.
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def test_survivors_of_a_full_collection_are_frozen_until_a_thaw_frees_their_cycles():
    freezer = HeapFreezer(thaw_interval_s=3600, growth=1e9)  # thaws only when told below
    gc.collect()
    frozen_before = gc.get_freeze_count()
    freezer.install()
    try:
        kept = [_cycle() for _ in range(1000)]
        gc.collect()  # a full collection: its survivors are frozen
        assert gc.get_freeze_count() >= frozen_before + 2000
        assert not any(isinstance(o, _Node) for o in gc.get_objects(generation=2))

        probe = weakref.ref(kept[0])
        del kept  # the cycles become garbage while frozen: full collections do not see them
        gc.collect()
        assert probe() is not None

        freezer.thaw_interval_s = 0  # due: the next full collection ends with a thaw
        gc.collect()
        assert gc.get_freeze_count() == 0
        assert freezer.thaws == 1

        freezer.thaw_interval_s = 3600
        gc.collect()  # walks everything once: the cycles are freed, the survivors frozen again
        assert probe() is None
        assert gc.get_freeze_count() > 0
    finally:
        freezer.uninstall()
        gc.unfreeze()
    assert freezer._on_collection not in gc.callbacks


def test_a_thaw_comes_as_soon_as_the_frozen_heap_grows_by_half():
    # Connection churn leaves cycles among frozen objects: growth, not only time, bounds them.
    gc.collect()
    gc.freeze()  # as at startup: what is alive now is the baseline
    freezer = HeapFreezer(thaw_interval_s=3600, growth=0.5)
    freezer.install()
    try:
        baseline = gc.get_freeze_count()
        kept = [_cycle() for _ in range(baseline // 8)]  # +baseline // 4 nodes: not enough
        gc.collect()
        assert freezer.thaws == 0
        assert gc.get_freeze_count() >= baseline + len(kept) * 2

        kept += [_cycle() for _ in range(baseline // 4)]  # now over half the baseline
        probe = weakref.ref(kept[0])
        gc.collect()
        assert freezer.thaws == 1
        assert gc.get_freeze_count() == 0

        del kept
        gc.collect()  # the thawed collection frees the cycles and sets the new baseline
        assert probe() is None
        assert 0 < gc.get_freeze_count() < baseline * 1.5
        gc.collect()
        assert freezer.thaws == 1
    finally:
        freezer.uninstall()
        gc.unfreeze()
