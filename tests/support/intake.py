"""Core-level helpers for intake tests: an order's items read back as the shipment read model
(`core.reads.shipment_queries`, what GraphQL and the dashboard show) has them."""

from __future__ import annotations

from core.reads import shipment_queries
from core.storage import Doc, Storage


async def order_items(storage: Storage, order_id: str) -> list[Doc]:
    """The items of order `order_id`, in the order intake created them."""
    order = await storage.orders.find_one({"_id": order_id}, {"shipment_id": 1})
    assert order is not None, order_id
    shipment = await storage.shipments.find_one({"_id": order["shipment_id"]})
    assert shipment is not None
    (view,) = await shipment_queries.load_views(storage, [shipment])
    items = next(o.items for o in view.orders if o.order["_id"] == order_id)
    return sorted(items, key=lambda i: i.get("seq", 0))
