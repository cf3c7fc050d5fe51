"""The query cost budget: what a GraphQL document asks for, refused before it runs.

The cost of a document is the number of objects it may return: every object-typed field
counts once per instance, and a list multiplies what is under it by its size (its `first`,
directly or in an input object; the field's default page when absent at the root; else
`graphql_cost_list_size`). 30 aliases of `pushMessages(first: 10000)` cost 300,000 and are
refused with `extensions.code: QUERY_TOO_COSTLY`; a document with too many field selections
(fragments expanded) is refused with `TOO_MANY_FIELDS`. Both are validation errors: nothing
is executed.
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
    GraphQLList,
    GraphQLNamedType,
    GraphQLNonNull,
    GraphQLObjectType,
    GraphQLOutputType,
    GraphQLSchema,
    InlineFragmentNode,
    OperationDefinitionNode,
    SelectionSetNode,
    ValidationContext,
    ValidationRule,
    get_named_type,
    is_composite_type,
    value_from_ast_untyped,
)
from graphql.type.introspection import SchemaMetaFieldDef, TypeMetaFieldDef, TypeNameMetaFieldDef
from strawberry.extensions import SchemaExtension

from core.exceptions import queries as exception_queries
from core.feed import reader
from core.reads import shipment_queries
from core.settings import Settings

log = logging.getLogger(__name__)

# Root list fields and the page they return when `first` is not given.
DEFAULT_PAGES: dict[str, int] = {
    "pushMessages": reader.DEFAULT_PAGE,
    "shipments": shipment_queries.DEFAULT_SHIPMENTS_PAGE,
    "exceptions": exception_queries.ExceptionFilter.first,
}


@dataclass(frozen=True)
class CostLimits:
    max_cost: int
    max_fields: int
    list_size: int  # a nested list without `first` is taken to have this many items

    @classmethod
    def from_settings(cls, settings: Settings) -> CostLimits:
        return cls(
            settings.graphql_max_cost, settings.graphql_max_fields, settings.graphql_cost_list_size
        )


@dataclass
class DocumentCost:
    cost: int = 0
    fields: int = 0  # counted up to the first one over the limit


class _TooManyFields(Exception):
    """The walk stops at the first field over the limit: a fragment spread twice in a fragment
    spread twice ... doubles the fields at each level (2^20 from a few hundred bytes)."""


def _first(node: FieldNode, variables: Mapping[str, Any]) -> int | None:
    """The `first` argument of a field, given directly or inside an input object."""
    for argument in node.arguments or ():
        try:
            value = value_from_ast_untyped(argument.value, dict(variables))
        except (TypeError, ValueError):  # an invalid value: validation reports it
            continue
        if argument.name.value == "first" and isinstance(value, int):
            return value
        if isinstance(value, Mapping) and isinstance(value.get("first"), int):
            return int(value["first"])
    return None


class _Estimator:
    def __init__(
        self,
        schema: GraphQLSchema,
        fragments: Mapping[str, Any],
        variables: Mapping[str, Any],
        limits: CostLimits,
    ) -> None:
        self.schema = schema
        self.fragments = fragments
        self.variables = variables
        self.limits = limits
        self.total = DocumentCost()

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
    ) -> int:
        total = 0
        for node, owner in self.selections(selection_set, parent, path):
            self.total.fields += 1
            if self.total.fields > self.limits.max_fields:
                raise _TooManyFields
            field_type = self._field_type(node, owner, root)
            if field_type is None or node.selection_set is None:
                continue
            named = get_named_type(field_type)
            if not is_composite_type(named):
                continue
            size = self._list_size(node, field_type, root)
            total += size * (1 + self.cost(node.selection_set, named, root=False, path=path))
        return total

    def _field_type(
        self, node: FieldNode, owner: GraphQLNamedType, root: bool
    ) -> GraphQLOutputType | None:
        name = node.name.value
        if name == "__typename":
            return TypeNameMetaFieldDef.type
        if root and name == "__schema":
            return SchemaMetaFieldDef.type
        if root and name == "__type":
            return TypeMetaFieldDef.type
        fields = getattr(owner, "fields", None)
        definition = fields.get(name) if fields else None
        return definition.type if definition is not None else None

    def _list_size(self, node: FieldNode, field_type: GraphQLOutputType, root: bool) -> int:
        if isinstance(field_type, GraphQLNonNull):
            field_type = field_type.of_type
        if not isinstance(field_type, GraphQLList):
            return 1
        first = _first(node, self.variables)
        if first is not None:
            return max(first, 0)
        if root and node.name.value in DEFAULT_PAGES:
            return DEFAULT_PAGES[node.name.value]
        return self.limits.list_size


def _with_defaults(
    operation: OperationDefinitionNode, variables: Mapping[str, Any]
) -> dict[str, Any]:
    """The variables an operation runs with: those given, else their declared defaults."""
    values = dict(variables)
    for definition in operation.variable_definitions or ():
        name = definition.variable.name.value
        if name not in values and definition.default_value is not None:
            try:
                values[name] = value_from_ast_untyped(definition.default_value)
            except (TypeError, ValueError):  # an invalid default: validation reports it
                continue
    return values


def document_cost(
    context: ValidationContext, variables: Mapping[str, Any], limits: CostLimits
) -> DocumentCost:
    """The cost of the costliest operation of the document, and its field selections."""
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
        values = _with_defaults(definition, variables)
        estimator = _Estimator(context.schema, fragments, values, limits)
        try:
            estimator.total.cost = estimator.cost(definition.selection_set, root_type, root=True)
        except _TooManyFields:
            worst.fields = estimator.total.fields
            return worst  # refused for its fields; its cost is not known
        worst.cost = max(worst.cost, estimator.total.cost)
        worst.fields = max(worst.fields, estimator.total.fields)
    return worst


def too_many_fields(counted: int, limits: CostLimits) -> GraphQLError:
    return GraphQLError(
        f"the document selects more than {limits.max_fields} fields (fragments expanded)",
        extensions={"code": "TOO_MANY_FIELDS", "fields": counted, "limit": limits.max_fields},
    )


def fields_over_limit(document: DocumentNode, limit: int) -> int | None:
    """The field selections of the document's largest operation, fragments expanded, counted
    up to the first over `limit` (then returned); None within the limit. Needs no schema."""
    fragments = {
        f.name.value: f.selection_set
        for f in document.definitions
        if isinstance(f, FragmentDefinitionNode)
    }

    def walk(selection_set: SelectionSetNode, path: frozenset[str], counted: int) -> int:
        for selection in selection_set.selections:
            if isinstance(selection, FieldNode):
                counted += 1
                if counted > limit:
                    raise _TooManyFields(counted)
                if selection.selection_set is not None:
                    counted = walk(selection.selection_set, path, counted)
            elif isinstance(selection, InlineFragmentNode):
                counted = walk(selection.selection_set, path, counted)
            elif isinstance(selection, FragmentSpreadNode):
                name = selection.name.value
                if name in fragments and name not in path:
                    counted = walk(fragments[name], path | {name}, counted)
        return counted

    for definition in document.definitions:
        if isinstance(definition, OperationDefinitionNode):
            try:
                walk(definition.selection_set, frozenset(), 0)
            except _TooManyFields as over:
                return int(over.args[0])
    return None


def cost_rule(variables: Mapping[str, Any], limits: CostLimits) -> type[ValidationRule]:
    """A validation rule refusing a document over the cost budget or the field count."""

    class QueryCostRule(ValidationRule):
        def enter_document(self, *_args: Any) -> None:
            measured = document_cost(self.context, variables, limits)
            if measured.fields > limits.max_fields:
                log.info("graphql document refused: too many fields", extra=measured.__dict__)
                self.report_error(too_many_fields(measured.fields, limits))
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
        # Before any validation rule: the depth and alias limiters walk every spread of every
        # fragment, so a document of fragments each spreading the next twice holds the event
        # loop for minutes in them. Refused here, validation is skipped.
        context = self.execution_context
        document = context.graphql_document
        if document is not None and context.pre_execution_errors is None:
            counted = fields_over_limit(document, self.limits.max_fields)
            if counted is not None:
                log.info("graphql document refused: too many fields", extra={"fields": counted})
                context.pre_execution_errors = [too_many_fields(counted, self.limits)]
        yield
