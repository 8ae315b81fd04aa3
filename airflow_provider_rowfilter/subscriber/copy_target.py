"""Where table synchronization writes: the subscriber's table of the same name, through a staging table.

Columns are matched BY NAME, as PostgreSQL's apply and table sync do (logicalrep_rel_open): the
subscriber's table may order its columns differently, may have more columns (they take their
defaults), and may use other types as long as the publisher's text form converts. Every check runs
before a row moves.

The table may already have rows: PostgreSQL's tablesync copies into it and fails only on a real
duplicate key (copy_table in src/backend/replication/logical/tablesync.c runs a plain COPY FROM).
Several partitions COPY FROM STDIN into a staging table of the attempt (``rowfilter.copy_<hash>``, the
target's copied columns and types, unlogged, one per subscription and table), and ONE subscriber
transaction moves the staged rows into the table together with the state ``f``. The table's own rows
are never touched by a copy: an attempt that fails or is killed leaves only its staging table, which
the next attempt replaces; a duplicate key fails the move with PostgreSQL's unique-violation message.
A copy of one reader needs no staging: it COPYs straight into the table in the transaction that
records ``f`` (:func:`copy_direct`), as tablesync does, and writes each row once.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import psycopg
from psycopg import sql

from airflow_provider_rowfilter.connection import conninfo_params, open_session, password
from airflow_provider_rowfilter.core.errors import RowFilterError
from airflow_provider_rowfilter.core.relation import TableName
from airflow_provider_rowfilter.core.sync_state import SyncState
from airflow_provider_rowfilter.identifiers import table_sql
from airflow_provider_rowfilter.subscriber.state import SCHEMA, StateReader


class CopyTargetError(RowFilterError):
    """The subscriber's table cannot take table synchronization's rows."""


@dataclass(frozen=True)
class CopyTarget:
    """The subscriber's table and the published columns the copy fills, in the publisher's order."""

    table: TableName
    relkind: str  # "r" regular, "p" partitioned
    columns: tuple[str, ...]
    staging: TableName  # where the partitions write: staging_table(subscription, table)

    @property
    def only(self) -> sql.SQL:
        # A partitioned target takes its partitions' rows; a regular one never its inheritance
        # children's (they are tables of their own, copied or not on their own).
        return sql.SQL("" if self.relkind == "p" else "ONLY ")

    @property
    def column_list(self) -> sql.Composable:
        return sql.SQL(", ").join(map(sql.Identifier, self.columns))

    def copy_sql(self) -> str:
        """``COPY staging (cols) FROM STDIN`` in text format: the subscriber converts by its own types
        (the staging table has the target's)."""
        return sql.SQL("COPY {} ({}) FROM STDIN").format(table_sql(self.staging), self.column_list).as_string(None)


def staging_table(subscription: str, table: TableName) -> TableName:
    """The staging table of ``subscription``'s copy of ``table``: one name per pair (two subscriptions
    consolidating into one table copy side by side), short enough for any table name."""
    digest = hashlib.sha256(f"{subscription}\0{table}".encode()).hexdigest()[:24]
    return TableName(SCHEMA, f"copy_{digest}")


def check_target(conn: psycopg.Connection, subscription: str, table: TableName, columns: Sequence[str], *,
                 rerun: str = "run the snapshot again") -> CopyTarget:
    """Check that the subscriber's ``table`` can take ``columns``; raise why not. Rows already in it
    stay (PostgreSQL's copy_table copies into a non-empty table too).

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
    return CopyTarget(table, relkind, tuple(columns), staging_table(subscription, table))


def truncate(conn: psycopg.Connection, target: CopyTarget) -> None:
    """Empty the target (a resync) in the caller's transaction."""
    conn.execute(sql.SQL("TRUNCATE {}{}").format(target.only, table_sql(target.table)))


def create_staging(conn: psycopg.Connection, target: CopyTarget) -> None:
    """A new, empty staging table for an attempt, in the caller's transaction (a former attempt's,
    killed or failed, is dropped with whatever it staged). Its columns are the copied ones, with the
    target's types and none of its constraints: those apply when the rows move into the target."""
    conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(table_sql(target.staging)))
    conn.execute(sql.SQL("CREATE UNLOGGED TABLE {} AS SELECT {} FROM ONLY {} WITH NO DATA").format(
        table_sql(target.staging), target.column_list, table_sql(target.table)))


def drop_staging(conn: psycopg.Connection, target: CopyTarget) -> None:
    """Drop the attempt's staging table (autocommit, or in the caller's transaction)."""
    conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(table_sql(target.staging)))


def drop_stagings(conn: psycopg.Connection, subscription: str, tables: Iterable[TableName]) -> None:
    """Drop what killed copies of ``subscription`` left staged (``rowfilter drop``), in the caller's transaction."""
    for table in tables:
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(table_sql(staging_table(subscription, table))))


