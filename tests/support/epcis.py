"""Independent checks of what dockflow emits as EPCIS: GS1's official EPCIS 2.0 JSON Schema
(tests/vendor/epcis, fetched from gs1/EPCIS, not retyped) and the reference implementation of
the CBV 2.0 event hash (the MIT `epcis-event-hash-generator`, reading the JSON-LD document)."""

from __future__ import annotations

import copy
import json
import warnings
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jsonschema
from biip.sscc import Sscc
from epcis_event_hash_generator import hash_generator, json_to_py

from core.epcis import events
from core.epcis.identities import DIGITAL_LINK_BASE, EpcFormat, check_sscc, prefix_length

SCHEMA = json.loads(
    (Path(__file__).parents[1] / "vendor" / "epcis" / "EPCIS-JSON-Schema.json").read_text()
)
VALIDATOR = jsonschema.Draft7Validator(SCHEMA, format_checker=jsonschema.FormatChecker())


def recomputed_event_id(event: dict[str, Any]) -> str:
    """The reference implementation's hash of the event, read from an EPCISDocument."""
    document = epcis_document([event], datetime.now(UTC))
    with warnings.catch_warnings():
        # it reads its bundled JSON-LD context with importlib.resources.open_text, deprecated
        warnings.simplefilter("ignore", DeprecationWarning)
        parsed = json_to_py.event_list_from_epcis_document_json(copy.deepcopy(document))
    [hashed] = hash_generator.epcis_hashes_from_events(parsed)
    return str(hashed)


def assert_valid_event(event: dict[str, Any]) -> None:
    """The event alone and in an EPCISDocument is valid EPCIS 2.0, and its eventID is the CBV
    2.0 event hash the reference implementation computes."""
    document = epcis_document([event], datetime.now(UTC))
    VALIDATOR.validate(document)
    VALIDATOR.validate({"@context": document["@context"], **event})
    assert event["eventID"] == recomputed_event_id(event)


def epcis_document(found: list[dict[str, Any]], created_at: datetime) -> dict[str, Any]:
    """An EPCISDocument carrying `found`, built apart from the service's `epcis_document`."""
    return {
        "@context": [events.EPCIS_CONTEXT],
        "type": "EPCISDocument",
        "schemaVersion": events.SCHEMA_VERSION,
        "creationDate": created_at.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        "epcisBody": {"eventList": list(found)},
    }


def sscc_uri(sscc: str, declared_prefix: str | None, form: EpcFormat = "urn") -> str | None:
    """A pallet's EPC as a caller may name it in a query: ``urn:epc:id:sscc:…`` (GS1 EPC Tag
    Data Standard 6.3.2; None when its prefix length is unknown) or its Digital Link."""
    check_sscc(sscc)
    if form == "digital_link":
        return f"{DIGITAL_LINK_BASE}/00/{sscc}"
    body = sscc[1:-1]  # company prefix and serial reference, without extension and check digit
    length = prefix_length(body, declared_prefix, Sscc.parse(sscc).company_prefix)
    if length is None:
        return None
    return f"urn:epc:id:sscc:{body[:length]}.{sscc[0]}{body[length:]}"
