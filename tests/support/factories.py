"""Test data built through the real core functions (never inserted behind their back)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from core.feed.publish import NewMessage, build_messages
from core.services import Services
from core.storage import Storage
from core.tenancy import tenants
from core.tenancy.tenants import ApiClient, LabelFieldMapping
from tests.support.feed_writers import commit_messages

DEFAULT_LABELS = (
    LabelFieldMapping("lpn", "licensePlate"),
    LabelFieldMapping("sku", "skus", multiple=True),
    LabelFieldMapping("lot", "lotNumber"),
    LabelFieldMapping("expiry", "expirationDate"),
)


def pallet_payload(
    business: str = "acme",
    facility: str = "dc1",
    n: int = 0,
    *,
    shipment_id: int = 1,
    **labels: Any,
) -> dict[str, Any]:
    """A PALLET_EVENT payload of the published shape (its JSON Schema), for tests that write
    messages without a camera; `labels` are extra label fields (strings or lists of them)."""
    return {
        "businessSlug": business,
        "facilitySlug": facility,
        "serviceShipmentId": str(shipment_id),
        "servicePalletId": f"plt_{n:06d}",
        "occurredAt": "2026-05-01T12:00:00.000Z",
        "url": f"http://testserver/dashboard/pallets/plt_{n:06d}",
        "direction": "LOADING",
        "orders": ["SO-1"],
        "dockId": "D1",
        **labels,
    }


@dataclass
class Tenant:
    """A business with one facility, an API client with a token, and a camera per dock."""

    business: str
    facility: str
    docks: tuple[str, ...]
    client_id: str
    client_secret: str
    token: str
    camera_ids: dict[str, str] = field(default_factory=dict)
    camera_tokens: dict[str, str] = field(default_factory=dict)

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def camera_metadata(self, dock: str = "D1") -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.camera_tokens[dock]}"),)


async def make_tenant(
    services: Services,
    business: str = "acme",
    facility: str = "dc1",
    docks: tuple[str, ...] = ("D1", "D2", "D3", "D4"),
    *,
    complete_on_all_lpns: bool = True,
) -> Tenant:
    storage = services.storage
    await tenants.create_business(storage, business, f"{business.title()} Inc.")
    await tenants.create_facility(
        storage,
        business,
        facility,
        name=f"{facility.upper()} warehouse",
        docks=docks,
        timezone="America/Chicago",
        label_fields=DEFAULT_LABELS,
        complete_on_all_lpns=complete_on_all_lpns,
    )
    created = await tenants.create_client(storage, business, name="integration")
    client: ApiClient = created.entity
    issued = await services.tokens.issue(client)
    tenant = Tenant(
        business=business,
        facility=facility,
        docks=docks,
        client_id=client.client_id,
        client_secret=created.secret,
        token=issued.access_token,
    )
    for dock in docks:
        camera = await tenants.create_camera(storage, business, facility, dock=dock)
        tenant.camera_ids[dock] = camera.entity.camera_id
        tenant.camera_tokens[dock] = camera.secret
    return tenant


async def feed_of_earlier_release(storage: Storage, by_id: dict[int, str]) -> None:
    """The push message feed as the release before per-business message ids left it: messages
    of every business (`by_id`: id -> business) numbered by one global sequence, stored under
    their id, and that sequence's counter."""
    for message_id, business in sorted(by_id.items()):
        payload = pallet_payload(business, "dc1", message_id, sequence=str(message_id))
        new = NewMessage(business, "dc1", "PALLET_EVENT", payload, shipment_id=1)
        written = await build_messages(storage, [new], ids=[message_id])
        await commit_messages(storage, written)
    await storage.counters.insert_one({"_id": "push_messages", "value": max(by_id)})
