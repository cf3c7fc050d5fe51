"""The query cost budget: what a GraphQL document makes the server load, refused before it runs.

The cost of a document is the number of objects its resolvers may load: every object-typed
field counts once per instance, and a list multiplies what is under it by its size. The size is
read from the field's arguments as execution will see them: coerced by graphql-core against the
schema, with the operation's variables coerced against their definitions (JSON `10000.0` is the
Int 10000, a variable's declared default and an argument's or input field's schema default
count as given). It is the `first` argument, or the `first` of an input object argument; when
that is null, the field's default page (`LIST_SIZES`); a list without `first` holds at most
`LIST_SIZES` items, else is taken to hold `graphql_cost_list_size`. A field that also reads rows
it does not return (a shipment's LPN progress, a pallet's EPCIS event) is charged those rows
(`PARENT_LOADS`); so is each ASN, whatever is selected of it (`OBJECT_LOADS`).

30 aliases of `pushMessages(first: 10000)` cost 300,000 and are refused with
`extensions.code: QUERY_TOO_COSTLY`, a `first` out of its list's bounds (the readers' own,
`core.reads.shipment_queries.PAGES`) anywhere with `BAD_USER_INPUT`; nothing is executed.
Before validation, with no schema, a document with too many field selections (fragments
expanded) is refused with `TOO_MANY_FIELDS`, too many aliases with `TOO_MANY_ALIASES`, too many
fields of one response name in a selection set with `REPEATED_RESPONSE_NAME`: no validation rule
runs on them.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from graphql import (
    DocumentNode,
    FieldNode,
    FragmentDefinitionNode,
    FragmentSpreadNode,
    GraphQLError,
    GraphQLField,
    GraphQLList,
    GraphQLNamedType,
    GraphQLNonNull,
    GraphQLObjectType,
    GraphQLSchema,
    InlineFragmentNode,
    OperationDefinitionNode,
    SelectionSetNode,
    ValidationContext,
    ValidationRule,
    get_named_type,
    is_composite_type,
)
from graphql.execution.values import VariableValues, get_argument_values, get_variable_values
from graphql.type.introspection import SchemaMetaFieldDef, TypeMetaFieldDef, TypeNameMetaFieldDef
from strawberry.extensions import SchemaExtension

from core.asn import notice as asn_notice
from core.epcis import queries as epcis_queries
from core.exceptions import queries as exception_queries
from core.feed import reader
from core.outbox import delivery_log
from core.reads import shipment_queries
from core.settings import Settings

log = logging.getLogger(__name__)

# Lists whose size no `first` gives, by schema coordinate: their default page when `first` is
# null or absent (the root lists), or the most items they hold.
LIST_SIZES: dict[str, int] = {
    "Query.pushMessages": reader.DEFAULT_PAGE,
    "Query.shipments": shipment_queries.DEFAULT_SHIPMENTS_PAGE,
    "Query.exceptions": exception_queries.ExceptionFilter.first,
    "WebhookDelivery.attempts": delivery_log.MAX_ATTEMPTS_SHOWN,
}

# What each list that takes `first` lists (`core.reads.shipment_queries.PAGES`, its bounds).
PAGED: dict[str, str] = {
    "Query.shipments": "shipments",
    "Query.exceptions": "exceptions",
    "Query.pushMessages": "push messages",
    "Query.webhookDeliveries": "webhook deliveries",
    "Shipment.orders": "orders",
    "Shipment.pallets": "pallets",
    "Shipment.documents": "documents",
    "Shipment.exceptions": "exceptions of a parent",
    "Pallet.exceptions": "exceptions of a parent",
    "Order.items": "items",
}

# Rows read once per instance of a type when any of these fields is selected under it (at any
# depth), beyond the objects returned: a shipment's LPN progress reads its items and pallets, a
# pallet's EPCIS event its site (charged per pallet: an upper bound, as pallets of one facility
# share one read).
PARENT_LOADS: dict[str, tuple[frozenset[str], int]] = {
    "Shipment": (
        frozenset({"Shipment.lpns", "OrderItem.observed"}),
        shipment_queries.PROGRESS_ROWS,
    ),
    "Pallet": (frozenset({"Pallet.epcisEvent"}), epcis_queries.EVENT_READS),
}

# Rows read for every object of a type, whatever is selected under it: a shipment's ASN is
# built whole from its readings, orders and items (`core.asn.notice`), at most this many.
OBJECT_LOADS: dict[str, int] = {"ShipmentAsn": asn_notice.NOTICE_READS}


@dataclass(frozen=True)
class CostLimits:
    max_cost: int
    max_fields: int
    list_size: int  # a nested list without `first` or a known size is taken to have this many
    max_aliases: int
    max_same_name: int  # fields of one response name in one selection set

    @classmethod
    def from_settings(cls, settings: Settings) -> CostLimits:
        return cls(
            max_cost=settings.graphql_max_cost,
            max_fields=settings.graphql_max_fields,
            list_size=settings.graphql_cost_list_size,
            max_aliases=settings.graphql_max_aliases,
            max_same_name=settings.graphql_max_same_response_name,
        )


@dataclass
class DocumentCost:
    cost: int = 0
    bad_page: str | None = None  # why a list's `first` is refused, naming the list


class _BadPage(Exception):
    """A list's `first` is out of its bounds (`PAGED`): the list would refuse it, so the
    document is refused before its parents are read (a refusal deep in a page of shipments
    came after reading the page)."""


# What coercing a literal may raise besides GraphQLError: a custom scalar's parser.
_COERCION_ERRORS = (GraphQLError, TypeError, ValueError, OverflowError)


def _first(arguments: Mapping[str, Any]) -> int | None:
    """The coerced `first` argument of a field, given directly or inside an input object."""
    value = arguments.get("first")
    if isinstance(value, int):
        return value
    for argument in arguments.values():
        if isinstance(argument, Mapping) and isinstance(argument.get("first"), int):
            return int(argument["first"])
    return None


@dataclass
class _Subtree:
    cost: int  # objects and rows loaded under one instance of the parent
    selected: frozenset[str]  # schema coordinates selected in it, at any depth


class _Estimator:
    def __init__(
        self,
        schema: GraphQLSchema,
        fragments: Mapping[str, FragmentDefinitionNode],
        variables: VariableValues,
        limits: CostLimits,
    ) -> None:
        self.schema = schema
        self.fragments = fragments
        self.variables = variables
        self.limits = limits

    def selections(
        self, selection_set: SelectionSetNode, parent: GraphQLNamedType, path: frozenset[str]
    ) -> Iterator[tuple[FieldNode, GraphQLNamedType]]:
        """Every field under `selection_set`, fragments expanded (each spread once per path)."""
        for selection in selection_set.selections:
            if isinstance(selection, FieldNode):
                yield selection, parent
            elif isinstance(selection, InlineFragmentNode):
                condition = selection.type_condition
                named = self.schema.get_type(condition.name.value) if condition else parent
                yield from self.selections(selection.selection_set, named or parent, path)
            elif isinstance(selection, FragmentSpreadNode):
                name = selection.name.value
                fragment = self.fragments.get(name)
                if fragment is None or name in path:  # unknown or cyclic: validation says so
                    continue
                named = self.schema.get_type(fragment.type_condition.name.value)
                yield from self.selections(fragment.selection_set, named or parent, path | {name})

    def cost(
        self,
        selection_set: SelectionSetNode,
        parent: GraphQLNamedType,
        root: bool,
        path: frozenset[str] = frozenset(),
    ) -> _Subtree:
        total = 0
        selected: set[str] = set()
        for node, owner in self.selections(selection_set, parent, path):
            selected.add(f"{owner.name}.{node.name.value}")
            definition = self._definition(node, owner, root)
            if definition is None or node.selection_set is None:
                continue
            named = get_named_type(definition.type)
            if not is_composite_type(named):
                continue
            size = self._list_size(node, owner, definition)
            if size == 0:
                continue
            under = self.cost(node.selection_set, named, root=False, path=path)
            selected |= under.selected
            loads = self._parent_loads(named, under.selected) + OBJECT_LOADS.get(named.name, 0)
            total += size * (1 + under.cost + loads)
        return _Subtree(total, frozenset(selected))

    @staticmethod
    def _parent_loads(named: GraphQLNamedType, selected: frozenset[str]) -> int:
        loads = PARENT_LOADS.get(named.name)
        if loads is None or not loads[0] & selected:
            return 0
        return loads[1]

    def _definition(
        self, node: FieldNode, owner: GraphQLNamedType, root: bool
    ) -> GraphQLField | None:
        name = node.name.value
        if name == "__typename":
            return TypeNameMetaFieldDef
        if root and name == "__schema":
            return SchemaMetaFieldDef
        if root and name == "__type":
            return TypeMetaFieldDef
        fields = getattr(owner, "fields", None)
        definition = fields.get(name) if fields else None
        return definition if isinstance(definition, GraphQLField) else None

    def _list_size(self, node: FieldNode, owner: GraphQLNamedType, field: GraphQLField) -> int:
        """How many objects the field returns at most, from its arguments as coerced for
        execution; 0 when they cannot be coerced (the field then fails before its resolver)."""
        field_type = field.type
        if isinstance(field_type, GraphQLNonNull):
            field_type = field_type.of_type
        if not isinstance(field_type, GraphQLList):
            return 1
        try:
            arguments = get_argument_values(field, node, self.variables)
        except _COERCION_ERRORS:
            return 0
        coordinate = f"{owner.name}.{node.name.value}"
        first = _first(arguments)
        if first is None:
            return LIST_SIZES.get(coordinate, self.limits.list_size)
        refusal = shipment_queries.page_refusal(PAGED[coordinate], first)
        if refusal is not None:
            raise _BadPage(f"first of {coordinate} is {first}: it {refusal}")
        return first


def document_cost(
    context: ValidationContext, variables: Mapping[str, Any], limits: CostLimits
) -> DocumentCost:
    """The cost of the costliest operation of the document, or why a page of it is refused. Each
    operation is measured with its variables coerced as execution coerces them; one whose
    variables cannot be coerced is never executed and costs nothing."""
    fragments = {
        f.name.value: f
        for f in context.document.definitions
        if isinstance(f, FragmentDefinitionNode)
    }
    worst = DocumentCost()
    for definition in context.document.definitions:
        if not isinstance(definition, OperationDefinitionNode):
            continue
        root_type: GraphQLObjectType | None = context.schema.get_root_type(definition.operation)
        if root_type is None:
            continue
        try:
            values = get_variable_values(
                context.schema, definition.variable_definitions or (), dict(variables)
            )
        except _COERCION_ERRORS:
            continue
        if not isinstance(values, VariableValues):  # errors: execution refuses it as well
            continue
        estimator = _Estimator(context.schema, fragments, values, limits)
        try:
            root = estimator.cost(definition.selection_set, root_type, root=True)
        except _BadPage as bad:
            worst.bad_page = str(bad.args[0])
            return worst
        worst.cost = max(worst.cost, root.cost)
    return worst


def too_many_fields(counted: int, limits: CostLimits) -> GraphQLError:
    return GraphQLError(
        f"the document selects more than {limits.max_fields} fields (fragments expanded)",
        extensions={"code": "TOO_MANY_FIELDS", "fields": counted, "limit": limits.max_fields},
    )


class _ShapeRefused(Exception):
    """The walk stops at the first selection that breaks a shape limit: the error to answer."""


class _ShapeWalk:
    """Counts, with fragments expanded (each spread once per path), a document's field
    selections per operation, its aliases, and the fields sharing one response name in each
    merged selection set (a field's own selections, its fragments' included). Needs no schema:
    it runs before any validation rule, so validation never sees a document whose rule for
    overlapping fields is quadratic (many fields of one response name, each compared with
    every other)."""

    def __init__(self, document: DocumentNode, limits: CostLimits) -> None:
        self.limits = limits
        self.fragments = {
            f.name.value: f.selection_set
            for f in document.definitions
            if isinstance(f, FragmentDefinitionNode)
        }
        self.fields = 0
        self.aliases = 0
        # The first alias or response-name refusal; the walk goes on to the field limit,
        # which is told first (it bounds the walk, so it also bounds these counts).
        self.refusal: GraphQLError | None = None

    def operation(self, selection_set: SelectionSetNode) -> None:
        self.fields = 0
        self.merged(selection_set, frozenset())

    def merged(self, selection_set: SelectionSetNode, path: frozenset[str]) -> None:
        """One selection set as execution merges it: fields of the same response name in it
        and in the fragments it spreads are counted together."""
        names: dict[str, int] = {}
        for field, field_path in self._fields(selection_set, path):
            self.fields += 1
            if self.fields > self.limits.max_fields:
                raise _ShapeRefused(too_many_fields(self.fields, self.limits))
            if field.alias is not None:
                self.aliases += 1
                if self.aliases > self.limits.max_aliases and self.refusal is None:
                    self.refusal = self._too_many_aliases()
            name = (field.alias or field.name).value
            names[name] = names.get(name, 0) + 1
            if names[name] > self.limits.max_same_name and self.refusal is None:
                self.refusal = self._repeated(name)
            if field.selection_set is not None:
                self.merged(field.selection_set, field_path)

    def _fields(
        self, selection_set: SelectionSetNode, path: frozenset[str]
    ) -> Iterator[tuple[FieldNode, frozenset[str]]]:
        for selection in selection_set.selections:
            if isinstance(selection, FieldNode):
                yield selection, path
            elif isinstance(selection, InlineFragmentNode):
                yield from self._fields(selection.selection_set, path)
            elif isinstance(selection, FragmentSpreadNode):
                name = selection.name.value
                if name in self.fragments and name not in path:
                    yield from self._fields(self.fragments[name], path | {name})

    def _too_many_aliases(self) -> GraphQLError:
        limit = self.limits.max_aliases
        return GraphQLError(
            f"the document uses more than {limit} aliases (fragments expanded)",
            extensions={"code": "TOO_MANY_ALIASES", "aliases": self.aliases, "limit": limit},
        )

    def _repeated(self, name: str) -> GraphQLError:
        limit = self.limits.max_same_name
        return GraphQLError(
            f"more than {limit} fields answer as {name!r} in one selection set: "
            "select each field once",
            extensions={"code": "REPEATED_RESPONSE_NAME", "name": name, "limit": limit},
        )


def shape_refusal(document: DocumentNode, limits: CostLimits) -> GraphQLError | None:
    """Why the document is refused before validation (too many fields in an operation, too
    many aliases, too many fields of one response name in a selection set), or None."""
    walk = _ShapeWalk(document, limits)
    try:
        for definition in document.definitions:
            if isinstance(definition, OperationDefinitionNode):
                walk.operation(definition.selection_set)
    except _ShapeRefused as refused:
        error: GraphQLError = refused.args[0]
        return error
    return walk.refusal


def cost_rule(variables: Mapping[str, Any], limits: CostLimits) -> type[ValidationRule]:
    """A validation rule refusing a document over the cost budget or with a page out of its
    bounds."""

    class QueryCostRule(ValidationRule):
        def enter_document(self, *_args: Any) -> None:
            measured = document_cost(self.context, variables, limits)
            if measured.bad_page is not None:
                self.report_error(
                    GraphQLError(
                        measured.bad_page,
                        extensions={"code": "BAD_USER_INPUT", "reason": "VALIDATION_FAILED"},
                    )
                )
            if measured.cost > limits.max_cost:
                log.info("graphql document refused: too costly", extra=measured.__dict__)
                self.report_error(
                    GraphQLError(
                        f"the query may return {measured.cost} objects; the limit is "
                        f"{limits.max_cost}: ask for smaller pages (first) or fewer aliases",
                        extensions={
                            "code": "QUERY_TOO_COSTLY",
                            "cost": measured.cost,
                            "limit": limits.max_cost,
                        },
                    )
                )

    return QueryCostRule


class QueryCostLimiter(SchemaExtension):
    """Adds the cost rule, with this operation's variables, to the validation rules."""

    def __init__(self, limits: CostLimits) -> None:
        self.limits = limits

    def on_operation(self) -> Iterator[None]:
        context = self.execution_context
        rule = cost_rule(context.variables or {}, self.limits)
        context.validation_rules = (*context.validation_rules, rule)
        yield

    def on_validate(self) -> Iterator[None]:
        # Before any validation rule: the depth limiter walks every spread of every fragment,
        # so a document of fragments each spreading the next twice held the event loop for
        # minutes in it, and graphql-core's overlapping-fields rule compares every pair of
        # fields sharing a response name (500 of them: seconds of CPU). Refused here,
        # validation is skipped.
        context = self.execution_context
        document = context.graphql_document
        if document is not None and context.pre_execution_errors is None:
            refusal = shape_refusal(document, self.limits)
            if refusal is not None:
                log.info(
                    "graphql document refused before validation",
                    extra=dict(refusal.extensions or {}),
                )
                context.pre_execution_errors = [refusal]
        yield
