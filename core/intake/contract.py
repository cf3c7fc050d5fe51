"""The document intake contract: request and response models of ``POST /documents``.

The same models validate JSON and XML bodies and generate the OpenAPI schema. Field names on the
wire are camelCase (the spec's); unknown fields are refused so a typo is never dropped silently.
`parse_document` turns any decoded body into an `IntakeDocument` or raises `ValidationFailed`
naming every bad field (``items[2].quantity``).
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    ValidationInfo,
    WithJsonSchema,
)
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

from core.errors import ErrorList, FieldError, ValidationFailed
from core.identifiers import identifier_problem
from core.instants import instant_refusal
from core.settings import Settings
from core.shipments.directions import ShipmentDirection

Strategy = Literal["OVERWRITE", "APPEND", "MERGE", "DELETE"]
Direction = ShipmentDirection
QuantityUnit = Literal["PALLET", "CASE", "UNIT"]
WeightUnit = Literal["POUND", "KILOGRAM"]
ChangeType = Literal["SHIPMENT", "ORDER", "ORDER_ITEM"]

# Limits on one document: bounded work per request, whatever the body size limit.
MAX_ORDERS_PER_DOCUMENT = 1_000
MAX_ITEMS_PER_ORDER = 10_000
MAX_CASE_SERIALS_PER_ITEM = 1_000
MAX_ADDITIONAL_FIELDS = 100
MAX_QUANTITY = 1e12  # far above any real quantity; keeps stored numbers exact enough
# An expected arrival further ahead than this is a typo (year 9999), not a plan.
MAX_ARRIVAL_AHEAD = timedelta(days=2 * 366)

# Defaults of settings.intake_max_identifier_chars and settings.intake_max_text_chars.
MAX_IDENTIFIER_CHARS = 128
MAX_TEXT_CHARS = 2_000
# Control characters free text may keep: tab and line breaks.
_TEXT_CONTROLS_KEPT = frozenset("\t\n\r")


@dataclass(frozen=True)
class TextLimits:
    """Longest identifier and longest free text a document may carry."""

    identifier_chars: int = MAX_IDENTIFIER_CHARS
    text_chars: int = MAX_TEXT_CHARS

    @classmethod
    def from_settings(cls, settings: Settings) -> TextLimits:
        return cls(settings.intake_max_identifier_chars, settings.intake_max_text_chars)


def text_problem(value: str, max_chars: int = MAX_TEXT_CHARS) -> str | None:
    """Why `value` is not acceptable free text, or None: at most `max_chars` characters, no
    control characters but tab and line breaks, no lone surrogates (not storable as UTF-8)."""
    if len(value) > max_chars:
        return f"must be at most {max_chars} characters"
    for position, char in enumerate(value):
        if char in _TEXT_CONTROLS_KEPT:
            continue
        if unicodedata.category(char) in ("Cc", "Cs"):
            return (
                f"must not contain control characters or lone surrogates (U+{ord(char):04X} "
                f"at position {position})"
            )
    return None


def _limits(info: ValidationInfo) -> TextLimits:
    context = info.context
    limits = context.get("limits") if isinstance(context, dict) else None
    return limits if isinstance(limits, TextLimits) else TextLimits()


def _valid_identifier(value: str, info: ValidationInfo) -> str:
    problem = identifier_problem(value, _limits(info).identifier_chars)
    if problem is not None:
        raise PydanticCustomError("identifier", problem)
    return value


def _valid_text(value: str, info: ValidationInfo) -> str:
    problem = text_problem(value, _limits(info).text_chars)
    if problem is not None:
        raise PydanticCustomError("text", problem)
    return value


# Identifiers (numbers, slugs, lpn, sku, field names): trimmed, printable, 1 to
# `intake_max_identifier_chars` characters. The schema shows the default limit.
Ref = Annotated[
    str,
    StringConstraints(strip_whitespace=True, min_length=1),
    AfterValidator(_valid_identifier),
    WithJsonSchema(
        {
            "type": "string",
            "minLength": 1,
            "maxLength": MAX_IDENTIFIER_CHARS,
            "description": "Printable characters only.",
        }
    ),
]
# Free text (descriptions, additional field values): up to `intake_max_text_chars`.
Text = Annotated[
    str,
    AfterValidator(_valid_text),
    WithJsonSchema({"type": "string", "maxLength": MAX_TEXT_CHARS}),
]
Quantity = Annotated[float, Field(gt=0, le=MAX_QUANTITY, allow_inf_nan=False)]


class _Wire(BaseModel):
    """camelCase on the wire, unknown fields refused, values not silently coerced across kinds."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_alias=True,
        validate_by_name=False,
        serialize_by_alias=True,
        extra="forbid",
        frozen=True,
    )


