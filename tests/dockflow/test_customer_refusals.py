"""Which refusals the customer commands give up on: one rule by HTTP status for the token
endpoint and for GraphQL errors (dockflow/customer_client.py: refused_for_good)."""

from __future__ import annotations

import pytest

from dockflow.consume import ConsumerError, Refused, graphql_failure
from dockflow.customer_client import TokenRequestFailed


@pytest.mark.parametrize(
    ("extensions", "for_good"),
    [
        ({"code": "FORBIDDEN", "reason": "FORBIDDEN", "status": 403}, True),
        ({"code": "NOT_FOUND", "reason": "NOT_FOUND", "status": 404}, True),
        # A quota or a conflict is refused again until an operator acts.
        ({"code": "QUOTA_EXCEEDED", "reason": "QUOTA_EXCEEDED", "status": 403}, True),
        ({"code": "CONFLICT", "reason": "CONFLICT", "status": 409}, True),
        # No status: the query itself was refused (parse, validation, cost limits).
        ({"code": "BAD_USER_INPUT"}, True),
        ({"code": "QUERY_TOO_COSTLY"}, True),
        ({"code": "RATE_LIMITED", "reason": "RATE_LIMITED", "status": 429}, False),
        ({"code": "INTERNAL", "reason": "UNAVAILABLE", "status": 503}, False),
        ({"code": "INTERNAL", "reason": "SLOW_CONSUMER", "status": 503}, False),
        ({"code": "INTERNAL", "status": 500}, False),
    ],
)
def test_a_graphql_error_is_final_when_its_status_is_a_4xx_but_408_and_429(
    extensions: dict[str, object], for_good: bool
):
    failure = graphql_failure("pushMessages", {"message": "no", "extensions": extensions})

    assert isinstance(failure, Refused) is for_good
    assert isinstance(failure, ConsumerError) is not for_good


def test_an_unauthenticated_graphql_error_asks_for_a_new_token():
    failure = graphql_failure("pushMessages", {"extensions": {"code": "UNAUTHENTICATED"}})

    assert isinstance(failure, ConsumerError)
    assert failure.auth


@pytest.mark.parametrize(
    ("status", "for_good"), [(400, True), (401, True), (408, False), (429, False), (503, False)]
)
def test_the_token_endpoint_follows_the_same_rule(status: int, for_good: bool):
    assert TokenRequestFailed(status, "{}").permanent is for_good
