"""Where a batch lands: the subscriber's tables, written set-based from the staged net effect of the batch.

A reducer (spark/apply_frames.py, or apply/net_effect.py in the job's process) reduces every key a
batch touches to its net effect, computed twice: as if the key existed in the subscriber before the
batch (``p_*``, "present") and as if it did not (``a_*``, "absent"), because only the subscriber knows
which is true. The two outcomes differ in whether a row is left and in its flags, never in a value
either one reads, so a key's values are staged once (``vals``). The rows are staged in
``rowfilter.apply_stage`` (subscriber/apply_stage.py); here, inside the one transaction that also moves
the positions, each table is brought up to date with a handful of statements whose cost grows with the
batch, not with the table: look the staged keys up through the table's key index, raise the first
conflict, then DELETE, UPDATE and INSERT what the chosen outcome says.

A table's changes are cut into *phases* by the changes that cannot be reduced per key (TRUNCATE,
an UPDATE that changes the key): phase ``p``'s keys are applied, then barrier ``p`` as one
statement, then phase ``p + 1``, so the order of the source transactions is kept exactly. A table
without a key gets its INSERTs as keys of their own (inserted, never looked up) and each UPDATE or
DELETE (REPLICA IDENTITY FULL) as a barrier that finds one row equal to the old row.

The table itself (its columns, defaults and key, as relation.c ``logicalrep_rel_open`` reads them) is described
in subscriber/target_table.py; the conflicts on its unique indexes are found by subscriber/unique_conflicts.py,
counted and logged by subscriber/conflicts.py. Columns are matched by name. Per column and outcome, a flag
says where the value comes from: ``0`` the staged value (its text form, cast by the subscriber's column type), ``1`` the
column's default (a column the change did not carry: an INSERT fills it as PostgreSQL's
``slot_fill_defaults`` does), ``2`` the subscriber's current value (an UPDATE that did not carry the
column, or an unchanged TOASTed value: ``slot_modify_data`` keeps the local value).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field

import psycopg
from psycopg import sql

from airflow_provider_rowfilter.core.lsn import format_lsn
from airflow_provider_rowfilter.core.spec import CONFLICT_POLICIES, ConflictPolicy
from airflow_provider_rowfilter.identifiers import table_sql
from airflow_provider_rowfilter.subscriber.apply_stage import STAGE
from airflow_provider_rowfilter.subscriber.conflicts import ConflictError, ConflictLog, LocalRow, log_change, log_keys
from airflow_provider_rowfilter.subscriber.origin_conflicts import (
    LocalOrigin,
    origin_differs,
    report,
    row_origin,
    tracks_origins,
)
from airflow_provider_rowfilter.subscriber.target_table import (
    ApplyTarget,
    ApplyTargetError,
    TargetColumn,
    read_target,
    rejected_column,
)
from airflow_provider_rowfilter.subscriber.unique_conflicts import conflicting_rows, first_conflicting, unique_indexes

# The names callers import from here (the target's description lives in subscriber/target_table.py).
__all__ = ["ApplyTarget", "ApplyTargetError", "ConflictError", "StagedTable", "TableCounts", "TargetColumn",
           "read_target", "rejected_column"]


@dataclass
class TableCounts:
    """What one batch did to one subscriber table (the ``counts`` of ``rowfilter.batch_history``)."""

    insert: int = 0
    update: int = 0
    delete: int = 0
    truncate: int = 0
    missing_update: int = 0
    missing_delete: int = 0
    update_origin_differs: int = 0  # applied all the same (subscriber/origin_conflicts.py)
    delete_origin_differs: int = 0
    extra: dict[str, int] = field(default_factory=dict)  # filtered, update_to_insert, … (from Spark)

    def as_dict(self) -> dict[str, int]:
        counts = {"insert": self.insert, "update": self.update, "delete": self.delete, "truncate": self.truncate,
                  "missing_update": self.missing_update, "missing_delete": self.missing_delete,
                  "update_origin_differs": self.update_origin_differs,
                  "delete_origin_differs": self.delete_origin_differs, **self.extra}
        return {k: v for k, v in counts.items() if v}

    @property
    def changed(self) -> bool:
        return bool(self.insert or self.update or self.delete or self.truncate)


class StagedTable:
    """Applies one target's staged rows inside the caller's transaction."""

    def __init__(self, conn: psycopg.Connection, token: str, target: ApplyTarget, policy: ConflictPolicy = "error",
                 conflict_log: ConflictLog | None = None, span: str | None = None, origin: int = 0) -> None:
        if policy not in CONFLICT_POLICIES:
            raise ApplyTargetError(f"conflict_policy {policy!r} is not one of {', '.join(CONFLICT_POLICIES)}")
        self.conn = conn
        self.token = token
        self.target = target
        self.policy = policy
        self.conflict_log = conflict_log  # where skipped conflicts are logged (the spec's conflict_log: table)
        self.span = span  # the batch's changes in words, for a conflict no single transaction is known of
        self.origin = origin  # the replication origin the apply writes with (0: none): *_origin_differs
        self.tracks_origins = False
        self.keys = sql.Identifier(f"rowfilter_keys_{target.index}")
        self.rel = sql.SQL("{}{}").format(target.only, table_sql(target.table))

    # --- SQL pieces ----------------------------------------------------------------------------------
    def _key_match(self, left: str, right: str) -> sql.Composable:
        return sql.SQL(" AND ").join(
            sql.SQL("{}.{} = {}.{}").format(sql.Identifier(left), sql.Identifier(k), sql.Identifier(right),
                                             sql.Identifier(f"_k{i}"))
            for i, k in enumerate(self.target.key))

    @staticmethod
    def _value(vals: sql.Composable, i: int, column: TargetColumn) -> sql.Composable:
        return sql.SQL("({} ->> {})::{}").format(vals, sql.Literal(i), sql.SQL(column.type_sql))

    @staticmethod
    def _default(column: TargetColumn) -> sql.Composable:
        if column.default_sql is None:
            return sql.SQL("NULL::{}").format(sql.SQL(column.type_sql))
        return sql.SQL("({})::{}").format(sql.SQL(column.default_sql), sql.SQL(column.type_sql))

    def _flag(self, flags: sql.Composable, i: int) -> sql.Composable:
        return sql.SQL("substr({}, {}, 1)").format(flags, sql.Literal(i + 1))

    def _update_set(self, vals: sql.Composable, flags: sql.Composable) -> sql.Composable:
        return sql.SQL(", ").join(
            sql.SQL("{c} = CASE {f} WHEN '0' THEN {v} WHEN '1' THEN {d} ELSE t.{c} END").format(
                c=sql.Identifier(col.name), f=self._flag(flags, i), v=self._value(vals, i, col), d=self._default(col))
            for i, col in enumerate(self.target.columns))

    def _insert_values(self, vals: sql.Composable, flags: sql.Composable) -> sql.Composable:
        return sql.SQL(", ").join(
            sql.SQL("CASE {f} WHEN '0' THEN {v} ELSE {d} END").format(
                f=self._flag(flags, i), v=self._value(vals, i, col), d=self._default(col))
            for i, col in enumerate(self.target.columns))

    def _column_list(self) -> sql.Composable:
        return sql.SQL(", ").join(sql.Identifier(c.name) for c in self.target.columns)

    # --- applying ------------------------------------------------------------------------------------
    def apply(self) -> TableCounts:
        """Apply every phase and barrier; raise :class:`ConflictError` at the first conflict."""
        counts = TableCounts()
        self.tracks_origins = tracks_origins(self.conn)
        self._load_keys()
        phases = self.conn.execute(
            sql.SQL("SELECT max(phase) FROM {} WHERE token = %s AND target = %s").format(STAGE),
            (self.token, self.target.index)).fetchone()[0]
        for phase in range(0 if phases is None else phases + 1):
            self._apply_phase(phase, counts)
            self._apply_barrier(phase, counts)
        self.conn.execute(sql.SQL("DROP TABLE {}").format(self.keys))
        return counts

    def _load_keys(self) -> None:
        """The staged keys, one row each, typed; whether phase 0's keys exist is read here, in the same pass.

        A table without a key is staged one row per INSERT, by the change's own identity
        (``[commit_lsn, seq]``): no such row exists before, and PostgreSQL inserts every one.
        """
        key_columns = [sql.SQL("(key::jsonb ->> {})::{} AS {}, ").format(sql.Literal(i), sql.SQL(t),
                                                                         sql.Identifier(f"_k{i}"))
                       for i, t in enumerate(self.target.key_types())]
        existed = (sql.SQL("CASE WHEN s.phase = 0 THEN EXISTS (SELECT 1 FROM {rel} t WHERE {match}) END").format(
            rel=self.rel, match=self._key_match("t", "s")) if self.target.key else sql.SQL("false"))
        self.conn.execute(sql.SQL(
            """CREATE TEMP TABLE {keys} ON COMMIT DROP AS
               SELECT s.*, {existed} AS existed
               FROM (SELECT DISTINCT ON (phase, key) phase, key, {key_columns}n_insert, n_update, n_delete,
                            vals::jsonb AS vals, op, commit_lsn, xid, p_present, p_flags, p_conflict_lsn, p_conflict_xid,
                            p_missing_update, p_missing_delete,
                            a_present, a_flags, a_conflict_lsn, a_conflict_xid,
                            a_missing_update, a_missing_delete
                     FROM {stage} WHERE token = %s AND target = %s AND row_kind = 'K'
                     ORDER BY phase, key) s""").format(
            keys=self.keys, key_columns=sql.Composed(key_columns), stage=STAGE, existed=existed),
            (self.token, self.target.index))
        self.conn.execute(sql.SQL("CREATE INDEX ON {} (phase)").format(self.keys))
        # Statistics for the planner's joins and filters only: sampling the staged values (jsonb) cost more.
        self.conn.execute(sql.SQL("ANALYZE {} ({})").format(self.keys, sql.SQL(", ").join(
            sql.Identifier(c) for c in ("phase", "existed", "p_present", "a_present",
                                        *(f"_k{i}" for i in range(len(self.target.key)))))))

    def _apply_phase(self, phase: int, counts: TableCounts) -> None:
        q = {"keys": self.keys, "rel": self.rel, "match": self._key_match("t", "k")}
        if phase > 0 and self.target.key:  # after the barrier before it (phase 0 was looked up when the keys were loaded)
            self.conn.execute(sql.SQL(
                "UPDATE {keys} k SET existed = EXISTS (SELECT 1 FROM {rel} t WHERE {match}) WHERE k.phase = %s"
            ).format(**q), (phase,))
        conflict = self.conn.execute(sql.SQL(
            """SELECT key, lsn, xid, vals::text FROM (
                 SELECT key, vals, CASE WHEN existed THEN p_conflict_lsn ELSE a_conflict_lsn END AS lsn,
                        CASE WHEN existed THEN p_conflict_xid ELSE a_conflict_xid END AS xid
                 FROM {keys} WHERE phase = %s) c
               WHERE lsn IS NOT NULL ORDER BY lsn LIMIT 1""").format(**q), (phase,)).fetchone()
        if conflict is not None:
            self._insert_exists(phase, conflict[0], conflict[1], conflict[2], conflict[3])
        row = self.conn.execute(sql.SQL(
            """SELECT coalesce(sum(n_insert), 0), coalesce(sum(n_update), 0), coalesce(sum(n_delete), 0),
                      coalesce(sum(CASE WHEN existed THEN p_missing_update ELSE a_missing_update END), 0),
                      coalesce(sum(CASE WHEN existed THEN p_missing_delete ELSE a_missing_delete END), 0)
               FROM {keys} WHERE phase = %s""").format(**q), (phase,)).fetchone()
        inserts, updates, deletes, missing_update, missing_delete = (int(v) for v in row)
        counts.insert += inserts
        counts.update += updates - missing_update
        counts.delete += deletes - missing_delete
        counts.missing_update += missing_update
        counts.missing_delete += missing_delete
        if self.conflict_log is not None and (missing_update or missing_delete):
            log_keys(self.conn, self.conflict_log, self.target.table, self.keys, phase, self.target.key,
                     self.target.column_names)
        if self.tracks_origins and self.target.key:
            found = origin_differs(self.conn, self.target.table, self.keys, self.rel, q["match"], phase, self.origin,
                                   self.target.key, self.target.column_names, self.conflict_log)
            counts.update_origin_differs += found.get("update_origin_differs", 0)
            counts.delete_origin_differs += found.get("delete_origin_differs", 0)
        if not self.target.key:  # only INSERTs are staged as keys (spark/apply_frames.py): nothing to find
            self.conn.execute(sql.SQL(
                "INSERT INTO {rel_name} ({columns}) OVERRIDING SYSTEM VALUE SELECT {values} FROM {keys} k "
                "WHERE k.phase = %s AND k.a_present "
                "ORDER BY (k.key::jsonb ->> 0)::numeric, (k.key::jsonb ->> 1)::int"  # commit order
            ).format(rel_name=table_sql(self.target.table), columns=self._column_list(),
                     values=self._insert_values(sql.SQL("k.vals"), sql.SQL("k.a_flags")), keys=self.keys), (phase,))
            return
        self.conn.execute(sql.SQL(
            "DELETE FROM {rel} t USING {keys} k WHERE k.phase = %s AND k.existed AND NOT k.p_present AND {match}"
        ).format(**q), (phase,))
        try:
            with self.conn.transaction():
                self.conn.execute(sql.SQL(
                    "UPDATE {rel} t SET {set} FROM {keys} k WHERE k.phase = %s AND k.existed AND k.p_present AND {match}"
                ).format(set=self._update_set(sql.SQL("k.vals"), sql.SQL("k.p_flags")), **q), (phase,))
        except psycopg.errors.UniqueViolation:
            self._update_exists(phase)
            raise  # not a unique index the checks cover, or two updated rows taking one value: PostgreSQL's error
        try:
            with self.conn.transaction():
                self.conn.execute(sql.SQL(
                    "INSERT INTO {rel_name} ({columns}) OVERRIDING SYSTEM VALUE SELECT {values} FROM {keys} k "
                    "WHERE k.phase = %s AND NOT k.existed AND k.a_present"
                ).format(rel_name=table_sql(self.target.table), columns=self._column_list(),
                         values=self._insert_values(sql.SQL("k.vals"), sql.SQL("k.a_flags")), keys=self.keys), (phase,))
        except psycopg.errors.UniqueViolation:
            self._other_index_conflict(phase)
            raise  # not a unique index the checks cover (an expression or partial one): PostgreSQL's own error

    # --- conflicts on unique indexes (subscriber/unique_conflicts.py) ------------------------------------------
    def _new_rows(self, phase: int, flags: str, key: str | None = None) -> sql.Composable:
        """The rows phase ``phase`` would insert (``key`` and every writable column), or only ``key``'s."""
        values = sql.SQL(", ").join(
            sql.SQL("CASE {f} WHEN '0' THEN {v} ELSE {d} END AS {c}").format(
                f=self._flag(sql.SQL(flags), i), v=self._value(sql.SQL("k.vals"), i, col), d=self._default(col),
                c=sql.Identifier(col.name))
            for i, col in enumerate(self.target.columns))
        which = sql.SQL("NOT k.existed AND k.a_present") if key is None else sql.SQL("k.key = {}").format(
            sql.Literal(key))
        return sql.SQL("SELECT k.key, k.commit_lsn AS _lsn, k.xid AS _xid, {} FROM {} k WHERE k.phase = {} AND {}").format(
            values, self.keys, sql.Literal(phase), which)

    def _updated_rows(self, phase: int, key: str | None = None) -> sql.Composable:
        """The rows phase ``phase``'s UPDATE would leave (``key``, the row's address ``_oid``/``_ctid``, every
        writable column), or only ``key``'s."""
        values = sql.SQL(", ").join(
            sql.SQL("CASE {f} WHEN '0' THEN {v} WHEN '1' THEN {d} ELSE t.{c} END AS {c}").format(
                f=self._flag(sql.SQL("k.p_flags"), i), v=self._value(sql.SQL("k.vals"), i, col), d=self._default(col),
                c=sql.Identifier(col.name))
            for i, col in enumerate(self.target.columns))
        which = sql.SQL("") if key is None else sql.SQL(" AND k.key = {}").format(sql.Literal(key))
        return sql.SQL("SELECT k.key, k.commit_lsn AS _lsn, k.xid AS _xid, t.tableoid AS _oid, t.ctid AS _ctid, {} "
                       "FROM {} k JOIN {} t ON {} WHERE k.phase = {} AND k.existed AND k.p_present{}").format(
            values, self.keys, self.rel, self._key_match("t", "k"), sql.Literal(phase), which)

    def _update_exists(self, phase: int) -> None:
        """The phase's UPDATE violated a unique index: raise PostgreSQL 18's ``update_exists`` (or
        ``multiple_unique_conflicts``) for the first row (by key) whose new values exist in another local row
        (execReplication.c ``ExecSimpleRelationUpdate`` → ``CheckAndReportConflict``); return when none does."""
        indexes = unique_indexes(self.conn, table_sql(self.target.table))
        key = first_conflicting(self.conn, self.rel, self._updated_rows(phase), indexes, other_row=True)
        if key is None:
            return
        new = self._updated_rows(phase, key)
        found = conflicting_rows(self.conn, self.rel, self.target.column_names, new, indexes, other_row=True)
        remote, lsn, xid = self._remote(new)
        raise ConflictError(self.target.table, "multiple_unique_conflicts" if len(found) > 1 else "update_exists",
                            self.target.key, _json_list(key), lsn, xid, found, remote, batch=self.span,
                            identity=(self.target.key, _json_list(key)))

    def _remote(self, new: sql.Composable) -> tuple[list[str | None], int | None, int | None]:
        """A new row's values as text, and its key's transaction (finish LSN, xid) when one is known."""
        row = self.conn.execute(sql.SQL("SELECT _lsn, _xid, {} FROM ({}) n").format(
            sql.SQL(", ").join(sql.SQL("n.{}::text").format(sql.Identifier(c)) for c in self.target.column_names),
            new)).fetchone()
        assert row is not None
        return list(row[2:]), None if row[0] is None else int(row[0]), None if row[1] is None else int(row[1])

    def _insert_exists(self, phase: int, key: str, commit_lsn: int, xid: int | None, vals: str | None) -> None:
        """An INSERT whose key the subscriber has: ``insert_exists``, or ``multiple_unique_conflicts`` when its row
        exists in another unique index too (conflict.c, worker.c)."""
        new = self._new_rows(phase, "CASE WHEN k.existed THEN k.p_flags ELSE k.a_flags END", key)
        found = conflicting_rows(self.conn, self.rel, self.target.column_names, new,
                                 unique_indexes(self.conn, table_sql(self.target.table)))
        local = found or [row for row in [self._local_row(key)] if row is not None]
        raise ConflictError(self.target.table, "multiple_unique_conflicts" if len(local) > 1 else "insert_exists",
                            self.target.key, _json_list(key), int(commit_lsn), None if xid is None else int(xid),
                            local, None if vals is None else _json_list(vals))

    def _other_index_conflict(self, phase: int) -> None:
        """The phase's INSERT violated a unique index other than the key: raise PostgreSQL 18's conflict for the
        first row that did (by key), naming every index it exists in; return when none of the covered ones."""
        indexes = unique_indexes(self.conn, table_sql(self.target.table))
        others = [i for i in indexes if i.columns != self.target.key]
        key = first_conflicting(self.conn, self.rel, self._new_rows(phase, "k.a_flags"), others)
        if key is None:
            return
        new = self._new_rows(phase, "k.a_flags", key)
        found = conflicting_rows(self.conn, self.rel, self.target.column_names, new, indexes)
        remote, lsn, xid = self._remote(new)
        raise ConflictError(self.target.table, "multiple_unique_conflicts" if len(found) > 1 else "insert_exists",
                            self.target.key, _json_list(key), lsn, xid, found, remote, batch=self.span)

    def _apply_barrier(self, phase: int, counts: TableCounts) -> None:
        row = self.conn.execute(sql.SQL(
            """SELECT op, key, vals, p_flags, commit_lsn, xid, restart_identity FROM {stage}
               WHERE token = %s AND target = %s AND row_kind = 'B' AND phase = %s LIMIT 1""").format(stage=STAGE),
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
            new = [None if f != "0" else v for v, f in zip(_json_list(vals), flags, strict=False)]
            by_name = dict(zip(self.target.column_names, new, strict=False))
            self._conflict("update_exists", _json_text([by_name.get(k) for k in self.target.key]), commit_lsn, xid,
                           _json_text(new))
        if cur.rowcount:
            counts.update += 1
            if local is not None:
                self._origin_differed("U", local, counts, dict(zip(self.target.key, _json_list(key), strict=True)),
                                      vals, commit_lsn, xid)
        elif self.policy == "upsert":
            self.conn.execute(sql.SQL("INSERT INTO {} ({}) OVERRIDING SYSTEM VALUE SELECT {}").format(
                table_sql(self.target.table), self._column_list(),
                self._insert_values(vals_sql, sql.Literal(flags))))
            counts.insert += 1
        else:
            counts.missing_update += 1
            self._log_skipped("update_missing", dict(zip(self.target.key, _json_list(key), strict=True)), vals,
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
                            self.target.key, _json_list(key), int(commit_lsn), None if xid is None else int(xid),
                            found, None if remote is None else list(remote), identity=(self.target.key, _json_list(key)))

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
            remote = None if vals is None else dict(zip(self.target.column_names, _json_list(vals), strict=False))
            log_change(self.conn, self.conflict_log, self.target.table, kind, key, remote,
                       None if commit_lsn is None else format_lsn(int(commit_lsn)), None if xid is None else int(xid),
                       local.row)

    def _log_skipped(self, kind: str, key: dict | None, vals: str | None, commit_lsn: int | None,
                     xid: int | None) -> None:
        if self.conflict_log is None:
            return
        remote = None if vals is None else dict(zip(self.target.column_names, _json_list(vals), strict=False))
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

    def _conflict(self, kind: str, key: str, commit_lsn: int, xid: int | None, vals: str | None = None) -> None:
        local = self._local_row(key)
        raise ConflictError(self.target.table, kind, self.target.key, _json_list(key), int(commit_lsn),
                            None if xid is None else int(xid), [] if local is None else [local],
                            None if vals is None else _json_list(vals))

    def _local_row(self, key: str) -> LocalRow | None:
        """The subscriber's row holding ``key`` (a JSON list), the index it exists in, its xmin."""
        match = sql.SQL(" AND ").join(
            sql.SQL("t.{} = ({}::jsonb ->> {})::{}").format(sql.Identifier(k), sql.Literal(key), sql.Literal(i),
                                                             sql.SQL(t))
            for i, (k, t) in enumerate(zip(self.target.key, self.target.key_types(), strict=True)))
        row = self.conn.execute(sql.SQL("SELECT t.xmin::text, t.tableoid, {} FROM {} t WHERE {} LIMIT 1").format(
            sql.SQL(", ").join(sql.SQL("t.{}::text").format(sql.Identifier(c)) for c in self.target.column_names),
            self.rel, match)).fetchone()
        if row is None:
            return None
        index = self.conn.execute(
            """SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
               WHERE i.indrelid = %s AND (i.indisreplident OR i.indisprimary)
               ORDER BY i.indisreplident DESC LIMIT 1""", (row[1],)).fetchone()
        return LocalRow("?" if index is None else index[0], row[0], tuple(row[2:]), self.target.key,
                        tuple(_json_list(key)))


def _json_list(text: str) -> list[str | None]:
    return list(json.loads(text))


def _json_text(values: Sequence[str | None]) -> str:
    return json.dumps(list(values))
