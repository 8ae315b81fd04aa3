"""A reconcile's writes: one group of the table's rows brought to the publisher's rows, in one subscriber transaction.

The group's rows on the publisher (the initial copy's ``COPY (SELECT … WHERE filter AND group) TO STDOUT``,
in the reconcile's snapshot, read by the caller: publisher/copy_source.py ``read_copy``) are streamed into a
temporary table of the transaction (its columns and types
the target's, as the copy's staging table), and three statements make the target's rows of the group equal
to them: the extra rows deleted, the different ones updated (only the published columns: the others keep
their values, as the apply leaves them), the missing ones inserted. A row is "different" when its text form
differs: the subscriber's own type decides, as it decides what a new copy would hold. A table without a
key is fixed as a multiset: surplus copies of a row deleted, lacking ones inserted.

The transaction ends with every row of the group as a new copy at the snapshot would give it, whatever the
group held before: run twice (a Spark task retried, a rerun after a kill), it does nothing the second time.
It runs on an executor, or in the job's process: psycopg only.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass

import psycopg
from psycopg import sql

from airflow_provider_rowfilter.connection import open_session
from airflow_provider_rowfilter.core.compare.table_compare import ident
from airflow_provider_rowfilter.core.relation import TableName
from airflow_provider_rowfilter.identifiers import table_sql

log = logging.getLogger(__name__)

STAGE = "rowfilter_reconcile"
TEMP_BUFFERS = "128MB"


@dataclass(frozen=True)
class GroupFix:
    """One group of a table to fix (picklable: what a Spark task receives)."""

    table: TableName
    partitioned: bool  # the target is a partitioned table (read without ONLY)
    columns: tuple[str, ...]  # the published columns
    key: tuple[str, ...]  # the subscriber's key; empty: a multiset
    copy_out: str  # the publisher's COPY … TO STDOUT of the group's rows
    predicate: str  # the group's rows of the target (SQL over its columns)
    qualified: str  # the same over the columns of the target as ``t`` (a statement that reads the stage too)
    group: int = 0


@dataclass
class GroupCounts:
    group: int
    inserted: int = 0
    updated: int = 0
    deleted: int = 0
    publisher_rows: int = 0


def fix_group(target: dict[str, str], fix: GroupFix, blocks: Iterable[bytes | bytearray]) -> GroupCounts:
    """Bring the target's rows of ``fix``'s group to the publisher's, in ONE transaction: ``blocks`` are the
    output of the group's ``copy_out`` (COPY text, whole lines), read once the transaction has begun."""
    with open_session(autocommit=False, **target) as conn:
        with conn.transaction():
            # Room for a group's rows in the session's local buffers (settable before its first temporary table).
            conn.execute(f"SET LOCAL temp_buffers = '{TEMP_BUFFERS}'")
            _replica_role(conn)
            return _fix(conn, fix, blocks)


def _replica_role(conn: psycopg.Connection) -> None:
    """``session_replication_role = replica`` as the copy and the apply write (subscriber/replica_role.py), when
    the role may; the job's driver said so once already when it may not."""
    conn.execute("SAVEPOINT rowfilter_role")
    try:
        conn.execute("SET LOCAL session_replication_role = replica")
        conn.execute("RELEASE SAVEPOINT rowfilter_role")
    except psycopg.errors.InsufficientPrivilege:
        conn.execute("ROLLBACK TO SAVEPOINT rowfilter_role")


