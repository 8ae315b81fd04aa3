"""The conflict counts of a batch that stops, beside a native PostgreSQL 18 subscription of the same publisher.

PostgreSQL's counts are not transactional (pgstat_report_subscription_conflict): the ``update_missing`` and
``delete_missing`` its apply worker met before an ``insert_exists`` in the same remote transaction stay counted when
the worker stops, and again at each retry. Ours stay counted too (subscriber/conflicts.py ``count_stopped``), once
however often the batch is retried. Cheap: ``copy_data: false`` and the publisher's own filtering.
"""

from __future__ import annotations

import time

import psycopg
import pytest

from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec
from airflow_provider_rowfilter.flows.apply.drain import apply
from airflow_provider_rowfilter.flows.refresh import refresh
from airflow_provider_rowfilter.subscriber.apply_target import ConflictError
from airflow_provider_rowfilter.tooling.native import NativeSubscription
from tests.e2e.jobs.conflict_counts import execute, native_count, ours_count

TABLE = "CREATE TABLE s (id int PRIMARY KEY, v text);"


def test_the_conflicts_met_before_a_stop_stay_counted_as_postgresql_18_counts_them(fresh_db, tmp_path):
    began = time.monotonic()
    pub, native_db, ours = fresh_db(), fresh_db(), fresh_db()
    execute(pub, TABLE, "INSERT INTO s VALUES (1, 'a')", "CREATE PUBLICATION ps FOR TABLE s")
    for dsn in (native_db, ours):
        execute(dsn, TABLE, "INSERT INTO s VALUES (7, 'local')")
    native = NativeSubscription(pub, native_db, "stopped_native", ["ps"], {"copy_data": "false"}).create()
    spec = SubscriptionSpec(subscription="stopped_ours", publisher=pub, subscriber=ours, publications=("ps",),
                            copy_data=False, change_log=str(tmp_path / "changes"))
    refresh(spec)
    try:
        # The subscriber lacks row 1 (update_missing, delete_missing), then has row 7 (insert_exists: stops).
        execute(pub, "BEGIN; UPDATE s SET v = 'x' WHERE id = 1; DELETE FROM s WHERE id = 1; "
                     "INSERT INTO s VALUES (7, 'remote'); COMMIT")
        for attempt in (1, 2):
            with pytest.raises(ConflictError) as caught:
                apply(spec)
            assert caught.value.kind == "insert_exists", str(caught.value)
            # The stopping conflict once per attempt; those met before it once, however often the batch stops.
            assert ours_count(ours, spec, "confl_insert_exists") == attempt
            assert ours_count(ours, spec, "confl_update_missing") == 1
            assert ours_count(ours, spec, "confl_delete_missing") == 1
        # PostgreSQL counts them too, before the error, at each attempt of its worker.
        for column in ("confl_insert_exists", "confl_update_missing", "confl_delete_missing"):
            assert native_count(native_db, native.name, column) >= 1
        for dsn in (native_db, ours):
            execute(dsn, "DELETE FROM s WHERE id = 7")
        apply(spec)
        native.wait_caught_up()
        # The retry that commits counts none of them again (PostgreSQL's counts each attempt: one more each).
        assert ours_count(ours, spec, "confl_update_missing") == 1
        assert ours_count(ours, spec, "confl_delete_missing") == 1
        assert ours_count(ours, spec, "confl_insert_exists") == 2
        with psycopg.connect(ours) as a, psycopg.connect(native_db) as b:
            rows = "SELECT s::text FROM s ORDER BY id"
            assert a.execute(rows).fetchall() == b.execute(rows).fetchall() == [("(7,remote)",)]
            assert a.execute("SELECT count(*) FROM rowfilter.conflict_stopped").fetchone()[0] == 0
        # A later batch counts its own conflicts in full.
        execute(pub, "INSERT INTO s VALUES (1, 'b')")
        apply(spec)
        execute(ours, "DELETE FROM s WHERE id = 1")
        execute(pub, "UPDATE s SET v = 'y' WHERE id = 1")
        apply(spec)
        assert ours_count(ours, spec, "confl_update_missing") == 2
    finally:
        native.drop()
    print(f"stopped batch counts: {time.monotonic() - began:.1f} s")
