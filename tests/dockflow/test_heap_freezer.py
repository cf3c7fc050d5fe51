"""The server processes' garbage-collection policy (dockflow/heap.py, HeapFreezer)."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Callable, Iterator

import pytest

from core.services import Services
from core.settings import Settings
from dockflow.heap import HeapFreezer
from dockflow.runtime import serve


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


@pytest.mark.parametrize("freeze", [True, False])
async def test_serve_freezes_its_heap_unless_the_setting_turns_it_off(
    freeze: bool, settings_factory: Callable[..., Settings]
):
    stop = asyncio.Event()
    frozen_while_serving: list[int] = []

    async def started(services: Services, addresses: dict[str, str]) -> None:
        frozen_while_serving.append(gc.get_freeze_count())
        stop.set()

    await serve(settings_factory(gc_freeze_heap=freeze), (), on_started=started, stop_event=stop)

    assert (frozen_while_serving[0] > 0) is freeze
    assert gc.get_freeze_count() == 0  # handed back to the collector on stop
