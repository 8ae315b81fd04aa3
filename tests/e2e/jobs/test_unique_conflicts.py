"""Conflicts on unique indexes other than the key, beside a native PostgreSQL 18 subscription of the same publisher.

PostgreSQL 18 checks every unique index before its apply worker inserts a row (execReplication.c
``CheckAndReportConflict``): a row existing in one index stops it with ``insert_exists`` naming that index, in
several with ``multiple_unique_conflicts`` naming each; both are counted in ``pg_stat_subscription_stats``.
Cheap: ``copy_data: false`` and the publisher's own filtering, so no Spark and no copy.
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
from tests.e2e.jobs.conflict_counts import TABLE, execute, native_count, ours_count
from tests.e2e.jobs.databases import apply_path


def test_a_row_existing_in_other_unique_indexes_stops_as_postgresql_18_stops(fresh_db, tmp_path):
    began = time.monotonic()
    pub, native_db, ours = fresh_db(), fresh_db(), fresh_db()
    execute(pub, TABLE, "CREATE PUBLICATION pw FOR TABLE w")
    for dsn in (native_db, ours):
        execute(dsn, TABLE, "INSERT INTO w VALUES (10, 5, 'local')")
    native = NativeSubscription(pub, native_db, "uniq_native", ["pw"], {"copy_data": "false"}).create()
    spec = SubscriptionSpec(subscription="uniq_ours", publisher=pub, subscriber=ours, publications=("pw",),
                            copy_data=False, change_log=str(tmp_path / "changes"))
    refresh(spec)
    try:
        # Another key, the same u: insert_exists on w_u_key (not the key's index).
        execute(pub, "INSERT INTO w VALUES (11, 5, 'remote')")
        with pytest.raises(ConflictError) as caught:
            apply(spec)
        text = str(caught.value)
        assert caught.value.kind == "insert_exists", text
        assert 'Key already exists in unique index "w_u_key", modified in transaction ' in text, text
        assert "Key (u)=(5); existing local tuple (10, 5, local); remote tuple (11, 5, remote)." in text, text
        # The key's one change is one remote transaction's: named by its finish LSN, which `rowfilter skip` takes.
        assert caught.value.commit_lsn is not None and "finished at" in text, text
        assert native_count(native_db, native.name, "confl_insert_exists") >= 1
        assert ours_count(ours, spec, "confl_insert_exists") == 1
        # Both go on once the local row is out of the way.
        for dsn in (native_db, ours):
            execute(dsn, "DELETE FROM w WHERE id = 10")
        apply(spec)
        native.wait_caught_up()

        # The key and u both exist, in two local rows: multiple_unique_conflicts, each index named.
        for dsn in (native_db, ours):
            execute(dsn, "INSERT INTO w VALUES (20, 1, 'local key'), (21, 7, 'local u')")
        execute(pub, "INSERT INTO w VALUES (20, 7, 'remote')")
        with pytest.raises(ConflictError) as caught:
            apply(spec)
        text = str(caught.value)
        assert caught.value.kind == "multiple_unique_conflicts", text
        assert 'conflict=multiple_unique_conflicts' in text and '"w_pkey"' in text and '"w_u_key"' in text, text
        assert "Key (id)=(20); existing local tuple (20, 1, local key)" in text, text
        assert "Key (u)=(7); existing local tuple (21, 7, local u)" in text, text
        assert native_count(native_db, native.name, "confl_multiple_unique_conflicts") >= 1
        assert ours_count(ours, spec, "confl_multiple_unique_conflicts") == 1
        for dsn in (native_db, ours):
            execute(dsn, "DELETE FROM w WHERE id IN (20, 21)")
        apply(spec)
        native.wait_caught_up()
        with psycopg.connect(ours) as a, psycopg.connect(native_db) as b:
            rows = "SELECT w::text FROM w ORDER BY id"
            assert a.execute(rows).fetchall() == b.execute(rows).fetchall()
    finally:
        native.drop()
    print(f"unique conflicts: {time.monotonic() - began:.1f} s")


# Each reducer and each capture mode once: the job's process after the publisher's filtering, Spark judging and
# reducing (Spark reducing the publisher's judgement adds nothing the check reads: tests/apply/test_fold.py).
@pytest.mark.parametrize("path", ["source", "spark"])
def test_an_update_onto_another_rows_unique_value_stops_as_postgresql_18_stops(fresh_db, tmp_path, monkeypatch, path,
                                                                                request):
    """``update_exists`` (execReplication.c ``ExecSimpleRelationUpdate``): an UPDATE, keeping its key or changing it,
    whose new row exists in another local row of a unique index."""
    began = time.monotonic()
    filtering, engines = apply_path(monkeypatch, path)
    spark = request.getfixturevalue("spark") if path != "source" else None
    pub, native_db, ours = fresh_db(), fresh_db(), fresh_db()
    for dsn in (pub, native_db, ours):
        execute(dsn, TABLE, "INSERT INTO w VALUES (1, 1, 'a')")
    execute(pub, "CREATE PUBLICATION pw FOR TABLE w")
    name = f"upd_{path.replace('-', '_')}"
    native = NativeSubscription(pub, native_db, f"{name}_native", ["pw"], {"copy_data": "false"}).create()
    spec = SubscriptionSpec(subscription=f"{name}_ours", publisher=pub, subscriber=ours, publications=("pw",),
                            copy_data=False, change_log=str(tmp_path / "changes"), filtering=filtering)
    refresh(spec)
    try:
        # The key kept, u moved onto a local row's: a phase's UPDATE.
        for dsn in (native_db, ours):
            execute(dsn, "INSERT INTO w VALUES (10, 5, 'local')")
        execute(pub, "UPDATE w SET u = 5 WHERE id = 1")
        with pytest.raises(ConflictError) as caught:
            apply(spec, spark=spark)
        text = str(caught.value)
        assert caught.value.kind == "update_exists", text
        assert 'conflict detected on relation "public.w": conflict=update_exists' in text, text
        assert 'Key already exists in unique index "w_u_key", modified in transaction ' in text, text
        assert ("Key (u)=(5); existing local tuple (10, 5, local); remote tuple (1, 5, a); replica identity (id)=(1)."
                in text), text
        # One remote transaction changed the key: it is named, so `rowfilter skip --lsn` can target it.
        assert caught.value.commit_lsn is not None and "finished at" in text and "rowfilter skip --lsn" in text, text
        assert native_count(native_db, native.name, "confl_update_exists") >= 1
        assert ours_count(ours, spec, "confl_update_exists") == 1
        for dsn in (native_db, ours):
            execute(dsn, "DELETE FROM w WHERE id = 10")
        apply(spec, spark=spark)
        native.wait_caught_up()

        # The key changed too (a barrier), onto a local row's u.
        for dsn in (native_db, ours):
            execute(dsn, "INSERT INTO w VALUES (30, 7, 'local')")
        execute(pub, "UPDATE w SET id = 2, u = 7 WHERE id = 1")
        with pytest.raises(ConflictError) as caught:
            apply(spec, spark=spark)
        text = str(caught.value)
        assert caught.value.kind == "update_exists", text
        assert "Key (u)=(7); existing local tuple (30, 7, local); remote tuple (2, 7, a); replica identity (id)=(1)." \
            in text, text
        assert native_count(native_db, native.name, "confl_update_exists") >= 2
        assert ours_count(ours, spec, "confl_update_exists") == 2
        for dsn in (native_db, ours):
            execute(dsn, "DELETE FROM w WHERE id = 30")
        apply(spec, spark=spark)
        native.wait_caught_up()
        with psycopg.connect(ours) as a, psycopg.connect(native_db) as b:
            rows = "SELECT w::text FROM w ORDER BY id"
            assert a.execute(rows).fetchall() == b.execute(rows).fetchall() == [("(2,7,a)",)]
        assert engines["spark" if path != "source" else "process"] >= 1, engines
    finally:
        native.drop()
    print(f"update_exists ({path}): {time.monotonic() - began:.1f} s")
