"""PostgreSQL 18's ``update_origin_differs`` and ``delete_origin_differs``: a remote UPDATE or DELETE finds a local
row last modified by another origin (a local transaction, or another subscription's apply).

PostgreSQL's apply worker reads the origin of the transaction that last modified the row it found
(execReplication.c / conflict.c ``GetTupleTransactionInfo``: the row's xmin through
``TransactionIdGetCommitTsData``, known only while ``track_commit_timestamp`` is on) and, when it is not the
session's own (``replorigin_session_origin``), counts the conflict, logs it (LOG, not ERROR) and applies the
change all the same (worker.c ``apply_handle_update_internal``, ``apply_handle_delete_internal``).

Here the same per phase of a table, set-based, before its DELETE and UPDATE statements
(subscriber/apply_target.py): the staged keys that existed before the phase and whose first change is an UPDATE
or a DELETE (the reducers stage each key's first operation) are joined to their local rows, and the rows whose
``pg_xact_commit_timestamp_origin(xmin)`` names an origin other than the apply's own
(subscriber/replication_origin.py; 0 when its writes are untagged) conflict. Later changes of the same key in
the batch find the row the apply itself wrote, as PostgreSQL's would: no conflict. A transaction whose commit
timestamp is not known (older than when ``track_commit_timestamp`` was turned on, frozen, or this very
transaction's) has no origin to compare: no conflict, as in PostgreSQL.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import psycopg
from psycopg import sql

from airflow_provider_rowfilter.core.relation import TableName
from airflow_provider_rowfilter.subscriber.conflicts import ConflictLog, log_found

if TYPE_CHECKING:
    from datetime import datetime

log = logging.getLogger(__name__)

#: How many of a phase's conflicts are logged one by one (the count and the conflict log hold them all).
LOGGED = 10
_KINDS = {"U": ("update_origin_differs", "Updating"), "D": ("delete_origin_differs", "Deleting")}


def tracks_origins(conn: psycopg.Connection) -> bool:
    """Whether the subscriber records each transaction's origin (``track_commit_timestamp``) and can tell it
    (``pg_xact_commit_timestamp_origin``, PostgreSQL 14+)."""
    row = conn.execute("SELECT current_setting('track_commit_timestamp')::bool "
                       "AND current_setting('server_version_num')::int >= 140000").fetchone()
    return bool(row and row[0])


def origin_differs(conn: psycopg.Connection, table: TableName, keys: sql.Composable, rel: sql.Composable,
                   match: sql.Composable, phase: int, origin: int, key_columns: tuple[str, ...],
                   columns: tuple[str, ...], conflict_log: ConflictLog | None) -> dict[str, int]:
    """Find, log and count phase ``phase``'s ``*_origin_differs`` conflicts; return ``{type: number}``.

    :param keys: the staged keys' temp table (``k``), :param rel: the table (``t``), :param match: ``t``'s row
        of ``k``'s key; :param origin: the apply's replication origin id (0: untagged).
    """
    found = differing_rows(keys, rel, match, sql.Literal(phase), origin)
    counts = {_KINDS[op][0]: int(n) for op, n in conn.execute(
        sql.SQL("SELECT op, count(*) FROM ({}) f GROUP BY op").format(found)).fetchall()}
    if not counts:
        return counts
    for key, op, commit_lsn, xid, local_xmin, roident, ts, roname in conn.execute(sql.SQL(
            "SELECT key, op, commit_lsn, xid, local_xmin, roident, \"timestamp\", roname FROM ({}) f "
            "ORDER BY key LIMIT {}").format(found, sql.Literal(LOGGED))).fetchall():
        report(table, op, LocalOrigin(local_xmin, roident, ts, roname, None),
               f"replica identity ({', '.join(key_columns)})={key}", None if commit_lsn is None else xid)
    total = sum(counts.values())
    if total > LOGGED:
        log.info('%s: %d more *_origin_differs conflicts in this batch (counted in rowfilter.subscription_stats%s)',
                 table, total - LOGGED, "; each in rowfilter.conflict_log" if conflict_log is not None else "")
    if conflict_log is not None:
        log_found(conn, conflict_log, table, found, key_columns, columns)
    return counts


def differing_rows(keys: sql.Composable, rel: sql.Composable, match: sql.Composable, phase: sql.Composable,
                   origin: int) -> sql.Composable:
    """The query of phase ``phase``'s ``*_origin_differs`` conflicts (``phase``: a literal, or the variable of the
    server-side walk of subscriber/change_by_change.py, which only asks whether there is one)."""
    return sql.SQL(
        """SELECT k.key, k.op, k.commit_lsn, k.xid, k.vals, t.xmin::text AS local_xmin, o.roident,
                  o."timestamp", r.roname, to_jsonb(t) AS local_row
           FROM {keys} k JOIN {rel} t ON {match}
           CROSS JOIN LATERAL pg_xact_commit_timestamp_origin(t.xmin) o
           LEFT JOIN pg_replication_origin r ON r.roident = o.roident
           WHERE k.phase = {phase} AND k.existed AND k.op IN ('U', 'D')
             AND o.roident IS NOT NULL AND o.roident <> {origin}""").format(
        keys=keys, rel=rel, match=match, phase=phase, origin=sql.Literal(origin))


@dataclass(frozen=True)
class LocalOrigin:
    """Who last modified a local row: its xmin, that transaction's origin (0: local) and commit time."""

    xmin: str
    roident: int
    timestamp: datetime
    roname: str | None  # the origin's name (None: local, or an origin since dropped)
    row: dict | None  # the row's columns (to_jsonb)


def row_origin(conn: psycopg.Connection, rel: sql.Composable, where: sql.Composable, origin: int) -> LocalOrigin | None:
    """The first local row ``where`` finds (``t``: the one a barrier's UPDATE or DELETE then changes), when a
    transaction of another origin than ``origin`` last modified it; else None."""
    row = conn.execute(sql.SQL(
        """SELECT f.xmin::text, o.roident, o."timestamp", r.roname, f.local_row
           FROM (SELECT t.xmin, to_jsonb(t) AS local_row FROM {} t WHERE {} LIMIT 1) f
           CROSS JOIN LATERAL pg_xact_commit_timestamp_origin(f.xmin) o
           LEFT JOIN pg_replication_origin r ON r.roident = o.roident""").format(rel, where)).fetchone()
    if row is None or row[1] is None or int(row[1]) == origin:
        return None
    return LocalOrigin(row[0], int(row[1]), row[2], row[3], row[4])


def report(table: TableName, op: str, local: LocalOrigin, identity: str, xid: int | None) -> None:
    """Log one ``*_origin_differs`` conflict as PostgreSQL 18 does (LOG; conflict.c ``errdetail_apply_conflict``)."""
    kind, doing = _KINDS[op]
    by = "locally" if local.roident == 0 else (f'by a different origin "{local.roname}"' if local.roname is not None
                                               else "by a non-existent origin")
    where = "" if xid is None else f" (remote transaction {xid})"
    log.info('conflict detected on relation "%s": conflict=%s\nDETAIL: %s the row that was modified %s in '
             "transaction %s at %s.\n%s%s; applied.", table, kind, doing, by, local.xmin, local.timestamp, identity,
             where)
