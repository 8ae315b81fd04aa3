"""What one apply batch evaluates, per subscriber table and per definitions epoch (no Spark, no database).

A refresh records the effective definitions with the position from which they hold
(``rowfilter.refresh_history``); a change is judged by the definitions of the latest refresh at or
before its ``commit_lsn`` (R2.9), so an epoch is the LSN range between two refreshes. The filters
come as the Spark SQL the refresh translated (``spark_filters``); :func:`filter_expression` rewrites
each column reference into a typed read of the change's values (PostgreSQL text form, cast to the
column's Spark type), from the syntax tree.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import sqlglot
from sqlglot import exp

from airflow_provider_rowfilter.core import pg_types
from airflow_provider_rowfilter.core.errors import UntranslatableFilterError
from airflow_provider_rowfilter.core.lsn import parse_lsn
from airflow_provider_rowfilter.core.relation import TableName

DML = ("insert", "update", "delete")


@dataclass(frozen=True)
class EpochRules:
    """One table's definitions in one epoch: what is published and with which filters and columns."""

    actions: frozenset[str]  # insert, update, delete, truncate
    filters: dict[str, str | None]  # DML action -> Spark SQL filter (None: unfiltered)
    columns: tuple[str, ...] | None  # the column list, None when there is none
    column_types: dict[str, str]  # format_type() of the columns the filters read

    @classmethod
    def from_document(cls, entry: dict) -> EpochRules:
        return cls(
            actions=frozenset(entry["actions"]),
            filters={a: entry["spark_filters"].get(a) for a in DML if a in entry["actions"]},
            columns=None if entry.get("columns") is None else tuple(entry["columns"]),
            column_types=dict(entry.get("filter_column_types") or {}),
        )

    def publishes_column(self, name: str) -> bool:
        return self.columns is None or name in self.columns


@dataclass(frozen=True)
class TargetPlan:
    """One subscriber table the batch applies to."""

    index: int
    table: TableName
    leaves: tuple[TableName, ...]
    position: int  # apply changes with commit_lsn >= position
    columns: tuple[str, ...]  # the subscriber's writable columns, in its order
    key: tuple[str, ...]  # the subscriber's key columns
    rules: tuple[EpochRules | None, ...]  # per epoch; None: not subscribed then


@dataclass(frozen=True)
class ApplyPlan:
    epochs: tuple[int, ...]  # the LSN each epoch starts at, ascending (epoch 0 also covers anything before)
    targets: tuple[TargetPlan, ...]
    skip_lsn: int | None = None
    policy: str = "error"


@dataclass(frozen=True)
class Epochs:
    """The recorded definitions that can concern changes at or after some position."""

    starts: tuple[int, ...]
    documents: tuple[dict, ...]

    def rules(self, table: TableName) -> tuple[EpochRules | None, ...]:
        result = []
        for doc in self.documents:
            entry = next((t for t in doc["tables"] if t["table"] == str(table)), None)
            result.append(None if entry is None else EpochRules.from_document(entry))
        return tuple(result)

    def leaves(self, table: TableName) -> tuple[TableName, ...]:
        """The table's leaves in the newest epoch that publishes it (the capture publication's view)."""
        for doc in reversed(self.documents):
            for t in doc["tables"]:
                if t["table"] == str(table):
                    return tuple(TableName.parse(leaf) for leaf in t["leaves"])
        return (table,)


def epochs_from_history(history: Sequence[tuple[str, dict]], since: int) -> Epochs:
    """Keep the refreshes that can govern a change at or after ``since`` (``history``: (lsn, document), any order)."""
    ordered = sorted(((parse_lsn(lsn), doc) for lsn, doc in history), key=lambda h: h[0])
    if not ordered:
        return Epochs((), ())
    first = max([i for i, (lsn, _) in enumerate(ordered) if lsn <= since], default=0)
    kept = ordered[first:]
    return Epochs(tuple(lsn for lsn, _ in kept), tuple(doc for _, doc in kept))


def filter_expression(spark_sql: str, column_types: dict[str, str],
                      read: Callable[[str], exp.Expression]) -> exp.Expression:
    """The filter with each column reference replaced by ``read(name)`` cast to the column's Spark type.

    ``CAST(<read('a')> AS INT)``: the value's PostgreSQL text form, converted the way the
    differential tests check; a column the change does not carry reads as NULL.
    """
    tree = sqlglot.parse_one(spark_sql, dialect="spark")

    def typed(node: exp.Expression) -> exp.Expression:
        if not isinstance(node, exp.Column):
            return node
        name = node.name
        type_name = column_types.get(name)
        spark_type = None if type_name is None else pg_types.spark_type(pg_types.parse_type(type_name))
        if spark_type is None:
            raise UntranslatableFilterError(
                f'the filter column "{name}" has no recorded type the apply can read it as',
                hint="run `rowfilter refresh` again so the definitions record the filter columns' types")
        return exp.Cast(this=read(name), to=exp.DataType.build(spark_type, dialect="spark"))

    return tree.transform(typed)


def case_over(branches: Iterable[tuple[exp.Expression, exp.Expression]], default: exp.Expression | None = None
              ) -> exp.Expression:
    """``CASE WHEN cond THEN value … [ELSE default] END`` (a bare default when there is no branch)."""
    case = exp.Case()
    any_branch = False
    for condition, value in branches:
        case = case.when(condition, value)
        any_branch = True
    if not any_branch:
        return default if default is not None else exp.Null()
    return case.else_(default) if default is not None else case
