"""What the initial copy reads: the query text, the column set, and how a table is split."""

from __future__ import annotations

import psycopg
import pytest

from airflow_provider_rowfilter.core.publication.subscription_filters import TableFilters
from airflow_provider_rowfilter.core.relation import Column, Relation, RelKind, ReplicaIdentity, TableName
from airflow_provider_rowfilter.publisher.copy_source import (
    SPLIT_START_COST,
    BlockRanges,
    CopySource,
    CopySourceError,
    KeyRanges,
    PartitionOptions,
    SinglePartition,
    copy_out_sql,
    copy_out_statements,
    copy_source,
    exported_snapshot,
    plan_partitions,
    read_copy,
    select_sql,
)

T1 = TableName("public", "t1")


def relation(*columns: Column, key: tuple[str, ...] = ("id",), relkind: RelKind = RelKind.TABLE) -> Relation:
    return Relation(name=T1, oid=1, relkind=relkind, columns=columns, identity_columns=key,
                    replica_identity=ReplicaIdentity.DEFAULT)


def filters(columns=None) -> TableFilters:
    return TableFilters(table=T1, leaves=(T1,), actions=frozenset(), filters={}, copy_filters=None,
                        columns=columns, publications=("p1",))


ID = Column("id", 1, "bigint", 20)
NAME = Column("Name", 2, "text", 25)
GEN = Column("g", 3, "integer", 23, generated="s")


@pytest.mark.parametrize(("source", "kwargs", "expected"), [
    pytest.param(CopySource(T1, ("id", "Name"), None, only=True), {},
                 'SELECT "id", "Name" FROM ONLY "public"."t1"', id="whole-table"),
    pytest.param(CopySource(T1, ("a",), "(a > 5) OR (c = 'x')", only=False), {},
                 """SELECT "a" FROM "public"."t1" WHERE ((a > 5) OR (c = 'x'))""", id="root-filtered"),
    pytest.param(CopySource(T1, ("a",), "(a > 5) OR (b)", only=True), {"predicate": "ctid >= '(4,0)'::tid"},
                 """SELECT "a" FROM ONLY "public"."t1" WHERE ((a > 5) OR (b)) AND ctid >= '(4,0)'::tid""",
                 id="range-cannot-bind-to-one-side-of-the-or"),
])
def test_select_sql(source, kwargs, expected):
    assert select_sql(source, **kwargs) == expected
    assert copy_out_sql(source, **kwargs) == f"COPY ({expected}) TO STDOUT"


def test_copy_source_takes_published_columns_and_an_integer_key():
    rel = relation(ID, NAME, GEN)
    assert copy_source(filters(), rel) == CopySource(T1, ("id", "Name"), None, only=True, key="id")
    assert copy_source(filters(("Name",)), rel).columns == ("Name",)
    assert copy_source(filters(), relation(ID, NAME, key=("Name",))).key is None  # text key: block ranges
    assert copy_source(filters(), relation(ID, NAME, key=("id", "Name"))).key is None
    assert not copy_source(filters(), relation(ID, relkind=RelKind.PARTITIONED)).only


def test_block_ranges_cover_the_table_and_leave_the_end_open():
    ranges = BlockRanges(((0, 10), (10, 20), (20, None)))
    assert ranges.predicates() == ["ctid >= '(0,0)'::tid AND ctid < '(10,0)'::tid",
                                   "ctid >= '(10,0)'::tid AND ctid < '(20,0)'::tid", "ctid >= '(20,0)'::tid"]


def test_key_ranges_cover_every_key_once_and_leave_both_ends_open():
    assert KeyRanges(101, 1001, 4).predicates("id") == [
        '("id" < 326 OR "id" IS NULL)', '"id" >= 326 AND "id" < 551', '"id" >= 551 AND "id" < 776', '"id" >= 776']
    assert KeyRanges(-5, 3, 3).predicates("K") == ['("K" < -3 OR "K" IS NULL)', '"K" >= -3 AND "K" < 0', '"K" >= 0']


