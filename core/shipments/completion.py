"""Shipment completion: exactly once per shipment, with its SHIPMENT_COMPLETE push message.

Triggers (the first one wins): DOOR_CLOSED or TRAILER_DEPARTED at the shipment's dock
(`core.shipments.dock_events`), every expected LPN observed in the expected direction when the
facility's `complete_on_all_lpns` is on (`check_all_lpns_observed`, run after each pallet batch),
or an explicit request (`complete_shipment`, used by GraphQL and the dashboard).

One unit of work (`publish.write_with_messages`): the shipment's completion (holding its
message id, `completion_message_id`), its orders' COMPLETED status, the SHORT exception when
expected LPNs are missing, that exception's message and the completion message commit together
or not at all. Exactly once: the unit reads the shipment inside its transaction and completes it
only when ``completed_at`` is unset; of two racing triggers the later one conflicts with the
first, runs again, finds the shipment completed and writes nothing. A call on a completed
shipment answers the completion stored.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

from core import urls
from core.epcis import events as epcis_events
from core.errors import NotFound
from core.exception_codes import MAX_LPNS
from core.exceptions import records, rules
from core.feed import publish
from core.settings import Settings
from core.shipments import directions, lifecycle, observed
from core.storage import Doc, Session, Storage, Transaction, together
from core.tenancy.tenants import Facility, find_facility

REQUESTED = "REQUESTED"
DOOR_CLOSED = "DOOR_CLOSED"
TRAILER_DEPARTED = "TRAILER_DEPARTED"
ALL_LPNS_OBSERVED = "ALL_LPNS_OBSERVED"


@dataclass(frozen=True)
class Completion:
    shipment_id: int
    # None only on a completion an earlier release left half-written, until the start-up step
    # finishes it (`core.shipments.unfinished`).
    message_id: int | None
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


@dataclass(frozen=True)
class Contents:
    """What a completion reads of its shipment, once: its pallets (for the SHORT rule's missing
    LPNs and the payload) and all its order numbers by creation (the payload's; the SHORT
    record keeps the first `core.exception_codes.MAX_LPNS`)."""

    pallets: list[Doc]
    orders: list[str]


async def read_contents(storage: Storage, shipment_id: int, session: Session = None) -> Contents:
    """A shipment's `Contents`, in `session`."""
    pallets, orders = await together(
        session,
        storage.pallets.find(
            {"shipment_id": shipment_id},
            {"payload": 1, "dock": 1, **observed.PROGRESS_FIELDS},
            session=session,
        ).to_list(),
        records.shipment_order_numbers(storage, shipment_id, session),
    )
    return Contents(pallets, orders)


