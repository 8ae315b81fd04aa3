"""The copy on Spark: one task per range, each streaming the publisher's COPY into the subscriber's."""

from __future__ import annotations

from functools import partial

import psycopg
import pytest

from airflow_provider_rowfilter.core.relation import TableName
from airflow_provider_rowfilter.publisher.copy_source import (
    BlockRanges,
    CopySource,
    KeyRanges,
    copy_out_statements,
    exported_snapshot,
)
from airflow_provider_rowfilter.spark.copy_frames import copy_partition, run_partitions


@pytest.fixture
def dbs(fresh_db):
    publisher, subscriber = fresh_db(), fresh_db()
    with psycopg.connect(publisher, autocommit=True) as conn:
        conn.execute("""CREATE TABLE t (id int PRIMARY KEY, v text);
                        INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 2000) g;""")
    with psycopg.connect(subscriber, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (v varchar(20), id bigint PRIMARY KEY, extra text DEFAULT 'default')")
    return publisher, subscriber


def copy(spark, publisher, subscriber, source, plan, snapshot=None, **kwargs) -> int:
    return run_partitions(spark, copy_out_statements(source, plan), partial(
        copy_partition, {"conninfo": publisher}, snapshot, {"conninfo": subscriber},
        "COPY public.t (id, v) FROM STDIN", **kwargs))


def rows(dsn) -> list[tuple]:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT id, v, extra FROM t ORDER BY id").fetchall()


@pytest.mark.parametrize("plan", [KeyRanges(1, 2001, 3), BlockRanges(((0, 3), (3, 6), (6, None)))],
                         ids=["key-ranges", "block-ranges"])
def test_every_reader_sees_the_exported_snapshot(spark, dbs, plan):
    publisher, subscriber = dbs
    source = CopySource(TableName("public", "t"), ("id", "v"), "(id % 2 = 0)", only=True, key="id")
    with exported_snapshot(psycopg.connect(publisher, autocommit=True, replication="database")) as snap:
        # Committed after the snapshot was taken: an UPDATE that moves rows to the table's end (and
        # to other ranges), an INSERT and a DELETE. None of it may be seen, nothing read twice.
        with psycopg.connect(publisher, autocommit=True) as other:
            other.execute("UPDATE t SET v = 'moved' WHERE id <= 100; INSERT INTO t VALUES (4000, 'new');"
                          "DELETE FROM t WHERE id = 2000")
        assert copy(spark, publisher, subscriber, source, plan, snap, block_rows=7) == 1000
    assert rows(subscriber) == [(g, f"v{g}", "default") for g in range(2, 2001, 2)]


def test_without_a_snapshot_each_reader_reads_the_current_rows(spark, dbs):
    publisher, subscriber = dbs
    with psycopg.connect(publisher, autocommit=True) as conn:
        conn.execute(r"""UPDATE t SET v = E'a\tb\\c\nd' WHERE id = 1; UPDATE t SET v = NULL WHERE id = 2;
                         UPDATE t SET v = '\N' WHERE id = 3""")
    source = CopySource(TableName("public", "t"), ("id", "v"), "(id < 5)", only=True, key="id")
    assert copy(spark, publisher, subscriber, source, KeyRanges(1, 2001, 2)) == 4
    assert rows(subscriber) == [(1, "a\tb\\c\nd", "default"), (2, None, "default"), (3, "\\N", "default"),
                                (4, "v4", "default")]
