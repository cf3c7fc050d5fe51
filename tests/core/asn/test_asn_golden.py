"""The golden examples of docs/asn.md are what the writers produce for the notice they
describe, byte for byte (the docs cannot drift from the code), and each is read back: the 856
by the independent X12 parser, the DESADV by pydifact."""

from __future__ import annotations

import re
from datetime import UTC, date, datetime
from pathlib import Path

import pytest

from core.asn import desadv, x12
from core.asn.notice import ContentLine, PalletNotice, References, ShipNotice
from core.asn.partners import TradingPartner
from core.asn.x12 import Envelope
from tests.support.asn import parse_856, parse_desadv

DOC = Path(__file__).resolve().parents[3] / "docs" / "asn.md"
LOADED = datetime(2026, 5, 1, 8, 10, tzinfo=UTC)


def line(po: str, sku: str, lot: str, expiry: date, quantity: int) -> ContentLine:
    return ContentLine(po, "SO-1", sku, "10614141000415", lot, expiry, quantity, "CASE")


NOTICE = ShipNotice(
    business="acme",
    facility="dc1",
    facility_name="Acme DC1",
    shipment_id=42,
    complete=True,
    shipped_at=datetime(2026, 5, 1, 8, 30, tzinfo=UTC),
    references=References(
        number="SHP-77",
        bol="BOL-123",
        pro="PRO-456",
        seal="SEAL-5",
        trailer="TRL-9",
        scac="ABCD",
        carrier="ABCD",
    ),
    ship_from_gln="0614141000012",
    ship_to_gln="0614141000029",
    pallets=(
        PalletNotice(
            "106141411234567897",
            LOADED,
            "D1",
            (line("4500001", "SKU-A", "LOT-1", date(2027, 5, 31), 40),),
        ),
        PalletNotice(
            "006141411234567906",
            LOADED,
            "D1",
            (
                line("4500002", "SKU-B", "LOT-2", date(2027, 6, 30), 20),
                line("4500002", "SKU-C", "LOT-3", date(2027, 7, 31), 10),
            ),
        ),
    ),
    purchase_orders=("4500001", "4500002"),
)
PARTNER = TradingPartner(
    sender_id="DOCKFLOWACME",
    receiver_id="RETAILER01",
    usage="P",
    edifact_sender_qualifier="ZZZ",
    edifact_receiver_qualifier="ZZZ",
)
ENVELOPE = Envelope(control_number=17, created_at=datetime(2026, 5, 1, 8, 31, tzinfo=UTC))


def golden(kind: str) -> str:
    found = re.search(rf"```{kind}\n(.*?)```", DOC.read_text(), re.DOTALL)
    assert found is not None, f"docs/asn.md has no {kind} block"
    return found.group(1)


@pytest.mark.parametrize("version", ["004010", "005010"])
def test_the_856_example_is_what_the_writer_writes(version: str):
    partner = TradingPartner(**{**PARTNER.as_doc(), "x12_version": version})

    written = x12.interchange(NOTICE, partner, ENVELOPE)

    parse_856(written)
    if version == "004010":
        assert written == golden("x12")


def test_the_desadv_example_is_what_the_writer_writes():
    written = desadv.interchange(NOTICE, PARTNER, ENVELOPE)

    parse_desadv(written)
    assert written == golden("edifact")


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("SE*34*0017", "SE*33*0017"),  # a wrong segment count
        ("GE*1*17", "GE*1*18"),  # control numbers that disagree
        ("MAN*GM*", "MAN*GMX*"),  # an element the grammar refuses
    ],
)
def test_the_independent_parser_refuses_a_broken_856(old: str, new: str):
    written = x12.interchange(NOTICE, PARTNER, ENVELOPE)
    assert old in written

    with pytest.raises(AssertionError):
        parse_856(written.replace(old, new))
