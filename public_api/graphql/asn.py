"""A shipment's advance ship notice as GraphQL shows it (`Shipment.asn`, docs/asn.md): the
same document `GET /shipments/{id}/asn` answers, issued by `core.asn.issue` under the same
rules (another business's or facility's shipment is NOT_FOUND; a pallet lacking what an ASN
needs is reason CONFLICT, no trading-partner profile reason VALIDATION_FAILED, each naming
what is missing). The format enum is core's, shared with the ASN webhook endpoints."""

from __future__ import annotations

import strawberry

from core.asn import issue
from core.asn.issue import AsnDocument
from core.endpoints.endpoint_kinds import AsnFormat
from public_api.graphql.context import GraphQLContext

__all__ = ["AsnFormat", "ShipmentAsn", "asn_of"]

# Core's formats under the name the schema has given them since ASN endpoints came: renaming
# the enum would break every client document declaring a variable of it.
strawberry.enum(
    AsnFormat,
    name="WebhookAsnFormat",
    description="The EDI document of an ASN: X12_856 (an X12 856 ship notice) or "
    "EDIFACT_DESADV (a D96A EANCOM DESADV).",
)


@strawberry.type(
    description="A shipment's advance ship notice, built from the pallets loaded on its trailer."
)
class ShipmentAsn:
    text: str = strawberry.field(description="The EDI interchange, as REST answers it.")
    format: AsnFormat
    content_type: str = strawberry.field(description="application/edi-x12 or application/edifact.")
    control_number: int = strawberry.field(description="The interchange's (ISA13 / UNB 0020).")
    complete: bool = strawberry.field(
        description="false: the shipment is still loading; the notice is a preview under "
        "control number 0, which no partner's sequence spends."
    )
    replaces: bool = strawberry.field(
        description="A replacement after a correction (BSN01 05 / BGM function 5)."
    )

    @classmethod
    def of(cls, document: AsnDocument) -> ShipmentAsn:
        return cls(
            text=document.text,
            format=AsnFormat(document.format),
            content_type=document.content_type,
            control_number=document.control_number,
            complete=document.complete,
            replaces=document.replaces,
        )


async def asn_of(
    context: GraphQLContext, shipment_id: int, format: AsnFormat, x12_version: str | None
) -> ShipmentAsn:
    """The caller's shipment's ASN, the shipment read again under the caller's scope: the
    rule is REST's, in one place (`core.asn.issue.asn_for`)."""
    document = await issue.asn_for(
        context.services.storage,
        context.require_principal(),
        shipment_id,
        issue.check_format(format.value),
        x12_version=x12_version,
    )
    return ShipmentAsn.of(document)
