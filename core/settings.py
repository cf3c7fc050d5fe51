"""One frozen settings object: defaults, then an optional TOML file, then ``DOCKFLOW_*`` env."""

from __future__ import annotations

import difflib
import ipaddress
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)
from pydantic_settings.exceptions import SettingsError

from core.errors import ConfigError
from core.settings_files import ENV_PREFIX, SettingFilesSource, decode_text, variable

# The MongoDB-wire servers dockflow can start itself (dockflow/embedded/supervisor.py).
EmbeddedEngine = Literal["nx-27017", "secantusdb"]
# The argon2id costs a new password may be hashed with (core/auth/credentials.py).
PasswordProfile = Literal["rfc9106-low-memory", "owasp-minimum"]

CONFIG_FILE = f"{ENV_PREFIX}CONFIG_FILE"
# DOCKFLOW_* variables that are not settings: read by the command line (customer tools, the
# simulator, the webhook listener), the test suite, and the compose files in deploy/.
OTHER_VARIABLES = frozenset(
    {
        CONFIG_FILE,
        "DOCKFLOW_CLIENT_ID",
        "DOCKFLOW_CLIENT_SECRET",
        "DOCKFLOW_CAMERA_TOKEN",
        "DOCKFLOW_WEBHOOK_SECRET",
        "DOCKFLOW_HOST",
        "DOCKFLOW_IMAGE",
        "DOCKFLOW_CHROMIUM",
        "DOCKFLOW_CATALOG_SELF_TEST",
    }
)
# Listening on every interface: clients on this machine reach it as localhost.
_WILDCARD_HOSTS = ("", "0.0.0.0", "::", "[::]")


def _config_file() -> Path | None:
    path = os.environ.get(CONFIG_FILE)
    return Path(path) if path else None


