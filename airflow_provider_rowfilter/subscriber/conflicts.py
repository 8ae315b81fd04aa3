"""Conflicts as PostgreSQL 18 names them: running counts per subscription and table, and the log of those the apply
went on from (skipped or applied).

Part of the state module (subscriber/state.py); the tables are migration 9's (subscriber/state_migrations.py).
PostgreSQL 18 (src/backend/replication/logical/conflict.c ``ReportApplyConflict``) counts every conflict its
apply worker meets in ``pg_stat_subscription_stats`` (``pgstat_report_subscription_conflict``) before it logs
it: a conflict that stops the apply (``insert_exists``, ``update_exists``, ``multiple_unique_conflicts``:
ERROR) is counted each time it is met, one that does not (``update_missing``, ``delete_missing``: skipped;
``update_origin_differs``, ``delete_origin_differs``: applied; LOG) once, with the transaction that meets it.
So here: a conflict the batch goes on from is counted in the batch's own transaction (:func:`count` from
subscriber/apply_target.py's caller), an error in a transaction of its own after the batch rolled back
(flows/apply/drain.py), once per attempt.

``rowfilter.subscription_stats`` reads like ``pg_stat_subscription_stats`` (its error counts under PostgreSQL 19's
names, :data:`ERROR_COUNTS`, its ``confl_*`` columns and ``stats_reset``, one row per subscription; and
``sync_error_count``, 18's name of ``sync_table_error_count``, kept for one release); ``rowfilter.conflict_stats``
holds the same conflict counts per table;
``rowfilter.reset_subscription_stats(name)`` is ``pg_stat_reset_subscription_stats`` (NULL: every one).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from airflow_provider_rowfilter.core.errors import RowFilterError
from airflow_provider_rowfilter.core.lsn import format_lsn
from airflow_provider_rowfilter.core.relation import TableName

#: PostgreSQL 18's conflict types, in its order (conflict.c ``ConflictTypeNames``).
CONFLICT_TYPES = ("insert_exists", "update_origin_differs", "update_exists", "update_missing",
                  "delete_origin_differs", "delete_missing", "multiple_unique_conflicts")
#: What the apply does at each (conflict.c ``ReportApplyConflict``'s elevel, worker.c): stop the batch, or go on
#: (``*_missing``: the change skipped; ``*_origin_differs``: applied, found only on a subscriber with
#: track_commit_timestamp, which records each row's origin: subscriber/origin_conflicts.py).
STOPS = frozenset({"insert_exists", "update_exists", "multiple_unique_conflicts"})
#: A batch's per-table counts (subscriber/apply_target.py ``TableCounts``) that are conflicts.
FROM_COUNTS = {"missing_update": "update_missing", "missing_delete": "delete_missing",
               "update_origin_differs": "update_origin_differs", "delete_origin_differs": "delete_origin_differs"}


@dataclass(frozen=True)
class LocalRow:
    """A subscriber row a change conflicts with, in one unique index, as PostgreSQL 18's DETAIL names it (conflict.c
    ``errdetail_apply_conflict``, ``build_tuple_value_details``)."""

    index: str  # the unique index the key exists in
    xmin: str  # the transaction that last modified the row
    values: tuple[str | None, ...]  # its columns' text, in the table's order
    key_columns: tuple[str, ...] = ()  # the index's columns
    key: tuple[str | None, ...] = ()  # their values


def _tuple(values: Sequence[str | None]) -> str:
    """A row as execMain.c ``ExecBuildSlotValueDescription`` shows it: ``(1, local)``, NULL as null."""
    return "(" + ", ".join("null" if v is None else v[:64] + ("..." if len(v) > 64 else "") for v in values) + ")"


class ConflictError(RowFilterError):
    """A change conflicts with the subscriber's data: PostgreSQL 18's ``insert_exists``, ``update_exists`` (one
    unique index) or ``multiple_unique_conflicts`` (several), which stop its apply worker."""

    def __init__(self, table: TableName, kind: str, key_columns: Sequence[str], key: Sequence[str | None],
                 commit_lsn: int | None, xid: int | None, found: Sequence[LocalRow] = (),
                 remote: Sequence[str | None] | None = None, batch: str | None = None,
                 identity: tuple[Sequence[str], Sequence[str | None]] | None = None) -> None:
        self.kind = kind
        self.met: dict[TableName, dict[str, int]] = {}  # the conflicts the batch went on from before it stopped
        self.batch_start: str | None = None  # the stopped batch's start (flows/apply/batch_transaction.py sets both)
        self.commit_lsn = commit_lsn
        self.xid = xid
        self.key = tuple(key)
        # PostgreSQL 18's DETAIL (conflict.c errdetail_apply_conflict: one part per conflicting unique index), then
        # where the change came from (its CONTEXT).
        parts = []
        for local in found or [LocalRow("", "", (), tuple(key_columns), tuple(key))]:
            shown = ", ".join("null" if v is None else v for v in local.key)
            values = f"Key ({', '.join(local.key_columns)})=({shown})"
            if local.index:
                values += f"; existing local tuple {_tuple(local.values)}"
            if remote is not None:
                values += f"; remote tuple {_tuple(remote)}"
            if identity is not None:  # the row an UPDATE found (conflict.c build_tuple_value_details)
                shown_identity = ", ".join("null" if v is None else v for v in identity[1])
                values += f"; replica identity ({', '.join(identity[0])})=({shown_identity})"
            parts.append((f'Key already exists in unique index "{local.index}", modified in transaction {local.xmin}.'
                          if local.index else "Key already exists in the subscriber.") + "\n" + values + ".")
        if commit_lsn is not None:
            lsn = format_lsn(commit_lsn)
            where = f"Remote transaction {xid} finished at {lsn}."
            hint = (f"remove or change the subscriber's row and run again; or skip the whole remote transaction with "
                    f"`rowfilter skip --lsn {lsn}` (ALTER SUBSCRIPTION … SKIP); or set conflict_policy: upsert")
        else:  # a key's changes from several transactions, reduced together: not told apart
            where = (f"The change is one of the batch's changes to this key, from several remote transactions "
                     f"({batch}).")
            hint = ("remove or change the subscriber's row and run again (`rowfilter skip` needs one transaction: "
                    "these changes are from several)")
        super().__init__(
            f'conflict detected on relation "{table}": conflict={kind}',
            detail="\n".join(parts) + f"\n{where} Nothing of the batch was applied.", hint=hint, table=str(table))


_COLUMNS = [sql.Identifier(f"confl_{t}") for t in CONFLICT_TYPES]


def conflicts_of(counts: Mapping[str, int]) -> dict[str, int]:
    """The conflicts in a batch's per-table counts (``missing_update`` → ``update_missing``, …)."""
    return {FROM_COUNTS[k]: int(n) for k, n in counts.items() if k in FROM_COUNTS and n}


