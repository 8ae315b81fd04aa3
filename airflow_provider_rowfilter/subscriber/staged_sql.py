"""The building blocks of the statements that apply a batch to one subscriber table (subscriber/apply_target.py).

:class:`StagedStatements` holds what a table's statements share: the connection, the staged keys' temp table,
the table's SQL name, and the pieces the phases and the barriers (subscriber/apply_barriers.py) both write:
a key's match, a staged value cast by its column's type, a column's default, the SET list of an UPDATE and the
values of an INSERT by each column's flag (``0`` the staged value, ``1`` the default, ``2`` the subscriber's
current value), and the lookups a conflict's DETAIL names. :class:`TableCounts` is what a batch did to a table.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field

import psycopg
from psycopg import sql

from airflow_provider_rowfilter.core.spec.values import CONFLICT_POLICIES, ConflictPolicy
from airflow_provider_rowfilter.identifiers import table_sql
from airflow_provider_rowfilter.subscriber.apply_stage import STAGE
from airflow_provider_rowfilter.subscriber.conflicts import ConflictError, ConflictLog, LocalRow
from airflow_provider_rowfilter.subscriber.target_table import ApplyTarget, ApplyTargetError, TargetColumn


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

    def add_phases(self, conn: psycopg.Connection, keys: sql.Composable, low: int, high: int) -> int:
        """Add what phases ``low`` … ``high`` of a keys table did: its INSERTs, UPDATEs and DELETEs, the UPDATEs and
        DELETEs that found no row counted as missing instead (each key as found: ``existed``); return how many
        were missing (the skipped changes a conflict log records)."""
        row = conn.execute(sql.SQL(
            """SELECT coalesce(sum(n_insert), 0), coalesce(sum(n_update), 0), coalesce(sum(n_delete), 0),
                      coalesce(sum(CASE WHEN existed THEN p_missing_update ELSE a_missing_update END), 0),
                      coalesce(sum(CASE WHEN existed THEN p_missing_delete ELSE a_missing_delete END), 0)
               FROM {} WHERE phase BETWEEN %s AND %s""").format(keys), (low, high)).fetchone()
        inserts, updates, deletes, missing_update, missing_delete = (int(v) for v in row) if row else (0,) * 5
        self.insert += inserts
        self.update += updates - missing_update
        self.delete += deletes - missing_delete
        self.missing_update += missing_update
        self.missing_delete += missing_delete
        return missing_update + missing_delete


class StagedStatements:
    """The SQL pieces of one target's statements, inside the caller's transaction."""

    def __init__(self, conn: psycopg.Connection, token: str, target: ApplyTarget, policy: ConflictPolicy = "error",
                 conflict_log: ConflictLog | None = None, span: str | None = None, origin: int = 0,
                 stage: sql.Composable = STAGE) -> None:
        if policy not in CONFLICT_POLICIES:
            raise ApplyTargetError(f"conflict_policy {policy!r} is not one of {', '.join(CONFLICT_POLICIES)}")
        self.conn = conn
        self.token = token
        self.target = target
        self.policy = policy
        self.conflict_log = conflict_log  # where skipped conflicts are logged (the spec's conflict_log: table)
        self.span = span  # the batch's changes in words, for a conflict no single transaction is known of
        self.origin = origin  # the replication origin the apply writes with (0: none): *_origin_differs
        self.stage = stage  # apply_stage, or the transaction's own (subscriber/apply_stage.py LOCAL_STAGE)
        self.tracks_origins = False
        self.keys = sql.Identifier(f"rowfilter_keys_{target.index}")
        self.rel = sql.SQL("{}{}").format(target.only, table_sql(target.table))

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

    def _remote(self, new: sql.Composable) -> tuple[list[str | None], int | None, int | None]:
        """A new row's values as text, and its key's transaction (finish LSN, xid) when one is known."""
        row = self.conn.execute(sql.SQL("SELECT _lsn, _xid, {} FROM ({}) n").format(
            sql.SQL(", ").join(sql.SQL("n.{}::text").format(sql.Identifier(c)) for c in self.target.column_names),
            new)).fetchone()
        assert row is not None
        return list(row[2:]), None if row[0] is None else int(row[0]), None if row[1] is None else int(row[1])

    def _conflict(self, kind: str, key: str, commit_lsn: int, xid: int | None, vals: str | None = None) -> None:
        local = self._local_row(key)
        raise ConflictError(self.target.table, kind, self.target.key, json_list(key), int(commit_lsn),
                            None if xid is None else int(xid), [] if local is None else [local],
                            None if vals is None else json_list(vals))

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
                        tuple(json_list(key)))


def json_list(text: str) -> list[str | None]:
    return list(json.loads(text))


def json_text(values: Sequence[str | None]) -> str:
    return json.dumps(list(values))
