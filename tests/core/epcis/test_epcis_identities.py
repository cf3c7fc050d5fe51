"""GS1 identities and their EPC URIs (`core.epcis.identities`), with the GS1 EPC Tag Data
Standard's own examples: SSCC (00)106141412345678908 of company prefix 0614141 is
urn:epc:id:sscc:0614141.1234567890 (TDS 6.3.2), GLN 0614141123452 with extension 400 is
urn:epc:id:sgln:0614141.12345.400 (TDS 6.3.3)."""

from __future__ import annotations

from typing import Any

import pytest

from core.epcis import events, query
from core.epcis.identities import (
    Identities,
    check_company_prefix,
    check_gln,
    check_gln_extension,
    check_sscc,
    sgln_uri,
)
from core.errors import ValidationFailed
from tests.support.epcis import sscc_uri

TDS_SSCC = "106141412345678908"
TDS_GLN = "0614141123452"


def test_the_standards_sscc_example_with_its_declared_prefix():
    assert sscc_uri(TDS_SSCC, "0614141") == "urn:epc:id:sscc:0614141.1234567890"
    assert sscc_uri(TDS_SSCC, "0614141", "digital_link") == f"https://id.gs1.org/00/{TDS_SSCC}"


def test_the_standards_sgln_example_and_the_whole_location():
    assert sgln_uri(TDS_GLN, "400", "0614141") == "urn:epc:id:sgln:0614141.12345.400"
    assert sgln_uri(TDS_GLN, None, "0614141") == "urn:epc:id:sgln:0614141.12345.0"
    assert (
        sgln_uri(TDS_GLN, "400", None, "digital_link")
        == f"https://id.gs1.org/414/{TDS_GLN}/254/400"
    )
    assert sgln_uri(TDS_GLN, None, None, "digital_link") == f"https://id.gs1.org/414/{TDS_GLN}"


def test_without_a_declared_prefix_gs1s_prefix_lengths_split_the_number():
    # 0614141 is a 7-digit prefix in GS1's table; another business's SSCC splits the same way
    assert sscc_uri(TDS_SSCC, None) == "urn:epc:id:sscc:0614141.1234567890"
    assert sscc_uri(TDS_SSCC, "952000") == "urn:epc:id:sscc:0614141.1234567890"
    assert sgln_uri("9520000000004", None, None) == "urn:epc:id:sgln:952000.000000.0"


def test_a_declared_prefix_decides_the_split_of_its_own_numbers():
    assert sgln_uri(TDS_GLN, "1", "06141411") == "urn:epc:id:sgln:06141411.2345.1"


def test_a_number_whose_prefix_length_nobody_knows_has_no_epc_uri_but_a_digital_link():
    # 020-029 are restricted-circulation numbers: GS1 assigns no company prefixes there
    sscc = "002000000000000004"
    assert sscc_uri(sscc, None) is None
    assert sgln_uri("0200000000004", None, None) is None
    assert sgln_uri("0200000000004", None, "020000") == "urn:epc:id:sgln:020000.000000.0"
    assert sscc_uri(sscc, None, "digital_link") == f"https://id.gs1.org/00/{sscc}"


@pytest.mark.parametrize(
    ("check", "value", "fragment"),
    [
        (check_gln, "0614141123453", "check digit"),
        (check_gln, "061414112345", "13 digits"),
        (check_company_prefix, "06141", "6 to 12 digits"),
        (check_company_prefix, "06141a1", "6 to 12 digits"),
        (check_gln_extension, "0", "whole location"),
        (check_gln_extension, "door/4", "letters, digits"),
        (check_gln_extension, "x" * 21, "1-20"),
    ],
)
def test_bad_identities_are_refused_with_the_reason(check, value, fragment):
    with pytest.raises(ValidationFailed) as refused:
        check(value)
    assert fragment in refused.value.detail


def test_a_wrong_sscc_check_digit_is_refused():
    with pytest.raises(ValidationFailed):
        sscc_uri("106141412345678907", "0614141")


def test_a_facility_names_its_dock_doors_and_itself():
    ids = Identities("0614141", TDS_GLN, {"D1": "1", "D2": "D-02"})

    assert ids.business_location() == "urn:epc:id:sgln:0614141.12345.0"
    assert ids.read_point("D1") == "urn:epc:id:sgln:0614141.12345.1"
    assert ids.read_point("D2", "digital_link") == f"https://id.gs1.org/414/{TDS_GLN}/254/D-02"
    assert ids.read_point("D3") == "urn:epc:id:sgln:0614141.12345.0"  # no extension: the site
    assert Identities(None, None, {}).read_point("D1") is None


def _arabic_indic(digits: str) -> str:
    return "".join(chr(0x0660 + int(d)) for d in digits)


def _fullwidth(digits: str) -> str:
    return "".join(chr(0xFF10 + int(d)) for d in digits)


@pytest.mark.parametrize("spelled", [_arabic_indic, _fullwidth])
def test_a_gs1_number_is_ascii_digits_only(spelled):
    # Python's \d and isdecimal() take these for digits; a GS1 number never holds them
    for check, number in ((check_gln, TDS_GLN), (check_sscc, TDS_SSCC)):
        with pytest.raises(ValidationFailed):
            check(spelled(number))
    with pytest.raises(ValidationFailed):
        check_company_prefix(spelled("0614141"))
    lpn_only: dict[str, Any] = {
        "occurred_at": None,
        "direction": "LOADING",
        "dock": "D1",
        "gs1_labels": [],
    }
    ids = Identities(None, None, {})
    assert events.pallet_event({**lpn_only, "lpns": [spelled(TDS_SSCC)]}, ids, "UTC") is None
    urn = f"urn:epc:id:sscc:{spelled('0614141')}.{spelled('1234567890')}"
    link = f"https://id.gs1.org/00/{spelled(TDS_SSCC)}"
    assert query.parse_query({"MATCH_epc": f"{urn},{link}"}).ssccs == frozenset()