def count(conn: psycopg.Connection, subscription: str, table: TableName, conflicts: Mapping[str, int]) -> None:
    """Add ``conflicts`` (type → number) to the table's running counts, in the caller's transaction."""
    conflicts = {t: n for t, n in conflicts.items() if n}
    if not conflicts:
        return
    unknown = set(conflicts) - set(CONFLICT_TYPES)
    if unknown:
        raise ValueError(f"not a conflict type of PostgreSQL's: {sorted(unknown)}")
    names = [sql.Identifier(f"confl_{t}") for t in conflicts]
    conn.execute(sql.SQL(
        """INSERT INTO rowfilter.conflict_stats (subscription, schema_name, table_name, {columns})
           VALUES (%s, %s, %s, {values})
           ON CONFLICT (subscription, schema_name, table_name) DO UPDATE SET {adds}, updated_at = now()""").format(
        columns=sql.SQL(", ").join(names), values=sql.SQL(", ").join(sql.Placeholder() for _ in names),
        adds=sql.SQL(", ").join(sql.SQL("{c} = conflict_stats.{c} + EXCLUDED.{c}").format(c=c) for c in names)),
        (subscription, table.schema, table.name, *conflicts.values()))


def count_stopped(conn: psycopg.Connection, subscription: str, start_lsn: str | None,
                  met: Mapping[TableName, Mapping[str, int]]) -> None:
    """A batch starting at ``start_lsn`` stopped: count the conflicts it went on from before it stopped (``met``, per
    table), in the caller's transaction of its own, as PostgreSQL's counts do not roll back with the apply
    (pgstat_report_subscription_conflict is not transactional). Idempotent across the batch's retries: what an
    earlier stop of a batch from the same start counted is not counted again, and its retry that commits counts
    only the rest (:func:`count_batch`)."""
    conn.execute("DELETE FROM rowfilter.conflict_stopped WHERE subscription = %s AND start_lsn IS DISTINCT FROM %s",
                 (subscription, start_lsn))
    for table, conflicts in met.items():
        before = _stopped(conn, subscription, table)
        _count_beyond(conn, subscription, table, conflicts, before)
        conn.execute(
            """INSERT INTO rowfilter.conflict_stopped (subscription, schema_name, table_name, start_lsn, counted)
               VALUES (%s, %s, %s, %s, %s) ON CONFLICT (subscription, schema_name, table_name)
               DO UPDATE SET counted = EXCLUDED.counted, start_lsn = EXCLUDED.start_lsn""",
            (subscription, table.schema, table.name, start_lsn,
             Jsonb({t: max(n, before.get(t, 0)) for t, n in {**before, **conflicts}.items()})))


