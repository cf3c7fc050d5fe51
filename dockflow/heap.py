"""The server processes' garbage-collection policy: long-lived objects are kept out of the
collector's full walks (`HeapFreezer`, installed by `dockflow.runtime.serve` unless
DOCKFLOW_GC_FREEZE_HEAP=false)."""

from __future__ import annotations

import contextlib
import gc
import time

from core import metrics


class HeapFreezer:
    """Freezes the survivors of every full garbage collection, so the next one walks only what
    came since; a thaw lets one full collection walk everything again.

    A long-running server's heap is mostly long-lived: every open websocket subscription, every
    gRPC stream, the caches. CPython's full collection walks all of it, stopping the event loop:
    with 2,000 subscribers, 470 ms (`dockflow bench fanout`, docs/benchmarks.md fix 16). An
    object that survived a full collection is likely to live on; frozen, it is still freed by
    reference counting, but a reference cycle that becomes garbage while frozen (a closed
    websocket leaves ~100 objects in cycles, ~19 KiB) waits for the next thaw. So a thaw comes
    when the frozen objects have grown by `growth` (half) over what the last thawed collection
    left alive, which bounds that garbage by the live heap whatever the connection churn, and
    at the latest every `thaw_interval_s`. The callback runs when a full collection stops, so
    exactly its survivors are frozen. `install` collects at once: what startup allocated
    (modules, the GraphQL schema, routes: ~100,000 objects) is frozen first (fix 9).
    """

    def __init__(self, thaw_interval_s: float, growth: float = 0.5) -> None:
        self.thaw_interval_s = thaw_interval_s
        self.growth = growth
        self._last_thaw = time.monotonic()
        self._live = gc.get_freeze_count()  # frozen right after the last thawed collection
        self._thawed = self._live == 0  # nothing frozen yet: the next collection walks all
        self.thaws = 0

    def install(self) -> None:
        """Follow every full collection from now on, starting with one now."""
        if self._on_collection not in gc.callbacks:
            gc.callbacks.append(self._on_collection)
        gc.collect()

    def uninstall(self) -> None:
        """Stop following collections and hand every frozen object back to the collector."""
        with contextlib.suppress(ValueError):
            gc.callbacks.remove(self._on_collection)
        gc.unfreeze()

    def _on_collection(self, phase: str, info: dict[str, int]) -> None:
        if phase != "stop" or info["generation"] != 2:
            return
        gc.freeze()
        frozen = gc.get_freeze_count()
        if self._thawed:  # this collection walked everything: what it froze is alive
            self._thawed = False
            self._live = frozen
        elif (
            frozen > self._live * (1 + self.growth)
            or time.monotonic() - self._last_thaw >= self.thaw_interval_s
        ):
            gc.unfreeze()  # the next full collection walks (and frees) everything once
            self._thawed = True
            self._last_thaw = time.monotonic()
            self.thaws += 1
        metrics.FROZEN_OBJECTS.set(gc.get_freeze_count())

    def __enter__(self) -> HeapFreezer:
        self.install()
        return self

    def __exit__(self, *exc: object) -> None:
        self.uninstall()
