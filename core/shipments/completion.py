"""Shipment completion: exactly once per shipment, with its SHIPMENT_COMPLETE push message.

Triggers (the first one wins): DOOR_CLOSED or TRAILER_DEPARTED at the shipment's dock
(`core.shipments.dock_events`), every expected LPN observed in the expected direction when the
facility's `complete_on_all_lpns` is on (`check_all_lpns_observed`, run after each pallet batch),
or an explicit request (`complete_shipment`, used by GraphQL and the dashboard).

Exactly once: a message id is reserved, then one compare-and-set on ``completed_at: None`` stores
the completion together with that id (`completion_message_id`). Only the writer whose update
matched writes the message; a racing trigger finds ``completed_at`` set and writes nothing. If
the process dies between the two writes, the next `complete_shipment` call for the shipment
(any trigger) finds the message missing and writes it under the stored id — so the message
exists at most once, and at least once after any later completion call.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

from pymongo import ASCENDING

from core import urls
from core.epcis import events as epcis_events
from core.errors import NotFound
from core.exceptions import records, rules
from core.feed import publish
from core.settings import Settings
from core.shipments import directions, lifecycle, observed
from core.storage import Doc, Storage, insert_ignoring_duplicates
from core.tenancy.tenants import Facility, find_facility

REQUESTED = "REQUESTED"
DOOR_CLOSED = "DOOR_CLOSED"
TRAILER_DEPARTED = "TRAILER_DEPARTED"
ALL_LPNS_OBSERVED = "ALL_LPNS_OBSERVED"


@dataclass(frozen=True)
class Completion:
    shipment_id: int
    message_id: int
    reason: str
    completed_at: datetime
    # False when the shipment had already been completed (by this or another trigger).
    completed_now: bool


def pallet_key(pallet: Doc) -> str:
    """What makes two readings the same physical pallet: its LPNs, else the pallet itself."""
    lpns = sorted(pallet.get("lpns") or [])
    return "lpn:" + "|".join(lpns) if lpns else "plt:" + str(pallet["_id"])


def net_pallets(pallets: Iterable[Doc], expected: str | None = None) -> list[Doc]:
    """The pallets that stayed, in `occurred_at` order: a movement in the `expected` direction
    (LOADING for an outbound shipment) and a later one of the same pallet in the other
    direction cancel each other. A movement against the direction with nothing to cancel stays.
    Without `expected`, any two opposite movements in a row cancel. A reading declared wrong
    (`observed.counts`) is no movement: it neither stays nor cancels."""
    ordered = sorted(observed.counted(pallets), key=observed.reading_order)
    stacks: dict[str, list[Doc]] = {}
    for pallet in ordered:
        stack = stacks.setdefault(pallet_key(pallet), [])
        cancels = stack and stack[-1]["direction"] == directions.opposite(pallet["direction"])
        if cancels and expected is not None:
            cancels = stack[-1]["direction"] == expected
        if cancels:
            stack.pop()
        else:
            stack.append(pallet)
    kept = {id(p) for stack in stacks.values() for p in stack}
    return [p for p in ordered if id(p) in kept]


async def shipment_order_numbers(storage: Storage, shipment_id: int) -> list[str]:
    orders = (
        await storage.orders.find({"shipment_id": shipment_id}, {"number": 1, "created_seq": 1})
        .sort("created_seq", ASCENDING)
        .to_list()
    )
    return [str(o["number"]) for o in orders]


async def build_completion_payload(settings: Settings, storage: Storage, shipment: Doc) -> Doc:
    """The spec's shipment completion payload: its pallets net of load/unload pairs, each a
    pallet payload without occurredAt; and, for an outbound shipment, its ASN's URL."""
    shipment_id = int(shipment["_id"])
    pallets = await storage.pallets.find(
        {"shipment_id": shipment_id},
        {"payload": 1, "dock": 1, **observed.PROGRESS_FIELDS},
    ).to_list()
    kept = net_pallets(pallets, directions.reading_direction(shipment["direction"]))
    dock = shipment.get("dock") or (kept[-1]["dock"] if kept else "") or ""
    return {
        "serviceShipmentId": str(shipment_id),
        "orders": await shipment_order_numbers(storage, shipment_id),
        "url": urls.shipment_url(settings, shipment_id),
        "dockId": dock,
        "pallets": [{k: v for k, v in p["payload"].items() if k != "occurredAt"} for p in kept],
        # An outbound shipment's ASN (docs/asn.md); an inbound one has none.
        **(
            {"asn": urls.asn_url(settings, shipment_id)}
            if shipment["direction"] == "OUTBOUND"
            else {}
        ),
    }