class CaseSerial(_Wire):
    """One case serial number on an item, with how many units it holds."""

    id: Ref
    quantity: Quantity | None = None


class AdditionalField(_Wire):
    """A customer-defined shipment field kept as given."""

    name: Ref
    value: Text


class DocumentItem(_Wire):
    """An order item in a document. Which fields are required depends on the strategy."""

    lpn: Ref | None = Field(None, description="License plate of the pallet.")
    sku: Ref | None = Field(None, description="Stock keeping unit.")
    quantity: Quantity | None = Field(None, description="Item quantity, > 0.")
    quantity_unit: QuantityUnit | None = None
    identifier: Ref | None = Field(
        None, description="When given, the item's reference (else lpn, else sku)."
    )
    purchase_order: Ref | None = None
    description: Text | None = None
    upc: Ref | None = None
    lot: Ref | None = None
    expiration_date: date | None = Field(None, description="ISO 8601 date, e.g. 2026-09-30.")
    weight_per_unit: Quantity | None = None
    weight_unit: WeightUnit | None = None
    case_serials: list[CaseSerial] | None = Field(None, max_length=MAX_CASE_SERIALS_PER_ITEM)

    @property
    def reference(self) -> str:
        """The spec's item reference: identifier, else lpn, else sku."""
        return self.identifier or self.lpn or self.sku or ""


class DocumentOrder(_Wire):
    """One order of a multi-order document."""

    order_number: Ref
    order_item_update_strategy: Strategy | None = Field(
        None, description="Defaults to the document's strategy, then OVERWRITE."
    )
    items: list[DocumentItem] | None = Field(None, max_length=MAX_ITEMS_PER_ORDER)


class IntakeDocument(_Wire):
    """Body of ``POST /documents``: a single order (``orderNumber``) or several (``orders``)."""

    business: Ref = Field(description="Business slug.")
    facility: Ref = Field(description="Facility slug.")
    direction: Direction
    order_number: Ref | None = Field(None, description="Single-order shape: the order number.")
    shipment_number: Ref | None = Field(
        None, description="Shipment reference; defaults to orderNumber in the single-order shape."
    )
    order_item_update_strategy: Strategy | None = Field(
        None, description="OVERWRITE (default when items are given), APPEND, MERGE or DELETE."
    )
    items: list[DocumentItem] | None = Field(None, max_length=MAX_ITEMS_PER_ORDER)
    orders: list[DocumentOrder] | None = Field(
        None, max_length=MAX_ORDERS_PER_DOCUMENT, description="Multi-order shape."
    )
    expected_arrival_at: AwareDatetime | None = Field(
        None, description="ISO 8601 with a UTC offset."
    )
    trailer_number: Ref | None = None
    dock_slug: Ref | None = Field(None, description="Dock of the facility planned for it.")
    carrier: Ref | None = None
    seal_number: Ref | None = None
    bol_number: Ref | None = None
    additional_fields: list[AdditionalField] | None = Field(None, max_length=MAX_ADDITIONAL_FIELDS)

    def order_documents(self) -> list[DocumentOrder]:
        """Every order of the document in the multi-order form, strategies defaulted."""
        if self.orders is not None:
            return [
                o.model_copy(
                    update={
                        "order_item_update_strategy": o.order_item_update_strategy
                        or self.order_item_update_strategy
                    }
                )
                for o in self.orders
            ]
        assert self.order_number is not None  # guaranteed by parse_document
        return [
            DocumentOrder.model_construct(
                order_number=self.order_number,
                order_item_update_strategy=self.order_item_update_strategy,
                items=self.items,
            )
        ]

    def order_paths(self) -> list[str]:
        """The path prefix of each order's fields, for error messages (``orders[1].``)."""
        if self.orders is not None:
            return [f"orders[{i}]." for i in range(len(self.orders))]
        return [""]

    @property
    def shipment_reference(self) -> str:
        """The shipment number: shipmentNumber, else orderNumber."""
        return self.shipment_number or self.order_number or ""


