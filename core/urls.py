"""Every public URL dockflow hands out (in push messages, GraphQL answers, Location headers),
built in one place from the settings' base URLs."""

from __future__ import annotations

from core.settings import Settings


def pallet_url(settings: Settings, pallet_id: str) -> str:
    """The pallet's dashboard page."""
    return f"{settings.dashboard_base_url}/pallets/{pallet_id}"


def shipment_url(settings: Settings, shipment_id: int) -> str:
    """The shipment's dashboard page."""
    return f"{settings.dashboard_base_url}/shipments/{shipment_id}"


def exception_url(settings: Settings, exception_id: str) -> str:
    """The exception's dashboard page."""
    return f"{settings.dashboard_base_url}/exceptions/{exception_id}"


def shipment_document_url(settings: Settings, document_id: str) -> str:
    """Where an API client downloads a shipment document (with its bearer token)."""
    return f"{settings.public_base_url}/shipment-documents/{document_id}"


def asn_url(settings: Settings, shipment_id: int) -> str:
    """Where an API client fetches an outbound shipment's ASN (with its bearer token)."""
    return f"{settings.public_base_url}/shipments/{shipment_id}/asn"


def schema_url(settings: Settings, message_type: str) -> str:
    """The JSON Schema of a message type's payload (the event catalog)."""
    return f"{settings.public_base_url}/v1/schemas/{message_type}.json"
