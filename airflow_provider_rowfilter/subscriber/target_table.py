"""A subscriber table as the apply writes it: its writable columns, their types and defaults, its key.

Read from the subscriber's catalog as PostgreSQL's apply worker opens its target (relation.c
``logicalrep_rel_open``: columns matched by name, the replica identity index else the primary key); the
checks PostgreSQL makes before it applies a change to it (a missing or generated column, no key for an
UPDATE or DELETE) raise :class:`ApplyTargetError` with its message. subscriber/apply_target.py writes a batch
into it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import psycopg
from psycopg import sql

from airflow_provider_rowfilter.core.errors import RowFilterError
from airflow_provider_rowfilter.core.lsn import format_lsn
from airflow_provider_rowfilter.core.relation import TableName
from airflow_provider_rowfilter.identifiers import table_sql
from airflow_provider_rowfilter.subscriber.apply_stage import STAGE


class ApplyTargetError(RowFilterError):
    """The subscriber's table cannot take the changes published for it."""


@dataclass(frozen=True)
class TargetColumn:
    name: str
    type_sql: str  # format_type() of the subscriber's column
    default_sql: str | None  # its default expression, or None (NULL)


@dataclass(frozen=True)
class ApplyTarget:
    """A subscriber table as the apply writes it."""

    index: int
    table: TableName
    relkind: str
    columns: tuple[TargetColumn, ...]  # the columns it can write (not generated), in the table's order
    generated: frozenset[str]
    key: tuple[str, ...]  # replica identity index, else primary key (as logicalrep_rel_open picks)

    @property
    def column_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    def key_types(self) -> list[str]:
        by_name = {c.name: c.type_sql for c in self.columns}
        return [by_name[k] for k in self.key]

    @property
    def only(self) -> sql.SQL:
        return sql.SQL("" if self.relkind == "p" else "ONLY ")

    def check_published(self, published: Sequence[str], commit_lsn: int) -> None:
        """Every published column must be a writable column of the target (logicalrep_rel_open)."""
        missing = [c for c in published if c not in self.column_names and c not in self.generated]
        if missing:
            raise ApplyTargetError(
                f'logical replication target relation "{self.table}" is missing replicated column: "{missing[0]}"',
                detail=f"the publisher sends it from the transaction finished at {format_lsn(commit_lsn)} on",
                hint=f'add column "{missing[0]}" to {self.table} in the subscriber and run again; nothing was applied',
                table=str(self.table))
        generated = [c for c in published if c in self.generated]
        if generated:
            raise ApplyTargetError(
                f'logical replication target relation "{self.table}" has incompatible generated column: '
                f'"{generated[0]}"', table=str(self.table),
                hint="make it a regular column in the subscriber, or leave it out of the publication's column list")

    def not_updatable(self, kind: str, commit_lsn: int) -> ApplyTargetError:
        """An UPDATE or DELETE for this table, which has no key, from a publisher table without REPLICA IDENTITY
        FULL: nothing to find the row by (worker.c check_relation_updatable, relation.c
        logicalrep_rel_mark_updatable). INSERTs and TRUNCATEs need no key."""
        lsn = format_lsn(commit_lsn)
        return ApplyTargetError(
            f'logical replication target relation "{self.table}" has neither REPLICA IDENTITY index nor PRIMARY '
            "KEY and published relation does not have REPLICA IDENTITY FULL", table=str(self.table),
            detail=f'the remote transaction finished at {lsn} sends it a message of type "{kind.upper()}". '
            "Nothing of the batch was applied.",
            hint=f"add a primary key (or a REPLICA IDENTITY USING INDEX) on the published key columns to {self.table} "
            f"in the subscriber and run again; or skip the whole remote transaction with `rowfilter skip --lsn {lsn}` "
            "(ALTER SUBSCRIPTION … SKIP). The change log keeps the batch")


def read_target(conn: psycopg.Connection, table: TableName, index: int) -> ApplyTarget:
    """Read ``table``'s columns, defaults and key from the subscriber's catalog; raise when it is missing."""
    row = conn.execute(
        """SELECT c.oid, c.relkind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
           WHERE n.nspname = %s AND c.relname = %s AND c.relkind IN ('r', 'p')""",
        (table.schema, table.name)).fetchone()
    if row is None:
        raise ApplyTargetError(f'logical replication target relation "{table}" does not exist', table=str(table),
                               hint=f"create {table} in the subscriber with at least the published columns")
    oid, relkind = row
    columns, generated = [], set()
    for name, type_sql, default_sql, attgenerated, identity in conn.execute(
            """SELECT a.attname, format_type(a.atttypid, a.atttypmod), pg_get_expr(d.adbin, d.adrelid),
                      a.attgenerated, a.attidentity
               FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
               WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum""", (oid,)):
        if attgenerated:
            generated.add(name)
            continue
        if identity:
            default_sql = sql.SQL("nextval(pg_get_serial_sequence({}, {}))").format(
                sql.Literal(table_sql(table).as_string(conn)), sql.Literal(name)).as_string(conn)
        columns.append(TargetColumn(name, type_sql, default_sql))
    key = [r[0] for r in conn.execute(
        """SELECT a.attname FROM (
               SELECT i.indkey FROM pg_index i WHERE i.indrelid = %s AND (i.indisreplident OR i.indisprimary)
               ORDER BY i.indisreplident DESC LIMIT 1) i,
             LATERAL unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, n)
           JOIN pg_attribute a ON a.attrelid = %s AND a.attnum = k.attnum ORDER BY k.n""", (oid, oid))]
    return ApplyTarget(index, table, relkind, tuple(columns), frozenset(generated), tuple(key))


def rejected_column(conn: psycopg.Connection, token: str, target: ApplyTarget,
                    stage: sql.Composable = STAGE) -> TargetColumn | None:
    """The first column of ``target`` whose staged values its subscriber type refuses (a DataError), or None.

    Each column's staged values are cast in turn, each in a transaction of its own (a savepoint when
    the caller's transaction is open).
    """
    for i, column in enumerate(target.columns):
        try:
            with conn.transaction():
                conn.execute(sql.SQL("SELECT count(({vals}::jsonb ->> {i})::{t}) FROM {stage} "
                                     "WHERE token = %s AND target = %s AND vals IS NOT NULL").format(
                    vals=sql.Identifier("vals"), i=sql.Literal(i), t=sql.SQL(column.type_sql), stage=stage),
                    (token, target.index))
        except psycopg.errors.DataError:
            return column
    return None
