"""SnapshotCopy's failure paths, resync and reruns, through the CLI and the job's entry point."""

from __future__ import annotations

import json

import psycopg
import pytest

from airflow_provider_rowfilter import cli
from airflow_provider_rowfilter.core.relation import TableName
from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec
from airflow_provider_rowfilter.core.sync_state import SyncState
from airflow_provider_rowfilter.flows.refresh import refresh
from airflow_provider_rowfilter.flows.table_sync.sync import sync_tables
from airflow_provider_rowfilter.jobs import snapshot as snapshot_job
from airflow_provider_rowfilter.subscriber.copy_target import check_target, create_staging
from airflow_provider_rowfilter.subscriber.state import StateStore
from airflow_provider_rowfilter.tooling.native import table_rows
from tests.e2e.jobs.snapshot_scenario import SPLIT, T1, T2, execute, published


def state(spec: SubscriptionSpec, table: str):
    with psycopg.connect(spec.subscriber, autocommit=True) as conn:
        (rel,) = StateStore(conn, spec.subscription).tables([TableName("public", table)])
    return rel


@pytest.mark.parametrize(("target", "message", "rows_before"), [
    pytest.param("", 'logical replication target relation "public.t1" does not exist', None, id="table-missing"),
    pytest.param("CREATE TABLE t1 (id int PRIMARY KEY, v int);",
                 'logical replication target relation "public.t1" is missing replicated column: "region"', [],
                 id="column-missing"),
])
def test_target_problems_fail_before_any_row_moves(setup, spark, capsys, target, message, rows_before):
    spec, path = setup
    execute(spec.subscriber, target + T2)
    refresh(spec)

    assert cli.main(["snapshot", "--spec", path]) == 1
    err = capsys.readouterr().err
    assert message in err and "HINT" in err

    t1 = state(spec, "t1")
    assert t1.state is SyncState.INIT and message in t1.last_error
    if rows_before is not None:
        assert table_rows(spec.subscriber, "t1") == rows_before  # nothing copied, nothing removed
    # The other table is independent, as tablesync workers are.
    assert state(spec, "t2").state is SyncState.FINISHED_COPY
    assert table_rows(spec.subscriber, "t2") == published(spec, "t2")


def test_a_table_outside_the_subscription_is_refused(setup, spark, capsys):
    spec, path = setup
    execute(spec.subscriber, T1 + T2)
    refresh(spec)
    assert cli.main(["snapshot", "--spec", path, "--table", "public.t9"]) == 1
    assert "table public.t9 is not part of subscription" in capsys.readouterr().err
    assert state(spec, "t1").state is SyncState.INIT


def test_snapshot_copies_once_then_reports_tables_already_copied(setup, spark, capsys):
    spec, path = setup
    execute(spec.subscriber, T1 + T2)
    refresh(spec)
    assert snapshot_job.main(["--spec-json", spec.to_json(), "--table", "t1"]) == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed["ok"] and [t["table"] for t in printed["tables"]] == ["public.t1"]
    assert printed["rows_copied"] == 950 and printed["tables"][0]["state"] == "f"
    assert state(spec, "t2").state is SyncState.INIT  # only the named table

    assert cli.main(["snapshot", "--spec", path]) == 0
    out = capsys.readouterr().out
    assert "public.t1: state f" in out and "already copied" in out and "public.t2: state f" in out
    assert table_rows(spec.subscriber, "t1") == published(spec, "t1")
    assert table_rows(spec.subscriber, "t2") == published(spec, "t2")


