"""Subscription events executed once, sent to every subscriber of the same operation.

Without this, graphql-core executes a subscription's selection set for every event *and every
subscriber*, and every frame is JSON-encoded per subscriber: with 2,000 subscribers of one
`pushMessage` query, one message costs 2,000 executions and encodings (docs/benchmarks.md).

An event payload that has a `shared_event_key()` (a `PushMessage`: immutable once written) is
executed once per (event, operation document, operation name, variables) and the result is
kept in a small cache (bounded in entries and in encoded bytes); every subscriber with that
operation gets the same result, and its `data` object carries its JSON text, encoded once
(`SharedData.encoded`), which the view splices into each subscriber's frame (only the
operation id differs between frames).

What still runs per subscriber is unchanged: the subscription resolver (scope, facility
filter, resume from `afterId`/`since`, bounded buffer), strawberry's extensions (errors get
`extensions.code`) and the protocol handler. An event whose execution is asynchronous, or an
operation without a source text, is executed per subscriber as before.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Hashable, Mapping
from typing import Any, ClassVar, cast

from graphql import ExecutionResult
from strawberry.schema.schema import StrawberryGraphQLCoreExecutionContext

CACHE_ENTRIES = 4096  # results kept: a subscriber further behind than this re-executes
CACHE_BYTES = 32 * 1024 * 1024  # encoded bytes kept (`graphql_shared_cache_bytes` in a server)
_encode = json.JSONEncoder(separators=(",", ":")).encode  # as strawberry's `encode_json`


class SharedData(dict[str, Any]):
    """The `data` of a result shared by several subscribers, with its JSON text."""

    __slots__ = ("_encoded",)

    def __init__(self, data: Mapping[str, Any]) -> None:
        super().__init__(data)
        self._encoded: str | None = None

    @property
    def encoded(self) -> str:
        """`json.dumps` of this data as strawberry encodes frames; computed once."""
        if self._encoded is None:
            self._encoded = _encode(self)
        return self._encoded


class SharedResults:
    """The per-schema cache of executed events, with counters for tests and diagnostics."""

    def __init__(self, max_entries: int = CACHE_ENTRIES, max_bytes: int = CACHE_BYTES) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._results: OrderedDict[Hashable, tuple[ExecutionResult, int]] = OrderedDict()
        self.bytes = 0  # encoded size of the results kept
        self.executions = 0  # shareable events executed (cache misses)
        self.shared = 0  # results served from the cache instead of executing again

    def get(self, key: Hashable) -> ExecutionResult | None:
        entry = self._results.get(key)
        if entry is None:
            return None
        self.shared += 1
        return entry[0]

    def put(self, key: Hashable, result: ExecutionResult) -> ExecutionResult:
        self.executions += 1
        shared = ExecutionResult(
            data=SharedData(result.data) if result.data is not None else None,
            errors=result.errors,
            extensions=result.extensions,
        )
        # Counted as sent: the encoding is needed for the first frame anyway.
        size = len(shared.data.encoded) if isinstance(shared.data, SharedData) else 0
        if size > self.max_bytes:
            return shared  # too large to keep: each subscriber executes it again
        previous = self._results.pop(key, None)
        if previous is not None:
            self.bytes -= previous[1]
        self._results[key] = (shared, size)
        self.bytes += size
        while len(self._results) > self.max_entries or self.bytes > self.max_bytes:
            _, (_, dropped) = self._results.popitem(last=False)
            self.bytes -= dropped
        return shared

    def __len__(self) -> int:
        return len(self._results)


def _operation_key(executor: SharedEventExecutionContext) -> Hashable | None:
    operation = executor.operation
    if operation.loc is None:
        return None
    variables = executor.variable_values.coerced
    return (
        operation.loc.source.body,
        operation.name.value if operation.name else None,
        repr(variables),  # coerced values: input objects, datetimes; repr is exact for them
    )


class SharedEventExecutionContext(StrawberryGraphQLCoreExecutionContext):
    """graphql-core executor that shares subscription event results between subscribers."""

    shared_results: ClassVar[SharedResults]
    _shared_operation_key: Hashable | None = None
    _shared_operation_key_known = False
    _shared_event_key: Hashable | None = None  # set on a per-event executor that may share

    def build_per_event_executor(self, payload: Any) -> Any:
        if not self._shared_operation_key_known:
            # Once per subscription: the per-event executors are copies of this one.
            self._shared_operation_key = _operation_key(self)
            self._shared_operation_key_known = True
        event_key = getattr(payload, "shared_event_key", None)
        if event_key is None or self._shared_operation_key is None:
            return super().build_per_event_executor(payload)
        key = (event_key(), self._shared_operation_key)
        found = self.shared_results.get(key)
        if found is not None:
            return _ExecutedEvent(found)  # no per-event copy of the executor either
        executor = cast(SharedEventExecutionContext, super().build_per_event_executor(payload))
        executor._shared_event_key = key
        return executor

    def execute_operation(self, serially: bool | None = None) -> Any:
        key = self._shared_event_key
        result = super().execute_operation(serially)
        if key is None or not isinstance(result, ExecutionResult):
            return result  # awaitable: not shared, another subscriber would execute it meanwhile
        return self.shared_results.put(key, result)


class _ExecutedEvent:
    """Stands in for a per-event executor whose result is already known."""

    __slots__ = ("result",)

    def __init__(self, result: ExecutionResult) -> None:
        self.result = result

    def execute_operation(self, serially: bool | None = None) -> ExecutionResult:
        return self.result


def shared_execution_context_class(
    max_bytes: int = CACHE_BYTES,
) -> type[SharedEventExecutionContext]:
    """A subclass with its own cache (of at most `max_bytes` encoded), for one schema."""
    return type(
        "SharedEventExecutionContextForSchema",
        (SharedEventExecutionContext,),
        {"shared_results": SharedResults(max_bytes=max_bytes)},
    )


def encode_frame(message: Mapping[str, Any]) -> str | None:
    """The JSON text of a `next`/`data` frame whose payload carries `SharedData`, spliced from
    the shared encoding; exactly what `json.dumps(message, separators=(",", ":"))` gives.
    None for any other message."""
    payload = message.get("payload")
    if not isinstance(payload, dict):
        return None
    data = payload.get("data")
    if not isinstance(data, SharedData):
        return None
    payload_parts = [
        f"{_encode(key)}:{data.encoded if key == 'data' else _encode(value)}"
        for key, value in payload.items()
    ]
    payload_text = "{" + ",".join(payload_parts) + "}"
    parts = [
        f"{_encode(key)}:{payload_text if key == 'payload' else _encode(value)}"
        for key, value in message.items()
    ]
    return "{" + ",".join(parts) + "}"