def _fix(conn: psycopg.Connection, fix: GroupFix, blocks: Iterable[bytes]) -> GroupCounts:
    began = time.monotonic()
    target = table_sql(fix.table).as_string(conn)
    only = "" if fix.partitioned else "ONLY "
    cols = ", ".join(map(ident, fix.columns))
    conn.execute(f"CREATE TEMP TABLE {STAGE} ON COMMIT DROP AS SELECT {cols} FROM ONLY {target} WITH NO DATA")
    with conn.cursor() as cur:
        with cur.copy(sql.SQL(f"COPY {STAGE} ({cols}) FROM STDIN")) as copy:
            for block in blocks:
                copy.write(block)
        staged = cur.rowcount
    conn.execute(f"ANALYZE {STAGE}")
    staged_at = time.monotonic()
    counts = GroupCounts(fix.group, publisher_rows=staged)
    if fix.key:
        _fix_keyed(conn, fix, target, only, cols, counts)
    else:
        _fix_multiset(conn, fix, target, only, cols, counts)
    log.debug("%s: group %d: %d publisher rows staged in %.2f s, fixed in %.2f s (+%d ~%d -%d)", fix.table,
              fix.group, staged, staged_at - began, time.monotonic() - staged_at, counts.inserted, counts.updated,
              counts.deleted)
    return counts


def _fix_keyed(conn: psycopg.Connection, fix: GroupFix, target: str, only: str, cols: str,
               counts: GroupCounts) -> None:
    # Every statement restricts the target to the group (an index reads a key range): the stage holds the
    # group's rows only, and a join to the whole target would scan it once per group.
    key = " AND ".join(f"t.{ident(k)} = s.{ident(k)}" for k in fix.key)
    counts.deleted = conn.execute(
        f"DELETE FROM {only}{target} t WHERE ({fix.qualified}) AND NOT EXISTS (SELECT FROM {STAGE} s WHERE {key})"
    ).rowcount
    values = [c for c in fix.columns if c not in fix.key]
    if values:
        row_t = f"ROW({', '.join('t.' + ident(c) for c in fix.columns)})::text"
        row_s = f"ROW({', '.join('s.' + ident(c) for c in fix.columns)})::text"
        sets = ", ".join(f"{ident(c)} = s.{ident(c)}" for c in values)
        counts.updated = conn.execute(
            f"UPDATE {only}{target} t SET {sets} FROM {STAGE} s WHERE ({fix.qualified}) AND {key} "
            f"AND {row_t} IS DISTINCT FROM {row_s}").rowcount
    counts.inserted = conn.execute(
        f"INSERT INTO {target} ({cols}) OVERRIDING SYSTEM VALUE SELECT {cols} FROM {STAGE} s "
        f"WHERE NOT EXISTS (SELECT FROM {only}{target} t WHERE ({fix.qualified}) AND {key})").rowcount


def _fix_multiset(conn: psycopg.Connection, fix: GroupFix, target: str, only: str, cols: str,
                  counts: GroupCounts) -> None:
    row = f"ROW({cols})::text"
    # Surplus copies of a row go (any of them: they are equal), then the copies still lacking come in.
    counts.deleted = conn.execute(
        f"""DELETE FROM {only}{target} WHERE (tableoid, ctid) IN (
              SELECT t.rowfilter_oid, t.rowfilter_tid FROM (
                SELECT tableoid AS rowfilter_oid, ctid AS rowfilter_tid, {row} AS rowfilter_row,
                       row_number() OVER (PARTITION BY {row}) AS rowfilter_n
                FROM {only}{target} WHERE ({fix.predicate})) t
              LEFT JOIN (SELECT {row} AS rowfilter_row, count(*) AS rowfilter_c FROM {STAGE} GROUP BY 1) s
                USING (rowfilter_row)
              WHERE t.rowfilter_n > coalesce(s.rowfilter_c, 0))""").rowcount
    counts.inserted = conn.execute(
        f"""INSERT INTO {target} ({cols}) OVERRIDING SYSTEM VALUE
            SELECT {cols} FROM (
              SELECT {cols}, {row} AS rowfilter_row, row_number() OVER (PARTITION BY {row}) AS rowfilter_n
              FROM {STAGE}) s
            LEFT JOIN (SELECT {row} AS rowfilter_row, count(*) AS rowfilter_c FROM {only}{target}
                       WHERE ({fix.predicate}) GROUP BY 1) t USING (rowfilter_row)
            WHERE s.rowfilter_n > coalesce(t.rowfilter_c, 0)""").rowcount