def copy_direct(conn: psycopg.Connection, blocks: Iterable[bytes], target: CopyTarget) -> int:
    """A copy of one reader, as tablesync runs it: the publisher's rows (``blocks`` of COPY text, whole
    lines, from its ``COPY … TO STDOUT``: publisher/copy_source.py ``read_copy``) streamed straight into
    ``COPY table FROM STDIN`` on ``conn``, in the caller's transaction (which records ``f`` with it);
    returns the rows written.

    No staging table and no second write: one transaction already keeps a failed copy invisible
    (copy_table in tablesync.c). A key already in the table fails with PostgreSQL's unique violation,
    as the move of a staged copy does, and the caller's rollback leaves the table's rows as they were.
    """
    statement = sql.SQL("COPY {} ({}) FROM STDIN").format(table_sql(target.table), target.column_list)
    try:
        with conn.cursor() as cur:
            return _stream(cur, statement, blocks)
    except psycopg.errors.UniqueViolation as e:
        raise _duplicate_key(e, target) from e


def _duplicate_key(e: psycopg.errors.UniqueViolation, target: CopyTarget) -> CopyTargetError:
    return CopyTargetError(
        e.diag.message_primary or str(e), detail=e.diag.message_detail, table=str(target.table),
        hint=f"the subscriber's table {target.table} already has a row with a key the copy brings (rows of its "
        "own, or of another subscription): delete one of the two rows, then run the snapshot again; nothing "
        "was copied into the table, and its rows are as they were")


def move_staged(conn: psycopg.Connection, target: CopyTarget) -> int:
    """Move the staged rows into the target and drop the staging table, in the caller's transaction;
    return the rows moved. A key already in the target fails with PostgreSQL's unique violation
    (``duplicate key value violates unique constraint …``, ``Key (id)=(5) already exists.``), as
    tablesync's COPY does; the caller's rollback leaves the target's rows as they were.

    ``OVERRIDING SYSTEM VALUE`` lets the publisher's values into a ``GENERATED ALWAYS AS IDENTITY``
    column, which COPY FROM (what tablesync runs) fills without complaint (CopyFrom in copyfrom.c
    never checks identity columns).
    """
    try:
        moved = conn.execute(sql.SQL("INSERT INTO {} ({}) OVERRIDING SYSTEM VALUE SELECT {} FROM {}").format(
            table_sql(target.table), target.column_list, target.column_list, table_sql(target.staging))).rowcount
    except psycopg.errors.UniqueViolation as e:
        raise _duplicate_key(e, target) from e
    drop_staging(conn, target)
    return moved


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
    """The advisory-lock key that orders a table's copy writers against a new attempt's staging table."""
    return f"rowfilter-copy:{subscription}", str(table)


class CopySupersededError(RowFilterError):
    """A writer of an abandoned copy attempt (a task Spark had already given up on) woke up late."""


def fence_copies(conn: psycopg.Connection, fence_key: tuple[str, str]) -> None:
    """In the caller's transaction, wait for every writer's COPY transaction of the table to end.

    Taken before a new attempt replaces the staging table (and a resync's TRUNCATE): a task of a failed
    attempt that Spark has not stopped yet either committed before (and its rows go with the old staging
    table) or sees a new token and writes nothing.
    """
    conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s), hashtext(%s))", fence_key)


def write_copy(conninfo: dict[str, str], statement: str, blocks: Iterable[bytes | bytearray],
               fence: CopyFence | None = None) -> int:
    """Run ``statement`` (a COPY FROM STDIN) with ``blocks`` in ONE transaction; return the rows written.

    Runs on a Spark executor: ``blocks`` are COPY text, whole lines with their newlines. A failure
    (of the subscriber, or of the iterator feeding the blocks) rolls the whole partition back, so a
    retried task starts from nothing. With a ``fence``, the transaction first checks that its copy
    attempt is still the table's current one, before the first block is asked for.
    """
    with open_session(autocommit=False, **conninfo) as conn, conn.cursor() as cur:
        if fence is not None:
            cur.execute("SELECT pg_advisory_xact_lock_shared(hashtext(%s), hashtext(%s))", fence.lock_key)
            token = StateReader(conn, fence.subscription).copy_token(TableName(fence.schema, fence.table),
                                                                     SyncState.DATA_COPY)
            if token is None or token != fence.token:
                raise CopySupersededError(f"copy of {fence.schema}.{fence.table} was superseded by a newer attempt")
        return _stream(cur, statement, blocks)


def _stream(cur: psycopg.Cursor, statement: str | sql.Composable, blocks: Iterable[bytes]) -> int:
    """``blocks`` of COPY text (whole lines) into ``statement``, a ``COPY … FROM STDIN``; the rows written."""
    with cur.copy(statement) as copy:
        for block in blocks:
            copy.write(block)
    return cur.rowcount


def executor_conninfo(url: str, role: str, application_name: str) -> dict[str, str]:
    """libpq parameters for the executors' connections to the ``role`` database (the password resolved
    here, on the driver).

    Executors of a cluster do not share the driver's environment, so a password given to the job
    (connection.password: handed in-process, or ``ROWFILTER_PUBLISHER_PASSWORD`` /
    ``ROWFILTER_SUBSCRIBER_PASSWORD``; else ``PGPASSWORD``) travels inside the task, as Spark's own
    JDBC options do; it is never logged.
    """
    params = conninfo_params(url, f"the connection string for {application_name}")
    secret = password(role) or os.environ.get("PGPASSWORD")
    if secret:
        params["password"] = secret
    params["application_name"] = application_name
    params["client_encoding"] = "UTF8"
    return {k: str(v) for k, v in params.items()}