def test_resync_empties_the_table_and_copies_it_again(setup, spark, capsys):
    spec, path = setup
    execute(spec.subscriber, T1 + T2)
    refresh(spec)
    assert sync_tables(spec, spark=spark).ok
    first = state(spec, "t1")
    execute(spec.publisher, "INSERT INTO t1 VALUES (1001, 'NSW', 1001), (1002, 'VIC', 1002); DELETE FROM t1 WHERE id = 60;")
    execute(spec.subscriber, "INSERT INTO t1 VALUES (1, 'stray', 0);")

    assert cli.main(["resync", "--spec", path, "--table", "public.t1"]) == 0
    assert "the next snapshot copies it" in capsys.readouterr().out
    rel = state(spec, "t1")
    assert (rel.state, rel.lsn, rel.rows_copied) == (SyncState.INIT, None, None)
    assert table_rows(spec.subscriber, "t1") == []
    assert state(spec, "t2").state is SyncState.FINISHED_COPY  # untouched

    assert cli.main(["snapshot", "--spec", path, "--max-partitions", "1"]) == 0  # one reader: into the table itself
    again = state(spec, "t1")
    assert again.state is SyncState.FINISHED_COPY and again.rows_copied == 951
    assert table_rows(spec.subscriber, "t1") == published(spec, "t1")
    with psycopg.connect(spec.subscriber) as conn:
        assert conn.execute("SELECT %s::pg_lsn > %s::pg_lsn", (again.lsn, first.lsn)).fetchone()[0]

    execute(spec.publisher, "UPDATE t1 SET v = -v WHERE id > 990")
    assert cli.main(["resync", "--spec", path, "--table", "public.t1", "--copy"]) == 0
    assert state(spec, "t1").state is SyncState.FINISHED_COPY
    assert table_rows(spec.subscriber, "t1") == published(spec, "t1")


def error_counts(spec) -> tuple[int, int, int, int]:
    """rowfilter.subscription_stats' apply, sequence-sync and table-sync error counts, and sync_error_count."""
    with psycopg.connect(spec.subscriber) as conn:
        return conn.execute("SELECT apply_error_count, sync_seq_error_count, sync_table_error_count, sync_error_count "
                            "FROM rowfilter.subscription_stats WHERE subname = %s", (spec.subscription,)).fetchone()


def test_a_failed_copy_stays_in_d_and_a_rerun_copies_again(setup, spark):
    spec, _ = setup
    # One published row breaks the target's constraint: its partition's COPY fails on the subscriber.
    execute(spec.subscriber, T1.replace(");", ", CHECK (v <> 300));") + T2)
    refresh(spec)
    result = sync_tables(spec, [TableName("public", "t1")], spark=spark, options=SPLIT)
    assert not result.ok
    (failed,) = result.failed
    assert failed.table == "public.t1" and 't1_v_check' in failed.error
    rel = state(spec, "t1")
    assert rel.state is SyncState.DATA_COPY and 't1_v_check' in rel.last_error
    assert "t1_v_check" in str(result.error()) and "run the snapshot again" in str(result.error())
    assert error_counts(spec) == (0, 0, 1, 1)  # a table sync error (PostgreSQL 19's name, and 18's for one release)

    execute(spec.subscriber, "ALTER TABLE t1 DROP CONSTRAINT t1_v_check")
    result = sync_tables(spec, spark=spark, options=SPLIT)
    assert result.ok, result.summary()
    rel = state(spec, "t1")
    assert rel.state is SyncState.FINISHED_COPY and rel.last_error is None and rel.rows_copied == 950
    assert table_rows(spec.subscriber, "t1") == published(spec, "t1")


def test_a_copy_killed_in_d_is_redone_and_the_tables_own_rows_stay(setup, spark):
    spec, _ = setup
    execute(spec.subscriber, T1 + T2 + "INSERT INTO t1 SELECT g, 'local', g FROM generate_series(1, 10) g")
    refresh(spec)
    # What a job killed mid-copy leaves: state d, some rows in its staging table, none in the table.
    t1 = TableName("public", "t1")
    with psycopg.connect(spec.subscriber, autocommit=True) as conn:
        StateStore(conn, spec.subscription).set_state(t1, SyncState.DATA_COPY)
        target = check_target(conn, spec.subscription, t1, ("id", "region", "v"))
        create_staging(conn, target)
        conn.execute(f"INSERT INTO {target.staging} SELECT g, 'NSW', g FROM generate_series(51, 120) g")
    local = table_rows(spec.subscriber, "t1")
    result = sync_tables(spec, spark=spark, options=SPLIT)
    assert result.ok, result.summary()
    assert {t.table: t.partitions for t in result.tables}["public.t1"] == 3
    assert state(spec, "t1").state is SyncState.FINISHED_COPY and state(spec, "t1").rows_copied == 950
    assert table_rows(spec.subscriber, "t1") == sorted(local + published(spec, "t1"))
    with psycopg.connect(spec.subscriber) as conn:  # the staging table went with the move
        assert conn.execute("SELECT to_regclass(%s)", (str(target.staging),)).fetchone()[0] is None
