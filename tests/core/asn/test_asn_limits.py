"""What an ASN may hold: every value within its element's limits (X12 004010 / 005010 856,
UN D96A DESADV) and within its syntax's characters (X12: printable ASCII; the DESADV's UNOC:
ISO 8859-1), or refused naming the element and its limit, never sent invalid; a mixed-PO pallet
in an 856, fractional and oversized quantities, profiles the envelope cannot carry, and more
readings than a notice is built from, refused; a free-text ship-to GLN that is no GLN left out.
Every document written is checked by the independent parser's grammars."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, date, datetime

import pytest

from core.asn import desadv, issue, notice, partners, x12
from core.asn.notice import ContentLine
from core.asn.partners import TradingPartner
from core.asn.x12 import Envelope
from core.errors import Conflict, PayloadTooLarge, ValidationFailed
from core.settings import Settings
from core.storage import Storage
from tests.support.asn import (
    GTIN,
    SSCC_1,
    load_shipment,
    parse_856,
    parse_desadv,
    segments,
    small_notice,
)
from tests.support.factories import Tenant

PARTNER = TradingPartner(sender_id="DOCKFLOWACME", receiver_id="RETAILER01", usage="P")
PARTNER_5010 = replace(PARTNER, x12_version="005010")
ENVELOPE = Envelope(17, datetime(2026, 5, 1, 8, 31, tzinfo=UTC))


def line(po: str = "4500001", quantity: float = 40, sku: str = "SKU-A") -> ContentLine:
    return ContentLine(po, "SO-1", sku, GTIN, "LOT-1", date(2027, 5, 31), quantity, "CASE")


@pytest.mark.parametrize("partner", [PARTNER, PARTNER_5010])
def test_a_one_character_shipment_number_is_padded_to_bsn02s_minimum(partner: TradingPartner):
    written = x12.interchange(small_notice(number="7"), partner, ENVELOPE)

    parse_856(written)
    assert segments(written)[3][:3] == ["BSN", "00", "7 "]


@pytest.mark.parametrize(
    ("refs", "element", "limit"),
    [
        ({"number": "S" * 31}, "BSN02", "2..30"),
        ({"trailer": "T" * 11}, "TD303", "1..10"),
        ({"bol": "B" * 31}, "REF02", "1..30"),
        ({"scac": "ABCD", "pro": "P" * 31}, "REF02", "1..30"),
    ],
)
def test_an_x12_value_past_its_elements_limit_is_refused_by_element(
    refs: dict[str, str], element: str, limit: str
):
    with pytest.raises(ValidationFailed) as refused:
        x12.interchange(small_notice(**refs), PARTNER, ENVELOPE)

    assert element in refused.value.detail
    assert limit in refused.value.detail
    if element in ("TD303", "REF02"):  # 005010 widened these: sent, and its grammar agrees
        parse_856(x12.interchange(small_notice(**refs), PARTNER_5010, ENVELOPE))


def test_a_purchase_order_past_prf01_is_refused():
    with pytest.raises(ValidationFailed, match=r"PRF01 .*1\.\.22"):
        x12.interchange(small_notice(line("P" * 23)), PARTNER, ENVELOPE)


@pytest.mark.parametrize(
    ("built", "element"),
    [
        (small_notice(number="S" * 36), "BGM 1004"),
        (small_notice(bol="B" * 36), "RFF 1154"),
        (small_notice(seal="S" * 11), "SEL 9308"),
        (small_notice(trailer="T" * 18), "EQD 8260"),
        (small_notice(line(sku="K" * 36)), "PIA 7140"),
        (small_notice(line("P" * 36)), "RFF 1154"),
    ],
)
def test_a_desadv_value_past_its_elements_limit_is_refused_by_element(built, element: str):
    with pytest.raises(ValidationFailed) as refused:
        desadv.interchange(built, PARTNER, ENVELOPE)

    assert element in refused.value.detail
    assert "an.." in refused.value.detail


def test_the_desadv_is_iso_8859_1_and_refuses_what_unoc_cannot_carry():
    written = desadv.interchange(small_notice(bol="BOL-Ü1"), PARTNER, ENVELOPE)

    parse_desadv(written)  # checked on its ISO 8859-1 bytes, as sent
    assert "UNB+UNOC:3+" in written
    assert "RFF+BM:BOL-Ü1'".encode("iso-8859-1") in written.encode(issue.CHARSETS["edifact-desadv"])
    with pytest.raises(ValidationFailed, match=r"RFF 1154 .*U\+2713.*UNOC"):
        desadv.interchange(small_notice(bol="BOL-✓"), PARTNER, ENVELOPE)


@pytest.mark.parametrize(
    ("refs", "found"),
    [({"bol": "BOL-Ü1"}, "REF02 .*U\\+00DC"), ({"pro": "PRO\n1"}, "REF02 .*U\\+000A")],
)
def test_an_x12_value_outside_printable_ascii_is_refused_by_element(
    refs: dict[str, str], found: str
):
    with pytest.raises(ValidationFailed, match=found):
        x12.interchange(small_notice(**refs), PARTNER, ENVELOPE)


def test_free_text_is_mapped_into_the_character_set_not_refused():
    described = replace(line(), description="Crème brûlée ✓ 1*2~3")
    built = replace(small_notice(described), facility_name="Dépôt Nord")

    written = x12.interchange(built, PARTNER, ENVELOPE)

    parse_856(written)
    assert ["PID", "F", "", "", "", "Cr me br l e 1 2 3"] in segments(written)
    parse_desadv(desadv.interchange(built, PARTNER, ENVELOPE))


def test_a_pallet_of_two_purchase_orders_is_refused_in_an_856_and_listed_once_in_a_desadv():
    mixed = small_notice(line("4500001"), line("4500002", sku="SKU-B"))

    with pytest.raises(Conflict) as refused:
        x12.interchange(mixed, PARTNER, ENVELOPE)
    assert f"{SSCC_1} (4500001, 4500002)" in refused.value.detail

    exchange = parse_desadv(desadv.interchange(mixed, PARTNER, ENVELOPE))
    assert [s.elements[1] for s in exchange.segments if s.tag == "GIN"] == [SSCC_1]


@pytest.mark.parametrize(
    ("quantity", "x12_refused", "desadv_refused"),
    [
        (0.5, "SN102 quantity 0.5 is not a whole", "QTY 6060 quantity 0.5 is not a whole"),
        (1e-7, "is not a whole", "is not a whole"),
        (12_345_678_901, "SN102 quantity 12345678901 has 11 digits: at most 10", None),
    ],
)
def test_quantities_a_unit_cannot_carry_or_too_long_are_refused(
    quantity: float, x12_refused: str, desadv_refused: str | None
):
    built = small_notice(line(quantity=quantity))

    with pytest.raises(ValidationFailed, match=x12_refused):
        x12.interchange(built, PARTNER, ENVELOPE)
    if desadv_refused:
        with pytest.raises(ValidationFailed, match=desadv_refused):
            desadv.interchange(built, PARTNER, ENVELOPE)
    else:
        exchange = parse_desadv(desadv.interchange(built, PARTNER, ENVELOPE))
        assert [s.elements[0][1] for s in exchange.segments if s.tag == "QTY"] == [str(quantity)]


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"sender_qualifier": "Z"}, "sender_qualifier"),
        ({"receiver_qualifier": "ZZZ"}, "receiver_qualifier"),
        ({"sender_qualifier": "ÄÖ"}, "sender_qualifier"),
        ({"application_sender": "A"}, "application_sender"),
        ({"application_receiver": "R" * 16}, "application_receiver"),
        ({"sender_id": "A"}, "application_sender"),  # GS02 would be one character
        ({"edifact_sender_qualifier": "14"}, "edifact_sender_qualifier"),  # S is no GLN
        ({"receiver_id": "0614141000028"}, "edifact_receiver_qualifier"),  # check digit wrong
        ({"edifact_receiver_qualifier": "1é"}, "edifact_receiver_qualifier"),
    ],
)
async def test_a_profile_whose_envelope_would_break_is_refused_by_field(
    storage: Storage, tenant: Tenant, values: dict[str, str], field: str
):
    given = {"sender_id": "S1", "receiver_id": "R1", **values}
    if field == "edifact_receiver_qualifier" and "receiver_id" in values:
        given["edifact_receiver_qualifier"] = "14"

    with pytest.raises(ValidationFailed) as refused:
        await partners.set_partner(storage, tenant.business, given)

    assert [e.path for e in refused.value.errors] == [field]


def test_an_edifact_qualifier_not_given_is_a_gln_s_when_the_id_is_one():
    chosen = partners.partner_from({"sender_id": "0614141000012", "receiver_id": "RETAILER01"})

    assert (chosen.edifact_sender_qualifier, chosen.edifact_receiver_qualifier) == ("14", "ZZZ")


async def test_more_readings_or_items_than_a_notice_is_built_from_are_refused_never_cut(
    storage: Storage, settings: Settings, tenant: Tenant, monkeypatch: pytest.MonkeyPatch
):
    loaded = await load_shipment(storage, settings, tenant)  # four readings, one a take-off
    monkeypatch.setattr(notice, "MAX_READINGS", 3)

    with pytest.raises(PayloadTooLarge, match="more than 3 pallet readings"):
        await issue.asn_for(storage, loaded.principal, loaded.shipment_id)

    monkeypatch.setattr(notice, "MAX_READINGS", 4)
    monkeypatch.setattr(notice, "MAX_ITEMS", 2)  # the shipment's orders hold three items
    with pytest.raises(PayloadTooLarge, match="more than 2 order items"):
        await issue.asn_for(storage, loaded.principal, loaded.shipment_id)

    monkeypatch.setattr(notice, "MAX_ITEMS", 3)
    parse_856((await issue.asn_for(storage, loaded.principal, loaded.shipment_id)).text)


async def test_a_free_text_ship_to_that_is_no_gln_is_left_out_and_a_bad_scac_refused(
    storage: Storage, settings: Settings, tenant: Tenant
):
    loaded = await load_shipment(storage, settings, tenant)
    await storage.shipments.update_one(
        {"_id": loaded.shipment_id},
        {"$set": {"fields.additionalFields": [{"name": "shipToGln", "value": "12345"}]}},
    )
    await storage.pallets.update_many(
        {"shipment_id": loaded.shipment_id}, {"$set": {"gs1_labels.$[].shipToGln": "0614141000028"}}
    )

    document = await issue.asn_for(storage, loaded.principal, loaded.shipment_id)

    rows = segments(document.text)
    assert [row[1] for row in rows if row[0] == "N1"] == ["SF"]  # no ship-to: none was a GLN
    await storage.shipments.update_one(
        {"_id": loaded.shipment_id},
        {"$set": {"fields.additionalFields": [{"name": "scac", "value": "AB1"}]}},
    )
    with pytest.raises(ValidationFailed, match="SCAC 'AB1' is not 2-4 letters"):
        await issue.asn_for(storage, loaded.principal, loaded.shipment_id)


async def test_a_document_the_writer_refuses_spends_no_control_number_and_records_no_issue(
    storage: Storage, settings: Settings, tenant: Tenant
):
    loaded = await load_shipment(storage, settings, tenant)
    shipment = {"_id": loaded.shipment_id}
    await storage.shipments.update_one(shipment, {"$set": {"fields.bolNumber": "B" * 31}})

    with pytest.raises(ValidationFailed, match="REF02"):
        await issue.asn_for(storage, loaded.principal, loaded.shipment_id)
    assert await storage.ship_notices.count_documents({}) == 0

    await storage.shipments.update_one(shipment, {"$set": {"fields.bolNumber": "BOL-1"}})
    document = await issue.asn_for(storage, loaded.principal, loaded.shipment_id)
    assert document.complete
    assert document.control_number == 1  # the refusal spent none
