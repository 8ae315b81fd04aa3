"""Where the initial copy writes: the subscriber's table of the same name, through COPY FROM STDIN.

Columns are matched BY NAME, as PostgreSQL's apply and table sync do (logicalrep_rel_open): the
subscriber's table may order its columns differently, may have more columns (they take their
defaults), and may use other types as long as the publisher's text form converts. Every check runs
before a row moves.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from contextlib import closing
from dataclasses import dataclass

import psycopg
from psycopg import sql

from airflow_provider_rowfilter.connection import conninfo_params
from airflow_provider_rowfilter.core.errors import RowFilterError
from airflow_provider_rowfilter.core.relation import TableName
from airflow_provider_rowfilter.core.sync_state import SyncState
from airflow_provider_rowfilter.identifiers import table_sql
from airflow_provider_rowfilter.publisher.copy_source import (
    DEFAULT_BLOCK_ROWS,
    ExportedSnapshot,
    read_copy,
)
from airflow_provider_rowfilter.subscriber.state import StateReader


class CopyTargetError(RowFilterError):
    """The subscriber's table cannot take the initial copy."""


@dataclass(frozen=True)
class CopyTarget:
    """The subscriber's table and the published columns the copy fills, in the publisher's order."""

    table: TableName
    relkind: str  # "r" regular, "p" partitioned
    columns: tuple[str, ...]

    @property
    def only(self) -> sql.SQL:
        # A partitioned target takes its partitions' rows; a regular one never its inheritance
        # children's (they are tables of their own, copied or not on their own).
        return sql.SQL("" if self.relkind == "p" else "ONLY ")

    def copy_sql(self) -> str:
        """``COPY target (cols) FROM STDIN`` in text format: the subscriber converts by its own types."""
        return sql.SQL("COPY {} ({}) FROM STDIN").format(
            table_sql(self.table), sql.SQL(", ").join(map(sql.Identifier, self.columns))).as_string(None)


def check_target(conn: psycopg.Connection, table: TableName, columns: Sequence[str], *,
                 require_empty: bool, rerun: str = "run the snapshot again") -> CopyTarget:
    """Check that the subscriber's ``table`` can take ``columns`` (and is empty when asked); raise why not.

    :param rerun: what the hints tell the user to run once the cause is fixed (a resync's own command).
    """
    row = conn.execute(
        """SELECT c.oid, c.relkind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
           WHERE n.nspname = %s AND c.relname = %s""", (table.schema, table.name)).fetchone()
    if row is None:
        raise CopyTargetError(
            f'logical replication target relation "{table}" does not exist', table=str(table),
            hint=f"create table {table} in the subscriber with at least the published columns "
            f"({', '.join(columns)}), then {rerun}")
    oid, relkind = row
    if relkind not in ("r", "p"):
        raise CopyTargetError(
            f'cannot use relation "{table}" as logical replication target', table=str(table),
            detail=f'"{table}" is not a table (relkind {relkind!r}).',
            hint="the target must be a regular or partitioned table of the same name")
    present = dict(conn.execute(
        "SELECT attname, attgenerated FROM pg_attribute WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped",
        (oid,)).fetchall())
    missing = [c for c in columns if c not in present]
    if missing:
        listed = ", ".join(f'"{c}"' for c in missing)
        raise CopyTargetError(
            f'logical replication target relation "{table}" is missing replicated column'
            f'{"s" if len(missing) > 1 else ""}: {listed}', table=str(table),
            hint=f"add the column{'s' if len(missing) > 1 else ''} to {table} in the subscriber "
            f"(ALTER TABLE {table} ADD COLUMN …), then {rerun}")
    generated = [c for c in columns if present[c]]
    if generated:
        raise CopyTargetError(
            f'logical replication target relation "{table}" has generated column'
            f'{"s" if len(generated) > 1 else ""} {", ".join(generated)} that the publisher publishes',
            table=str(table), hint="make the subscriber's column an ordinary column, or leave it out of the "
            "publication's column list")
    target = CopyTarget(table, relkind, tuple(columns))
    if require_empty and conn.execute(
            sql.SQL("SELECT EXISTS (SELECT FROM {}{})").format(target.only, table_sql(table))).fetchone()[0]:
        raise CopyTargetError(
            f'target table "{table}" is not empty; the initial copy starts from an empty table',
            table=str(table),
            hint=f"empty it (TRUNCATE {table} on the subscriber) and run the snapshot again, or run "
            f"`rowfilter resync --table {table} --copy`, which truncates it and copies again")
    return target


