"""The server processes' garbage-collection policy (dockflow/runtime.py, HeapFreezer)."""

from __future__ import annotations

import gc
import weakref

from dockflow.runtime import HeapFreezer


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


def _cycle() -> _Node:
    first, second = _Node(), _Node()
    first.other, second.other = second, first
    return first


def test_survivors_of_a_full_collection_are_frozen_until_a_thaw_frees_their_cycles():
    freezer = HeapFreezer(thaw_interval_s=3600)
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
