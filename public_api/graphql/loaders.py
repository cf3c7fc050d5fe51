"""What a result's shipments, orders and pallets select, read a page at a time.

A field such as `Shipment.pallets` is resolved once per shipment; each resolver asks a
DataLoader here, which reads the children of every shipment of the page in one query (each
parent's first `first`, `core.reads.shipment_queries`), and only when the field is selected.
One `ReadLoaders` serves one root field's result (a page of shipments, one shipment, a
facility's docks): nothing it caches outlives that field, so a mutation never reads from a cache
what an earlier one changed, and a websocket's later operations read afresh.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Hashable, Mapping, Sequence
from typing import TypeVar

from strawberry.dataloader import DataLoader

from core.auth.access import Principal
from core.epcis import queries as epcis_queries
from core.epcis.events import Site
from core.errors import DockflowError
from core.exceptions import client as exception_client
from core.reads import shipment_queries
from core.shipments.observed import LpnProgress
from core.storage import Doc, Storage

K = TypeVar("K", bound=Hashable)
Paged = Callable[[list[K], int], Awaitable[Mapping[K, list[Doc]]]]


async def _pages(keys: Sequence[tuple[K, int]], read: Paged[K]) -> list[list[Doc] | BaseException]:
    """Answers (parent, first) keys with one read per distinct `first`; a refused `first` fails
    only the keys that asked for it."""
    by_first: dict[int, list[K]] = {}
    for parent, first in keys:
        by_first.setdefault(first, []).append(parent)
    found: dict[int, Mapping[K, list[Doc]] | DockflowError] = {}
    for first, parents in by_first.items():
        try:
            found[first] = await read(parents, first)
        except DockflowError as refused:
            found[first] = refused
    answers: list[list[Doc] | BaseException] = []
    for parent, first in keys:
        page = found[first]
        answers.append(page if isinstance(page, DockflowError) else page[parent])
    return answers


class ReadLoaders:
    """The loaders of one operation (or one mutation field)."""

    def __init__(self, storage: Storage, principal: Callable[[], Principal]) -> None:
        self.storage = storage
        self.principal = principal
        self.orders = DataLoader[tuple[int, int], list[Doc]](self._orders)
        self.items = DataLoader[tuple[str, int], list[Doc]](self._items)
        self.pallets = DataLoader[tuple[int, int], list[Doc]](self._pallets)
        self.documents = DataLoader[tuple[int, int], list[Doc]](self._documents)
        self.progress = DataLoader[tuple[int, str], LpnProgress | None](self._progress)
        self.exceptions = DataLoader[tuple[str, Hashable, int], list[Doc]](self._exceptions)
        self.sites = DataLoader[tuple[str, str], Site](self._sites)
        self.bols = DataLoader[Hashable, str | None](self._bols)
        self._observed: dict[int, frozenset[str]] = {}

    async def observed(self, shipment_id: int, direction: str) -> frozenset[str] | None:
        """The LPNs observed on the shipment (`progress`), as a set made once per shipment:
        each of its items asks."""
        if shipment_id not in self._observed:
            progress = await self.progress.load((shipment_id, direction))
            if progress is None:
                return None
            self._observed[shipment_id] = frozenset(progress.observed)
        return self._observed[shipment_id]

    async def _orders(self, keys: list[tuple[int, int]]) -> list[list[Doc] | BaseException]:
        return await _pages(
            keys, lambda ids, first: shipment_queries.orders_of(self.storage, ids, first)
        )

    async def _items(self, keys: list[tuple[str, int]]) -> list[list[Doc] | BaseException]:
        return await _pages(
            keys, lambda ids, first: shipment_queries.items_of(self.storage, ids, first)
        )

    async def _pallets(self, keys: list[tuple[int, int]]) -> list[list[Doc] | BaseException]:
        return await _pages(
            keys, lambda ids, first: shipment_queries.pallets_of(self.storage, ids, first)
        )

    async def _documents(self, keys: list[tuple[int, int]]) -> list[list[Doc] | BaseException]:
        return await _pages(
            keys, lambda ids, first: shipment_queries.documents_of(self.storage, ids, first)
        )

    async def _progress(self, keys: list[tuple[int, str]]) -> list[LpnProgress | None]:
        shipments = [
            {"_id": shipment_id, "direction": direction} for shipment_id, direction in keys
        ]
        progress = await shipment_queries.progress_of(self.storage, shipments)
        return [progress[shipment_id] for shipment_id, _ in keys]

    async def _sites(self, keys: list[tuple[str, str]]) -> list[Site | BaseException]:
        """The sites (business, facility) of a page's pallets, each read once."""
        answers: list[Site | BaseException] = []
        for business, facility in keys:
            try:
                answers.append(await epcis_queries.site_of(self.storage, business, facility))
            except DockflowError as refused:
                answers.append(refused)
        return answers

    async def _bols(self, keys: list[Hashable]) -> list[str | None]:
        """The bills of lading of a page's pallets' shipments, in one read."""
        found = await epcis_queries.bols_of(self.storage, keys)
        return [found.get(key) for key in keys]

    async def _exceptions(
        self, keys: list[tuple[str, Hashable, int]]
    ) -> list[list[Doc] | BaseException]:
        """`Shipment.exceptions` and `Pallet.exceptions` of a page: one query per field."""
        answers: dict[tuple[str, Hashable, int], list[Doc] | BaseException] = {}
        for field in {field for field, _, _ in keys}:

            async def read(
                ids: list[Hashable], first: int, field: str = field
            ) -> dict[Hashable, list[Doc]]:
                found = await exception_client.of_parents(
                    self.storage, self.principal(), field, ids, first
                )
                return dict(zip(ids, found, strict=True))

            mine = [(parent, first) for f, parent, first in keys if f == field]
            for (parent, first), answer in zip(mine, await _pages(mine, read), strict=True):
                answers[(field, parent, first)] = answer
        return [answers[key] for key in keys]
