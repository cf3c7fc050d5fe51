"""Who is calling, and what they may see: the one access rule every capability asks.

The rule, written once here (`client_may_see`, `operator_may_see`): an API client sees its own
business, and where it is restricted to facilities, only records of those facilities (a record
of the whole business, such as a business-wide webhook endpoint, is not one of them); an
operator sees every business, or only the businesses of its account. The checks below differ
only in the answer a caller gets when the rule says no (docs/decisions.md, D3):

- `check_access`, `check_client_record`: an address or a record (REST, `shipment(id)`): another
  business is 404, NOT_FOUND.
- `check_scope`: a filter (GraphQL `pushMessages`, `shipments`, subscriptions): FORBIDDEN.
- `check_operator_scope`: the dashboard and the CLI: "not found", as for a missing record.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import jwt

from core.errors import Forbidden, NotFound, Unauthenticated

if TYPE_CHECKING:
    from core.storage import Doc
    from core.tenancy.tenants import Operator


@dataclass(frozen=True)
class Principal:
    """An authenticated API caller: a client (or an external-issuer subject) of one business."""

    subject: str
    business: str
    # None: every facility of the business; otherwise only these.
    facilities: frozenset[str] | None = None
    token_id: str | None = None
    # The token's `iat` (seconds since the epoch), None when it has none.
    issued_at: int | None = None
    # The token's `exp`: an open websocket ends then (`TokenService.current_principal`).
    expires_at: int | None = None
    # The built-in signing key that signed the token: its revocation ends the principal too.
    key_id: str | None = None
    # Issued by the configured external identity provider (no client stored here).
    external: bool = False


@dataclass(frozen=True)
class Scope:
    """The (business, facility) pairs a reader may see: every business of `businesses` with
    every facility of `facilities`, None standing for all. An operator sees whole businesses;
    an API client sees its business, perhaps only some of its facilities."""

    businesses: frozenset[str] | None = None
    facilities: frozenset[str] | None = None

    @classmethod
    def of_principal(cls, principal: Principal) -> Scope:
        return cls(frozenset([principal.business]), principal.facilities)

    @classmethod
    def of_operator(cls, operator: Operator) -> Scope:
        return cls(operator.businesses)

    def narrowed(self, business: str | None, facility: str | None = None) -> Scope | None:
        """This scope limited to a business and a facility (None: no limit); None when
        nothing is left."""
        for wanted, allowed in ((business, self.businesses), (facility, self.facilities)):
            if wanted is not None and allowed is not None and wanted not in allowed:
                return None
        return Scope(
            self.businesses if business is None else frozenset([business]),
            self.facilities if facility is None else frozenset([facility]),
        )

    def query(self) -> dict[str, Any]:
        """The query fragment limiting a collection with `business` and `facility` fields."""
        fragment: dict[str, Any] = {}
        for field, allowed in (("business", self.businesses), ("facility", self.facilities)):
            if allowed is not None and len(allowed) == 1:
                fragment[field] = next(iter(allowed))
            elif allowed is not None:
                fragment[field] = {"$in": sorted(allowed)}
        return fragment


def client_may_see(principal: Principal, business: str, facility: str | None) -> bool:
    """Whether an API client may see a record of `business` and `facility` (None: a record of
    the whole business, which a client restricted to facilities does not see)."""
    if business != principal.business:
        return False
    return principal.facilities is None or (
        facility is not None and facility in principal.facilities
    )


def operator_may_see(operator: Operator, business: str) -> bool:
    """Whether an operator may see records of `business`: every business, or its own list."""
    return operator.businesses is None or business in operator.businesses


def check_access(principal: Principal, business: str, facility: str | None = None) -> None:
    """Raise unless `principal` may act on `business` (and `facility`).

    Another business is 404, never 403: a caller must not learn that another tenant exists.
    A facility outside a restricted client's list is 403 (it is the caller's own business).
    """
    if business != principal.business:
        raise NotFound(f"business {business!r} not found")
    if facility is not None and not client_may_see(principal, business, facility):
        raise Forbidden(f"this client may not access facility {facility!r}")


def check_scope(principal: Principal, business: str, facility: str | None = None) -> None:
    """GraphQL's scope rule for a filter: a business slug other than the caller's is FORBIDDEN.

    (REST answers 404 for it; here the slug is a filter, not an address, and every other slug
    gets the same answer, so nothing about other tenants is revealed.)
    """
    if business != principal.business:
        raise Forbidden(f"this client may not access business {business!r}")
    if facility is not None and not client_may_see(principal, business, facility):
        raise Forbidden(f"this client may not access facility {facility!r}")


def check_client_record(principal: Principal, record: Doc | None, what: str) -> Doc:
    """`record` if the client may see it; `NotFound` naming `what` for a missing record or one of
    another business (the same answer, so no other tenant's id can be told from a made-up one),
    `Forbidden` for one of a facility outside a restricted client's list."""
    if record is None or record.get("business") != principal.business:
        raise NotFound(f"{what} not found")
    if not client_may_see(principal, principal.business, record.get("facility")):
        raise Forbidden(f"this client may not access facility {record.get('facility')!r}")
    return record


def check_operator_scope(operator: Operator, record: Doc | None, what: str) -> Doc:
    """`record` if the operator may see its business, else `NotFound` (as for a missing record:
    the dashboard never reveals another business's records)."""
    if record is None or not operator_may_see(operator, str(record.get("business"))):
        raise NotFound(f"{what} not found")
    return record


LEEWAY_S = 30  # clock skew tolerated on exp/iat, between dockflow processes, clients, providers


def decode_claims(
    token: str, key: Any, *, algorithm: str, audience: str, issuer: str, require: list[str]
) -> dict[str, Any]:
    """The verified claims of a bearer token (signature, expiry, audience, issuer, required
    claims); each failure is `Unauthenticated` with what is wrong. Built-in and external-issuer
    tokens alike."""
    try:
        claims: dict[str, Any] = jwt.decode(
            token,
            key,
            algorithms=[algorithm],
            audience=audience,
            issuer=issuer,
            leeway=LEEWAY_S,
            options={"require": require},
        )
    except jwt.ExpiredSignatureError:
        raise Unauthenticated("the bearer token has expired") from None
    except jwt.InvalidAudienceError:
        raise Unauthenticated("the bearer token is for another audience") from None
    except jwt.InvalidIssuerError:
        raise Unauthenticated("the bearer token is from another issuer") from None
    except jwt.PyJWTError:
        raise Unauthenticated("the bearer token is invalid") from None
    return claims


def principal_from_claims(
    claims: dict[str, Any], business_claim: str = "business", *, external: bool = False
) -> Principal:
    """The principal of verified token claims: `sub`, the business (from `business_claim`) and
    an optional `facilities` list. Used for built-in and external-issuer tokens alike."""
    business = claims.get(business_claim)
    if not isinstance(business, str) or not business:
        raise Unauthenticated(f"the bearer token has no {business_claim!r} claim")
    facilities = claims.get("facilities")
    if facilities is not None and not (
        isinstance(facilities, list) and all(isinstance(f, str) for f in facilities)
    ):
        raise Unauthenticated("the bearer token's facilities claim is invalid")
    token_id = claims.get("jti")
    issued_at, expires_at = claims.get("iat"), claims.get("exp")
    return Principal(
        subject=str(claims["sub"]),
        business=business,
        facilities=None if facilities is None else frozenset(facilities),
        token_id=token_id if isinstance(token_id, str) else None,
        issued_at=issued_at if isinstance(issued_at, int) else None,
        expires_at=expires_at if isinstance(expires_at, int) else None,
        external=external,
    )
