"""The ASN of an outbound shipment, built from the pallets observed on its trailer: every 856
read by an independent X12 parser with 856 grammars (its own process), every DESADV read back
with pydifact; SSCCs exactly the pallets on the trailer, hierarchy, counts and control numbers
checked; refusals name what is missing."""

from __future__ import annotations

from collections import Counter

import pytest

from core.asn import issue, notice, partners
from core.auth.access import Principal
from core.endpoints import endpoint_kinds
from core.errors import BadRequest, Conflict, NotFound, PayloadTooLarge, ValidationFailed
from core.pallets.batch import record_pallets
from core.pallets.readings import Label, Reading
from core.settings import Settings
from core.storage import Storage
from tests.support.asn import (
    FACILITY_GLN,
    GTIN,
    SHIP_TO_GLN,
    SSCC_1,
    SSCC_3,
    gs1_label,
    load_shipment,
    parse_856,
    parse_desadv,
    reading,
    segments,
)
from tests.support.factories import Tenant
from tests.support.pallets import START, camera_of


def by_tag(rows: list[list[str]], tag: str) -> list[list[str]]:
    return [row for row in rows if row[0] == tag]


def check_hierarchy(rows: list[list[str]]) -> list[tuple[str, str]]:
    """Each HL's parent exists before it and is one level up (S > O > T > I); the levels with
    what they name (PRF for an order, MAN for a pallet), in order."""
    levels: dict[str, str] = {}
    seen: list[tuple[str, str]] = []
    up = {"O": "S", "T": "O", "I": "T"}
    for index, row in enumerate(rows):
        if row[0] != "HL":
            continue
        number, parent, code = row[1], row[2], row[3]
        assert int(number) == len(levels) + 1
        assert (levels.get(parent) if parent else None) == up.get(code), row
        levels[number] = code
        following = rows[index + 1]
        seen.append((code, following[-1] if code in ("O", "T") else following[0]))
    return seen


def test_every_asn_format_an_endpoint_may_send_has_a_writer_and_its_media_types():
    """The formats are named where an ASN endpoint's setting is checked (endpoint_kinds, below
    the ASN); each needs its writer, content type, charset and extension here."""
    formats = set(endpoint_kinds.ASN_FORMATS)

    assert set(issue.WRITERS) == formats
    assert set(issue.CONTENT_TYPES) == set(issue.CHARSETS) == set(issue.EXTENSIONS) == formats


async def test_the_856_names_exactly_the_pallets_on_the_trailer_by_purchase_order(
    storage: Storage, settings: Settings, tenant: Tenant
):
    loaded = await load_shipment(storage, settings, tenant)

    document = await issue.asn_for(storage, loaded.principal, loaded.shipment_id)

    parsed = parse_856(document.text)  # the third-party 856 grammar accepts it
    assert parsed["data"]["children"][0]["ISA15"] == "T"
    rows = segments(document.text)
    # SSCC_2 was loaded, then taken off: not in the ASN
    assert [row[2] for row in by_tag(rows, "MAN")] == [SSCC_1, SSCC_3]
    assert all(row[1] == "GM" for row in by_tag(rows, "MAN"))
    assert check_hierarchy(rows) == [
        ("S", "TD1"),
        ("O", "4500001"),
        ("T", SSCC_1),
        ("I", "LIN"),
        ("O", "SO-2"),  # an order without a purchaseOrder goes under its own number
        ("T", SSCC_3),
        ("I", "LIN"),
    ]
    # contents: the label's GTIN and lot, the item's quantity, the label's expiry
    assert by_tag(rows, "LIN")[0] == ["LIN", "", "UK", GTIN, "VN", "SKU-A", "LT", "LOT-1"]
    assert by_tag(rows, "SN1")[0] == ["SN1", "", "40", "CA"]
    assert ["DTM", "036", "20270531"] in rows
    # the shipment's references and parties
    assert ["REF", "BM", "BOL-123"] in rows
    assert ["REF", "CN", "PRO-456"] in rows
    assert ["REF", "SN", "SEAL-5"] in rows
    assert ["TD5", "", "2", "ABCD"] in rows
    assert ["TD3", "TL", "", "TRL-9"] in rows
    assert ["TD1", "PLT", "2"] in rows
    assert by_tag(rows, "N1") == [
        ["N1", "SF", "DC1 warehouse", "UL", FACILITY_GLN],
        ["N1", "ST", "", "UL", SHIP_TO_GLN],
    ]
    assert by_tag(rows, "DTM")[0][:2] == ["DTM", "011"]  # shipped
    assert by_tag(rows, "BSN")[0][1:3] == ["00", "SHP-77"]
    # counts and control numbers
    st = rows.index(by_tag(rows, "ST")[0])
    se = rows.index(by_tag(rows, "SE")[0])
    assert rows[se] == ["SE", str(se - st + 1), rows[st][2]]
    assert by_tag(rows, "CTT") == [["CTT", "7"]]
    isa, gs = rows[0], rows[1]
    assert int(isa[13]) == int(gs[6]) == int(rows[st][2]) == document.control_number
    assert rows[-2] == ["GE", "1", gs[6]]
    assert rows[-1] == ["IEA", "1", isa[13]]
    assert (isa[12], gs[8]) == ("00401", "004010")
    assert (document.complete, document.replaces) == (True, False)


