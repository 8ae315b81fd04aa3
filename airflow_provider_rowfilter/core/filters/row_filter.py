"""Row filters: one publication ``WHERE`` expression, parsed once, typed and validated as PostgreSQL does.

A :class:`RowFilter` is what the rest of the product carries: the syntax tree (core/filters/grammar.py)
with the PostgreSQL type of every node (core/filters/analysis.py), for one table of the publisher.
The publication model keeps it (``PublishedTable.filter``), the subscription's effective filters
OR it per action, and core/filters/spark_translation.py renders it into the Spark expression the apply
evaluates (docs/row-filters.md, "From definition to Spark").
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlglot import exp

from airflow_provider_rowfilter.core.filters.analysis import FilterContext, analyze
from airflow_provider_rowfilter.core.filters.grammar import parse_row_filter
from airflow_provider_rowfilter.core.filters.pg_types import PgType
from airflow_provider_rowfilter.core.filters.stack_depth import bounded, deep_stack
from airflow_provider_rowfilter.core.relation import Relation


@dataclass(frozen=True, eq=False)
class RowFilter:
    """A validated row filter of one table, with the PostgreSQL type of every node."""

    sql: str
    tree: exp.Expr
    relation: Relation
    context: FilterContext
    types: dict[int, PgType]
    targets: dict[int, PgType]  # id(node) -> type the node is coerced to by its parent
    collations: dict[int, str | None]
    constants: dict[int, object]  # id(node) -> Python value of a typed constant
    columns: frozenset[str]
    #: why Spark cannot evaluate it (:func:`evaluated_by_publisher`): the publisher evaluates it, nobody else
    untranslatable: str | None = None

    def type_of(self, node: exp.Expr) -> PgType:
        return self.types[id(node)]


@deep_stack
def validate_row_filter(
    sql: str,
    relation: Relation,
    context: FilterContext | None = None,
    *,
    tree: exp.Expr | None = None,
) -> RowFilter:
    """Parse (unless ``tree`` is the parse of ``sql``), type and check a filter; raise the error PostgreSQL would.

    On a deep stack, AND/OR chains flattened, nesting bounded (core/filters/stack_depth.py)."""
    context = context or FilterContext()
    analysis = analyze(sql, bounded(tree if tree is not None else parse_row_filter(sql)), relation, context)
    assert analysis.tree is not None  # analyze() sets it
    return RowFilter(
        sql=sql, tree=analysis.tree, relation=relation, context=context, types=analysis.types,
        targets=analysis.targets, collations=analysis.collations, constants=analysis.constants,
        columns=frozenset(analysis.columns),
    )


@deep_stack
def evaluated_by_publisher(sql: str, relation: Relation, reason: str) -> RowFilter:
    """A filter of the publisher's catalog that only the publisher evaluates (``filtering: source``).

    The publisher accepted it (it is in pg_publication_rel) and its pgoutput evaluates it; here it is
    read for its text (table synchronization pushes it down to the publisher) and the columns it reads (the
    replica-identity warnings), never typed or translated (``reason``: why Spark could not).
    """
    tree = bounded(parse_row_filter(sql))
    return RowFilter(sql=sql, tree=tree, relation=relation, context=FilterContext(), types={}, targets={},
                     collations={}, constants={}, columns=frozenset(c.name for c in tree.find_all(exp.Column)),
                     untranslatable=reason)
