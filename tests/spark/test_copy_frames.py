"""The copy's Spark frames: COPY text lines, and every reader in the driver's exported snapshot."""

from __future__ import annotations

import psycopg
import pytest
from pyspark.sql.types import StringType, StructField, StructType

from airflow_provider_rowfilter.core.relation import TableName
from airflow_provider_rowfilter.pg.copy_source import BlockRanges, CopySource, KeyRanges, exported_snapshot
from airflow_provider_rowfilter.spark.copy_frames import copy_lines, copy_text, published_rows
from airflow_provider_rowfilter.spark.jdbc import jdbc_connection

ROWS = [
    ("plain", "a\tb", None),
    ("x\\y", "line\nbreak\r", ""),
    (None, "\\N", "tab at end\t"),
]
LINES = [
    b"plain\ta\\tb\t\\N",
    b"x\\\\y\tline\\nbreak\\r\t",
    b"\\N\t\\\\N\ttab at end\\t",
]


def test_copy_text_writes_postgresql_copy_text_lines(spark):
    frame = spark.createDataFrame(ROWS, StructType([StructField(c, StringType()) for c in ("a", "b.c", "d")]))
    lines = copy_text(frame)
    assert lines.columns == ["line"]
    assert sorted(copy_lines(lines).collect()) == sorted(LINES)


def test_plain_columns_are_passed_as_they_are(spark):
    frame = spark.createDataFrame([("1", "a\tb"), (None, None)], ["n", "t"])
    assert sorted(copy_lines(copy_text(frame, plain_columns={"n"})).collect()) == [b"1\ta\\tb", b"\\N\t\\N"]


@pytest.fixture
def publisher(fresh_db):
    dsn = fresh_db()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("""CREATE TABLE t (id int PRIMARY KEY, v text);
                        INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 2000) g;""")
    return dsn


@pytest.mark.parametrize("plan", [KeyRanges(1, 2001, 3), BlockRanges(((0, 3), (3, 6), (6, None)))],
                         ids=["key-ranges", "block-ranges"])
def test_every_reader_sees_the_exported_snapshot(spark, publisher, plan):
    source = CopySource(TableName("public", "t"), ("id", "v"), "(id % 2 = 0)", only=True, key="id")
    jdbc = jdbc_connection(publisher, "ROWFILTER_PUBLISHER_PASSWORD", "test")
    with exported_snapshot(psycopg.connect(publisher, autocommit=True, replication="database")) as snap:
        # Committed after the snapshot was taken: an UPDATE that moves rows to the table's end (and
        # to other ranges), an INSERT and a DELETE. None of it may be seen, nothing read twice.
        with psycopg.connect(publisher, autocommit=True) as other:
            other.execute("UPDATE t SET v = 'moved' WHERE id <= 100; INSERT INTO t VALUES (4000, 'new');"
                          "DELETE FROM t WHERE id = 2000")
        frame = published_rows(spark, jdbc, source, plan, snapshot=snap)
        assert frame.rdd.getNumPartitions() == 3
        rows = sorted((int(r.id), r.v) for r in frame.collect())
    assert rows == [(g, f"v{g}") for g in range(2, 2001, 2)]
    later = sorted((int(r.id), r.v) for r in published_rows(spark, jdbc, source, plan).collect())
    assert len(later) == 1000 and (4000, "new") in later and (2, "moved") in later and (2000, "v2000") not in later
