"""A PROTOTYPE for measurement only (bench/subscriber_log.py): the subscriber as the change log, PeerDB's shape.

Not the product. The product's capture (publisher/capture.py) decodes the slot as usual; this log takes each
segment it would publish and COPYs its rows into ``rowfilter.bench_raw_changes`` of the subscriber, in ONE
subscriber transaction with the log's position (``rowfilter.bench_raw_position``), before the capture advances
the slot: capture and position commit together. :func:`apply_range` then applies the raw rows of an LSN range
in SQL in one subscriber transaction (the net effect per key: the last change of each key, ``INSERT … ON
CONFLICT DO UPDATE`` or ``DELETE``), deletes them, and moves the applied position: what PeerDB's "normalize"
step does with its raw table. (Spark reading a range by LSN through JDBC in parallel partitions, for a big
batch, is not shown: it needs PostgreSQL's JDBC driver on every executor, which no rowfilter job uses.)

Simplifications, each in the prototype's favour: values are stored as the segment holds them (text arrays,
no column names or types per row: the target's catalog gives them, the tables being alike); the publisher
judged the row filters (PostgreSQL 15+); keys never change, there is no TRUNCATE and no unchanged TOAST value
(pgbench's workload: :func:`apply_range` refuses otherwise). One against it: the capture still writes the
segment to a local Parquet file, which this log reads back and COPYs (a real one would COPY the decoded
columns); bench/subscriber_log.py reports the COPY's own time apart.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pyarrow.parquet as pq
from psycopg import sql

from airflow_provider_rowfilter.change_log.log import ChangeLog, Segment

RAW = "rowfilter.bench_raw_changes"
POSITION = "rowfilter.bench_raw_position"
DDL = f"""
CREATE SCHEMA IF NOT EXISTS rowfilter;
CREATE TABLE IF NOT EXISTS {RAW} (
    commit_lsn bigint NOT NULL, xid bigint NOT NULL, seq integer NOT NULL, lsn bigint NOT NULL,
    kind "char" NOT NULL, relation text NOT NULL, new_values text[], old_values text[]);
CREATE INDEX IF NOT EXISTS bench_raw_changes_commit_lsn ON {RAW} (commit_lsn);
CREATE TABLE IF NOT EXISTS {POSITION} (
    subscription text PRIMARY KEY, captured_lsn bigint NOT NULL, applied_lsn bigint NOT NULL);