async def _write_completion_message(
    settings: Settings, storage: Storage, shipment: Doc, message_id: int
) -> int:
    """Write the completion message under `message_id`, or under a fresh id (stored in the
    shipment) if a feed reader fenced that one; returns the id it was written under."""
    payload = await build_completion_payload(settings, storage, shipment)
    written = await publish.build_messages(
        storage,
        [
            publish.NewMessage(
                business=shipment["business"],
                facility=shipment["facility"],
                type="SHIPMENT_COMPLETE",
                payload=payload,
                shipment_id=int(shipment["_id"]),
            )
        ],
        ids=[message_id],
    )
    shipment_id = int(shipment["_id"])

    async def store_new_id(renumbered: dict[int, int]) -> None:
        for old, new in renumbered.items():
            await storage.shipments.update_one(
                {"_id": shipment_id, "completion_message_id": old},
                {"$set": {"completion_message_id": new}},
            )

    await publish.write_messages(storage, written, on_renumber=store_new_id)
    return written.ids[0]


async def complete_shipment(
    storage: Storage,
    settings: Settings,
    shipment_id: int,
    source: str,
    *,
    reason: str = REQUESTED,
    status: str | None = None,
    at: datetime | None = None,
) -> Completion:
    """Complete the shipment once and write its SHIPMENT_COMPLETE message with deliveries.

    `source` names who asked (``operator:alice``, ``client:dfc_…``, ``dock:DOOR_CLOSED``); it
    goes into the history. `status` overrides the final status (default LOADED/UNLOADED by
    direction; TRAILER_DEPARTED passes DEPARTED). Completing a completed shipment changes
    nothing and answers ``completed_now=False`` (after repairing a missing message).
    """
    at = at or lifecycle.now_ms()
    shipment = await storage.shipments.find_one({"_id": shipment_id})
    if shipment is None:
        raise NotFound(f"shipment {shipment_id} not found")
    if shipment.get("completed_at") is None:
        missing = await _missing_lpns(storage, shipment)
        # The SHORT exception's message comes before the completion's (a lower id).
        ids = list(
            await publish.reserve_message_ids(storage, shipment["business"], 2 if missing else 1)
        )
        message_id = ids[-1]
        fields: Doc = {
            "completed_at": at,
            "recorded_at": lifecycle.now_ms(),  # dockflow's clock: the event's recordTime
            "completion_reason": reason,
            "completion_message_id": message_id,
        }
        if site := await find_facility(storage, shipment["business"], shipment["facility"]):
            fields[epcis_events.RECORDED_SITE] = epcis_events.site_record(
                site.gln, site.gln_extension(shipment.get("dock") or ""), site.timezone, at
            )
        if missing:
            short = rules.short_exception(
                shipment, missing, await shipment_order_numbers(storage, shipment_id)
            )
            fields["short_exception"] = records.new_record(
                exception_id=records.exception_id(f"shipment:{shipment_id}", "SHORT"),
                code=short.code,
                priority=short.priority,
                business=shipment["business"],
                facility=shipment["facility"],
                shipment_id=shipment_id,
                pallet_id=None,
                dock=shipment.get("dock") or "",
                lpns=short.lpns,
                orders=short.orders,
                detail=short.detail,
                expected=short.expected,
                observed=short.observed,
                occurred_at=at,
                now=at,
                by=records.Actor("RULE", source),
                message_id=ids[0],
            )
        final = status or directions.done_status(shipment["direction"])
        written = await lifecycle.update_with_history(
            storage,
            shipment_id,
            status=final,
            at=at,
            source=source,
            fields=fields,
            condition={"completed_at": None},
            shipment=shipment,
        )
        if written is not None:
            await storage.orders.update_many(
                {"shipment_id": shipment_id}, {"$set": {"status": "COMPLETED"}}
            )
            await _raise_short(storage, settings, written)
            message_id = await _write_completion_message(settings, storage, written, message_id)
            return Completion(shipment_id, message_id, reason, at, completed_now=True)
        shipment = await storage.shipments.find_one({"_id": shipment_id})
        assert shipment is not None
    return await _repair(settings, storage, shipment)


