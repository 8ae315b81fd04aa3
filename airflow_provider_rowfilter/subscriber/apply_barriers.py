"""The barriers of a table's batch: the changes that are not reduced per key, one statement each, in commit order.

A TRUNCATE; an UPDATE that changes the key (found by its old key: ``update_exists`` when its new row exists in
another row of a unique index, ``update_missing`` when none is found); an UPDATE or DELETE of a table without a
key, from a publisher with REPLICA IDENTITY FULL (the first row equal to the old row). Each UPDATE or DELETE
that finds a row another origin last modified is PostgreSQL 18's ``*_origin_differs``
(subscriber/origin_conflicts.py): counted, logged and applied. subscriber/apply_target.py runs barrier ``p``
between its phases ``p`` and ``p + 1``.
"""

from __future__ import annotations

import psycopg
from psycopg import sql

from airflow_provider_rowfilter.core.lsn import format_lsn
from airflow_provider_rowfilter.identifiers import table_sql
from airflow_provider_rowfilter.subscriber.conflicts import ConflictError, log_change
from airflow_provider_rowfilter.subscriber.origin_conflicts import LocalOrigin, report, row_origin
from airflow_provider_rowfilter.subscriber.staged_sql import StagedStatements, TableCounts, json_list, json_text
from airflow_provider_rowfilter.subscriber.unique_conflicts import conflicting_rows, unique_indexes


