"""The documents a stored reading leaves: its pallet (with the payload of its PALLET_EVENT
message), its message, and its claim (docs/data-model.md)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from core import urls
from core.epcis import events as epcis_events
from core.feed import publish
from core.pallets.matching import position_id
from core.pallets.readings import ReadingInBatch, label_docs
from core.settings import Settings
from core.storage import Doc


def pallet_doc(settings: Settings, item: ReadingInBatch, now: datetime) -> Doc:
    """A matched reading's pallet document, holding its message's payload and id."""
    assert item.shipment is not None
    assert item.facility is not None
    assert item.occurred_at is not None
    shipment_id = int(item.shipment["_id"])
    payload: dict[str, Any] = {
        "businessSlug": item.camera.business,
        "facilitySlug": item.camera.facility,
        "serviceShipmentId": str(shipment_id),
        "servicePalletId": item.pallet_id,
        "occurredAt": publish.iso_utc(item.occurred_at),
        "url": urls.pallet_url(settings, item.pallet_id),
        "direction": item.reading.direction,
        "orders": list(item.orders),
        "dockId": item.dock,
        **item.fields,
    }
    doc: Doc = {
        "_id": item.pallet_id,
        "camera_id": item.camera.camera_id,
        "reading_id": item.reading.reading_id,
        "business": item.camera.business,
        "facility": item.camera.facility,
        "dock": item.dock,
        "direction": item.reading.direction,
        "occurred_at": item.occurred_at,
        "labels": label_docs(item.reading.labels),
        "image_urls": list(item.reading.image_urls),
        "lpns": list(item.lpns),
        "skus": list(item.skus),
        "shipment_id": shipment_id,
        "order_ids": list(item.order_ids),
        "orders": list(item.orders),
        "payload": payload,
        "message_id": item.message_id,
        "created_at": now,
        # how this pallet was read on its shipment (DUPLICATE_PALLET): see `matching._positions`
        "position": position_id(item),
    }
    if item.repeated:  # read with `.get`: most readings are no repeat
        doc["repeated"] = True
    if item.gs1.facts:  # for GraphQL, pages
        doc["gs1_labels"] = [facts.as_dict() for facts in item.gs1.facts]
    facility = item.facility  # its EPCIS event says what the site was called when read
    doc[epcis_events.RECORDED_SITE] = epcis_events.site_record(
        facility.gln,
        facility.gln_extension(item.dock),
        facility.timezone,
        item.occurred_at,
        outbound=item.shipment["direction"] == "OUTBOUND",
    )
    return doc


def claim(key: str, pallet: Doc) -> Doc:
    """The claim of a reading id (`{camera_id}:{reading_id}`): what a resend is answered with."""
    return {
        "_id": key,
        "pallet_id": pallet["_id"],
        "shipment_id": pallet["shipment_id"],
        "message_id": pallet["message_id"],
        "created_at": pallet["created_at"],
    }


def message_for(pallet: Doc) -> publish.NewMessage:
    """The PALLET_EVENT message of a pallet: its payload."""
    return publish.NewMessage(
        business=pallet["business"],
        facility=pallet["facility"],
        type="PALLET_EVENT",
        payload=pallet["payload"],
        shipment_id=int(pallet["shipment_id"]),
        pallet_id=pallet["_id"],
    )
