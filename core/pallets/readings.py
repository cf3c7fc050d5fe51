"""A camera's pallet reading: what it carries, whether it may be stored, and what it names.

A reading is validated before any write (`validate_reading`, `check_storable`): nothing that
passes can make the database refuse its pallet, so one bad reading is REJECTED alone instead of
failing the batch it shares with other cameras. Matching reads its LPNs and SKUs
(`matched_values`) and the payload its labels as the facility maps them (`label_fields`).
`ReadingInBatch` carries one reading through its batch (`core.pallets.batch`).
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Literal

import bson
import bson.errors

from core import camera_input
from core.errors import ValidationFailed
from core.exceptions import records, rules
from core.pallets import gs1_labels
from core.settings import Settings
from core.shipments import directions, lifecycle
from core.shipments.dock_events import resolve_dock
from core.storage import Doc
from core.tenancy.tenants import Camera, Facility

AckStatus = Literal["ACCEPTED", "DUPLICATE", "REJECTED"]
LPN_LABEL = "lpn"  # canonical camera label names that matching reads
SKU_LABEL = "sku"
# Fixed payload fields; a label may not overwrite one of them.
FIXED_FIELDS = (
    "businessSlug",
    "facilitySlug",
    "serviceShipmentId",
    "servicePalletId",
    "occurredAt",
    "url",
    "direction",
    "orders",
    "dockId",
)
# What a pallet takes from its reading, encoded; leaves room under the database's 16 MiB
# document limit for the fixed fields (the `ingest_max_*` settings keep readings far below).
MAX_STORED_READING_BYTES = 15 * 1024 * 1024


@dataclass(frozen=True)
class Label:
    name: str
    value: str
    confidence: float = 0.0


@dataclass(frozen=True)
class Reading:
    """One completed pallet reading as a camera reports it."""

    reading_id: str
    dock: str  # empty: the camera's dock
    direction: str  # LOADING / UNLOADING; empty when the camera sent none
    occurred_at: datetime | None
    labels: tuple[Label, ...]
    image_urls: tuple[str, ...] = ()
    # Why the transport could not read the camera's occurred_at (a clock beyond what a
    # timestamp holds): the reading is rejected with it.
    occurred_at_error: str = ""
    # The transport's span of this reading (core.tracing), so its batch's store joins its trace.
    trace: Any = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class ReadingResult:
    reading_id: str
    status: AckStatus
    pallet_id: str = ""
    shipment_id: int | None = None
    message_id: int | None = None
    error: str = ""
    # The exceptions this reading raised (stored with its pallet), for the dock's display.
    exceptions: tuple[records.Raised, ...] = ()


def pallet_id_for(camera_id: str, reading_id: str) -> str:
    """Deterministic: a resend of a half-written reading finds its pallet."""
    digest = hashlib.sha256(f"{camera_id}\x00{reading_id}".encode()).hexdigest()
    return f"plt_{digest[:20]}"


def label_fields(facility: Facility, labels: Sequence[Label]) -> dict[str, Any]:
    """Labels renamed by the facility's mapping. A field marked multiple is always a list; a
    repeated single field keeps its most confident value; unmapped labels keep their camera name
    (a list when repeated) unless that name is a fixed field."""
    mapping = facility.label_mapping()
    grouped: dict[str, list[Label]] = {}
    for label in labels:
        grouped.setdefault(label.name, []).append(label)
    out: dict[str, Any] = {}
    for name, group in grouped.items():
        rule = mapping.get(name)
        target = rule.field if rule else name
        if target in FIXED_FIELDS:
            continue
        if rule is not None and rule.multiple:
            out[target] = [label.value for label in group]
        elif rule is not None or len(group) == 1:
            out[target] = max(group, key=lambda label: label.confidence).value
        else:
            out[target] = [label.value for label in group]
    return out


def _values(labels: Sequence[Label], name: str) -> list[str]:
    seen: dict[str, None] = {}
    for label in labels:
        if label.name == name and label.value:
            seen.setdefault(label.value, None)
    return list(seen)


def with_gs1_facts(reading: Reading, gs1: gs1_labels.ReadingLabels) -> Reading:
    """The reading with the facts of its GS1 labels (read once, `gs1_labels.read_labels`) added
    as labels, so that matching, the rules and the message read them as any label."""
    if not gs1.derived:
        return reading
    return replace(reading, labels=reading.labels + tuple(Label(*d) for d in gs1.derived))


def matched_values(
    facility: Facility, reading: Reading, gs1: gs1_labels.ReadingLabels, name: str
) -> list[str]:
    """The distinct values matching reads under a label name: the reading's labels that hold
    no GS1 content, and the facts of those that do (a facility mapping `lpn=gs1` sends its
    GS1 label as `lpn`: its content is no LPN, the SSCC read from it is)."""
    labels = [label for label in reading.labels if not gs1_labels.is_gs1(facility, label.name)]
    return _values([*labels, *(Label(*d) for d in gs1.derived)], name)


def validate_reading(
    settings: Settings, camera: Camera, facility: Facility, reading: Reading, now: datetime
) -> str:
    """The reading's dock, or a typed error (its message becomes the REJECTED reason). Nothing
    that passes can make the database refuse the pallet (see `camera_input`)."""
    camera_input.check_identifier("reading_id", reading.reading_id, settings.ingest_max_id_chars)
    if reading.direction not in directions.READING_DIRECTIONS:
        raise ValidationFailed("direction must be LOADING or UNLOADING")
    if reading.occurred_at_error:
        raise ValidationFailed(reading.occurred_at_error)
    if reading.occurred_at is None:
        raise ValidationFailed("occurred_at is required")
    lifecycle.check_camera_clock(settings, reading.occurred_at, now)
    if len(reading.labels) > settings.ingest_max_labels:
        raise ValidationFailed(f"a reading has at most {settings.ingest_max_labels} labels")
    gs1_count = 0
    for label in reading.labels:
        gs1 = gs1_labels.is_gs1(facility, label.name)
        gs1_count += gs1
        if gs1_count > gs1_labels.MAX_GS1_LABELS:
            most = gs1_labels.MAX_GS1_LABELS
            raise ValidationFailed(f"a reading has at most {most} GS1 labels (it names one pallet)")
        camera_input.check_label(settings, label.name, label.value, label.confidence, gs1=gs1)
    if not any(label.name and label.value for label in reading.labels):
        raise ValidationFailed("a reading needs at least one label with a value")
    mapping = facility.label_mapping()
    camera_input.check_payload_keys(
        rule.field for label in reading.labels if (rule := mapping.get(label.name)) is not None
    )
    camera_input.check_image_urls(settings, reading.image_urls)
    camera_input.check_dock_id(settings, reading.dock)
    dock = resolve_dock(camera, reading.dock)
    if facility.dock(dock) is None:
        raise ValidationFailed(f"unknown dock {dock!r} in facility {facility.key}")
    return dock


def check_storable(facility: Facility, reading: Reading) -> dict[str, Any]:
    """The reading's payload fields, once its content is known to fit in a pallet document.

    Everything a pallet takes from the reading is encoded as the driver will encode it, before
    any write: a reading the database layer would refuse is REJECTED here, alone, instead of
    failing the batch it shares with other cameras after shipments were changed for it."""
    fields = label_fields(facility, reading.labels)
    content = {
        "reading_id": reading.reading_id,
        "labels": label_docs(reading.labels),
        "image_urls": list(reading.image_urls),
        "payload": fields,
    }
    try:
        size = len(bson.encode(content))
    except (bson.errors.BSONError, OverflowError, TypeError, ValueError) as error:
        raise ValidationFailed(f"the reading cannot be stored ({type(error).__name__})") from None
    if size > MAX_STORED_READING_BYTES:
        raise ValidationFailed(f"the reading is larger than {MAX_STORED_READING_BYTES} bytes")
    return fields


def label_docs(labels: Sequence[Label]) -> list[Doc]:
    """A reading's labels as its pallet document keeps them."""
    return [
        {"name": label.name, "value": label.value, "confidence": label.confidence}
        for label in labels
    ]