def count_batch(conn: psycopg.Connection, subscription: str, start_lsn: str | None, table: TableName,
                conflicts: Mapping[str, int]) -> None:
    """:func:`count` for a batch that commits, less what a stop of the same batch (same start) counted already."""
    _count_beyond(conn, subscription, table, conflicts, _stopped(conn, subscription, table, start_lsn))


def clear_stopped(conn: psycopg.Connection, subscription: str) -> None:
    """A batch committed: what its stops counted is behind it (with the batch's transaction)."""
    conn.execute("DELETE FROM rowfilter.conflict_stopped WHERE subscription = %s", (subscription,))


def _count_beyond(conn: psycopg.Connection, subscription: str, table: TableName, conflicts: Mapping[str, int],
                  before: Mapping[str, int]) -> None:
    """:func:`count` of what ``conflicts`` holds beyond what a stop counted ``before``."""
    count(conn, subscription, table, {t: n - before.get(t, 0) for t, n in conflicts.items() if n > before.get(t, 0)})


def _stopped(conn: psycopg.Connection, subscription: str, table: TableName,
             start_lsn: str | None = None) -> dict[str, int]:
    row = conn.execute(
        "SELECT counted FROM rowfilter.conflict_stopped WHERE subscription = %s AND schema_name = %s "
        "AND table_name = %s" + ("" if start_lsn is None else " AND start_lsn = %s"),
        (subscription, table.schema, table.name, *(() if start_lsn is None else (start_lsn,)))).fetchone()
    return {} if row is None else {t: int(n) for t, n in row[0].items()}


#: pg_stat_subscription_stats' error counts (PostgreSQL 19's names; migration 11): which worker's error each counts.
ERROR_COUNTS = ("apply_error_count", "sync_seq_error_count", "sync_table_error_count")


def count_error(conn: psycopg.Connection, subscription: str, column: str) -> None:
    """One more error of the apply, a table's copy or the sequence synchronization (``column``, one of
    :data:`ERROR_COUNTS`), committed at once: as the worker's error in PostgreSQL (pgstat_report_subscription_error),
    it is counted however the run that met it ends. A subscriber whose schema predates the counts is left as it is."""
    if column not in ERROR_COUNTS:
        raise ValueError(f"not an error count of pg_stat_subscription_stats: {column}")
    if conn.execute("SELECT to_regclass('rowfilter.error_stats') IS NULL").fetchone()[0]:
        return
    with conn.transaction():
        conn.execute(sql.SQL(
            """INSERT INTO rowfilter.error_stats (subscription, {c}) SELECT name, 1 FROM rowfilter.subscription
               WHERE name = %s ON CONFLICT (subscription) DO UPDATE SET {c} = error_stats.{c} + 1""").format(
            c=sql.Identifier(column)), (subscription,))


def reset(conn: psycopg.Connection, subscription: str | None) -> None:
    """``pg_stat_reset_subscription_stats``: the counts of ``subscription`` (None: of every one) back to zero."""
    conn.execute("SELECT rowfilter.reset_subscription_stats(%s)", (subscription,))


@dataclass(frozen=True)
class ConflictStats:
    """A subscription's running conflict counts: per table, in total, and when they were last reset."""

    tables: dict[str, dict[str, int]] = field(default_factory=dict)
    stats_reset: datetime | None = None

    @property
    def total(self) -> dict[str, int]:
        return {t: sum(c.get(t, 0) for c in self.tables.values()) for t in CONFLICT_TYPES}

    def as_dict(self) -> dict:
        return {"total": self.total, "tables": self.tables,
                "stats_reset": None if self.stats_reset is None else self.stats_reset.isoformat()}


def read(conn: psycopg.Connection, subscription: str) -> ConflictStats:
    """The subscription's counts (every type, zeros included, for each table that met one)."""
    rows = conn.execute(sql.SQL(
        "SELECT schema_name, table_name, {} FROM rowfilter.conflict_stats WHERE subscription = %s "
        "ORDER BY schema_name, table_name").format(sql.SQL(", ").join(_COLUMNS)), (subscription,)).fetchall()
    reset_at = conn.execute("SELECT stats_reset FROM rowfilter.conflict_stats_reset WHERE subscription = %s",
                            (subscription,)).fetchone()
    return ConflictStats({str(TableName(r[0], r[1])): dict(zip(CONFLICT_TYPES, map(int, r[2:]), strict=True))
                          for r in rows}, None if reset_at is None else reset_at[0])


@dataclass(frozen=True)
class ConflictLog:
    """Where a batch logs its skipped and applied conflicts (the spec's ``conflict_log: table``): one row per key
    and type of a reduced key (its number of changes in ``changes``), one per change of a barrier, with the
    batch's span."""

    subscription: str
    batch_start_lsn: str | None
    batch_end_lsn: str