def effective_strategy(order: DocumentOrder) -> Strategy:
    return order.order_item_update_strategy or "OVERWRITE"


# Fields an item must carry under each strategy (MERGE's creation needs are checked by intake).
_REQUIRED: dict[str, tuple[str, ...]] = {
    "OVERWRITE": ("lpn", "sku", "quantity", "quantityUnit"),
    "APPEND": ("lpn", "sku", "quantity", "quantityUnit"),
    "MERGE": ("lpn", "sku"),
    "DELETE": ("lpn", "sku"),
}


def parse_document(data: Any, limits: TextLimits | None = None) -> IntakeDocument:
    """Validate a decoded body (JSON object or the dict built from XML) into a document.

    Raises `ValidationFailed` with one `{path, detail}` per bad field: types and limits
    (`limits`, else the defaults) first, then the document shape and the fields each strategy
    requires.
    """
    if not isinstance(data, dict):
        raise ValidationFailed(
            "the document must be an object",
            errors=[FieldError("$", "expected an object with orderNumber or orders")],
        )
    try:
        document = IntakeDocument.model_validate(data, context={"limits": limits or TextLimits()})
    except ValidationError as exc:
        errors = ErrorList()
        for error in exc.errors(include_url=False):
            errors.add(_path(error["loc"]), _message(error))
        errors.raise_if_any()
        raise  # pragma: no cover - a ValidationError always has errors
    _check_shape(document)
    return document


def _check_shape(document: IntakeDocument) -> None:
    errors = ErrorList()
    arrival = document.expected_arrival_at
    if arrival is not None and (refusal := instant_refusal(arrival)) is not None:
        errors.add("expectedArrivalAt", refusal)
    elif arrival is not None and arrival > datetime.now(UTC) + MAX_ARRIVAL_AHEAD:
        errors.add("expectedArrivalAt", "more than two years ahead")
    if document.orders is not None:
        if document.order_number is not None:
            errors.add("orderNumber", "give either orderNumber or orders, not both")
        if document.items is not None:
            errors.add("items", "with orders, items belong inside each order")
        if document.shipment_number is None:
            errors.add("shipmentNumber", "required with orders")
        if not document.orders:
            errors.add("orders", "must list at least one order")
        seen: dict[str, int] = {}
        for index, order in enumerate(document.orders):
            first = seen.setdefault(order.order_number, index)
            if first != index:
                errors.add(
                    f"orders[{index}].orderNumber",
                    f"order {order.order_number!r} already appears in orders[{first}]",
                )
    elif document.order_number is None:
        errors.add("orderNumber", "Field required (or give shipmentNumber and orders)")
    if not errors.errors:
        for prefix, order in zip(document.order_paths(), document.order_documents(), strict=True):
            strategy = effective_strategy(order)
            for index, item in enumerate(order.items or ()):
                for name in _REQUIRED[strategy]:
                    if getattr(item, _snake(name)) is None:
                        errors.add(
                            f"{prefix}items[{index}].{name}", f"Field required for {strategy}"
                        )
    errors.raise_if_any()


def _snake(name: str) -> str:
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in name)


def _path(loc: tuple[int | str, ...]) -> str:
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else str(part)
    return path or "$"


def _message(error: Any) -> str:
    if error["type"] == "extra_forbidden":
        return "unknown field"
    return str(error["msg"])


# --- response ------------------------------------------------------------------------------


class _Out(BaseModel):
    """Response parts: built by name in Python, serialized camelCase."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_alias=True,
        validate_by_name=True,
        serialize_by_alias=True,
        frozen=True,
    )


class ChangeEntry(_Out):
    """An entity this request created, updated or removed."""

    type: ChangeType
    id: str
    reference: str


class ResponseItem(_Out):
    lpn: str | None
    sku: str | None
    quantity: float | int
    quantity_unit: str
    id: str


class ResponseOrder(_Out):
    order_number: str
    status: str
    items: list[ResponseItem]


class ResponseShipment(_Out):
    id: int
    status: str
    orders: list[ResponseOrder]


class IntakeResponse(_Out):
    """Body of a successful ``POST /documents``: 201 when `created` is non-empty, else 200."""

    created: list[ChangeEntry]
    updated: list[ChangeEntry]
    removed: list[ChangeEntry]
    shipment: ResponseShipment
