"""``update_origin_differs`` and ``delete_origin_differs`` beside a native PostgreSQL 18 subscription.

PostgreSQL 18's apply worker compares the origin of the transaction that last modified the local row it found
with its own (``GetTupleTransactionInfo``, only with ``track_commit_timestamp = on``), counts and logs the
conflict and applies the change. That setting needs a restart, so these tests run on a cluster of their own
(started once per module, with it on: about 1 s), publisher and subscribers alike; ``copy_data: false`` and the
publisher's filtering, so no Spark and no copy. The check is the subscriber's; what it reads from the reducers (each
key's first operation, its one transaction) tests/apply/test_fold.py holds Spark's reducer to as well.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import psycopg
import pytest

from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec
from airflow_provider_rowfilter.flows.apply.drain import apply
from airflow_provider_rowfilter.flows.drop import drop
from airflow_provider_rowfilter.flows.refresh import refresh
from airflow_provider_rowfilter.flows.table_sync.sync import sync_tables
from airflow_provider_rowfilter.subscriber.replication_origin import origin_name
from airflow_provider_rowfilter.tooling.embedded import LocalPostgres
from airflow_provider_rowfilter.tooling.native import NativeSubscription
from tests.e2e.jobs.conflict_counts import execute, native_count, ours_count
from tests.replication_origins import drop_origins

TABLE = "CREATE TABLE o (id int PRIMARY KEY, v text); CREATE TABLE k (a int, b text);"
COUNTED = ("confl_update_origin_differs", "confl_delete_origin_differs")


@pytest.fixture(scope="module")
def commit_ts_pg(tmp_path_factory) -> Iterator[LocalPostgres]:
    """A PostgreSQL 18 cluster with ``track_commit_timestamp = on`` (set, then the server restarted)."""
    began = time.monotonic()
    data = tmp_path_factory.mktemp("commit-ts") / "data"
    with LocalPostgres.start(data_dir=data) as first, psycopg.connect(first.dsn(), autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET track_commit_timestamp = on")
    with LocalPostgres.start(data_dir=data) as pg:
        print(f"track_commit_timestamp cluster: {time.monotonic() - began:.1f} s")
        yield pg
        drop_origins(pg)


def test_rows_another_origin_modified_are_counted_logged_and_applied_as_postgresql_18_does(commit_ts_pg, tmp_path):
    began = time.monotonic()
    name = "origin"
    pub, native_db, ours = (commit_ts_pg.create_database(f"{name}_{n}") for n in ("pub", "native", "ours"))
    # Every database has the same rows, inserted by a local transaction of each (origin 0).
    for dsn in (pub, native_db, ours):
        execute(dsn, TABLE, "INSERT INTO o SELECT g, 'v' || g FROM generate_series(1, 5) g",
                "INSERT INTO k VALUES (1, 'x'), (2, 'y')")
    execute(pub, "ALTER TABLE k REPLICA IDENTITY FULL", "CREATE PUBLICATION po FOR TABLE o, k")
    native = NativeSubscription(pub, native_db, f"{name}_native", ["po"], {"copy_data": "false"}).create()
    spec = SubscriptionSpec(subscription=f"{name}_ours", publisher=pub, subscriber=ours, publications=("po",),
                            copy_data=False, change_log=str(tmp_path / "changes"),
                            conflict_log="table")
    refresh(spec)
    try:
        # Rows inserted locally: the first UPDATE or DELETE of each conflicts; a second change of the same row, in
        # another remote transaction of the batch, finds the row the apply wrote: none.
        execute(pub, "UPDATE o SET v = 'r1' WHERE id = 1", "UPDATE o SET v = 'r2' WHERE id = 2",
                "UPDATE o SET v = 'r2 again' WHERE id = 2", "DELETE FROM o WHERE id = 3")
        result = apply(spec)
        assert result.tables["public.o"]["update_origin_differs"] == 2, result.tables
        assert result.tables["public.o"]["delete_origin_differs"] == 1, result.tables
        # Rows the apply wrote: no conflict.
        execute(pub, "UPDATE o SET v = 'r1 again' WHERE id = 1")
        apply(spec)
        # A batch of UPDATEs alone (one statement from the rows: subscriber/direct_update.py) meets a row a local
        # UPDATE wrote: the general way counts and logs it.
        for dsn in (native_db, ours):
            execute(dsn, "UPDATE o SET v = 'local' WHERE id = 2")
        execute(pub, "UPDATE o SET v = 'r2 third' WHERE id = 2")
        result = apply(spec)
        assert result.tables["public.o"] == {"update": 1, "update_origin_differs": 1}, result.tables
        # A local UPDATE on the subscriber, then the publisher's UPDATE or DELETE of the same row.
        for dsn in (native_db, ours):
            execute(dsn, "UPDATE o SET v = 'local' WHERE id IN (1, 4)")
        execute(pub, "UPDATE o SET v = 'r4' WHERE id = 4", "DELETE FROM o WHERE id = 1")
        apply(spec)
        # The statements that are not reduced per key: an UPDATE that changes the key, the changes of a table
        # without one (REPLICA IDENTITY FULL).
        for dsn in (native_db, ours):
            execute(dsn, "UPDATE o SET v = 'local' WHERE id = 5")
        execute(pub, "UPDATE o SET id = 50 WHERE id = 5", "UPDATE k SET b = 'x2' WHERE a = 1", "DELETE FROM k WHERE a = 2")
        result = apply(spec)
        assert result.tables["public.k"] == {"update": 1, "delete": 1, "update_origin_differs": 1,
                                             "delete_origin_differs": 1}, result.tables
        native.wait_caught_up()

        expected = {"confl_update_origin_differs": 6, "confl_delete_origin_differs": 3}
        for column, n in expected.items():
            assert native_count(native_db, native.name, column, at_least=n) == n
            assert ours_count(ours, spec, column) == n
        with psycopg.connect(ours) as a, psycopg.connect(native_db) as b:
            rows = "SELECT o::text FROM o ORDER BY id"
            assert a.execute(rows).fetchall() == b.execute(rows).fetchall() == [
                ("(2,\"r2 third\")",), ("(4,r4)",), ("(50,v5)",)]
            rows = "SELECT k::text FROM k ORDER BY a"
            assert a.execute(rows).fetchall() == b.execute(rows).fetchall() == [("(1,x2)",)]
            logged = a.execute(
                "SELECT conflict_type, key ->> 'id', local_row ->> 'v', remote_row ->> 'v', commit_lsn IS NOT NULL "
                "FROM rowfilter.conflict_log WHERE subscription = %s AND table_name = 'o' ORDER BY id",
                (spec.subscription,)).fetchall()
        assert sorted(logged) == sorted([
            ("update_origin_differs", "1", "v1", "r1", True),
            ("update_origin_differs", "2", "v2", "r2 again", False),  # two transactions, one key
            ("update_origin_differs", "2", "local", "r2 third", True),
            ("delete_origin_differs", "3", "v3", None, True),
            ("update_origin_differs", "4", "local", "r4", True),
            ("delete_origin_differs", "1", "local", None, True),
            ("update_origin_differs", "5", "local", "v5", True)]), logged
    finally:
        native.drop()
        for dsn_name in ("ours", "native", "pub"):
            commit_ts_pg.drop_database(f"{name}_{dsn_name}")
    print(f"origin_differs: {time.monotonic() - began:.1f} s")


def test_rows_the_initial_copy_wrote_conflict_as_postgresql_18s_copied_rows_do(commit_ts_pg, tmp_path, caplog):
    """The table synchronization worker writes its copy with an origin of its own (``pg_<suboid>_<relid>``, dropped
    once the table is ready): the first remote UPDATE or DELETE of a copied row is ``*_origin_differs``, the row
    "modified by a non-existent origin". Ours copies with an origin of its own too, dropped after the copy."""
    began = time.monotonic()
    name = "copyorigin"
    pub, native_db, ours = (commit_ts_pg.create_database(f"{name}_{n}") for n in ("pub", "native", "ours"))
    execute(pub, "CREATE TABLE c (id int PRIMARY KEY, v text)", "INSERT INTO c SELECT g, 'v' || g FROM generate_series(1, 4) g",
            "CREATE PUBLICATION pc FOR TABLE c")
    for dsn in (native_db, ours):
        execute(dsn, "CREATE TABLE c (id int PRIMARY KEY, v text)")
    native = NativeSubscription(pub, native_db, f"{name}_native", ["pc"]).create()
    spec = SubscriptionSpec(subscription=f"{name}_ours", publisher=pub, subscriber=ours, publications=("pc",),
                            change_log=str(tmp_path / "changes"))
    refresh(spec)
    try:
        assert sync_tables(spec).ok
        apply(spec)
        with psycopg.connect(ours) as conn:
            # The copied rows carry an origin, not ours, and that origin is gone.
            origins = conn.execute("SELECT DISTINCT (pg_xact_commit_timestamp_origin(xmin)).roident FROM c").fetchall()
            assert len(origins) == 1 and origins[0][0] not in (None, 0), origins
            assert conn.execute("SELECT count(*) FROM pg_replication_origin WHERE roident = %s",
                                (origins[0][0],)).fetchone()[0] == 0
        execute(pub, "UPDATE c SET v = 'r1' WHERE id = 1", "DELETE FROM c WHERE id = 2")
        with caplog.at_level("INFO", logger="airflow_provider_rowfilter.subscriber.origin_conflicts"):
            apply(spec)
        assert "Updating the row that was modified by a non-existent origin in transaction" in caplog.text, \
            caplog.text
        # Rows the apply wrote since: no conflict.
        execute(pub, "UPDATE c SET v = 'r1 again' WHERE id = 1")
        apply(spec)
        native.wait_caught_up()
        for column in COUNTED:
            assert native_count(native_db, native.name, column, at_least=1) == 1
            assert ours_count(ours, spec, column) == 1
        with psycopg.connect(ours) as a, psycopg.connect(native_db) as b:
            rows = "SELECT c::text FROM c ORDER BY id"
            assert a.execute(rows).fetchall() == b.execute(rows).fetchall() == [
                ('(1,"r1 again")',), ("(3,v3)",), ("(4,v4)",)]
        # A copy killed before it dropped its origin leaves it: `rowfilter drop` drops it, as DROP SUBSCRIPTION does.
        with psycopg.connect(ours, autocommit=True) as conn:
            relid = conn.execute("SELECT 'c'::regclass::oid").fetchone()[0]
            left = f"{origin_name(conn, spec.subscription)}_{relid}"
            conn.execute("SELECT pg_replication_origin_create(%s)", (left,))
        drop(spec)
        with psycopg.connect(ours, autocommit=True) as conn:
            assert conn.execute("SELECT roname FROM pg_replication_origin WHERE roname LIKE %s",
                                (f"rowfilter_%_{spec.subscription}%",)).fetchall() == []
    finally:
        native.drop()
        for dsn_name in ("ours", "native", "pub"):
            commit_ts_pg.drop_database(f"{name}_{dsn_name}")
    print(f"copied rows' origin: {time.monotonic() - began:.1f} s")