async def test_005010_is_selectable_and_read_by_its_grammar(
    storage: Storage, settings: Settings, tenant: Tenant
):
    loaded = await load_shipment(storage, settings, tenant)

    document = await issue.asn_for(
        storage, loaded.principal, loaded.shipment_id, x12_version="005010"
    )

    parse_856(document.text)
    rows = segments(document.text)
    assert (rows[0][11], rows[0][12], rows[1][8]) == ("^", "00501", "005010")
    with pytest.raises(BadRequest, match="X12 version"):
        await issue.asn_for(storage, loaded.principal, loaded.shipment_id, x12_version="003050")


async def test_the_desadv_reads_back_with_one_cps_and_gin_per_sscc(
    storage: Storage, settings: Settings, tenant: Tenant
):
    loaded = await load_shipment(storage, settings, tenant)

    document = await issue.asn_for(
        storage, loaded.principal, loaded.shipment_id, endpoint_kinds.EDIFACT_DESADV
    )

    exchange = parse_desadv(document.text)
    [message] = list(exchange.get_messages())
    assert message.identifier == ["DESADV", "D", "96A", "UN", "EAN005"]
    found = [(s.tag, s.elements) for s in exchange.segments]
    tags = [tag for tag, _ in found]
    assert [e for t, e in found if t == "GIN"] == [["BJ", SSCC_1], ["BJ", SSCC_3]]
    assert [e for t, e in found if t == "RFF" and e[0][0] == "ON"] == [
        [["ON", "4500001"]],
        [["ON", "SO-2"]],
    ]
    assert Counter(tags)["CPS"] == 3  # the consignment and one per pallet
    first = dict(reversed(found))  # each tag's first segment
    assert first["LIN"] == ["1", "", [GTIN, "SRV"]]
    assert first["QTY"] == [["12", "40", "CT"]]
    assert first["BGM"] == ["351", "SHP-77", "9"]
    # UNT counts UNH through UNT; UNB and UNZ name the interchange's control reference
    unh, unt = tags.index("UNH"), tags.index("UNT")
    assert found[unt][1] == [str(unt - unh + 1), "1"]
    assert exchange.control_reference == str(document.control_number)
    assert document.text.splitlines()[-1] == f"UNZ+1+{document.control_number}'"
    assert exchange.sender == ["DOCKFLOWACME", "ZZZ"]  # not a GLN: mutually defined
    assert exchange.extra_header_elements[-1] == "1"  # the profile's usage T: a test


