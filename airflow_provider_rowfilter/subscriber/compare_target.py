"""What a verify or reconcile reads of the subscriber's table: its published columns, its key, its rows in a snapshot.

The subscriber's table is matched to the publisher's as the copy and the apply match it (by column name,
subscriber/copy_target.py ``check_target``; its key as the apply reads it, subscriber/apply_target.py
``read_target``). A verify reads it in a snapshot exported by a repeatable-read transaction together with
the tables' positions (:func:`exported_positions`): rows and positions are committed together by every
batch, so the snapshot's rows are the table as of the position it shows. Its rows are read as the
publisher's are (the comparison's readers, flows/verify/comparison.py): this module says only what the subscriber
holds, and imports nothing of the publisher's side.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import psycopg

from airflow_provider_rowfilter.core.compare.table_compare import CompareShape, compare_shape
from airflow_provider_rowfilter.core.relation import TableName
from airflow_provider_rowfilter.subscriber.apply_target import read_target
from airflow_provider_rowfilter.subscriber.copy_target import CopyTarget, check_target
from airflow_provider_rowfilter.subscriber.state import RelState, StateReader


@dataclass(frozen=True)
class CompareTarget:
    """The subscriber's side of one table's comparison."""

    target: CopyTarget
    key: tuple[str, ...]
    types: dict[str, str]  # format_type() of each column


def compare_target(conn: psycopg.Connection, subscription: str, table: TableName, columns: tuple[str, ...],
                   *, rerun: str) -> CompareTarget:
    """Check that the subscriber's ``table`` has the published ``columns`` (as the copy checks it) and read its key.

    :raises CopyTargetError: the table is missing, is not a table, or lacks a published column.
    """
    target = check_target(conn, subscription, table, columns, rerun=rerun)
    read = read_target(conn, table, 0)
    return CompareTarget(target, read.key, {c.name: c.type_sql for c in read.columns})


def shape_of(table: TableName, columns: tuple[str, ...], publisher_types: dict[str, str],
             target: CompareTarget, record_hashing: bool) -> CompareShape:
    return compare_shape(table, columns, target.key, publisher_types, target.types, record_hashing)


@contextmanager
def exported_positions(conn: psycopg.Connection, subscription: str) -> Iterator[tuple[str, list[RelState]]]:
    """A repeatable-read, read-only transaction on ``conn`` (a connection of its own, kept open and idle while
    readers import its snapshot): the id of its exported snapshot, and the subscription's tables as that
    snapshot sees them."""
    conn.autocommit = False
    try:
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        snapshot_id = conn.execute("SELECT pg_export_snapshot()").fetchone()[0]
        rels = StateReader(conn, subscription).tables()
        yield snapshot_id, rels
    finally:
        if not conn.closed:
            conn.rollback()
            conn.autocommit = True


def native_subscriptions_of(conn: psycopg.Connection, table: TableName) -> list[str]:
    """The subscriber's own (native) subscriptions that replicate into ``table`` (``pg_subscription_rel``)."""
    try:
        rows = conn.execute(
            """SELECT s.subname FROM pg_subscription_rel r JOIN pg_subscription s ON s.oid = r.srsubid
               WHERE r.srrelid = to_regclass(%s) ORDER BY 1""", (table.as_sql(),)).fetchall()
    except psycopg.errors.InsufficientPrivilege:
        return []
    return [r[0] for r in rows]