def test_one_copy_statement_per_partition():
    source = CopySource(T1, ("id",), "(id > 0)", only=True, key="id")
    assert copy_out_statements(source, SinglePartition()) == [
        'COPY (SELECT "id" FROM ONLY "public"."t1" WHERE ((id > 0))) TO STDOUT']
    assert copy_out_statements(source, KeyRanges(1, 11, 2)) == [
        'COPY (SELECT "id" FROM ONLY "public"."t1" WHERE ((id > 0)) AND ("id" < 6 OR "id" IS NULL)) TO STDOUT',
        'COPY (SELECT "id" FROM ONLY "public"."t1" WHERE ((id > 0)) AND "id" >= 6) TO STDOUT']
    assert len(copy_out_statements(source, BlockRanges(((0, 5), (5, None))))) == 2
    with pytest.raises(ValueError, match="no integer key"):
        copy_out_statements(CopySource(T1, ("a",), None, only=True), KeyRanges(1, 11, 2))


@pytest.fixture
def publisher(fresh_db):
    dsn = fresh_db()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("""CREATE TABLE k (id int PRIMARY KEY, pad text);
                        INSERT INTO k SELECT g, repeat('x', 200) FROM generate_series(101, 1000) g;
                        CREATE TABLE nokey (pad text);
                        INSERT INTO nokey SELECT repeat('x', 200) FROM generate_series(1, 1000);
                        CREATE TABLE root (id int, pad text) PARTITION BY RANGE (id);
                        CREATE TABLE root_a PARTITION OF root FOR VALUES FROM (0) TO (10);
                        CREATE TABLE root_b PARTITION OF root FOR VALUES FROM (10) TO (MAXVALUE);
                        INSERT INTO root SELECT g, repeat('x', 200) FROM generate_series(1, 1000) g;""")
    with psycopg.connect(dsn, autocommit=True) as conn:
        yield conn


def test_plan_partitions_by_blocks_by_key_or_not_at_all(publisher, monkeypatch):
    k = CopySource(TableName("public", "k"), ("id",), None, only=True, key="id")
    keyed = plan_partitions(publisher, k, PartitionOptions(4, min_pages=1))
    assert isinstance(keyed, BlockRanges) and keyed.partitions == 4  # 14+: block ranges even with a key
    assert plan_partitions(publisher, k, PartitionOptions(4, min_pages=10_000)) == SinglePartition()
    nokey_source = CopySource(TableName("public", "nokey"), ("pad",), None, only=True)
    nokey = plan_partitions(publisher, nokey_source, PartitionOptions(3, min_pages=1))
    assert isinstance(nokey, BlockRanges) and nokey.partitions == 3
    assert nokey.bounds[0][0] == 0 and nokey.bounds[-1][1] is None
    # A partitioned root is sized by its largest partition: the ranges apply to every partition.
    root = plan_partitions(publisher, CopySource(TableName("public", "root"), ("pad",), None, only=False),
                           PartitionOptions(2, min_pages=1))
    assert isinstance(root, BlockRanges) and root.partitions == 2
    # Before 14 (no TID Range Scan): the integer key's ranges, else one reader.
    monkeypatch.setattr(type(publisher.info), "server_version", property(lambda _: 130000))
    assert plan_partitions(publisher, k, PartitionOptions(4, min_pages=1)) == KeyRanges(101, 1001, 4)
    assert plan_partitions(publisher, nokey_source, PartitionOptions(3, min_pages=1)) == SinglePartition()


