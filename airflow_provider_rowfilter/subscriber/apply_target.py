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

Columns are matched by name (relation.c ``logicalrep_rel_open``). Per column and outcome, a flag
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

from airflow_provider_rowfilter.core.errors import RowFilterError
from airflow_provider_rowfilter.core.lsn import format_lsn
from airflow_provider_rowfilter.core.relation import TableName
from airflow_provider_rowfilter.core.spec import CONFLICT_POLICIES, ConflictPolicy
from airflow_provider_rowfilter.identifiers import table_sql
from airflow_provider_rowfilter.subscriber.apply_stage import STAGE
from airflow_provider_rowfilter.subscriber.conflicts import ConflictError, ConflictLog, LocalRow, log_change, log_keys
from airflow_provider_rowfilter.subscriber.unique_conflicts import conflicting_rows, first_conflicting, unique_indexes


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


@dataclass
class TableCounts:
    """What one batch did to one subscriber table (the ``counts`` of ``rowfilter.batch_history``)."""

    insert: int = 0
    update: int = 0
    delete: int = 0
    truncate: int = 0
    missing_update: int = 0
    missing_delete: int = 0
    extra: dict[str, int] = field(default_factory=dict)  # filtered, update_to_insert, … (from Spark)

    def as_dict(self) -> dict[str, int]:
        counts = {"insert": self.insert, "update": self.update, "delete": self.delete, "truncate": self.truncate,
                  "missing_update": self.missing_update, "missing_delete": self.missing_delete, **self.extra}
        return {k: v for k, v in counts.items() if v}

    @property
    def changed(self) -> bool:
        return bool(self.insert or self.update or self.delete or self.truncate)


class StagedTable:
    """Applies one target's staged rows inside the caller's transaction."""

    def __init__(self, conn: psycopg.Connection, token: str, target: ApplyTarget, policy: ConflictPolicy = "error",
                 conflict_log: ConflictLog | None = None, span: str | None = None,
                 stage: sql.Composable = STAGE) -> None:
        if policy not in CONFLICT_POLICIES:
            raise ApplyTargetError(f"conflict_policy {policy!r} is not one of {', '.join(CONFLICT_POLICIES)}")
        self.conn = conn
        self.token = token
        self.target = target
        self.policy = policy
        self.conflict_log = conflict_log  # where skipped conflicts are logged (the spec's conflict_log: table)
        self.span = span  # the batch's changes in words, for a conflict no single transaction is known of
        self.stage = stage  # apply_stage, or the transaction's own (subscriber/apply_stage.py LOCAL_STAGE)
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

    def _values_set(self, vals: sql.Composable) -> sql.Composable:
        """Every column from the staged values (each flag 0)."""
        return sql.SQL(", ").join(sql.SQL("{} = {}").format(sql.Identifier(col.name), self._value(vals, i, col))
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
        self._load_keys()
        phases = self.conn.execute(
            sql.SQL("SELECT max(phase) FROM {} WHERE token = %s AND target = %s").format(self.stage),
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
        # A retried Spark task may have staged a key twice (apply_stage.py copy_stage); this process stages each once.
        once = self.stage is not STAGE
        self.conn.execute(sql.SQL(
            """CREATE TEMP TABLE {keys} ON COMMIT DROP AS
               SELECT s.*, {existed} AS existed
               FROM (SELECT {distinct}phase, key, {key_columns}n_insert, n_update, n_delete,
                            vals::jsonb AS vals, p_present, p_flags, p_conflict_lsn, p_conflict_xid,
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
        # A key whose every column comes from the change (flags all 0: most keys) is set without a CASE per column
        # and without reading the row's current values: about a third less (300,000 keys: 3.15 s against 4.57 s).
        every = sql.Literal("0" * len(self.target.columns))
        for which, assignments in (
                (sql.SQL("k.p_flags = {}").format(every), self._values_set(sql.SQL("k.vals"))),
                (sql.SQL("k.p_flags IS DISTINCT FROM {}").format(every),
                 self._update_set(sql.SQL("k.vals"), sql.SQL("k.p_flags")))):
            self.conn.execute(sql.SQL(
                "UPDATE {rel} t SET {set} FROM {keys} k "
                "WHERE k.phase = %s AND k.existed AND k.p_present AND {which} AND {match}"
            ).format(set=assignments, which=which, **q), (phase,))
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
        return sql.SQL("SELECT k.key, {} FROM {} k WHERE k.phase = {} AND {}").format(
            values, self.keys, sql.Literal(phase), which)

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
        remote = self.conn.execute(sql.SQL("SELECT {} FROM ({}) n").format(
            sql.SQL(", ").join(sql.SQL("n.{}::text").format(sql.Identifier(c)) for c in self.target.column_names),
            new)).fetchone()
        raise ConflictError(self.target.table, "multiple_unique_conflicts" if len(found) > 1 else "insert_exists",
                            self.target.key, _json_list(key), None, None, found, remote, batch=self.span)

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
        try:
            with self.conn.transaction():
                cur = self.conn.execute(sql.SQL("UPDATE {} t SET {} WHERE {}").format(
                    self.rel, self._update_set(vals_sql, sql.Literal(flags)), old_key))
        except psycopg.errors.UniqueViolation:
            new = [None if f != "0" else v for v, f in zip(_json_list(vals), flags, strict=False)]
            by_name = dict(zip(self.target.column_names, new, strict=False))
            self._conflict("update_exists", _json_text([by_name.get(k) for k in self.target.key]), commit_lsn, xid,
                           _json_text(new))
        if cur.rowcount:
            counts.update += 1
        elif self.policy == "upsert":
            self.conn.execute(sql.SQL("INSERT INTO {} ({}) OVERRIDING SYSTEM VALUE SELECT {}").format(
                table_sql(self.target.table), self._column_list(),
                self._insert_values(vals_sql, sql.Literal(flags))))
            counts.insert += 1
        else:
            counts.missing_update += 1
            self._log_skipped("update_missing", dict(zip(self.target.key, _json_list(key), strict=True)), vals,
                              commit_lsn, xid)

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
        if op == "D":
            if self.conn.execute(sql.SQL("DELETE FROM {} t WHERE {}").format(self.rel, one)).rowcount:
                counts.delete += 1
            else:
                counts.missing_delete += 1
                self._log_skipped("delete_missing", None, old, commit_lsn, xid)
            return
        vals_sql = sql.SQL("{}::jsonb").format(sql.Literal(vals))
        if self.conn.execute(sql.SQL("UPDATE {} t SET {} WHERE {}").format(
                self.rel, self._update_set(vals_sql, sql.Literal(flags)), one)).rowcount:
            counts.update += 1
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