def log_keys(conn: psycopg.Connection, log: ConflictLog, table: TableName, keys: sql.Composable, phase: int,
             key_columns: Sequence[str], columns: Sequence[str]) -> None:
    """Log phase ``phase``'s skipped changes of the reduced keys in ``keys`` (subscriber/apply_target.py's temp
    table): the key, the remote values the batch carried for it (its last image), how many changes were skipped,
    and their remote transaction when all the key's changes are one transaction's (else NULL: the changes of one
    key were reduced together, their LSNs are within the batch's span, not told apart)."""
    conn.execute(sql.SQL(
        """INSERT INTO rowfilter.conflict_log (subscription, schema_name, table_name, conflict_type, key, remote_row,
                                               changes, commit_lsn, xid, batch_start_lsn, batch_end_lsn)
           SELECT %(sub)s, %(schema)s, %(table)s, c.kind,
                  (SELECT jsonb_object_agg(n.name, k.key::jsonb -> (n.i - 1)::int)
                   FROM unnest(%(keys)s::text[]) WITH ORDINALITY n(name, i)),
                  CASE WHEN k.vals IS NOT NULL THEN
                      (SELECT jsonb_object_agg(n.name, k.vals -> (n.i - 1)::int)
                       FROM unnest(%(columns)s::text[]) WITH ORDINALITY n(name, i)) END,
                  c.n, '0/0'::pg_lsn + k.commit_lsn, k.xid, %(start)s, %(end)s
           FROM {keys} k CROSS JOIN LATERAL (VALUES
               ('update_missing', CASE WHEN k.existed THEN k.p_missing_update ELSE k.a_missing_update END),
               ('delete_missing', CASE WHEN k.existed THEN k.p_missing_delete ELSE k.a_missing_delete END)) c(kind, n)
           WHERE k.phase = %(phase)s AND c.n > 0
           ORDER BY k.key, c.kind""").format(keys=keys),
        {"sub": log.subscription, "schema": table.schema, "table": table.name, "keys": list(key_columns),
         "columns": list(columns), "start": log.batch_start_lsn, "end": log.batch_end_lsn, "phase": phase})


def log_change(conn: psycopg.Connection, log: ConflictLog, table: TableName, kind: str, key: dict | None,
               remote: dict | None, commit_lsn: str | None, xid: int | None, local: dict | None = None) -> None:
    """Log one conflict of one change (a barrier: a key's move, a change of a table without a key)."""
    conn.execute(
        """INSERT INTO rowfilter.conflict_log (subscription, schema_name, table_name, conflict_type, key, local_row,
                                               remote_row, commit_lsn, xid, batch_start_lsn, batch_end_lsn)
           VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)""",
        (log.subscription, table.schema, table.name, kind, None if key is None else Jsonb(key),
         None if local is None else Jsonb(local), None if remote is None else Jsonb(remote), commit_lsn, xid,
         log.batch_start_lsn, log.batch_end_lsn))


def log_found(conn: psycopg.Connection, log: ConflictLog, table: TableName, found: sql.Composable,
              key_columns: Sequence[str], columns: Sequence[str]) -> None:
    """Log the ``*_origin_differs`` conflicts ``found`` (subscriber/origin_conflicts.py's query: a row per key with
    its first operation, transaction, remote values and local row), one row each."""
    conn.execute(sql.SQL(
        """INSERT INTO rowfilter.conflict_log (subscription, schema_name, table_name, conflict_type, key,
                                               local_row, remote_row, commit_lsn, xid, batch_start_lsn,
                                               batch_end_lsn)
           SELECT %(sub)s, %(schema)s, %(table)s,
                  CASE f.op WHEN 'U' THEN 'update_origin_differs' ELSE 'delete_origin_differs' END,
                  (SELECT jsonb_object_agg(n.name, f.key::jsonb -> (n.i - 1)::int)
                   FROM unnest(%(keys)s::text[]) WITH ORDINALITY n(name, i)),
                  f.local_row,
                  CASE WHEN f.op = 'U' AND f.vals IS NOT NULL THEN
                      (SELECT jsonb_object_agg(n.name, f.vals -> (n.i - 1)::int)
                       FROM unnest(%(columns)s::text[]) WITH ORDINALITY n(name, i)) END,
                  '0/0'::pg_lsn + f.commit_lsn, f.xid, %(start)s, %(end)s
           FROM ({found}) f ORDER BY f.key""").format(found=found),
        {"sub": log.subscription, "schema": table.schema, "table": table.name, "keys": list(key_columns),
         "columns": list(columns), "start": log.batch_start_lsn, "end": log.batch_end_lsn})
