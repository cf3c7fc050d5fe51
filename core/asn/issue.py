"""Issuing an ASN: the notice, the partner's envelope, the document (docs/asn.md).

A completed shipment's ASN is issued once per format and content: the control number and the
creation time it first got are kept (`ship_notices`), so asking again (a download, a resend)
gives the same interchange, byte for byte. When what was loaded changed after it was issued (an
operator's correction), the next ASN takes a new control number and is a replacement (X12
BSN01 05, DESADV BGM function 5). A shipment still loading gets an ASN marked in progress
with the fixed control number `PREVIEW_CONTROL_NUMBER` (0): a preview is not sent to the
partner, so it takes no number of the partner's sequence, and 0 is one the sequence never
gives (it starts at 1). The document is laid out off the event loop: a large load takes a
while to write, and other requests should not wait for it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from pymongo.errors import DuplicateKeyError

from core.asn import desadv, notice, partners, x12
from core.asn.notice import ShipNotice
from core.asn.partners import TradingPartner
from core.asn.x12 import Envelope
from core.auth.access import Principal
from core.endpoints.endpoint_kinds import EDIFACT_DESADV, X12_856
from core.errors import BadRequest, Conflict, ValidationFailed
from core.storage import Doc, Storage

Writer = Callable[[ShipNotice, TradingPartner, Envelope], str]
WRITERS: dict[str, Writer] = {X12_856: x12.interchange, EDIFACT_DESADV: desadv.interchange}
CONTENT_TYPES = {X12_856: "application/edi-x12", EDIFACT_DESADV: "application/edifact"}
# The documents' encodings, as Content-Type charsets (and Python codec names).
CHARSETS = {X12_856: "us-ascii", EDIFACT_DESADV: desadv.ENCODING}
EXTENSIONS = {X12_856: "x12", EDIFACT_DESADV: "edi"}
ISSUE_TRIES = 3  # a racing issuer wins at most twice in a row
PREVIEW_CONTROL_NUMBER = 0  # every in-progress preview's: never one of the partner's sequence


@dataclass(frozen=True)
class AsnDocument:
    """One issued ASN and what a transport says about it."""

    shipment_id: int
    format: str
    text: str
    control_number: int
    complete: bool
    replaces: bool

    @property
    def content_type(self) -> str:
        return CONTENT_TYPES[self.format]

    @property
    def charset(self) -> str:
        """The encoding of the document's bytes: what its syntax declares (UNOC: ISO 8859-1;
        X12: ASCII, which the writer holds every value to)."""
        return CHARSETS[self.format]

    def encoded(self) -> bytes:
        return self.text.encode(self.charset)

    @property
    def filename(self) -> str:
        return f"asn-{self.shipment_id}-{self.control_number}.{EXTENSIONS[self.format]}"


def check_format(value: str | None) -> str:
    """The format asked for (x12-856 when none), or `BadRequest` naming the choices."""
    if value is None or value == "":
        return X12_856
    if value not in WRITERS:
        raise BadRequest(f"format {value!r} is none of {', '.join(WRITERS)}")
    return value


async def asn_for(
    storage: Storage,
    principal: Principal,
    shipment_id: int,
    format: str = X12_856,
    *,
    x12_version: str | None = None,
) -> AsnDocument:
    """The caller's shipment's ASN (another business's shipment is not found)."""
    shipment = await notice.find_shipment(storage, principal, shipment_id)
    return await asn_of_shipment(storage, shipment, format, x12_version=x12_version)


async def asn_of_shipment(
    storage: Storage,
    shipment: Doc,
    format: str = X12_856,
    *,
    x12_version: str | None = None,
    now: datetime | None = None,
) -> AsnDocument:
    """The ASN of a shipment already in hand (the outbox and GraphQL have checked the caller):
    refused with `Conflict` when a pallet lacks what it needs, `ValidationFailed` when the
    business has no trading-partner profile."""
    format = check_format(format)
    x12_version = partners.check_version(x12_version)
    business = str(shipment["business"])
    partner = await partners.get_partner(storage, business)  # before the notice's reads
    if partner is None:
        raise ValidationFailed(
            f"business {business!r} has no trading-partner profile: an ASN needs the "
            "sender and receiver IDs of its envelope (dockflow admin asn-partner)"
        )
    ship_notice = await notice.build_notice(storage, shipment)
    if format == X12_856:
        partner = partners.with_version(partner, x12_version)
    version = partner.x12_version if format == X12_856 else "D96A"
    now = now or datetime.now(UTC)
    write = WRITERS[format]
    kind = f"{format}:{version}"
    issued = await _issued(storage, ship_notice, kind)
    envelope = None if issued is None else issued.envelope()
    if envelope is not None:  # issued before for this very content: written once, as then
        text = await asyncio.to_thread(write, ship_notice, partner, envelope)
    else:
        # Written first under the preview's number: a document the writer refuses (a mixed-PO
        # pallet, a value past its element's length) draws no control number, records no issue.
        preview = Envelope(PREVIEW_CONTROL_NUMBER, now)
        text = await asyncio.to_thread(write, ship_notice, partner, preview)
        envelope = await _envelope(storage, ship_notice, kind, now, issued)
        if envelope != preview:
            text = await asyncio.to_thread(write, ship_notice, partner, envelope)
    return AsnDocument(
        shipment_id=ship_notice.shipment_id,
        format=format,
        text=text,
        control_number=envelope.control_number,
        complete=ship_notice.complete,
        replaces=envelope.replaces,
    )


@dataclass(frozen=True)
class _Issued:
    """A complete notice's content digest and the record of its last issue (None: never)."""

    digest: str
    stored: Doc | None

    def envelope(self) -> Envelope | None:
        """The envelope the notice was issued under for this very content, None if none was."""
        stored = self.stored
        if stored is None or stored["digest"] != self.digest:
            return None
        return Envelope(
            int(stored["control_number"]), stored["issued_at"], bool(stored["replaces"])
        )


async def _issued(storage: Storage, ship_notice: ShipNotice, kind: str) -> _Issued | None:
    """What a complete notice's issue is checked against, read and computed once; None for an
    incomplete one (a preview, never kept)."""
    if not ship_notice.complete:
        return None
    stored = await storage.ship_notices.find_one({"_id": f"{ship_notice.shipment_id}:{kind}"})
    return _Issued(await asyncio.to_thread(ship_notice.digest), stored)


async def _envelope(
    storage: Storage, ship_notice: ShipNotice, kind: str, now: datetime, issued: _Issued | None
) -> Envelope:
    """The envelope of the notice: kept per shipment and kind once complete (module doc).
    `issued` is the notice's `_issued`: its first try goes on from that read."""
    business = ship_notice.business
    if issued is None:
        return Envelope(PREVIEW_CONTROL_NUMBER, now)
    key = f"{ship_notice.shipment_id}:{kind}"
    digest = issued.digest
    for attempt in range(ISSUE_TRIES):
        if attempt == 0:
            stored = issued.stored
        else:
            stored = await storage.ship_notices.find_one({"_id": key})
        if stored is not None and stored["digest"] == digest:
            return Envelope(
                int(stored["control_number"]), stored["issued_at"], bool(stored["replaces"])
            )
        number = await partners.next_control_number(storage, business)
        doc = {
            "_id": key,
            "business": business,
            "facility": ship_notice.facility,
            "shipment_id": ship_notice.shipment_id,
            "digest": digest,
            "control_number": number,
            "issued_at": now,
            "replaces": stored is not None,
        }
        if stored is None:
            try:
                await storage.ship_notices.insert_one(doc)
            except DuplicateKeyError:  # another request issued it first: take theirs
                continue
        else:
            swapped = await storage.ship_notices.replace_one(
                {"_id": key, "control_number": stored["control_number"]}, doc
            )
            if swapped.matched_count != 1:  # another request replaced it first
                continue
        return Envelope(number, now, stored is not None)
    raise Conflict(f"the ASN of shipment {ship_notice.shipment_id} changes too often; ask again")