async def build_completion_payload(
    settings: Settings,
    storage: Storage,
    shipment: Doc,
    session: Session = None,
    contents: Contents | None = None,
) -> Doc:
    """The spec's shipment completion payload: its pallets net of load/unload pairs, each a
    pallet payload without occurredAt; and, for an outbound shipment, its ASN's URL. Built from
    `contents` when the caller has read them, else from what it reads."""
    shipment_id = int(shipment["_id"])
    if contents is None:
        contents = await read_contents(storage, shipment_id, session)
    kept = net_pallets(contents.pallets, directions.reading_direction(shipment["direction"]))
    dock = shipment.get("dock") or (kept[-1]["dock"] if kept else "") or ""
    return {
        "serviceShipmentId": str(shipment_id),
        "orders": contents.orders,
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


def _stored(shipment: Doc) -> Completion:
    """The completion a completed shipment holds."""
    message_id = shipment.get("completion_message_id")
    return Completion(
        int(shipment["_id"]),
        None if message_id is None else int(message_id),
        shipment["completion_reason"],
        shipment["completed_at"],
        completed_now=False,
    )


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
    """Complete the shipment once and write its SHIPMENT_COMPLETE message with deliveries, in
    one unit of work (see the module doc).

    `source` names who asked (``operator:alice``, ``client:dfc_…``, ``dock:DOOR_CLOSED``); it
    goes into the history. `status` overrides the final status (default LOADED/UNLOADED by
    direction; TRAILER_DEPARTED passes DEPARTED). Completing a completed shipment changes
    nothing and answers its stored completion, with ``completed_now=False``.
    """
    at = at or lifecycle.now_ms()
    shipment = await storage.shipments.find_one({"_id": shipment_id})
    if shipment is None:
        raise NotFound(f"shipment {shipment_id} not found")
    if shipment.get("completed_at") is not None:
        return _stored(shipment)
    facility = await find_facility(storage, shipment["business"], shipment["facility"])
    # A SHORT exception's message comes before the completion's (the lower of two ids); the
    # id is voided when nothing is missing.
    count = 2 if facility is not None and facility.checks("SHORT") else 1
    raised: list[Doc] = []  # the SHORT exception of the attempt that committed

    async def complete(
        ids: list[int], session: Transaction
    ) -> tuple[Completion, publish.WrittenMessages]:
        raised.clear()
        current = await storage.shipments.find_one({"_id": shipment_id}, session=session)
        if current is None:
            raise NotFound(f"shipment {shipment_id} not found")
        if current.get("completed_at") is not None:
            return _stored(current), publish.WrittenMessages()  # another trigger came first
        return await _complete(
            storage, settings, current, facility, ids, session, raised,
            source=source, reason=reason, status=status, at=at,
        )  # fmt: skip

    done = await publish.write_with_messages(
        storage, complete, business=shipment["business"], count=count
    )
    records.count_raised(raised)
    return done


async def _complete(
    storage: Storage,
    settings: Settings,
    shipment: Doc,
    facility: Facility | None,
    ids: list[int],
    session: Transaction,
    raised: list[Doc],
    *,
    source: str,
    reason: str,
    status: str | None,
    at: datetime,
) -> tuple[Completion, publish.WrittenMessages]:
    """The writes of a completion, in the transaction `session`: the shipment, its orders, the
    SHORT exception (also added to `raised`) and the messages, built from what it reads."""
    shipment_id = int(shipment["_id"])
    message_id = ids[-1]
    fields: Doc = {
        "completed_at": at,
        "recorded_at": lifecycle.now_ms(),  # dockflow's clock: the event's recordTime
        "completion_reason": reason,
        "completion_message_id": message_id,
    }
    if facility is not None:
        fields[epcis_events.RECORDED_SITE] = epcis_events.site_record(
            facility.gln, facility.gln_extension(shipment.get("dock") or ""), facility.timezone, at
        )
    contents = await read_contents(storage, shipment_id, session)
    missing = []
    if len(ids) > 1:
        missing = await missing_lpns(storage, shipment, facility, session, contents.pallets)
    short: Doc | None = None
    if missing:
        short = short_record(shipment, missing, contents.orders, source, at, ids[0])
        fields["short_exception"] = short
    written = await lifecycle.update_with_history(
        storage,
        shipment_id,
        status=status or directions.done_status(shipment["direction"]),
        at=at,
        source=source,
        fields=fields,
        condition={"completed_at": None},
        shipment=shipment,
        session=session,
    )
    assert written is not None  # read completed_at None in this transaction
    messages = await write_outcome(
        storage, settings, written, short, ids, session, raised, contents
    )
    return Completion(shipment_id, message_id, reason, at, completed_now=True), messages


async def write_outcome(
    storage: Storage,
    settings: Settings,
    shipment: Doc,
    short: Doc | None,
    ids: list[int],
    session: Transaction,
    raised: list[Doc],
    contents: Contents,
) -> publish.WrittenMessages:
    """What a completion writes once its shipment is completed (`shipment` as written), in the
    transaction `session`: its orders COMPLETED, its SHORT exception (also added to `raised`)
    and the messages, the SHORT's then SHIPMENT_COMPLETE (built from `contents`, read in
    `session`), under the last of `ids`."""
    shipment_id = int(shipment["_id"])
    await storage.orders.update_many(
        {"shipment_id": shipment_id}, {"$set": {"status": "COMPLETED"}}, session=session
    )
    new: list[publish.NewMessage] = []
    if short is not None:
        await storage.exceptions.insert_one(short, session=session)
        raised.append(short)
        new.append(records.message(settings, short))
    new.append(
        publish.NewMessage(
            business=shipment["business"],
            facility=shipment["facility"],
            type="SHIPMENT_COMPLETE",
            payload=await build_completion_payload(settings, storage, shipment, session, contents),
            shipment_id=shipment_id,
        )
    )
    messages = await publish.build_messages(storage, new, ids=ids[-len(new) :])
    await publish.write_messages(storage, messages, session)
    return messages


def short_record(
    shipment: Doc, missing: list[str], orders: list[str], source: str, at: datetime, message_id: int
) -> Doc:
    """The SHORT exception of a shipment completed without `missing` LPNs."""
    short = rules.short_exception(shipment, missing, orders)
    return records.new_record(
        exception_id=records.exception_id(f"shipment:{shipment['_id']}", "SHORT"),
        code=short.code,
        priority=short.priority,
        business=shipment["business"],
        facility=shipment["facility"],
        shipment_id=int(shipment["_id"]),
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
        message_id=message_id,
    )


async def missing_lpns(
    storage: Storage,
    shipment: Doc,
    facility: Facility | None,
    session: Session,
    pallets: list[Doc],
) -> list[str]:
    """The expected LPNs not on the trailer (among the shipment's `pallets`, read with
    `observed.PROGRESS_FIELDS`), when the facility raises SHORT exceptions."""
    if facility is None or not facility.checks("SHORT"):
        return []
    items = await storage.order_items.find(
        {"shipment_id": int(shipment["_id"])}, {"lpn": 1}, session=session
    ).to_list()
    expected = observed.expected_lpns(items)
    if not expected:
        return []
    return observed.lpn_progress(shipment["direction"], expected, pallets).missing


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


async def short_exception_now(
    storage: Storage,
    shipment: Doc,
    source: str,
    at: datetime,
    message_id: int,
    session: Session,
    contents: Contents | None = None,
) -> Doc | None:
    """The SHORT exception the completion of `shipment` would raise as its readings count now
    (its facility checks SHORT and expected LPNs are not on the trailer), not stored; None
    otherwise. A correction of a completed shipment's reading raises it (the completion's rule).
    Built from `contents` when the caller has read them."""
    shipment_id = int(shipment["_id"])
    facility = await find_facility(storage, shipment["business"], shipment["facility"])
    if contents is None:
        pallets = await storage.pallets.find(
            {"shipment_id": shipment_id}, observed.PROGRESS_FIELDS, session=session
        ).to_list()
    else:
        pallets = contents.pallets
    missing = await missing_lpns(storage, shipment, facility, session, pallets)
    if not missing:
        return None
    if contents is None:
        orders = await records.shipment_order_numbers(storage, shipment_id, session, limit=MAX_LPNS)
    else:
        orders = contents.orders
    return short_record(shipment, missing, orders, source, at, message_id)
