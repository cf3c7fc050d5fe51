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
from tests.epcis_support import assert_valid_event

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
}


@pytest.mark.parametrize("name", list(CASES))
def test_every_event_is_valid_epcis_and_its_id_is_the_cbv_event_hash(name: str):
    event = events.pallet_event(CASES[name], IDS, "America/Chicago")

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
