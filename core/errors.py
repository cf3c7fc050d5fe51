"""The one error hierarchy. Each error carries a stable `code` and no transport detail; each
transport maps codes once (problem+json in `public_api.problems`, GraphQL in
`public_api.graphql.errors`, gRPC in `edge.status`)."""

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

    def __init__(self, detail: str = "", *, errors: list[FieldError] | None = None) -> None:
        super().__init__(detail or self.code)
        self.detail = detail or self.code
        self.errors: list[FieldError] = errors or []


class ConfigError(DockflowError):
    """The settings are invalid: the process cannot start as configured."""

    code = "CONFIG"


class BackupError(ConfigError):
    """A backup of the embedded database cannot be taken or put back (bad folder, a server
    running, a mismatch, a database that cannot be read): `dockflow admin` says it in one
    line and exits 2."""


class BadRequest(DockflowError):
    """The request cannot be read (malformed body, bad header)."""

    code = "BAD_REQUEST"


class UnsupportedGrantType(BadRequest):
    """A token request for a grant other than client credentials."""

    code = "UNSUPPORTED_GRANT_TYPE"


class InvalidTarget(BadRequest):
    """A token request for an audience this issuer does not serve."""

    code = "INVALID_TARGET"


class Unauthenticated(DockflowError):
    code = "UNAUTHENTICATED"


class Forbidden(DockflowError):
    code = "FORBIDDEN"


class NotFound(DockflowError):
    code = "NOT_FOUND"


class Conflict(DockflowError):
    code = "CONFLICT"


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


class UnsupportedMediaType(DockflowError):
    code = "UNSUPPORTED_MEDIA_TYPE"


class NotAcceptable(DockflowError):
    """The request asks for a representation this service does not give."""

    code = "NOT_ACCEPTABLE"


class ValidationFailed(DockflowError):
    code = "VALIDATION_FAILED"


class IdempotencyKeyReused(ValidationFailed):
    code = "IDEMPOTENCY_KEY_REUSED"


class AuthMustBeGivenAgain(ValidationFailed):
    """A webhook endpoint's stored credentials were given for one origin (scheme, host, port):
    sending to another needs them given again (`webhook_endpoints.check_auth_may_stay`)."""

    code = "AUTH_MUST_BE_GIVEN_AGAIN"


class RetentionExceeded(ValidationFailed):
    """Messages asked for are older than the retained feed (`core.retention`)."""

    code = "RETENTION_EXCEEDED"


class RateLimited(DockflowError):
    code = "RATE_LIMITED"

    def __init__(self, detail: str = "", *, retry_after_s: int = 1) -> None:
        super().__init__(detail)
        self.retry_after_s = retry_after_s


class QuotaExceeded(DockflowError):
    """A business's stored bytes of one kind would pass its quota (core/tenancy/quotas.py):
    nothing is written until retention gives bytes back or an operator raises the quota."""

    code = "QUOTA_EXCEEDED"


class Unavailable(DockflowError):
    """The database (or another dependency) cannot be reached; the caller may retry."""

    code = "UNAVAILABLE"


class DatabaseUnavailable(Unavailable):
    """The embedded database did not start, or did not come back after a crash."""


class FeedStopped(Unavailable):
    """The push message feed is shutting down; subscribers reconnect elsewhere or later."""


class MessageIdsFenced(DockflowError):
    """A unit of work's reserved message ids were given up by a feed reader (a void took them)
    before it committed, each time it ran under fresh ids (`core.feed.publish.MAX_RENUMBERS`):
    it stalled past the feed's grace again and again, and gives up."""

    code = "MESSAGE_IDS_FENCED"

    def __init__(self, ids: list[int]) -> None:
        super().__init__(f"message ids {ids} were fenced by a feed reader; write them anew")
        self.ids = ids


class MessageIdsExhausted(DockflowError):
    """A business's message ids reached the bound below GraphQL's `Int` (core/feed/ids.py):
    its writes that publish messages are refused until an operator acts (docs/scale.md). Not
    UNAVAILABLE: a retry cannot succeed, and a camera retrying forever would burn ids."""

    code = "MESSAGE_IDS_EXHAUSTED"


class FeedSchemaTooNew(ConfigError):
    """The database's push message feed was laid out by a later release than this one."""


class FeedUpgradeNeeded(ConfigError):
    """The database's push message feed still has an earlier release's layout (one global
    message id sequence): this release refuses to start until the operator, with every process
    of earlier releases stopped, runs the upgrade (core/feed/ids.py, `upgrade`)."""


class SlowConsumer(DockflowError):
    """A subscriber fell further behind than its buffer allows; it resumes from its last id."""

    code = "SLOW_CONSUMER"


class CredentialUnreadable(DockflowError):
    """A credential stored at rest cannot be decrypted with this process's secret key (it was
    sealed with another one)."""

    code = "CREDENTIAL_UNREADABLE"


@dataclass
class ErrorList:
    """Collects field errors so validation reports every bad field at once."""

    errors: list[FieldError] = field(default_factory=list)

    def add(self, path: str, detail: str) -> None:
        self.errors.append(FieldError(path, detail))

    def raise_if_any(self, detail: str = "the document has invalid fields") -> None:
        if self.errors:
            raise ValidationFailed(detail, errors=self.errors)