class Settings(BaseSettings):
    """Everything an operator can tune. Read once at start; never mutated."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, frozen=True, extra="forbid")

    # Storage: unset MONGODB_URL means an embedded server under DATA_DIR/mongo/<engine>.
    mongodb_url: str | None = None
    mongodb_db: str = "dockflow"
    data_dir: Path = Path("./var")
    # The embedded server: nx-27017 (over SQLite) or secantusdb (SecantusDB's secantusd-py,
    # over WiredTiger, a separate program installed with the dev dependencies).
    embedded_engine: EmbeddedEngine = "nx-27017"
    # The embedded server is restarted (same port, same files) this many seconds after it
    # exits unexpectedly; requests answer 503 / UNAVAILABLE meanwhile.
    embedded_restart_delay_s: float = Field(1.0, ge=0)
    # nx-27017 aborts a transaction whose client said nothing for this many seconds: SQLite has
    # one writer, so until then every other write to the database waits (a killed client).
    embedded_transaction_idle_s: float = Field(5.0, gt=0, le=60)
    # ...and one older than this many seconds, however chatty its client: every other tenant's
    # writes wait for it meanwhile. Not below core.storage.TRANSACTION_LIMIT_S (30 s), the
    # longest one of dockflow's units of work may take, by default.
    embedded_transaction_lifetime_s: float = Field(30.0, gt=0, le=60)
    # Listeners.
    http_host: str = "0.0.0.0"
    http_port: int = Field(8080, ge=0, le=65535)
    grpc_host: str = "0.0.0.0"
    grpc_port: int = Field(50051, ge=0, le=65535)
    # The ops listener (/healthz, /readyz, /metrics) of every process; 0: a free port, printed
    # at start. Loopback unless set: the metrics name endpoints and volumes of every business.
    ops_host: str = "127.0.0.1"
    ops_port: int = Field(9090, ge=0, le=65535)
    # The API's /metrics is on the ops port, not the public one (false: on the public port,
    # and the API's processes run no ops listener).
    metrics_on_ops_port: bool = True
    # The address customers use (token audience, links, API docs); unset: derived from the HTTP
    # listener, http(s)://{http_host, localhost for every interface}:{http_port}.
    public_base_url: str = ""
    dashboard_url: str = ""  # empty: {public_base_url}/dashboard
    # Dashboard operator sessions end after this many seconds without a request.
    dashboard_session_idle_s: float = Field(8 * 3600.0, gt=0)
    # ...and after this many seconds in any case (log in again once per shift).
    dashboard_session_max_s: float = Field(24 * 3600.0, gt=0)
    # TLS for both listeners: set both paths to enable.
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    log_format: Literal["json", "console"] = "json"
    # Seconds a graceful shutdown waits for streams and requests to finish.
    shutdown_grace_s: float = Field(5.0, ge=0)
    # Seconds between readiness turning 503 (gRPC health NOT_SERVING) and the start of the
    # drain, so load balancers see it and send no new work: 0 drains at once.
    shutdown_delay_s: float = Field(0.0, ge=0)
    # A server process keeps what survived a full garbage collection out of the next ones
    # (gc.freeze; dockflow/heap.py): a full collection walking 2,000 subscriptions stopped the
    # event loop for 470 ms. Off: CPython's collector as it comes.
    gc_freeze_heap: bool = True
    # One full collection walks the whole heap again, to free cycles that became garbage while
    # frozen, when the frozen heap grew by half, and at the latest every this many seconds.
    gc_thaw_interval_s: float = Field(600.0, gt=0)

    # Tokens: lifetime of an access token in seconds (RFC 6749 expires_in).
    token_ttl_s: int = Field(86400, ge=60)
    # Optional external identity provider, accepted beside the built-in issuer.
    jwt_issuer: str | None = None
    jwt_jwks_url: str | None = None
    jwt_audience: str | None = None
    jwt_business_claim: str = "business"
    # Seconds between JWKS fetches when an external token names an unknown key (and the most
    # a fetched JWKS is trusted before it is fetched again).
    jwt_jwks_min_refresh_s: float = Field(30.0, ge=0)
    jwt_jwks_max_age_s: float = Field(3600.0, gt=0)
    # Failed token requests for one client id: after `auth_failure_limit` failures within
    # `auth_failure_window_s`, the client id is locked for `auth_lockout_s` (doubling on each
    # further failure, up to `auth_lockout_max_s`); 429 with Retry-After meanwhile.
    auth_failure_limit: int = Field(10, ge=1)
    auth_failure_window_s: float = Field(900.0, gt=0)
    auth_lockout_s: float = Field(60.0, gt=0)
    auth_lockout_max_s: float = Field(3600.0, gt=0)
    # How long a verified camera token, and a client's enabled state, are cached per process:
    # disabling a camera or client takes effect within this time.
    auth_cache_s: float = Field(30.0, ge=0)
    # Key for encrypting webhook credentials at rest (urlsafe base64, 32 bytes); derived from
    # DATA_DIR's secret file when unset.
    secret_key: str | None = None

    # Request limits.
    max_document_bytes: int = Field(1024 * 1024, ge=1024)
    max_upload_bytes: int = Field(25 * 1024 * 1024, ge=1024)
    grpc_max_message_bytes: int = Field(1024 * 1024, ge=1024)
    # Longest a lone reading waits for others to share its database batch.
    ingest_batch_wait_ms: float = Field(5.0, ge=0)
    # Readings per database batch; bounded, as a feed reader meeting a business watches the
    # ids a full batch of every writer may hold in flight (core/feed/hub.py: start_window).
    ingest_batch_max: int = Field(256, ge=1, le=4096)

    # Camera ingest: what one reading or dock event may carry. A reading over a limit is
    # REJECTED with the reason and its stream goes on (core/camera_input.py).
    # Labels per reading.
    ingest_max_labels: int = Field(200, ge=1)
    # Readings and dock events older than this are refused: a camera clock that was reset (to
    # 1970, to year 1) would misdate pallets and switch date rules off. Cameras that buffer
    # offline replay within it.
    ingest_max_age_days: float = Field(7.0, gt=0, le=3650)
    # Characters of a label name (letters, digits, '_' and '-'; it becomes a payload key).
    ingest_max_label_name_chars: int = Field(64, ge=1)
    # UTF-8 bytes of one label value (printable text).
    ingest_max_label_value_bytes: int = Field(1024, ge=16)
    # Characters of a reading id or dock event id (printable text).
    ingest_max_id_chars: int = Field(200, ge=1)
    # Characters of the dock id a reading or dock event names.
    ingest_max_dock_id_chars: int = Field(200, ge=1)
    # Image URLs per reading (http or https).
    ingest_max_image_urls: int = Field(16, ge=0)
    # Characters of one image URL.
    ingest_max_image_url_chars: int = Field(2048, ge=16)
    # Open StreamReadings calls per camera and edge process (more: RESOURCE_EXHAUSTED); one is
    # the rule, the rest is room for reconnects that overlap the old stream.
    ingest_max_streams_per_camera: int = Field(8, ge=1)
    # Unary calls (SubmitReading, ReportDockEvent) in flight per camera and edge process.
    ingest_max_calls_per_camera: int = Field(64, ge=1)
    # Seconds between checks that an open camera stream's camera is still enabled with the same
    # token; a disabled, deleted or moved camera's stream ends within this time.
    camera_recheck_interval_s: float = Field(10.0, gt=0, le=30)

    # Webhooks: attempt timeout, retry schedule (seconds after each failure), and egress rules.
    # An attempt succeeds on a 2xx answered within this many seconds.
    webhook_timeout_s: float = Field(15.0, gt=0)
    # Delay before attempt 1, 2, ... (the first is "immediately"); after the last, DEAD.
    webhook_retry_schedule_s: tuple[float, ...] = (0, 5, 300, 1800, 7200, 18000, 36000, 36000)
    # Each delay is stretched or shrunk by up to this fraction so retries do not stampede.
    webhook_retry_jitter: float = Field(0.1, ge=0, le=1)
    # A 429/503 Retry-After is honoured up to this many seconds.
    webhook_retry_after_max_s: float = Field(3600.0, ge=0)
    # A claimed delivery is retried by any worker after this; keep it above 3x the timeout.
    webhook_lease_s: float = Field(60.0, gt=0)
    webhook_poll_interval_s: float = Field(0.5, gt=0)
    # Hosts exempt from the SSRF guard (private addresses and plain http allowed), e.g. 127.0.0.1.
    webhook_allow_hosts: tuple[str, ...] = ()
    # Local address every webhook connection is made from (the IP customers allow-list).
    webhook_source_address: str | None = None
    # An endpoint failing without a single success for this long is disabled.
    webhook_disable_after_s: float = Field(5 * 86400, gt=0)
    # An endpoint failing this long without a success: its business hears (ENDPOINT_FAILING).
    webhook_failing_notice_after_s: float = Field(86400, gt=0)
    # Webhook endpoints a business's clients may create (operators' are not counted).
    webhook_endpoints_per_business: int = Field(10, ge=0, le=1000)
    # Test sends (sendTestWebhook) a business may make per minute.
    webhook_test_sends_per_minute: int = Field(10, ge=1, le=1000)
    # Resends and recoveries (resendWebhookDelivery, recoverWebhookDeliveries) a business may
    # ask for per minute, together.
    webhook_redeliveries_per_minute: int = Field(30, ge=1, le=10000)
    # Enables and disables of endpoints (enableWebhookEndpoint, disableWebhookEndpoint) a
    # business may ask for per minute, together: each requeues or holds a whole backlog.
    webhook_endpoint_switches_per_minute: int = Field(10, ge=1, le=10000)
    # Per worker: requests in flight to one endpoint, and requests per second to it (0: no limit).
    webhook_endpoint_concurrency: int = Field(4, ge=1)
    webhook_endpoint_rate_per_s: float = Field(50.0, ge=0)
    # Per worker: deliveries in flight across all endpoints (and pooled connections), and of
    # those at most this many for one business (its slow endpoints cannot hold every slot).
    webhook_max_in_flight: int = Field(64, ge=1)
    webhook_business_concurrency: int = Field(16, ge=1)
    webhooks_enabled: bool = True

    # GraphQL (/public_graphql): a websocket must send connection_init within this many seconds
    # (else close 4408); keep-alive pings every `graphql_keepalive_s`; operations per connection.
    graphql_init_timeout_s: float = Field(10.0, gt=0)
    graphql_keepalive_s: float = Field(15.0, gt=0)
    graphql_max_subscriptions: int = Field(100, ge=1)
    # Largest query nesting depth and token count a GraphQL document may have.
    graphql_max_depth: int = Field(12, ge=2)
    graphql_max_tokens: int = Field(2000, ge=50)
    # Push message feed (one tailer per API process): poll interval; how long an id reserved
    # but not yet written holds back the ids above it before the feed fences it (a stalled
    # writer then writes its message under a fresh id); messages a subscriber may lag.
    feed_poll_interval_s: float = Field(0.1, gt=0)
    feed_gap_grace_s: float = Field(5.0, ge=0)
    # Follow the feed by a change stream where the database offers one (false: always poll).
    feed_change_stream: bool = True
    # No longer used (a fenced id never commits late); still accepted so older files load.
    feed_late_window_s: float = Field(300.0, ge=0)
    feed_subscriber_buffer: int = Field(10000, ge=1)

    # Retention (core/retention.py): days each is kept, 0 = forever; how often it is swept.
    retention_messages_days: int = Field(30, ge=0, le=36500)
    retention_readings_days: int = Field(30, ge=0, le=36500)
    retention_deliveries_days: int = Field(30, ge=0, le=36500)
    retention_attempts_days: int = Field(30, ge=0, le=36500)
    # Completed shipments with everything that belongs to them (0: kept, the default).
    retention_shipments_days: int = Field(0, ge=0, le=36500)
    retention_sweep_interval_s: float = Field(3600.0, gt=0)

    # Hardening: webhook egress, dashboard content, identifiers.
    # Bytes of a webhook answer read (for the attempt's snippet); the rest is never read.
    webhook_max_response_bytes: int = Field(64 * 1024, ge=1024)
    # Bytes of a customer's token-login answer read; a bigger answer is a failed attempt.
    webhook_max_login_answer_bytes: int = Field(64 * 1024, ge=1024)
    # Longest token a customer's login may hand out (it is sent back as a header).
    webhook_max_token_chars: int = Field(4096, ge=16)
    # Longest identifier in a document (numbers, slugs, lpn, sku, field names): printable only.
    intake_max_identifier_chars: int = Field(128, ge=8, le=1024)
    # Longest free text in a document (descriptions, additional field values).
    intake_max_text_chars: int = Field(2000, ge=16, le=100_000)

    # --- Tokens, signing keys, tenancy, auth throttling, files on disk ---
    # Seconds a process trusts its cached signing keys: a key revoked by another process
    # (`dockflow admin rotate-signing-key --revoke`) stops verifying everywhere within this.
    signing_key_cache_s: float = Field(10.0, ge=0)
    # Ceiling on failed authentications of one client id or operator from all addresses (and of
    # one address over all ids) before it is locked as a whole; the limit per (id, address) is
    # `auth_failure_limit`. 0: no ceilings.
    auth_failure_id_limit: int = Field(100, ge=0)
    # Peers whose X-Forwarded-For is believed (addresses or CIDR networks), e.g. the load
    # balancer; for any other peer the header is ignored and the peer address is the source.
    trusted_proxies: tuple[str, ...] = ()
    # Threads per process hashing and verifying passwords (argon2), off the event loop.
    password_hash_threads: int = Field(2, ge=1)
    # Password checks waiting for a thread beyond which a login answers 429 at once.
    password_hash_queue_max: int = Field(32, ge=1)
    # The argon2id cost of a new operator password (core/auth/credentials.py): RFC 9106's
    # low-memory recommendation, or OWASP's minimum (a fifth of the CPU, for small machines).
    password_hash_profile: PasswordProfile = Field("rfc9106-low-memory")
    # Idempotency keys one client may hold within the retention window (24 h); 429 beyond.
    idempotency_keys_per_client: int = Field(10_000, ge=1)
    # Dashboard sessions one operator may hold; a new login ends the least recently used beyond.
    dashboard_sessions_per_operator: int = Field(20, ge=1)

    @field_validator("trusted_proxies")
    @classmethod
    def _proxy_networks(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for entry in value:
            try:
                ipaddress.ip_network(entry, strict=False)
            except ValueError:
                raise ValueError(f"{entry!r} is not an IP address or network") from None
        return value

    # HTTP and GraphQL entry points: limits on every body, query and connection.
    # Largest request body on any route without a larger limit of its own (documents use
    # `max_document_bytes`, GraphQL multipart uploads `max_upload_bytes`); chunked bodies too.
    http_max_body_bytes: int = Field(64 * 1024, ge=1024)
    # A GraphQL multipart request: most parts (fields and files), and most files.
    graphql_multipart_max_parts: int = Field(16, ge=3)
    graphql_multipart_max_files: int = Field(4, ge=1)
    # Query cost budget: objects a document may make the server load (list sizes from `first`
    # as execution coerces it, schema defaults included, multiplied through nesting); a list
    # with neither `first` nor a known most counts as `graphql_cost_list_size` items.
    graphql_max_cost: int = Field(50_000, ge=100)
    graphql_cost_list_size: int = Field(10, ge=1)
    # Aliases, and field selections (fragments expanded), in one GraphQL document.
    graphql_max_aliases: int = Field(30, ge=1)
    graphql_max_fields: int = Field(500, ge=10)
    # Bytes of one GraphQL answer over HTTP (its JSON); a larger one becomes RESPONSE_TOO_LARGE.
    graphql_max_response_bytes: int = Field(16 * 1024 * 1024, ge=64 * 1024)
    # Fields answering under one response name in one selection set (refused before validation).
    graphql_max_same_response_name: int = Field(10, ge=1)
    # Open GraphQL websockets per API client (per process); one more is closed with 4429.
    graphql_max_connections_per_client: int = Field(500, ge=1)
    # Websockets of one process still waiting for their connection_init (anonymous so far);
    # one more is closed at once with 1013.
    graphql_max_pending_connections: int = Field(1000, ge=1)
    # Open websockets re-read their client's enabled state and facilities this often (a change
    # closes them with 4403); they are also closed when their token expires.
    graphql_recheck_interval_s: float = Field(15.0, gt=0)
    # Bytes of messages a live subscriber may lag (beside `feed_subscriber_buffer` messages).
    feed_subscriber_buffer_bytes: int = Field(16 * 1024 * 1024, ge=64 * 1024)
    # Bytes the subscriptions of one websocket together may lag; past it the websocket closes 1008.
    graphql_connection_buffer_bytes: int = Field(16 * 1024 * 1024, ge=64 * 1024)
    # Bytes the subscriptions of one API client (all its websockets, per process) may lag together.
    graphql_client_buffer_bytes: int = Field(64 * 1024 * 1024, ge=64 * 1024)
    # Replay pages (afterId/since) one API client's subscriptions read at once, per process.
    graphql_client_concurrent_replays: int = Field(2, ge=1)
    # Bytes of encoded subscription results kept to share between subscribers.
    graphql_shared_cache_bytes: int = Field(32 * 1024 * 1024, ge=64 * 1024)
    # The business and facility the GraphQL sandbox's sample query names (`serve --demo`: the
    # demo tenant's); a placeholder otherwise.
    graphql_sandbox_business: str = Field("your-business", pattern=r"^[a-z0-9][a-z0-9_-]{0,63}$")
    graphql_sandbox_facility: str = Field("your-facility", pattern=r"^[a-z0-9][a-z0-9_-]{0,63}$")

    # Per-business quotas on stored bytes (core/tenancy/quotas.py; 0: no quota). Beyond one, a
    # write is refused with QUOTA_EXCEEDED (403 / GraphQL QUOTA_EXCEEDED) until retention gives
    # bytes back or the quota is raised.
    # What intake documents leave stored: their orders and items (BSON bytes, kept with their
    # shipment; a document sent again that stores nothing new counts nothing).
    quota_document_bytes: int = Field(4 * 1024**3, ge=0)
    # Files attached to shipments.
    quota_attachment_bytes: int = Field(20 * 1024**3, ge=0)
    # Exceptions raised by hand: each its note's bytes plus 4 KiB (record, message, deliveries).
    quota_exception_bytes: int = Field(1024**3, ge=0)
    # Websockets awaiting connection_init from one source address (an IPv6 /64; behind
    # `trusted_proxies`, the forwarded address), within `graphql_max_pending_connections`: a
    # fifth of it, so one address cannot fill it while a consumer host (or a NAT) may still open
    # its subscriptions a hundred at a time.
    graphql_max_pending_connections_per_source: int = Field(200, ge=1)

    @model_validator(mode="before")
    @classmethod
    def _derived_public_base_url(cls, data: Any) -> Any:
        """No public base URL given: the HTTP listener's own address, so that a changed port
        changes every address dockflow hands out with it."""
        if not isinstance(data, dict) or data.get("public_base_url"):
            return data
        return {**data, "public_base_url": cls._listener_base_url(data)}

    @classmethod
    def _listener_base_url(cls, data: dict[str, Any]) -> str:
        """The public base URL derived from the HTTP listener the settings `data` name."""
        fields = cls.model_fields
        host = str(data.get("http_host", fields["http_host"].default))
        port = data.get("http_port", fields["http_port"].default)
        tls = data.get("tls_cert_file") is not None and data.get("tls_key_file") is not None
        return listener_url(host, port, tls=tls)

    def with_http_port(self, port: int) -> Settings:
        """These settings with the HTTP port a listener was given (port 0 asks for any); a
        public base URL derived from the listener (none was set) follows it, by the same rule."""
        update: dict[str, Any] = {"http_port": port}
        if self.public_base_url == self._listener_base_url(dict(self)):
            update["public_base_url"] = self._listener_base_url({**dict(self), "http_port": port})
        return self.model_copy(update=update)

    @field_validator("public_base_url")
    @classmethod
    def _strip_slash(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        return value.rstrip("/")

    @model_validator(mode="after")
    def _tls_pair(self) -> Settings:
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("tls_cert_file and tls_key_file must be set together")
        return self

    @model_validator(mode="after")
    def _external_issuer_pair(self) -> Settings:
        if bool(self.jwt_issuer) != bool(self.jwt_jwks_url):
            raise ValueError("jwt_issuer and jwt_jwks_url must be set together")
        return self

    @model_validator(mode="after")
    def _retention_outlasts_the_retry_schedule(self) -> Settings:
        # The sweep takes deliveries by age whatever their state: one waiting for a retry would
        # be dropped unsent. It keeps a message past its retention while a delivery of it
        # waits, but past the feed's retention mark, where no feed read reaches it, and read
        # again by every sweep until the delivery ends: retention, not the retries, should
        # decide how long a message stays.
        retrying_s = sum(self.webhook_retry_schedule_s) * (1 + self.webhook_retry_jitter)
        for setting in ("retention_deliveries_days", "retention_messages_days"):
            days = getattr(self, setting)
            if days and days * 86400 <= retrying_s:
                raise ValueError(
                    f"{setting} ({days}) must outlast the"
                    f" webhook retry schedule ({retrying_s / 86400:.1f} days with its jitter)"
                )
        return self

    @property
    def dashboard_base_url(self) -> str:
        return (self.dashboard_url or f"{self.public_base_url}/dashboard").rstrip("/")

    @property
    def graphql_url(self) -> str:
        return f"{self.public_base_url}/public_graphql"

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # DOCKFLOW_<NAME>_FILE: a setting read from a file (secrets mounted into a container).
        sources: list[PydanticBaseSettingsSource] = [
            init_settings,
            _EnvSource(settings_cls),
            SettingFilesSource(settings_cls),
        ]
        path = _config_file()
        if path is not None:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=path))
        return tuple(sources)


def listener_url(host: str, port: object, *, tls: bool = False) -> str:
    """The URL clients on this machine use for a listener bound to `host`:`port`."""
    shown = "localhost" if host in _WILDCARD_HOSTS else host
    if ":" in shown and not shown.startswith("["):
        shown = f"[{shown}]"  # an IPv6 address
    return f"{'https' if tls else 'http'}://{shown}:{port}"


class _EnvSource(EnvSettingsSource):
    """``DOCKFLOW_*`` variables, where a list setting is JSON (``["a", "b"]``) or the
    comma-separated text env files hold (``a,b``)."""

    def decode_complex_value(self, field_name: str, field: FieldInfo, value: Any) -> Any:
        try:
            return decode_text(field, value)
        except ValueError as exc:  # named here, where the setting is known
            raise ConfigError(f"invalid setting {variable(field_name)}: {exc}") from None


def unknown_variables(environ: Mapping[str, str] | None = None) -> list[str]:
    """One warning per ``DOCKFLOW_*`` variable that is no setting (a misspelling is otherwise
    ignored without a word), naming the likely intended one when one is close."""
    environ = os.environ if environ is None else environ
    settings = {variable(name) for name in Settings.model_fields}
    # A setting read from a file (core/settings_files.py) is known too.
    known = settings | {name + "_FILE" for name in settings} | OTHER_VARIABLES
    warnings = []
    for name in sorted(environ):
        if not name.startswith(ENV_PREFIX) or name in known:
            continue
        # Compared without the prefix they all share, which would make any two names alike.
        close = difflib.get_close_matches(
            name.removeprefix(ENV_PREFIX), [k.removeprefix(ENV_PREFIX) for k in known], n=1
        )
        hint = f" (did you mean {ENV_PREFIX}{close[0]}?)" if close else ""
        warnings.append(f"unknown setting {name} is ignored{hint}")
    return warnings


def load_settings(**overrides: Any) -> Settings:
    """Build the settings; every invalid setting becomes one line of the ConfigError naming it
    (a value that cannot even be parsed too)."""
    path = _config_file()
    if path is not None and not path.is_file():
        raise ConfigError(f"{CONFIG_FILE}: no such file: {path}")
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        lines = []
        for error in exc.errors():
            location = error["loc"]
            if location:
                name = variable(str(location[0]))
                item = "".join(f" (item {int(p) + 1})" for p in location[1:] if isinstance(p, int))
                lines.append(f"invalid setting {name}{item}: {error['msg']}")
            else:  # a rule between settings names them in its message
                lines.append(f"invalid settings: {error['msg']}")
        raise ConfigError("\n".join(dict.fromkeys(lines))) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{CONFIG_FILE}: {path} is not valid TOML: {exc}") from None
    except SettingsError as exc:
        # A source failing otherwise (a value it cannot parse is told by `_EnvSource`).
        raise ConfigError(f"invalid settings: {exc} ({exc.__cause__ or 'no detail'})") from None
