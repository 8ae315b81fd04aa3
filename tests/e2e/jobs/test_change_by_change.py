"""Conflicts a key's net effect cannot judge, beside a native PostgreSQL 18 subscription of the same publisher.

PostgreSQL's apply worker checks each INSERT and UPDATE on its own; on a table with a unique index besides its key,
the batch's changes of that table are then judged one by one here too (subscriber/change_by_change.py): a key
inserted then updated onto a local row's unique value stops at the UPDATE (``update_exists``), a value a key held
only in the middle of the batch is checked (``insert_exists``), and two keys that swap values through a third, in
three transactions, are applied. Cheap: ``copy_data: false`` and the publisher's own filtering, so no copy and no
Spark (Spark's reducer stages the same phases as the job's own: tests/apply/test_fold.py).
"""

from __future__ import annotations

import logging
import time

import psycopg
import pytest

from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec
from airflow_provider_rowfilter.flows.apply.drain import apply
from airflow_provider_rowfilter.flows.refresh import refresh
from airflow_provider_rowfilter.subscriber import change_by_change
from airflow_provider_rowfilter.subscriber.apply_target import ConflictError
from airflow_provider_rowfilter.tooling.native import NativeSubscription
from tests.e2e.jobs.conflict_counts import TABLE, execute, native_count, ours_count
from tests.e2e.jobs.databases import apply_path

ROWS = "SELECT w::text FROM w ORDER BY id"


def same_tables(ours: str, native_db: str) -> list:
    with psycopg.connect(ours) as a, psycopg.connect(native_db) as b:
        mine = a.execute(ROWS).fetchall()
        assert mine == b.execute(ROWS).fetchall()
    return mine


def test_changes_the_net_effect_cannot_judge_are_judged_one_by_one_as_postgresql_18_does(fresh_db, tmp_path,
                                                                                         monkeypatch):
    began = time.monotonic()
    filtering, engines = apply_path(monkeypatch, "source")
    pub, native_db, ours = fresh_db(), fresh_db(), fresh_db()
    execute(pub, TABLE, "CREATE PUBLICATION pw FOR TABLE w")
    for dsn in (native_db, ours):
        execute(dsn, TABLE, "INSERT INTO w VALUES (10, 5, 'local')")
    name = "cbc"
    native = NativeSubscription(pub, native_db, f"{name}_native", ["pw"], {"copy_data": "false"}).create()
    spec = SubscriptionSpec(subscription=f"{name}_ours", publisher=pub, subscriber=ours, publications=("pw",),
                            copy_data=False, change_log=str(tmp_path / "changes"), filtering=filtering)
    refresh(spec)
    try:
        # Inserted, then updated onto a local row's u: PostgreSQL applies the INSERT and stops at the UPDATE.
        execute(pub, "BEGIN; INSERT INTO w VALUES (1, 1, 'r'); UPDATE w SET u = 5 WHERE id = 1; COMMIT")
        with pytest.raises(ConflictError) as caught:
            apply(spec)
        text = str(caught.value)
        assert caught.value.kind == "update_exists", text
        assert 'Key already exists in unique index "w_u_key", modified in transaction ' in text, text
        assert ("Key (u)=(5); existing local tuple (10, 5, local); remote tuple (1, 5, r); replica identity (id)=(1)."
                in text), text
        assert caught.value.commit_lsn is not None and "finished at" in text, text
        assert native_count(native_db, native.name, "confl_update_exists") >= 1
        assert ours_count(ours, spec, "confl_update_exists") == 1
        assert ours_count(ours, spec, "confl_insert_exists") == 0
        for dsn in (native_db, ours):
            execute(dsn, "DELETE FROM w WHERE id = 10")
        apply(spec)
        native.wait_caught_up()

        # A value held only in the middle of the batch: inserted onto a local row's u, then moved away from it.
        for dsn in (native_db, ours):
            execute(dsn, "INSERT INTO w VALUES (20, 7, 'local')")
        execute(pub, "BEGIN; INSERT INTO w VALUES (3, 7, 'x'); UPDATE w SET u = 8 WHERE id = 3; COMMIT")
        with pytest.raises(ConflictError) as caught:
            apply(spec)
        text = str(caught.value)
        assert caught.value.kind == "insert_exists", text
        assert "Key (u)=(7); existing local tuple (20, 7, local); remote tuple (3, 7, x)." in text, text
        assert native_count(native_db, native.name, "confl_insert_exists") >= 1
        assert ours_count(ours, spec, "confl_insert_exists") == 1
        for dsn in (native_db, ours):
            execute(dsn, "DELETE FROM w WHERE id = 20")
        apply(spec)
        native.wait_caught_up()

        # Skipped changes met on the way of a batch judged one by one (walked on the server up to the first phase
        # that needs this side: subscriber/change_by_change.py walk): counted as PostgreSQL counts them.
        for dsn in (native_db, ours):
            execute(dsn, "DELETE FROM w WHERE id = 3")
        execute(pub, "BEGIN; INSERT INTO w VALUES (4, 40, 'd'); UPDATE w SET v = 'm' WHERE id = 3; "
                     "UPDATE w SET u = 41 WHERE id = 4; DELETE FROM w WHERE id = 3; COMMIT")
        apply(spec)
        native.wait_caught_up()
        for column in ("confl_update_missing", "confl_delete_missing"):
            assert ours_count(ours, spec, column) == native_count(native_db, native.name, column) == 1, column

        # A value one key frees and another takes in a later transaction (one set-based UPDATE of both may meet
        # the taken value first); then two keys that swap values through a third, in three transactions.
        execute(pub, "INSERT INTO w VALUES (2, 2, 'b')")
        apply(spec)
        execute(pub, "UPDATE w SET u = 30 WHERE id = 1", "UPDATE w SET u = 5 WHERE id = 2")
        apply(spec)
        execute(pub, "UPDATE w SET u = 99 WHERE id = 1", "UPDATE w SET u = 30 WHERE id = 2",
                "UPDATE w SET u = 5 WHERE id = 1")
        apply(spec)
        native.wait_caught_up()
        assert same_tables(ours, native_db) == [("(1,5,r)",), ("(2,30,b)",), ("(4,41,d)",)]
        assert ours_count(ours, spec, "confl_update_exists") == 1
        assert engines["process"] >= 1, engines
    finally:
        native.drop()
    print(f"change by change: {time.monotonic() - began:.1f} s")