async def test_asked_again_an_asn_is_the_same_interchange_and_numbers_increase(
    storage: Storage, settings: Settings, tenant: Tenant
):
    loaded = await load_shipment(storage, settings, tenant)
    first = await issue.asn_for(storage, loaded.principal, loaded.shipment_id)

    again = await issue.asn_for(storage, loaded.principal, loaded.shipment_id)
    desadv = await issue.asn_for(
        storage, loaded.principal, loaded.shipment_id, endpoint_kinds.EDIFACT_DESADV
    )

    assert again.text == first.text
    assert desadv.control_number > first.control_number  # one sequence per partner


async def test_a_correction_after_completion_gives_a_replacement_with_a_new_number(
    storage: Storage, settings: Settings, tenant: Tenant
):
    loaded = await load_shipment(storage, settings, tenant)
    first = await issue.asn_for(storage, loaded.principal, loaded.shipment_id)
    # the operator's correction: SSCC_3 recorded as taken off the trailer
    camera = await camera_of(storage, tenant)
    taken_off = reading("r9", gs1_label(SSCC_3, "LOT-3", "270731", 6), 9, "UNLOADING")
    pallet = await record_pallets(storage, settings, [(camera, taken_off)])
    await storage.pallets.update_one(
        {"_id": pallet[0].pallet_id}, {"$set": {"shipment_id": loaded.shipment_id}}
    )

    replacement = await issue.asn_for(storage, loaded.principal, loaded.shipment_id)

    parse_856(replacement.text)
    rows = segments(replacement.text)
    assert by_tag(rows, "BSN")[0][1] == "05"
    assert [row[2] for row in by_tag(rows, "MAN")] == [SSCC_1]
    assert replacement.control_number > first.control_number
    assert replacement.replaces
    desadv = await issue.asn_for(
        storage, loaded.principal, loaded.shipment_id, endpoint_kinds.EDIFACT_DESADV
    )
    assert "BGM+351+SHP-77+9'" in desadv.text  # the first DESADV of it: an original


async def test_an_asn_of_a_shipment_still_loading_is_marked_and_takes_no_control_number(
    storage: Storage, settings: Settings, tenant: Tenant
):
    loaded = await load_shipment(storage, settings, tenant, complete=False)

    first = await issue.asn_for(storage, loaded.principal, loaded.shipment_id)
    second = await issue.asn_for(storage, loaded.principal, loaded.shipment_id)
    desadv = await issue.asn_for(
        storage, loaded.principal, loaded.shipment_id, endpoint_kinds.EDIFACT_DESADV
    )

    parse_856(first.text)
    assert ["REF", "ZZ", "SHIPMENT IN PROGRESS"] in segments(first.text)
    assert not any(row[:2] == ["DTM", "011"] for row in segments(first.text))
    assert not first.complete
    # a preview takes the fixed preview number, never one of the partner's sequence
    assert first.control_number == second.control_number == issue.PREVIEW_CONTROL_NUMBER
    assert desadv.control_number == issue.PREVIEW_CONTROL_NUMBER
    parse_desadv(desadv.text)  # D96A: FTX under the consignment's CPS, not in the header
    assert "CPS+1'\nFTX+AAI+++SHIPMENT IN PROGRESS'" in desadv.text
    assert await partners.next_control_number(storage, tenant.business) == 1


async def test_a_pallet_without_an_sscc_is_refused_by_name(
    storage: Storage, settings: Settings, tenant: Tenant
):
    loaded = await load_shipment(storage, settings, tenant, complete=False)
    camera = await camera_of(storage, tenant)
    plain = Reading(
        reading_id="r-plain",
        dock="",
        direction="LOADING",
        occurred_at=START,
        labels=(Label("lpn", "LPN-NOT-AN-SSCC", 0.99), Label("sku", "S", 0.9)),
    )
    [result] = await record_pallets(storage, settings, [(camera, plain)])
    await storage.pallets.update_one(
        {"_id": result.pallet_id}, {"$set": {"shipment_id": loaded.shipment_id}}
    )

    with pytest.raises(Conflict) as refused:
        await issue.asn_for(storage, loaded.principal, loaded.shipment_id)

    assert "LPN-NOT-AN-SSCC" in refused.value.detail
    assert "has no SSCC" in refused.value.detail
    assert [e.path for e in refused.value.errors] == ["pallets[0]"]


