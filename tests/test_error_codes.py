"""Every core error has a stable code and no transport detail, and each edge maps every code in
its one table: problem+json (`public_api.problems`), GraphQL (`public_api.graphql.errors`) and
gRPC (`edge.status`)."""

from __future__ import annotations

import grpc
import pytest

from core import errors
from core.errors import DockflowError
from edge.status import GRPC_CODES, status_for
from public_api.graphql.errors import GRAPHQL_CODES, error_extensions
from public_api.oauth import OAUTH_ERRORS
from public_api.problems import HTTP_PROBLEMS, http_problem


def _error_classes(root: type[DockflowError] = DockflowError) -> list[type[DockflowError]]:
    found = [root]
    for sub in root.__subclasses__():
        found += _error_classes(sub)
    return found


ERROR_CLASSES = _error_classes()
CODES = sorted({cls.code for cls in ERROR_CLASSES})


def test_every_core_error_is_defined_in_core_errors_with_a_code_and_no_http_status():
    for cls in ERROR_CLASSES:
        assert cls.__module__ == errors.__name__, cls
        assert cls.code.isupper(), cls
        assert not hasattr(cls, "status"), cls
        assert not hasattr(cls, "title"), cls


@pytest.mark.parametrize("code", CODES)
def test_every_code_is_in_each_edge_table(code: str):
    assert code in HTTP_PROBLEMS
    assert code in GRAPHQL_CODES
    assert code in GRPC_CODES


def test_the_oauth_table_maps_only_client_errors():
    assert set(OAUTH_ERRORS) <= set(CODES)
    assert all(400 <= status < 500 for status, _ in OAUTH_ERRORS.values())


# What clients see for a few errors, one per row: HTTP status, GraphQL code, gRPC status.
SEEN = [
    (errors.BadRequest, 400, "BAD_USER_INPUT", grpc.StatusCode.INVALID_ARGUMENT),
    (errors.Unauthenticated, 401, "UNAUTHENTICATED", grpc.StatusCode.UNAUTHENTICATED),
    (errors.Forbidden, 403, "FORBIDDEN", grpc.StatusCode.PERMISSION_DENIED),
    (errors.NotFound, 404, "NOT_FOUND", grpc.StatusCode.NOT_FOUND),
    (errors.AlreadyExists, 409, "BAD_USER_INPUT", grpc.StatusCode.ALREADY_EXISTS),
    (errors.DuplicateOrderItemKey, 409, "BAD_USER_INPUT", grpc.StatusCode.ABORTED),
    (errors.PayloadTooLarge, 413, "BAD_USER_INPUT", grpc.StatusCode.INVALID_ARGUMENT),
    (errors.UnsupportedMediaType, 415, "BAD_USER_INPUT", grpc.StatusCode.INTERNAL),
    (errors.IdempotencyKeyReused, 422, "BAD_USER_INPUT", grpc.StatusCode.INVALID_ARGUMENT),
    (errors.RetentionExceeded, 422, "BAD_USER_INPUT", grpc.StatusCode.OUT_OF_RANGE),
    (errors.RateLimited, 429, "BAD_USER_INPUT", grpc.StatusCode.RESOURCE_EXHAUSTED),
    (errors.CredentialUnreadable, 500, "INTERNAL", grpc.StatusCode.INTERNAL),
    (errors.DatabaseUnavailable, 503, "INTERNAL", grpc.StatusCode.UNAVAILABLE),
    (errors.SlowConsumer, 503, "INTERNAL", grpc.StatusCode.INTERNAL),
    (errors.MessageIdsExhausted, 500, "INTERNAL", grpc.StatusCode.FAILED_PRECONDITION),
]


@pytest.mark.parametrize(("cls", "http", "graphql", "rpc"), SEEN)
def test_each_edge_answers_an_error_with_its_status(
    cls: type[DockflowError], http: int, graphql: str, rpc: grpc.StatusCode
):
    error = cls("what went wrong")

    assert http_problem(error)[0] == http
    assert error_extensions(error) == {"code": graphql, "reason": cls.code, "status": http}
    assert status_for(error) == (rpc, "what went wrong")