def test_past_the_limit_a_key_changed_twice_is_applied_as_net_effects_with_a_warning(fresh_db, tmp_path, monkeypatch,
                                                                                      caplog):
    """One by one costs about 0.2 ms a change: past ONE_BY_ONE_LIMIT changes of the table, a key changed twice alone
    does not send the batch one by one. A value it held only mid-batch is then not checked (PostgreSQL would stop at the
    INSERT onto the local row's value, as the test above shows): applied, and the WARNING names the table and the key."""
    filtering, _ = apply_path(monkeypatch, "source")
    monkeypatch.setattr(change_by_change, "ONE_BY_ONE_LIMIT", 1)
    pub, ours = fresh_db(), fresh_db()
    execute(pub, TABLE, "CREATE PUBLICATION pw FOR TABLE w")
    execute(ours, TABLE, "INSERT INTO w VALUES (20, 7, 'local')")
    spec = SubscriptionSpec(subscription="cbc_limit", publisher=pub, subscriber=ours, publications=("pw",),
                            copy_data=False, change_log=str(tmp_path / "changes"), filtering=filtering)
    refresh(spec)
    execute(pub, "BEGIN; INSERT INTO w VALUES (3, 7, 'x'); UPDATE w SET u = 8 WHERE id = 3; COMMIT")
    with caplog.at_level(logging.WARNING, logger=change_by_change.__name__):
        apply(spec)
    with psycopg.connect(ours) as conn:
        assert conn.execute(ROWS).fetchall() == [("(3,8,x)",), ("(20,7,local)",)]
    assert ours_count(ours, spec, "confl_insert_exists") == 0
    assert any('public.w: key ["3"] is changed more than once among the batch\'s 2 changes' in r.getMessage()
               for r in caplog.records), [r.getMessage() for r in caplog.records]
