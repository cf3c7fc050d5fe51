"""EPCIS 2.0 ObjectEvents of pallet readings (`core.epcis.events`): every event and document is
valid against GS1's official EPCIS 2.0 JSON Schema (tests/vendor/epcis, fetched from gs1/EPCIS,
not retyped), and every eventID is recomputed independently by the reference implementation of
the CBV 2.0 event hash (the MIT `epcis-event-hash-generator`, from the JSON-LD document)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from core.epcis import events
from core.epcis.identities import Identities
from tests.support.epcis import VALIDATOR, assert_valid_event

SSCC = "106141411234567897"
GTIN = "10614141000415"
GLN = "0614141123452"
IDS = Identities("0614141", GLN, {"D1": "1", "D2": "D-02"})
AT = datetime(2026, 5, 1, 13, 0, 15, 123000, tzinfo=UTC)


def pallet(**fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "occurred_at": AT,
        "direction": "LOADING",
        "dock": "D1",
        "lpns": [SSCC],
        "gs1_labels": [],
    }
    return {**base, **fields}


CASES = {
    "loading with contents": pallet(
        gs1_labels=[{"sscc": SSCC, "gtin": GTIN, "lot": "LOT 42/A", "count": "24"}],
    ),
    "unloading at a door with a letter extension": pallet(direction="UNLOADING", dock="D2"),
    "a dock without an extension": pallet(dock="D3"),
    "contents without a count or a lot": pallet(gs1_labels=[{"gtin": GTIN}], lpns=[]),
    "two pallets' SSCCs and an LPN that is none": pallet(
        lpns=["LPN-7", "006141410000000012", SSCC]
    ),
    "orders, a customer PO and a ship-to GLN": pallet(
        orders=["SO-1", "PO 9/B"],
        gs1_labels=[{"sscc": SSCC, "customerPo": "PO-77", "shipToGln": "0614141000005"}],
    ),
    "received from a supplier": pallet(direction="UNLOADING", orders=["PO-5"]),
}
SITE = events.Site(IDS, "America/Chicago")


@pytest.mark.parametrize("name", list(CASES))
def test_every_event_is_valid_epcis_and_its_id_is_the_cbv_event_hash(name: str):
    event = events.pallet_event(CASES[name], IDS, "America/Chicago", bol="BOL-1")

    assert event is not None
    assert_valid_event(event)


def test_a_loading_is_observed_at_the_door_in_the_facility_with_its_contents():
    event = events.pallet_event(CASES["loading with contents"], IDS, "America/Chicago")

    assert event == {
        "eventID": event["eventID"] if event else None,
        "type": "ObjectEvent",
        "eventTime": "2026-05-01T13:00:15.123Z",
        "eventTimeZoneOffset": "-05:00",  # Chicago in May (daylight time)
        "epcList": [f"https://id.gs1.org/00/{SSCC}"],
        "quantityList": [
            {"epcClass": f"https://id.gs1.org/01/{GTIN}/10/LOT%2042%2FA", "quantity": 24}
        ],
        "action": "OBSERVE",
        "bizStep": "loading",
        "disposition": "in_progress",
        "readPoint": {"id": f"https://id.gs1.org/414/{GLN}/254/1"},
        "bizLocation": {"id": f"https://id.gs1.org/414/{GLN}"},
        "sourceList": [{"type": "location", "source": f"https://id.gs1.org/414/{GLN}"}],
    }


def test_the_same_reading_gives_the_same_id_and_any_difference_another():
    def event_id(**fields: Any) -> str:
        event = events.pallet_event(pallet(**fields), IDS, "America/Chicago")
        assert event is not None
        return str(event["eventID"])

    first = event_id()
    assert first.startswith("ni:///sha-256;")
    assert first.endswith("?ver=CBV2.0")
    assert event_id() == first
    # the same instant written with another offset is the same event time
    assert event_id(occurred_at=AT.astimezone(datetime.now().astimezone().tzinfo)) == first
    assert event_id(direction="UNLOADING") != first
    assert event_id(dock="D2") != first
    assert event_id(occurred_at=AT.replace(microsecond=124000)) != first


def test_a_facility_without_identities_still_has_valid_events_without_a_location():
    event = events.pallet_event(pallet(), Identities(None, None, {}), "Europe/Berlin")

    assert event is not None
    assert "readPoint" not in event
    assert "bizLocation" not in event
    assert event["eventTimeZoneOffset"] == "+02:00"
    assert_valid_event(event)


def test_only_lpns_that_are_ssccs_are_epcs():
    event = events.pallet_event(CASES["two pallets' SSCCs and an LPN that is none"], IDS, "UTC")

    assert event is not None
    assert event["epcList"] == [
        "https://id.gs1.org/00/006141410000000012",
        f"https://id.gs1.org/00/{SSCC}",
    ]


def test_a_pallet_with_neither_an_sscc_nor_a_gtin_has_no_event():
    assert events.pallet_event(pallet(lpns=["LPN-1"]), IDS, "UTC") is None


def test_a_pallet_known_by_its_contents_only_has_no_epc_list():
    event = events.pallet_event(CASES["contents without a count or a lot"], IDS, "UTC")

    assert event is not None
    assert "epcList" not in event
    assert [q["epcClass"] for q in event["quantityList"]] == [f"https://id.gs1.org/01/{GTIN}"]


def test_a_pallets_transactions_are_what_the_business_issued_and_its_places():
    event = events.pallet_event(
        CASES["orders, a customer PO and a ship-to GLN"], IDS, "America/Chicago", bol="BOL/1"
    )
    received = events.pallet_event(
        {**CASES["orders, a customer PO and a ship-to GLN"], "direction": "UNLOADING"},
        IDS,
        "America/Chicago",
        bol="BOL/1",
    )

    assert event is not None
    assert received is not None
    bt = f"urn:epcglobal:cbv:bt:{GLN}:"
    # shipping: the BOL is the business's (the shipper's); the POs are its customer's
    assert event["bizTransactionList"] == [{"type": "bol", "bizTransaction": f"{bt}BOL%2F1"}]
    # receiving: the POs are the business's (it is the customer); the BOL is the shipper's.
    # A number outside GS1 character set 82 ("PO 9/B": a space) names no transaction.
    assert received["bizTransactionList"] == [
        {"type": "po", "bizTransaction": f"{bt}SO-1"},
        {"type": "po", "bizTransaction": f"{bt}PO-77"},
    ]
    assert event["sourceList"] == [{"type": "location", "source": f"https://id.gs1.org/414/{GLN}"}]
    assert event["destinationList"] == [
        {"type": "location", "destination": "https://id.gs1.org/414/0614141000005"}
    ]
    assert_valid_event(received)
    without_bol = events.pallet_event(
        CASES["orders, a customer PO and a ship-to GLN"], IDS, "America/Chicago"
    )
    assert without_bol is not None
    assert without_bol["eventID"] != event["eventID"]


def test_an_unloading_arrives_at_the_facility_and_without_a_gln_names_no_transaction():
    event = events.pallet_event(CASES["received from a supplier"], IDS, "America/Chicago")
    bare = events.pallet_event(
        CASES["received from a supplier"], Identities(None, None, {}), "America/Chicago"
    )

    assert event is not None
    assert bare is not None
    assert "sourceList" not in event
    assert event["destinationList"] == [
        {"type": "location", "destination": f"https://id.gs1.org/414/{GLN}"}
    ]
    assert not {"bizTransactionList", "sourceList", "destinationList"} & set(bare)
    assert_valid_event(bare)


def shipment(direction: str, **fields: Any) -> dict[str, Any]:
    return {
        "direction": direction,
        "dock": "D1",
        "completed_at": datetime(2026, 5, 1, 15, 30, tzinfo=UTC),
        "fields": {"bolNumber": "BOL-9"},
        **fields,
    }


@pytest.mark.parametrize(
    ("direction", "step", "disposition"),
    [("OUTBOUND", "departing", "in_transit"), ("INBOUND", "receiving", "in_progress")],
)
def test_a_completed_shipment_is_one_event_of_what_is_on_the_trailer(
    direction: str, step: str, disposition: str
):
    event = events.shipment_event(shipment(direction), [SSCC, "LPN-7"], ["SO-1"], SITE)

    assert event is not None
    assert_valid_event(event)
    assert (event["bizStep"], event["disposition"]) == (step, disposition)
    assert event["epcList"] == [f"https://id.gs1.org/00/{SSCC}"]
    assert event["eventTime"] == "2026-05-01T15:30:00.000Z"
    # the business issues the BOL of what it ships and the POs of what it receives
    kinds = {"OUTBOUND": ["bol"], "INBOUND": ["po"]}[direction]
    assert [t["type"] for t in event["bizTransactionList"]] == kinds
    # CBV: `shipping` would also say the loading and departing these events already say
    assert event["bizStep"] != "shipping"


def test_a_shipment_not_completed_or_without_an_sscc_has_no_event():
    assert events.shipment_event(shipment("OUTBOUND", completed_at=None), [SSCC], [], SITE) is None
    assert events.shipment_event(shipment("OUTBOUND"), ["LPN-7"], [], SITE) is None


def test_a_pallet_taken_off_again_is_an_event_of_its_own():
    loaded = events.pallet_event(pallet(), IDS, "America/Chicago")
    later = datetime(2026, 5, 1, 13, 5, tzinfo=UTC)
    taken_off = events.pallet_event(
        pallet(direction="UNLOADING", occurred_at=later), IDS, "America/Chicago"
    )

    assert loaded is not None
    assert taken_off is not None
    assert_valid_event(taken_off)
    assert taken_off["bizStep"] == "unloading"
    assert taken_off["eventID"] != loaded["eventID"]


def test_an_error_declaration_keeps_the_events_id_as_the_hash_leaves_it_out():
    original = events.pallet_event(CASES["loading with contents"], IDS, "America/Chicago")
    corrective = events.pallet_event(pallet(lpns=["006141410000000012"]), IDS, "America/Chicago")
    assert original is not None
    assert corrective is not None

    declared = events.declare_error(
        original, datetime(2026, 5, 2, 8, tzinfo=UTC), corrective_event_ids=[corrective["eventID"]]
    )

    assert_valid_event(declared)  # the reference implementation recomputes the same id
    assert declared["eventID"] == original["eventID"]
    assert declared["errorDeclaration"] == {
        "declarationTime": "2026-05-02T08:00:00.000Z",
        "reason": "incorrect_data",
        "correctiveEventIDs": [corrective["eventID"]],
    }
    with pytest.raises(ValueError, match="error reason"):
        events.declare_error(original, datetime.now(UTC), reason="oops")


def test_the_document_of_several_events_is_a_valid_epcis_document():
    found = [events.pallet_event(case, IDS, "America/Chicago") for case in CASES.values()]
    document = events.epcis_document([e for e in found if e], datetime.now(UTC))

    VALIDATOR.validate(document)
    assert len(document["epcisBody"]["eventList"]) == len(CASES)


def test_a_number_outside_gs1_character_set_82_is_never_a_transaction():
    unloaded = pallet(
        direction="UNLOADING", orders=["PO-Ä1", "\uff30\uff2f1", "PO%41", "P" * 81, "A&B"]
    )
    event = events.pallet_event(unloaded, IDS, "UTC")

    assert event is not None
    # '%' and '&' are set 82 and escaped; 'Ä' and fullwidth letters are not (no UTF-8 escapes)
    assert [t["bizTransaction"].rsplit(":", 1)[1] for t in event["bizTransactionList"]] == [
        "PO%2541",
        "A%26B",
    ]
    assert_valid_event(event)


def test_every_ship_to_gln_is_a_destination():
    labels = [
        {"sscc": SSCC, "shipToGln": "0614141000005"},
        {"sscc": SSCC, "shipToGln": "0614141000012"},
    ]
    event = events.pallet_event(pallet(gs1_labels=labels), IDS, "UTC")

    assert event is not None
    assert [d["destination"] for d in event["destinationList"]] == [
        "https://id.gs1.org/414/0614141000005",
        "https://id.gs1.org/414/0614141000012",
    ]
    assert_valid_event(event)


def test_labels_disagreeing_on_a_count_give_one_class_without_a_count():
    labels = [
        {"gtin": GTIN, "lot": "L1", "count": "24"},
        {"gtin": GTIN, "lot": "L1", "count": "20"},
        {"gtin": GTIN, "count": "5"},
        {"gtin": GTIN, "count": "5"},
    ]
    event = events.pallet_event(pallet(gs1_labels=labels), IDS, "UTC")

    assert event is not None
    assert event["quantityList"] == [
        {"epcClass": f"https://id.gs1.org/01/{GTIN}/10/L1"},
        {"epcClass": f"https://id.gs1.org/01/{GTIN}", "quantity": 5},
    ]
    assert_valid_event(event)