async def test_a_trailer_with_no_pallet_on_it_has_no_asn(
    storage: Storage, settings: Settings, tenant: Tenant
):
    loaded = await load_shipment(storage, settings, tenant, complete=False)
    camera = await camera_of(storage, tenant)
    off = [
        reading(f"off-{sscc}", gs1_label(sscc, "L", "270531", 1), 5 + n, "UNLOADING")
        for n, sscc in enumerate((SSCC_1, SSCC_3))
    ]
    await record_pallets(storage, settings, [(camera, r) for r in off])

    with pytest.raises(Conflict, match="no pallet on its trailer"):
        await issue.asn_for(storage, loaded.principal, loaded.shipment_id)


@pytest.mark.parametrize(
    ("bound", "most"), [("MAX_READINGS", 3), ("MAX_ITEMS", 2), ("MAX_ORDERS", 1)]
)
async def test_a_shipment_past_what_one_notice_reads_is_refused_not_cut(
    storage: Storage,
    settings: Settings,
    tenant: Tenant,
    monkeypatch: pytest.MonkeyPatch,
    bound: str,
    most: int,
):
    # The loaded shipment has 4 readings, 3 order items and 2 orders: each one past its bound.
    loaded = await load_shipment(storage, settings, tenant)
    monkeypatch.setattr(notice, bound, most)

    with pytest.raises(PayloadTooLarge, match="more than"):
        await issue.asn_for(storage, loaded.principal, loaded.shipment_id)
    assert await storage.ship_notices.count_documents({}) == 0


async def test_no_partner_profile_no_access_and_inbound_are_refused(
    storage: Storage, settings: Settings, tenant: Tenant, other_tenant: Tenant
):
    loaded = await load_shipment(storage, settings, tenant, partner=False)

    with pytest.raises(ValidationFailed, match="no trading-partner profile"):
        await issue.asn_for(storage, loaded.principal, loaded.shipment_id)
    stranger = Principal(subject=other_tenant.client_id, business=other_tenant.business)
    with pytest.raises(NotFound):
        await issue.asn_for(storage, stranger, loaded.shipment_id)
    elsewhere = Principal(
        subject=tenant.client_id, business=tenant.business, facilities=frozenset({"dc9"})
    )
    with pytest.raises(NotFound):  # a client of the business limited to other facilities
        await issue.asn_for(storage, elsewhere, loaded.shipment_id)
    with pytest.raises(BadRequest, match="none of"):
        issue.check_format("x12-850")
    await storage.shipments.update_one(
        {"_id": loaded.shipment_id}, {"$set": {"direction": "INBOUND"}}
    )
    with pytest.raises(Conflict, match="inbound"):
        await issue.asn_for(storage, loaded.principal, loaded.shipment_id)


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"sender_id": "", "receiver_id": "R1"}, "sender_id"),
        ({"sender_id": "S" * 16, "receiver_id": "R1"}, "sender_id"),
        ({"sender_id": "S1*", "receiver_id": "R1"}, "sender_id"),
        ({"sender_id": "S1", "receiver_id": "R1", "usage": "X"}, "usage"),
        ({"sender_id": "S1", "receiver_id": "R1", "segment_terminator": "*"}, "separators"),
        ({"sender_id": "S1", "receiver_id": "R1", "x12_version": "003040"}, "x12_version"),
    ],
)
async def test_a_profile_that_cannot_be_sent_is_refused_by_field(
    storage: Storage, tenant: Tenant, values: dict[str, str], field: str
):
    with pytest.raises(ValidationFailed) as refused:
        await partners.set_partner(storage, tenant.business, values)

    assert [e.path for e in refused.value.errors] == [field]
    assert await partners.get_partner(storage, tenant.business) is None