def truncate(conn: psycopg.Connection, target: CopyTarget) -> None:
    """Empty the target (a copy redone from ``d``, or a resync) in the caller's transaction."""
    conn.execute(sql.SQL("TRUNCATE {}{}").format(target.only, table_sql(target.table)))


@dataclass(frozen=True)
class CopyFence:
    """Which copy attempt a writer belongs to: the table's ``updated_at`` when that attempt set ``d``."""

    subscription: str
    schema: str
    table: str
    token: str

    @property
    def lock_key(self) -> tuple[str, str]:
        return copy_lock_key(self.subscription, TableName(self.schema, self.table))


def copy_lock_key(subscription: str, table: TableName) -> tuple[str, str]:
    """The advisory-lock key that orders a table's copy writers against a new attempt's TRUNCATE."""
    return f"rowfilter-copy:{subscription}", str(table)


class CopySupersededError(RowFilterError):
    """A writer of an abandoned copy attempt (a task Spark had already given up on) woke up late."""


def fence_copies(conn: psycopg.Connection, fence_key: tuple[str, str]) -> None:
    """In the caller's transaction, wait for every writer's COPY transaction of the table to end.

    Taken before a TRUNCATE that starts a new attempt: a task of a failed attempt that Spark has
    not stopped yet either committed before (and is truncated) or sees a new token and writes nothing.
    """
    conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s), hashtext(%s))", fence_key)


def write_copy(conninfo: dict[str, str], statement: str, blocks: Iterable[bytes], fence: CopyFence | None = None) -> int:
    """Run ``statement`` (a COPY FROM STDIN) with ``blocks`` in ONE transaction; return the rows written.

    Runs on a Spark executor: ``blocks`` are COPY text, whole lines with their newlines. A failure
    (of the subscriber, or of the iterator feeding the blocks) rolls the whole partition back, so a
    retried task starts from nothing. With a ``fence``, the transaction first checks that its copy
    attempt is still the table's current one, before the first block is asked for.
    """
    with psycopg.connect(**conninfo) as conn, conn.cursor() as cur:
        if fence is not None:
            cur.execute("SELECT pg_advisory_xact_lock_shared(hashtext(%s), hashtext(%s))", fence.lock_key)
            token = StateReader(conn, fence.subscription).copy_token(TableName(fence.schema, fence.table),
                                                                     SyncState.DATA_COPY)
            if token is None or token != fence.token:
                raise CopySupersededError(f"copy of {fence.schema}.{fence.table} was superseded by a newer attempt")
        with cur.copy(statement) as copy:
            for block in blocks:
                copy.write(block)
        return cur.rowcount


def copy_partition(source: dict[str, str], snapshot: ExportedSnapshot | None, target: dict[str, str],
                   statement: str, counter, reads: Iterable[str], *, fence: CopyFence | None = None,
                   block_rows: int = DEFAULT_BLOCK_ROWS) -> None:
    """``foreachPartition`` body: each ``COPY … TO STDOUT`` of ``reads`` streamed into ``statement``.

    The publisher's COPY output (read in ``snapshot`` with ``source``) goes to the subscriber's
    ``COPY … FROM STDIN`` (``target``) block by block, as bytes: one subscriber transaction per
    read. The rows written are added to ``counter`` (spark/copy_frames.py ``RowCount``).
    """
    for read in reads:
        with closing(read_copy(source, read, snapshot, block_rows=block_rows)) as blocks:
            counter.add(write_copy(target, statement, blocks, fence))


def executor_conninfo(url: str, password_env: str, application_name: str) -> dict[str, str]:
    """libpq parameters for the executors' connections (the password resolved here, on the driver).

    Executors of a cluster do not share the driver's environment, so a password given to the job
    (``ROWFILTER_PUBLISHER_PASSWORD`` / ``ROWFILTER_SUBSCRIBER_PASSWORD``, else ``PGPASSWORD``)
    travels inside the task, as Spark's own JDBC options do; it is never logged.
    """
    params = conninfo_params(url, f"the connection string for {application_name}")
    password = os.environ.get(password_env) or os.environ.get("PGPASSWORD")
    if password:
        params["password"] = password
    params["application_name"] = application_name
    params["client_encoding"] = "UTF8"
    return {k: str(v) for k, v in params.items()}