@dataclass
class ReadingInBatch:
    """One validated reading on its way through a batch: what validation read from it, then
    what matching found (its shipment, orders and the facts the exception rules read)."""

    index: int  # its place in the batch, where its result goes
    camera: Camera
    reading: Reading
    key: str  # its claim: camera id and reading id
    pallet_id: str
    facility: Facility | None = None
    # What its GS1 labels say (read once, before their facts were added to its labels).
    gs1: gs1_labels.ReadingLabels = field(default_factory=gs1_labels.ReadingLabels)
    dock: str = ""
    occurred_at: datetime | None = None
    lpns: list[str] = field(default_factory=list)
    skus: list[str] = field(default_factory=list)
    fields: dict[str, Any] = field(default_factory=dict)  # the labels as payload fields
    shipment: Doc | None = None
    order_ids: list[str] = field(default_factory=list)
    unstarted_order_ids: list[str] = field(default_factory=list)  # still CREATED when read
    orders: list[str] = field(default_factory=list)
    message_id: int = 0
    facts: rules.ReadingFacts | None = None  # what the exception rules read (after matching)
    # Read against the direction of an open shipment expecting its LPN: perhaps a misloaded
    # pallet taken off again.
    may_take_off: bool = False
    repeated: bool = False  # read the way its pallet's last reading on the shipment went

    @functools.cached_property
    def lpn_digest(self) -> str:
        """The pallet's LPNs as one key: the same size for one LPN as for 200 of 1 KiB each."""
        return hashlib.sha256("\x00".join(sorted(self.lpns)).encode()).hexdigest()[:32]
