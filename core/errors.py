"""The one error hierarchy. Each transport maps these once (problem+json, gRPC status, GraphQL)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class FieldError:
    """One invalid input field, addressed like ``items[2].quantity``."""

    path: str
    detail: str


class DockflowError(Exception):
    """Root of every error the domain raises on purpose. `code` is stable for clients."""

    code = "INTERNAL"
    status = 500  # HTTP status the REST edge answers with
    title = "Internal Server Error"

    def __init__(self, detail: str = "", *, errors: list[FieldError] | None = None) -> None:
        super().__init__(detail or self.title)
        self.detail = detail or self.title
        self.errors: list[FieldError] = errors or []


class ConfigError(DockflowError):
    code = "CONFIG"
    title = "Invalid configuration"


class BadRequest(DockflowError):
    code = "BAD_REQUEST"
    status = 400
    title = "Bad Request"


class Unauthenticated(DockflowError):
    code = "UNAUTHENTICATED"
    status = 401
    title = "Unauthorized"


class Forbidden(DockflowError):
    code = "FORBIDDEN"
    status = 403
    title = "Forbidden"


class NotFound(DockflowError):
    code = "NOT_FOUND"
    status = 404
    title = "Not Found"


class Conflict(DockflowError):
    code = "CONFLICT"
    status = 409
    title = "Conflict"


class DuplicateOrderItemKey(Conflict):
    code = "DUPLICATE_ORDER_ITEM_KEY"


class DuplicateItemInRequest(Conflict):
    code = "DUPLICATE_ITEM_IN_REQUEST"


class AlreadyExists(Conflict):
    code = "ALREADY_EXISTS"


class OrderItemNotFound(Conflict):
    """DELETE named an lpn + sku pair that is not on the matched order."""

    code = "ORDER_ITEM_NOT_FOUND"


class IdempotencyKeyInFlight(Conflict):
    code = "IDEMPOTENCY_KEY_IN_FLIGHT"


class PayloadTooLarge(DockflowError):
    code = "PAYLOAD_TOO_LARGE"
    status = 413
    title = "Content Too Large"


class UnsupportedMediaType(DockflowError):
    code = "UNSUPPORTED_MEDIA_TYPE"
    status = 415
    title = "Unsupported Media Type"


class ValidationFailed(DockflowError):
    code = "VALIDATION_FAILED"
    status = 422
    title = "Unprocessable Entity"


class IdempotencyKeyReused(ValidationFailed):
    code = "IDEMPOTENCY_KEY_REUSED"


class RateLimited(DockflowError):
    code = "RATE_LIMITED"
    status = 429
    title = "Too Many Requests"

    def __init__(self, detail: str = "", *, retry_after_s: int = 1) -> None:
        super().__init__(detail)
        self.retry_after_s = retry_after_s


class Unavailable(DockflowError):
    """The database (or another dependency) cannot be reached; the caller may retry."""

    code = "UNAVAILABLE"
    status = 503
    title = "Service Unavailable"


@dataclass
class ErrorList:
    """Collects field errors so validation reports every bad field at once."""

    errors: list[FieldError] = field(default_factory=list)

    def add(self, path: str, detail: str) -> None:
        self.errors.append(FieldError(path, detail))

    def raise_if_any(self, detail: str = "the document has invalid fields") -> None:
        if self.errors:
            raise ValidationFailed(detail, errors=self.errors)