def test_by_default_a_table_is_split_only_where_the_split_pays(publisher):
    """Several readers stage and move their rows (each kept row written twice on the subscriber) and start
    Spark: by default they are used only when the publisher's read costs more than that, by the planner's
    estimates, and Spark's parallelism (the bound) is asked only then."""
    publisher.execute("ANALYZE k")  # 900 rows, a primary key on id

    def never() -> int:
        raise AssertionError("the default bound is asked only for a split that pays")

    def plan(filter_sql: str | None, start_cost: float = 0.0, bound=never):
        source = CopySource(TableName("public", "k"), ("id", "pad"), filter_sql, only=True, key="id")
        return plan_partitions(publisher, source, PartitionOptions(None, 1, bound, start_cost))

    assert plan(None) == SinglePartition()  # every row kept: the second writes cost more than the scan
    assert plan("id > 550") == SinglePartition()  # half kept, read through the key's index
    # one row, but the whole table scanned for it: as many readers as the bound allows
    split = plan("pad || id = 'x'", bound=lambda: 3)
    assert isinstance(split, BlockRanges) and split.partitions == 3
    assert plan("pad || id = 'x'", start_cost=SPLIT_START_COST) == SinglePartition()  # not worth Spark's start here
    # An explicit bound is the user's: no estimate decides it.
    explicit = plan_partitions(publisher, CopySource(TableName("public", "k"), ("id",), None, only=True),
                               PartitionOptions(2, min_pages=1))
    assert isinstance(explicit, BlockRanges) and explicit.partitions == 2


def test_exported_snapshot_splits_the_changes_at_its_consistent_point(publisher):
    dsn = publisher.info.dsn
    with exported_snapshot(psycopg.connect(dsn, autocommit=True, replication="database")) as snap:
        assert "SET TRANSACTION SNAPSHOT" in snap.session_init_sql()
        publisher.execute("INSERT INTO k VALUES (1, 'after')")  # commits at or after the consistent point
        with psycopg.connect(dsn) as reader:
            reader.execute(snap.session_init_sql())
            assert reader.execute("SELECT count(*) FROM k WHERE id = 1").fetchone()[0] == 0
        with psycopg.connect(dsn) as conn:
            assert conn.execute("SELECT temporary FROM pg_replication_slots WHERE slot_name = %s",
                                (snap.slot,)).fetchone() == (True,)
        commit = publisher.execute("SELECT pg_current_wal_insert_lsn() >= %s::pg_lsn", (snap.lsn,)).fetchone()[0]
        assert commit
    with psycopg.connect(dsn) as conn:  # closing the connection dropped the slot
        assert conn.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (snap.slot,)).fetchone() is None


def test_exported_snapshot_needs_a_replication_connection(publisher):
    with pytest.raises(CopySourceError, match="temporary slot") as caught, exported_snapshot(
            psycopg.connect(publisher.info.dsn, autocommit=True)):
        pass
    assert "REPLICATION" in caught.value.hint


def test_read_copy_yields_copy_text_in_blocks_of_whole_lines(publisher):
    publisher.execute("""CREATE TABLE odd (id int, t text, n numeric, a text[]);
                         INSERT INTO odd VALUES (1, E'tab\\there', 1.50, '{x,"y z"}'), (2, E'line\\nbreak\\\\', NULL, NULL),
                                                (3, '\\N', 'NaN', '{}'), (4, '', 0, NULL), (5, 'é', -1, NULL)""")
    source = CopySource(TableName("public", "odd"), ("id", "t", "n", "a"), "(id <> 4)", only=True)
    conninfo = {"conninfo": publisher.info.dsn}
    blocks = list(read_copy(conninfo, copy_out_sql(source), block_rows=2))
    assert all(b.endswith(b"\n") for b in blocks) and [b.count(b"\n") for b in blocks] == [2, 2]
    assert sorted(b"".join(blocks).splitlines()) == [
        b'1\ttab\\there\t1.50\t{x,"y z"}', b"2\tline\\nbreak\\\\\t\\N\t\\N",
        b"3\t\\\\N\tNaN\t{}", "5\té\t-1\t\\N".encode()]
    assert list(read_copy(conninfo, copy_out_sql(source, predicate="id > 100"))) == []


def test_read_copy_raises_the_publishers_error(publisher):
    with pytest.raises(psycopg.errors.UndefinedTable, match="nosuch"):
        list(read_copy({"conninfo": publisher.info.dsn}, "COPY (SELECT * FROM nosuch) TO STDOUT"))
    with pytest.raises(psycopg.errors.DivisionByZero):  # fails after the first rows were sent
        list(read_copy({"conninfo": publisher.info.dsn},
                       "COPY (SELECT 1 / (1000 - id) FROM public.k ORDER BY id) TO STDOUT", block_rows=10))