async def _missing_lpns(storage: Storage, shipment: Doc) -> list[str]:
    """The expected LPNs not on the trailer, when the facility raises SHORT exceptions."""
    facility = await find_facility(storage, shipment["business"], shipment["facility"])
    if facility is None or not facility.checks("SHORT"):
        return []
    shipment_id = int(shipment["_id"])
    items, pallets = await asyncio.gather(
        storage.order_items.find({"shipment_id": shipment_id}, {"lpn": 1}).to_list(),
        storage.pallets.find(
            {"shipment_id": shipment_id},
            observed.PROGRESS_FIELDS,
        ).to_list(),
    )
    expected = observed.expected_lpns(items)
    if not expected:
        return []
    return observed.lpn_progress(shipment["direction"], expected, pallets).missing


async def _raise_short(storage: Storage, settings: Settings, shipment: Doc) -> None:
    """Store the SHORT exception a completion holds, and its message (again after a crash:
    what exists is kept)."""
    record = shipment.get("short_exception")
    if record is None:
        return
    if await insert_ignoring_duplicates(storage, "exceptions", [record]):
        records.count_raised([record])
    stored = await storage.exceptions.find_one({"_id": record["_id"]})
    await records.publish_missing(storage, settings, [stored or record])


async def _repair(settings: Settings, storage: Storage, shipment: Doc) -> Completion:
    """A completed shipment: make sure its completion message exists (a crash may have come
    between the completion and the message), and its SHORT exception's before it."""
    await _raise_short(storage, settings, shipment)
    message_id = shipment.get("completion_message_id")
    if message_id is None:  # completed by an older code path: nothing to repair
        message_id = 0
    elif (
        await storage.push_messages.count_documents(
            {"_id": message_id, publish.VOID: {"$exists": False}}
        )
        == 0
    ):
        # Missing, or fenced by a feed reader (then it is written under a fresh id).
        message_id = await _write_completion_message(settings, storage, shipment, int(message_id))
    return Completion(
        int(shipment["_id"]),
        int(message_id),
        shipment.get("completion_reason") or REQUESTED,
        shipment["completed_at"],
        completed_now=False,
    )


async def check_all_lpns_observed(
    storage: Storage,
    settings: Settings,
    shipment_ids: Iterable[int],
    facilities: Mapping[tuple[str, str], Facility] | None = None,
) -> list[Completion]:
    """Complete each shipment whose expected LPNs were all observed (`core.shipments.observed`),
    if its facility's policy says so. `facilities` are those the caller has read already;
    others are looked up."""
    done: list[Completion] = []
    ids = sorted(set(shipment_ids))
    if not ids:
        return done
    # The shipments and their order items together (one round trip of waiting, not two).
    shipments, items = await asyncio.gather(
        storage.shipments.find(
            {"_id": {"$in": ids}, "completed_at": None},
            {"business": 1, "facility": 1, "direction": 1},
        ).to_list(),
        storage.order_items.find(
            {"shipment_id": {"$in": ids}}, {"shipment_id": 1, "lpn": 1}
        ).to_list(),
    )
    items_of: dict[int, list[Doc]] = {}
    for item in items:
        items_of.setdefault(int(item["shipment_id"]), []).append(item)
    known = facilities or {}
    policies: dict[tuple[str, str], bool] = {}
    for shipment in shipments:
        shipment_id = int(shipment["_id"])
        site = (shipment["business"], shipment["facility"])
        if site not in policies:
            facility = known.get(site) or await find_facility(storage, *site)
            policies[site] = facility is not None and facility.complete_on_all_lpns
        expected = observed.expected_lpns(items_of.get(shipment_id, []))
        if not (policies[site] and expected):
            continue  # the rule is off, or nothing to observe: no pallets to read
        pallets = await storage.pallets.find(
            {"shipment_id": shipment_id},
            observed.PROGRESS_FIELDS,
        ).to_list()
        if observed.lpn_progress(shipment["direction"], expected, pallets).all_observed:
            done.append(
                await complete_shipment(
                    storage, settings, shipment_id, "pallet", reason=ALL_LPNS_OBSERVED
                )
            )
    return done
