"""Where a batch lands: the subscriber's tables, written set-based from the staged net effect of the batch.

A reducer (spark/apply_frames.py, or flows/apply/net_effect.py in the job's process) reduces every key a
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

Its homes: the table itself (its columns, defaults and key, as relation.c ``logicalrep_rel_open`` reads them)
subscriber/target_table.py; the statements' SQL pieces subscriber/staged_sql.py; the barriers
subscriber/apply_barriers.py; here the keys' phases. The conflicts on unique indexes are found by
subscriber/unique_conflicts.py, those of origins by subscriber/origin_conflicts.py, counted and logged by
subscriber/conflicts.py. Columns are matched by name. Per column and outcome, a flag
says where the value comes from: ``0`` the staged value (its text form, cast by the subscriber's column type), ``1`` the
column's default (a column the change did not carry: an INSERT fills it as PostgreSQL's
``slot_fill_defaults`` does), ``2`` the subscriber's current value (an UPDATE that did not carry the
column, or an unchanged TOASTed value: ``slot_modify_data`` keeps the local value).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import psycopg
from psycopg import sql

from airflow_provider_rowfilter.identifiers import table_sql
from airflow_provider_rowfilter.subscriber.apply_barriers import BarrierStatements
from airflow_provider_rowfilter.subscriber.apply_stage import STAGE
from airflow_provider_rowfilter.subscriber.change_by_change import (
    ChangeByChange,
    covered_others,
    other_unique_indexes,
    phase_at_risk,
    walk,
)
from airflow_provider_rowfilter.subscriber.conflicts import ConflictError, log_keys
from airflow_provider_rowfilter.subscriber.direct_update import update_directly
from airflow_provider_rowfilter.subscriber.origin_conflicts import origin_differs, tracks_origins
from airflow_provider_rowfilter.subscriber.staged_sql import TableCounts, json_list
from airflow_provider_rowfilter.subscriber.target_table import (
    ApplyTarget,
    ApplyTargetError,
    TargetColumn,
    read_target,
    rejected_column,
)
from airflow_provider_rowfilter.subscriber.typed_keys import EVERY_STATEMENT, key_phases, statements_needed, write_keys
from airflow_provider_rowfilter.subscriber.unique_conflicts import conflicting_rows, first_conflicting, unique_indexes

if TYPE_CHECKING:  # the subscriber's side loads no Arrow when imported (tests/test_layers.py)
    import pyarrow as pa

# The names callers import from here (the target's description lives in subscriber/target_table.py).
__all__ = ["ApplyTarget", "ApplyTargetError", "ConflictError", "StagedTable", "TableCounts", "TargetColumn",
           "read_target", "rejected_column"]


class StagedTable(BarrierStatements):
    """Applies one target's staged rows inside the caller's transaction."""

    exact = False  # staged change by change (subscriber/change_by_change.py): each change a phase of its own
    walk_created = False  # whether its server-side walk (change_by_change.py walk) is created in this transaction
    #: The target's key rows when the batch was reduced in this process (not in the stage); None: in the stage.
    rows: pa.Table | None = None
    existed: pa.Array | None = None  # whether each of them existed, when known (subscriber/typed_keys.py)

    def apply(self) -> TableCounts:
        """Apply every phase and barrier; raise :class:`ConflictError` at the first conflict, :class:`ChangeByChange`
        when the net effects cannot answer as PostgreSQL's change-by-change apply."""
        counts = TableCounts()
        self.counts = counts  # what the phases before a stop counted (flows/apply/batch_transaction.py keeps it)
        self.tracks_origins = tracks_origins(self.conn)
        at_risk = bool(not self.exact and self.target.key and other_unique_indexes(self.conn, table_sql(self.target.table),
                                                                                self.target.key))
        self.at_risk = covered_others(self.conn, table_sql(self.target.table), self.target.key) if at_risk else None
        phases = self.conn.execute(  # the last barrier's (the rows staged by Spark: every row's)
            sql.SQL("SELECT max(phase) FROM {} WHERE token = %s AND target = %s").format(self.stage),
            (self.token, self.target.index)).fetchone()[0]
        if self.rows is None:
            self._load_keys()
        else:
            # Only UPDATEs of existing rows, nothing judged otherwise: one statement (subscriber/direct_update.py).
            simple = phases is None and not self.exact and self.at_risk is None
            updated = update_directly(self, self.rows, self.origin if self.tracks_origins else None) \
                if simple else None
            if updated is not None:
                counts.update += updated
                return counts
            # reduced in this process: its keys written once (subscriber/typed_keys.py), the barriers staged
            self.existed = write_keys(self.conn, self.keys, self.rel, self.target, self.rows,
                                      self._key_match("t", "k"))
        if self.rows is not None and self.rows.num_rows:
            phases = max(phases or 0, key_phases(self.rows))
        try:
            phase, last = 0, -1 if phases is None else phases
            while phase <= last:
                if self.exact and self.target.key:  # on the server, up to a phase only this side reports
                    phase = walk(self, phase, last, counts)  # (subscriber/change_by_change.py)
                    if phase > last:
                        break
                self._apply_phase(phase, counts)
                self._apply_barrier(phase, counts)
                phase += 1
        except (ConflictError, psycopg.errors.UniqueViolation) as e:
            if self.at_risk is not None:  # the order of the changes may decide it: judged one by one
                raise ChangeByChange([self.target.index], f"{self.target.table}: {e}") from e
            raise
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
        # A retried Spark task may have staged a key twice (apply_stage.py copy_stage); this process stages each once.
        once = self.stage is not STAGE
        self.conn.execute(sql.SQL(
            """CREATE TEMP TABLE {keys} ON COMMIT DROP AS
               SELECT s.*, {existed} AS existed
               FROM (SELECT {distinct}phase, key, {key_columns}n_insert, n_update, n_delete,
                            vals::jsonb AS vals, op, commit_lsn, xid, p_present, p_flags, p_conflict_lsn, p_conflict_xid,
                            p_missing_update, p_missing_delete,
                            a_present, a_flags, a_conflict_lsn, a_conflict_xid,
                            a_missing_update, a_missing_delete
                     FROM {stage} WHERE token = %s AND target = %s AND row_kind = 'K'{order}) s""").format(
            keys=self.keys, key_columns=sql.Composed(key_columns), stage=self.stage, existed=existed,
            distinct=sql.SQL("" if once else "DISTINCT ON (phase, key) "),
            order=sql.SQL("" if once else " ORDER BY phase, key")),
            (self.token, self.target.index))
        self.conn.execute(sql.SQL("CREATE INDEX ON {} (phase)").format(self.keys))
        # Statistics for the planner's joins and filters only: sampling the staged values (jsonb) cost more.
        self.conn.execute(sql.SQL("ANALYZE {} ({})").format(self.keys, sql.SQL(", ").join(
            sql.Identifier(c) for c in ("phase", "existed", "p_present", "a_present", "p_flags",
                                        *(f"_k{i}" for i in range(len(self.target.key)))))))

    def _apply_phase(self, phase: int, counts: TableCounts) -> None:
        q = {"keys": self.keys, "rel": self.rel, "match": self._key_match("t", "k")}
        if phase > 0 and self.target.key:  # after the barrier before it (phase 0 was looked up when the keys were loaded)
            self.conn.execute(sql.SQL(
                "UPDATE {keys} k SET existed = EXISTS (SELECT 1 FROM {rel} t WHERE {match}) WHERE k.phase = %s"
            ).format(**q), (phase,))
        if self.at_risk is not None:
            reason = phase_at_risk(self, phase, self.at_risk)
            if reason is not None:
                raise ChangeByChange([self.target.index], f"{self.target.table}: {reason}")
        # Reduced in this process, the key rows say which statements can find a row; the others are not sent.
        needed = EVERY_STATEMENT if self.rows is None else statements_needed(self.rows, phase, len(self.target.columns),
                                                                             self.existed)
        skipped = counts.add_phases(self.conn, self.keys, phase, phase)
        # (counted first: a stop keeps what the phase skipped, as PostgreSQL counts a conflict before the error)
        conflict = None if "conflict" not in needed else self.conn.execute(sql.SQL(
            """SELECT key, lsn, xid, vals::text FROM (
                 SELECT key, vals, CASE WHEN existed THEN p_conflict_lsn ELSE a_conflict_lsn END AS lsn,
                        CASE WHEN existed THEN p_conflict_xid ELSE a_conflict_xid END AS xid
                 FROM {keys} WHERE phase = %s) c
               WHERE lsn IS NOT NULL ORDER BY lsn LIMIT 1""").format(**q), (phase,)).fetchone()
        if conflict is not None:
            self._insert_exists(phase, conflict[0], conflict[1], conflict[2], conflict[3])
        if self.conflict_log is not None and skipped:
            log_keys(self.conn, self.conflict_log, self.target.table, self.keys, phase, self.target.key,
                     self.target.column_names)
        if self.tracks_origins and self.target.key:
            found = origin_differs(self.conn, self.target.table, self.keys, self.rel, q["match"], phase, self.origin,
                                   self.target.key, self.target.column_names, self.conflict_log)
            counts.update_origin_differs += found.get("update_origin_differs", 0)
            counts.delete_origin_differs += found.get("delete_origin_differs", 0)
        if not self.target.key:  # only INSERTs are staged as keys (spark/judge.py): nothing to find
            self.conn.execute(sql.SQL(
                "INSERT INTO {rel_name} ({columns}) OVERRIDING SYSTEM VALUE SELECT {values} FROM {keys} k "
                "WHERE k.phase = %s AND k.a_present "
                "ORDER BY (k.key::jsonb ->> 0)::numeric, (k.key::jsonb ->> 1)::int"  # commit order
            ).format(rel_name=table_sql(self.target.table), columns=self._column_list(),
                     values=self._insert_values(sql.SQL("k.vals"), sql.SQL("k.a_flags")), keys=self.keys), (phase,))
            return
        if "delete" in needed:
            self.conn.execute(sql.SQL(
                "DELETE FROM {rel} t USING {keys} k WHERE k.phase = %s AND k.existed AND NOT k.p_present AND {match}"
            ).format(**q), (phase,))
        # A key whose every column comes from the change (flags all 0: most keys) is set without a CASE per column
        # and without reading the row's current values: about a third less (300,000 keys: 3.15 s against 4.57 s).
        every = sql.Literal("0" * len(self.target.columns))
        try:
            with self.conn.transaction():
                for statement, which, assignments in (
                        ("update", sql.SQL("k.p_flags = {}").format(every), self._values_set(sql.SQL("k.vals"))),
                        ("update_partial", sql.SQL("k.p_flags IS DISTINCT FROM {}").format(every),
                         self._update_set(sql.SQL("k.vals"), sql.SQL("k.p_flags")))):
                    if statement not in needed:
                        continue
                    self.conn.execute(sql.SQL(
                        "UPDATE {rel} t SET {set} FROM {keys} k "
                        "WHERE k.phase = %s AND k.existed AND k.p_present AND {which} AND {match}"
                    ).format(set=assignments, which=which, **q), (phase,))
        except psycopg.errors.UniqueViolation:
            self._update_exists(phase)
            raise  # not a unique index the checks cover, or two updated rows taking one value: PostgreSQL's error
        if "insert" not in needed:
            return
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
                            self.target.key, json_list(key), lsn, xid, found, remote, batch=self.span,
                            identity=(self.target.key, json_list(key)))

    def _insert_exists(self, phase: int, key: str, commit_lsn: int, xid: int | None, vals: str | None) -> None:
        """An INSERT whose key the subscriber has: ``insert_exists``, or ``multiple_unique_conflicts`` when its row
        exists in another unique index too (conflict.c, worker.c)."""
        new = self._new_rows(phase, "CASE WHEN k.existed THEN k.p_flags ELSE k.a_flags END", key)
        found = conflicting_rows(self.conn, self.rel, self.target.column_names, new,
                                 unique_indexes(self.conn, table_sql(self.target.table)))
        local = found or [row for row in [self._local_row(key)] if row is not None]
        raise ConflictError(self.target.table, "multiple_unique_conflicts" if len(local) > 1 else "insert_exists",
                            self.target.key, json_list(key), int(commit_lsn), None if xid is None else int(xid),
                            local, None if vals is None else json_list(vals))

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
                            self.target.key, json_list(key), lsn, xid, found, remote, batch=self.span)