"""
_KIND = {"insert": "I", "update": "U", "delete": "D", "truncate": "T"}
_COLUMNS = ("commit_lsn", "xid", "seq", "lsn", "kind", "schema", "table", "new_values", "old_values")


def create(subscriber: str, subscription: str, start_lsn: int) -> None:
    """The raw table and the position row (captured = applied = the slot's position when the log starts)."""
    with psycopg.connect(subscriber) as conn:
        conn.execute(DDL)
        conn.execute(f"INSERT INTO {POSITION} VALUES (%s, %s, %s) ON CONFLICT (subscription) DO NOTHING",
                     (subscription, start_lsn, start_lsn))


def positions(subscriber: str, subscription: str) -> tuple[int, int]:
    """(captured, applied) LSNs of the table log."""
    with psycopg.connect(subscriber, autocommit=True) as conn:
        row = conn.execute(f"SELECT captured_lsn, applied_lsn FROM {POSITION} WHERE subscription = %s",
                           (subscription,)).fetchone()
    assert row is not None
    return row


class SubscriberTableLog(ChangeLog):
    """The capture's log whose segments land in the subscriber's raw table (a local folder only stages them)."""

    def __init__(self, staging: Path, subscriber: str, subscription: str) -> None:
        super().__init__(staging)
        self.subscriber, self.subscription = subscriber, subscription
        self.copied = 0
        self.copy_seconds = 0.0

    @property
    def where(self) -> str:
        return RAW

    def captured_through(self) -> int | None:
        return positions(self.subscriber, self.subscription)[0]

    def last_origin(self):
        return None

    def continuous(self, since, through, needs=None) -> list[Segment]:
        return []  # the raw table is continuous by construction: rows and position commit together

    def publish_segment(self, staged: Path, start_lsn: int, end_lsn: int) -> Segment:
        """COPY the staged segment's rows into the raw table and move the position, in ONE transaction."""
        began = time.monotonic()
        table = pq.read_table(staged, columns=list(_COLUMNS))
        columns = {name: table.column(name).to_pylist() for name in _COLUMNS}
        with psycopg.connect(self.subscriber) as conn:
            with conn.cursor().copy(f"COPY {RAW} (commit_lsn, xid, seq, lsn, kind, relation, new_values, old_values) "
                                    "FROM STDIN") as copy:
                for i in range(table.num_rows):
                    copy.write_row((columns["commit_lsn"][i], columns["xid"][i], columns["seq"][i], columns["lsn"][i],
                                    _KIND[columns["kind"][i]], f'{columns["schema"][i]}.{columns["table"][i]}',
                                    columns["new_values"][i], columns["old_values"][i]))
            conn.execute(f"UPDATE {POSITION} SET captured_lsn = %s WHERE subscription = %s AND captured_lsn = %s",
                         (end_lsn, self.subscription, start_lsn)).rowcount == 1 or _refuse(start_lsn)
        self.copied += table.num_rows
        self.copy_seconds += time.monotonic() - began
        os.unlink(staged)
        return Segment(Path(RAW), start_lsn, end_lsn)


def _refuse(start_lsn: int) -> None:
    raise SystemExit(f"the table log does not end at {start_lsn:X}: another writer?")


@contextlib.contextmanager
def capturing_into(log: SubscriberTableLog) -> Iterator[None]:
    """The product's capture writes to ``log`` while inside (its ``open_change_log`` replaced)."""
    from airflow_provider_rowfilter.publisher import capture

    original = capture.open_change_log
    capture.open_change_log = lambda spec: log
    try:
        yield
    finally:
        capture.open_change_log = original


# --- apply from the raw table -------------------------------------------------------------------------------
def _table_shape(conn: psycopg.Connection, relation: str) -> tuple[list[tuple[str, str]], list[int]]:
    """(column name, type) in attnum order, and the 1-based positions of the primary key's columns."""
    columns = conn.execute("SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = "
                           "%s::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum", (relation,)).fetchall()
    key = conn.execute("SELECT array_position(%s::text[], a.attname::text) FROM pg_index i JOIN pg_attribute a "
                       "ON a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey) WHERE i.indrelid = %s::regclass "
                       "AND i.indisprimary", ([c for c, _ in columns], relation)).fetchall()
    return columns, [k for (k,) in key]


def apply_range(subscriber: str, subscription: str, start: int, end: int) -> int:
    """Apply the raw changes of ``(start, end]`` in ONE transaction, delete them, move the applied position.

    Returns the changes applied. Per table: with a primary key the last change of each key (``DISTINCT ON``)
    is upserted or deleted; without one (an insert-only table) every INSERT is inserted in order.
    """
    in_range = sql.SQL("commit_lsn > {} AND commit_lsn <= {}").format(start, end)
    with psycopg.connect(subscriber) as conn:
        bad = conn.execute(sql.SQL(f"SELECT count(*) FILTER (WHERE kind = 'T'), count(*) FILTER (WHERE kind = 'U' AND "
                                   f"old_values IS NOT NULL) FROM {RAW} WHERE ") + in_range).fetchone()
        if bad != (0, 0):
            raise SystemExit(f"prototype: {bad[0]} truncate(s), {bad[1]} key change(s): not handled")
        relations = [r for (r,) in conn.execute(sql.SQL(f"SELECT DISTINCT relation FROM {RAW} WHERE ") + in_range)]
        for relation in relations:
            columns, key = _table_shape(conn, relation)
            target = sql.SQL(".").join(map(sql.Identifier, relation.split(".", 1)))
            names = sql.SQL(", ").join(sql.Identifier(c) for c, _ in columns)
            values = sql.SQL(", ").join(sql.SQL("(v[{}])::" + t).format(i) for i, (_, t) in enumerate(columns, 1))
            where = sql.SQL("relation = {} AND ").format(relation) + in_range
            if not key:
                conn.execute(sql.SQL("INSERT INTO {} ({}) SELECT {} FROM (SELECT new_values AS v FROM " + RAW +
                                     " WHERE kind = 'I' AND {} ORDER BY commit_lsn, seq) c").format(
                                         target, names, values, where))
                continue
            keys = sql.SQL(", ").join(sql.SQL("k{}").format(i) for i in key)
            key_values = sql.SQL(", ").join(sql.SQL("((coalesce(new_values, old_values))[{}])::" + columns[i - 1][1] +
                                                    " AS k{}").format(i, i) for i in key)
            matches = sql.SQL(" AND ").join(sql.SQL("t.{} = last.k{}").format(sql.Identifier(columns[i - 1][0]), i)
                                            for i in key)
            updates = sql.SQL(", ").join(sql.SQL("{} = EXCLUDED.{}").format(sql.Identifier(c), sql.Identifier(c))
                                         for i, (c, _) in enumerate(columns, 1) if i not in key)
            conflict = sql.SQL(", ").join(sql.Identifier(columns[i - 1][0]) for i in key)
            conn.execute(sql.SQL(
                "WITH last AS (SELECT DISTINCT ON ({keys}) kind, new_values AS v, {keys} FROM (SELECT kind, new_values, "
                "commit_lsn, seq, {key_values} FROM " + RAW + " WHERE {where}) c ORDER BY {keys}, commit_lsn DESC, "
                "seq DESC), gone AS (DELETE FROM {target} t USING last WHERE last.kind = 'D' AND {matches}) "
                "INSERT INTO {target} ({names}) SELECT {values} FROM last WHERE kind <> 'D' "
                "ON CONFLICT ({conflict}) DO UPDATE SET {updates}").format(
                    keys=keys, key_values=key_values, where=where, target=target, matches=matches, names=names,
                    values=values, conflict=conflict, updates=updates))
        applied = conn.execute(sql.SQL(f"DELETE FROM {RAW} WHERE ") + in_range).rowcount
        conn.execute(f"UPDATE {POSITION} SET applied_lsn = %s WHERE subscription = %s AND applied_lsn = %s",
                     (end, subscription, start)).rowcount == 1 or _refuse(start)
    return applied

