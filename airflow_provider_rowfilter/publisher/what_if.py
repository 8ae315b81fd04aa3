"""What-if before an ALTER PUBLICATION: how many rows of each table would enter and leave, without writing.

The statement is applied to the subscription's current definitions with PostgreSQL's rules (the publications
file's parser, core/publication/ddl.py: what PostgreSQL refuses is refused, with its message), never run on the
publisher. Each table's rows are then judged by the publisher itself, once, in one READ ONLY snapshot: the initial
copy's filter before (the OR of the publications' row filters, as tablesync.c ``fetch_remote_table_info`` reads
them) and after. A row enters when it satisfies the new filter and not the old; it leaves when it satisfies the old
and not the new (a filter that is NULL for a row is false, as for the copy). For a subscriber in step with its
publisher these are exactly the rows ``reconcile --dry-run`` finds missing and extra after the real ALTER.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import psycopg
from psycopg import sql

from airflow_provider_rowfilter.core.relation import TableName
from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec
from airflow_provider_rowfilter.identifiers import table_sql
from airflow_provider_rowfilter.publisher.copy_source import copy_source
from airflow_provider_rowfilter.publisher.definitions import Definitions, definitions_after, load_definitions


@dataclass(frozen=True)
class TableWhatIf:
    """One table: rows entering and leaving its initial-copy filter, and what else the statement changes."""

    table: str
    enter: int | None
    leave: int | None
    #: ``changed``, ``added`` (a table newly subscribed: copied whole, state i), ``removed`` (no longer
    #: subscribed: its rows stay, as PostgreSQL leaves them), ``unchanged``
    change: str
    filter_before: str | None = None
    filter_after: str | None = None
    #: the rows an added table would copy
    rows: int | None = None
    columns_before: list[str] = field(default_factory=list)
    columns_after: list[str] = field(default_factory=list)

    def describe(self) -> str:
        if self.change == "added":
            return (f"{self.table}: newly subscribed: {self.rows:,} rows would be copied (state i), filter "
                    f"{self.filter_after or 'none'}")
        if self.change == "removed":
            return f"{self.table}: no longer subscribed: its rows stay in the subscriber, as PostgreSQL leaves them"
        text = f"{self.table}: {self.enter:,} rows would enter, {self.leave:,} would leave"
        if self.filter_before != self.filter_after:
            text += f" (filter {self.filter_before or 'none'} → {self.filter_after or 'none'})"
        if self.columns_before != self.columns_after:
            added = [c for c in self.columns_after if c not in self.columns_before]
            dropped = [c for c in self.columns_before if c not in self.columns_after]
            text += "; columns " + ", ".join([*(f"+{c}" for c in added), *(f"-{c}" for c in dropped)])
        return text

    def as_dict(self) -> dict[str, object]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class WhatIf:
    subscription: str
    statement: str
    tables: list[TableWhatIf]

    def as_dict(self) -> dict[str, object]:
        return {"subscription": self.subscription, "statement": self.statement,
                "tables": [t.as_dict() for t in self.tables]}


def what_if(spec: SubscriptionSpec, publisher: psycopg.Connection, statement: str) -> WhatIf:
    """Judge ``statement`` against the subscription's tables; nothing is written (a READ ONLY transaction)."""
    before = load_definitions(spec, publisher)
    after = definitions_after(spec, publisher, before, statement)
    tables = sorted(set(before.filters.tables) | set(after.filters.tables))
    publisher.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")  # one snapshot, and no write possible
    try:
        judged = [_table(publisher, t, before, after) for t in tables]
    finally:
        publisher.execute("ROLLBACK")
    return WhatIf(spec.subscription, statement.strip(), judged)


def _table(conn: psycopg.Connection, table: TableName, before: Definitions, after: Definitions) -> TableWhatIf:
    old, new = before.filters.tables.get(table), after.filters.tables.get(table)
    name = str(table)
    if new is None:
        return TableWhatIf(name, None, None, "removed", old.copy_filter_sql if old else None)
    source = copy_source(new, after.catalog.relation(table))
    if old is None:
        count = conn.execute(sql.SQL("SELECT count(*) FROM {}{} WHERE {}").format(
            sql.SQL("ONLY " if source.only else ""), table_sql(table),
            sql.SQL(_truth(new.copy_filter_sql)))).fetchone()
        return TableWhatIf(name, None, None, "added", None, new.copy_filter_sql, rows=int(count[0]) if count else 0,
                           columns_after=list(source.columns))
    old_source = copy_source(old, before.catalog.relation(table))
    # Evaluated by the publisher, as its copy evaluates them (publisher/copy_source.py select_sql: the text as is,
    # under the session's empty search_path).
    row = conn.execute(sql.SQL("SELECT count(*) FILTER (WHERE n AND NOT o), count(*) FILTER (WHERE o AND NOT n) "
                               "FROM (SELECT {} AS n, {} AS o FROM {}{}) judged").format(
        sql.SQL(_truth(new.copy_filter_sql)), sql.SQL(_truth(old.copy_filter_sql)),
        sql.SQL("ONLY " if source.only else ""), table_sql(table))).fetchone()
    enter, leave = (int(row[0]), int(row[1])) if row else (0, 0)
    changed = (old.copy_filter_sql != new.copy_filter_sql or old_source.columns != source.columns)
    return TableWhatIf(name, enter, leave, "changed" if changed else "unchanged", old.copy_filter_sql,
                       new.copy_filter_sql, columns_before=list(old_source.columns), columns_after=list(source.columns))


def _truth(filter_sql: str | None) -> str:
    """A copy filter as a boolean that is never NULL (a NULL filter result keeps the row out, as the copy's WHERE)."""
    return "true" if not filter_sql else f"coalesce(({filter_sql}), false)"