class BarrierStatements(StagedStatements):
    """A target's barriers (its phases are subscriber/apply_target.py's :class:`StagedTable`)."""

    def _apply_barrier(self, phase: int, counts: TableCounts) -> None:
        row = self.conn.execute(sql.SQL(
            """SELECT op, key, vals, p_flags, commit_lsn, xid, restart_identity FROM {stage}
               WHERE token = %s AND target = %s AND row_kind = 'B' AND phase = %s LIMIT 1""").format(stage=self.stage),
            (self.token, self.target.index, phase)).fetchone()
        if row is None:
            return
        op, key, vals, flags, commit_lsn, xid, restart_identity = row
        if op == "T":
            self.conn.execute(sql.SQL("TRUNCATE {}{}").format(
                self.rel, sql.SQL(" RESTART IDENTITY" if restart_identity else "")))
            counts.truncate += 1
            return
        if self.target.key:
            # An UPDATE that moves a row to another key: one statement, located by the old key.
            self._move_key(key, vals, flags, commit_lsn, xid, counts)
        else:
            self._change_one_row(op, key, vals, flags, counts, commit_lsn, xid)

    def _move_key(self, key: str, vals: str, flags: str, commit_lsn: int, xid: int | None,
                  counts: TableCounts) -> None:
        old_key = sql.SQL(" AND ").join(
            sql.SQL("t.{} = ({}::jsonb ->> {})::{}").format(sql.Identifier(k), sql.Literal(key), sql.Literal(i),
                                                             sql.SQL(t))
            for i, (k, t) in enumerate(zip(self.target.key, self.target.key_types(), strict=True)))
        vals_sql = sql.SQL("{}::jsonb").format(sql.Literal(vals))
        if self.policy == "upsert":
            new_key = sql.SQL(" AND ").join(
                sql.SQL("t.{} = CASE {} WHEN '0' THEN {} END").format(
                    sql.Identifier(c.name), self._flag(sql.Literal(flags), i), self._value(vals_sql, i, c))
                for i, c in enumerate(self.target.columns) if c.name in self.target.key)
            self.conn.execute(sql.SQL("DELETE FROM {} t WHERE {} AND NOT ({})").format(self.rel, new_key, old_key))
        local = self._row_origin(old_key)
        try:
            with self.conn.transaction():
                cur = self.conn.execute(sql.SQL("UPDATE {} t SET {} WHERE {}").format(
                    self.rel, self._update_set(vals_sql, sql.Literal(flags)), old_key))
        except psycopg.errors.UniqueViolation:
            self._moved_key_exists(key, vals_sql, flags, commit_lsn, xid, old_key)
            new = [None if f != "0" else v for v, f in zip(json_list(vals), flags, strict=False)]
            by_name = dict(zip(self.target.column_names, new, strict=False))
            self._conflict("update_exists", json_text([by_name.get(k) for k in self.target.key]), commit_lsn, xid,
                           json_text(new))
        if cur.rowcount:
            counts.update += 1
            if local is not None:
                self._origin_differed("U", local, counts, dict(zip(self.target.key, json_list(key), strict=True)),
                                      vals, commit_lsn, xid)
        elif self.policy == "upsert":
            self.conn.execute(sql.SQL("INSERT INTO {} ({}) OVERRIDING SYSTEM VALUE SELECT {}").format(
                table_sql(self.target.table), self._column_list(),
                self._insert_values(vals_sql, sql.Literal(flags))))
            counts.insert += 1
        else:
            counts.missing_update += 1
            self._log_skipped("update_missing", dict(zip(self.target.key, json_list(key), strict=True)), vals,
                              commit_lsn, xid)

    def _moved_key_exists(self, key: str, vals_sql: sql.Composable, flags: str, commit_lsn: int, xid: int | None,
                          old_key: sql.Composable) -> None:
        """An UPDATE that changes the key violated a unique index: ``update_exists`` naming each index its new row
        exists in, in another row (``ExecSimpleRelationUpdate``); return when none of the covered ones."""
        values = sql.SQL(", ").join(
            sql.SQL("CASE {f} WHEN '0' THEN {v} WHEN '1' THEN {d} ELSE t.{c} END AS {c}").format(
                f=self._flag(sql.Literal(flags), i), v=self._value(vals_sql, i, col), d=self._default(col),
                c=sql.Identifier(col.name))
            for i, col in enumerate(self.target.columns))
        new = sql.SQL("SELECT {}::text AS key, t.tableoid AS _oid, t.ctid AS _ctid, {} FROM {} t WHERE {}").format(
            sql.Literal(key), values, self.rel, old_key)
        found = conflicting_rows(self.conn, self.rel, self.target.column_names, new,
                                 unique_indexes(self.conn, table_sql(self.target.table)), other_row=True)
        if not found:
            return
        remote = self.conn.execute(sql.SQL("SELECT {} FROM ({}) n").format(
            sql.SQL(", ").join(sql.SQL("n.{}::text").format(sql.Identifier(c)) for c in self.target.column_names),
            new)).fetchone()
        raise ConflictError(self.target.table, "multiple_unique_conflicts" if len(found) > 1 else "update_exists",
                            self.target.key, json_list(key), int(commit_lsn), None if xid is None else int(xid),
                            found, None if remote is None else list(remote), identity=(self.target.key, json_list(key)))

    def _row_origin(self, where: sql.Composable) -> LocalOrigin | None:
        """The row a barrier's UPDATE or DELETE finds (``where``), when another origin last modified it
        (subscriber/origin_conflicts.py); None without track_commit_timestamp."""
        return row_origin(self.conn, self.rel, where, self.origin) if self.tracks_origins else None

    def _origin_differed(self, op: str, local: LocalOrigin, counts: TableCounts, key: dict | None, vals: str | None,
                         commit_lsn: int | None, xid: int | None) -> None:
        """Count, log and record a barrier's ``update_origin_differs`` / ``delete_origin_differs`` (applied)."""
        kind = "update_origin_differs" if op == "U" else "delete_origin_differs"
        setattr(counts, kind, getattr(counts, kind) + 1)
        identity = ("replica identity full" if key is None else
                    f"replica identity ({', '.join(key)})=({', '.join(str(v) for v in key.values())})")
        report(self.target.table, op, local, identity, xid)
        if self.conflict_log is not None:
            remote = None if vals is None else dict(zip(self.target.column_names, json_list(vals), strict=False))
            log_change(self.conn, self.conflict_log, self.target.table, kind, key, remote,
                       None if commit_lsn is None else format_lsn(int(commit_lsn)), None if xid is None else int(xid),
                       local.row)

    def _log_skipped(self, kind: str, key: dict | None, vals: str | None, commit_lsn: int | None,
                     xid: int | None) -> None:
        if self.conflict_log is None:
            return
        remote = None if vals is None else dict(zip(self.target.column_names, json_list(vals), strict=False))
        log_change(self.conn, self.conflict_log, self.target.table, kind, key, remote,
                   None if commit_lsn is None else format_lsn(int(commit_lsn)), None if xid is None else int(xid))

    def _change_one_row(self, op: str, old: str, vals: str | None, flags: str | None, counts: TableCounts,
                        commit_lsn: int | None = None, xid: int | None = None) -> None:
        """An UPDATE or DELETE of a table without a key, from a publisher with REPLICA IDENTITY FULL: the first row
        equal to the old row on every column, NULL equal to NULL (execReplication.c RelationFindReplTupleSeq,
        tuples_equal); one row per change, whichever of identical rows."""
        same = sql.SQL(" AND ").join(
            sql.SQL("t.{} IS NOT DISTINCT FROM {}").format(sql.Identifier(c.name), self._value(
                sql.SQL("{}::jsonb").format(sql.Literal(old)), i, c))
            for i, c in enumerate(self.target.columns)) if self.target.columns else sql.SQL("true")
        # One row, by its address (a TID scan); a partitioned table's rows are told apart by partition too.
        address = sql.SQL("t.ctid" if self.target.relkind != "p" else "(t.tableoid, t.ctid)")
        one = sql.SQL("{a} = (SELECT {a} FROM {rel} t WHERE {same} LIMIT 1)").format(a=address, rel=self.rel,
                                                                                    same=same)
        local = self._row_origin(same)
        if op == "D":
            if self.conn.execute(sql.SQL("DELETE FROM {} t WHERE {}").format(self.rel, one)).rowcount:
                counts.delete += 1
                if local is not None:
                    self._origin_differed("D", local, counts, None, None, commit_lsn, xid)
            else:
                counts.missing_delete += 1
                self._log_skipped("delete_missing", None, old, commit_lsn, xid)
            return
        vals_sql = sql.SQL("{}::jsonb").format(sql.Literal(vals))
        if self.conn.execute(sql.SQL("UPDATE {} t SET {} WHERE {}").format(
                self.rel, self._update_set(vals_sql, sql.Literal(flags)), one)).rowcount:
            counts.update += 1
            if local is not None:
                self._origin_differed("U", local, counts, None, vals, commit_lsn, xid)
        elif self.policy == "upsert":
            self.conn.execute(sql.SQL("INSERT INTO {} ({}) OVERRIDING SYSTEM VALUE SELECT {}").format(
                table_sql(self.target.table), self._column_list(), self._insert_values(vals_sql, sql.Literal(flags))))
            counts.insert += 1
        else:
            counts.missing_update += 1
            self._log_skipped("update_missing", None, vals, commit_lsn, xid)
