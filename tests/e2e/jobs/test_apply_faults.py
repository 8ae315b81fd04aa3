"""ApplyChanges killed for real at every fault point, then rerun: nothing lost, nothing applied twice.

Each case runs the job as its own process (``python -m airflow_provider_rowfilter.jobs.apply``) with
``ROWFILTER_FAULT`` naming one point of faults.POINTS, so the process SIGKILLs itself there (no
``finally``, no rollback by us: the server sees the connection drop). Then the job runs again
without the fault and the subscriber's tables must equal PostgreSQL's own logical replication of the
same changes (a native subscription made before them). After every run the slot's
``confirmed_flush_lsn`` must not pass what the change log holds durably.

A conflict (our subscriber already holds a key the publisher then inserts) must stop the batch with
PostgreSQL's wording, leave the subscriber's tables and positions as they were, and let a rerun
finish once the conflicting row is gone; those runs are killed by nobody, so they run the job's
entry point in this process, on the session's Spark.

Refresh and the initial copy run in this process (session Spark); each job process starts its own
Spark (local[2]), so the number of job runs is kept small.
"""

from __future__ import annotations

import signal

import psycopg
import pytest

from airflow_provider_rowfilter import faults
from airflow_provider_rowfilter.change_log.log import TEMP_PREFIX, ChangeLog
from airflow_provider_rowfilter.core.lsn import parse_lsn
from airflow_provider_rowfilter.tooling.native import table_rows
from tests.e2e.jobs.apply_scenario import assert_same_as_native, bulk, changes, publish
from tests.e2e.jobs.databases import FILTERING_MODES


@pytest.mark.parametrize("filtering", FILTERING_MODES)
@pytest.mark.parametrize("point", faults.POINTS)
def test_killed_at_fault_point_then_rerun_matches_native(job, point, filtering):
    publish(job.dbs.publisher, changes(0) + ([bulk(0)] if point == "capture-mid-read" else []))
    before_tables, before_positions = job.ours(), job.positions()

    killed = job.run(fault=point)
    assert killed.returncode == -signal.SIGKILL, (killed.returncode, killed.stderr[-4000:])

    log = ChangeLog(job.change_log)
    if point == "capture-mid-read":
        # One row group written to the temporary file; no segment, the slot where it was.
        assert not log.segments()
        assert any(p.name.startswith(TEMP_PREFIX) for p in job.change_log.iterdir())
        assert job.slot_position() == job.initial_slot
    elif point == "capture-after-segment":
        # The segment is durable, the slot not advanced yet.
        assert len(log.segments()) == 1
        assert job.slot_position() < log.captured_through()
    if point != "apply-after-commit":
        # Nothing of the batch reached the subscriber: tables and positions as they were.
        assert job.ours() == before_tables
        assert job.positions() == before_positions
    else:
        # The subscriber committed the batch; its segment is not pruned yet.
        assert_same_as_native(job)
        assert log.segments()
        assert all(state == "r" for _, _, state, _ in job.positions())

    # More changes arrive before the rerun: it finishes the interrupted batch and takes them too.
    publish(job.dbs.publisher, changes(1))
    rerun = job.summary(job.run())
    assert rerun["capture"]["filtering"] == filtering, rerun["capture"]
    if point == "capture-after-segment":
        assert rerun["capture"]["recovered_lsn"] is not None, rerun["capture"]
    assert_same_as_native(job)
    assert all(state == "r" for _, _, state, _ in job.positions())
    assert job.staged_rows() == 0
    assert not any(p.name.startswith(TEMP_PREFIX) for p in job.change_log.iterdir())
    assert rerun["end_lsn"] is None or job.slot_position() >= parse_lsn(rerun["end_lsn"])


@pytest.mark.parametrize("filtering", ["source"])
@pytest.mark.parametrize("point", ["apply-after-commit", "apply-after-stage"])
def test_killed_while_the_next_batch_is_captured_ahead_then_rerun_matches_native(job, point, filtering):
    """A draining run captures batch k + 1 in a thread while batch k is applied (flows/apply/capture_ahead.py):
    killed in batch k's apply, the capture ahead dies with it, anywhere in its work."""
    publish(job.dbs.publisher, [f"INSERT INTO t SELECT g, g % 7, 'txn {i}' FROM generate_series({500_000 + i * 1000}, "
                                f"{500_399 + i * 1000}) g" for i in range(8)] + changes(0))
    killed = job.run(point, "--max-changes", "450")
    assert killed.returncode == -signal.SIGKILL, (killed.returncode, killed.stderr[-4000:])
    rerun = job.summary(job.run(None, "--max-changes", "450"))
    assert rerun["drained"] and rerun["batches"] >= 2, rerun
    assert_same_as_native(job)
    assert job.staged_rows() == 0
    assert not any(p.name.startswith(TEMP_PREFIX) for p in job.change_log.iterdir())


@pytest.mark.parametrize("filtering", FILTERING_MODES)
def test_conflict_stops_the_batch_untouched_then_rerun_after_fix(job, capsys, filtering):
    # Our subscriber already holds key 5001, which the publisher then inserts (and the filter passes).
    with psycopg.connect(job.dbs.ours, autocommit=True) as conn:
        conn.execute("INSERT INTO t VALUES (5001, 0, 'local row')")
    with psycopg.connect(job.dbs.publisher, autocommit=True) as conn:
        conn.execute("UPDATE t SET v = 'before the conflict' WHERE id = 1")
        conn.execute("UPDATE u SET n = 99 WHERE k = 60")
        start = parse_lsn(conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0])
        conn.execute("BEGIN; INSERT INTO t VALUES (5001, 1, 'remote row'); "
                     "UPDATE t SET v = 'same transaction' WHERE id = 2; COMMIT")
        end = parse_lsn(conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0])
        conn.execute("UPDATE t SET v = 'after the conflict' WHERE id = 3")
    before_tables, before_positions = job.ours(), job.positions()

    failed = job.run_in_process(capsys)
    assert failed.returncode == 1, (failed.returncode, failed.stdout[-2000:], failed.stderr[-4000:])
    assert not failed.stdout.strip(), failed.stdout  # no summary line: nothing was applied
    error = failed.stderr[failed.stderr.index("ERROR: "):]
    assert 'conflict detected on relation "public.t": conflict=insert_exists' in error, error
    assert 'Key already exists in unique index "t_pkey"' in error and "Key (id)=(5001); existing local tuple" in error, error
    lsn = parse_lsn(error.split("finished at ", 1)[1].split(".", 1)[0].split()[0])
    assert start <= lsn <= end, (hex(start), hex(lsn), hex(end))  # the LSN of the inserting transaction
    # Nothing applied (not even the transactions before the conflicting one), no position moved; the
    # change log still holds the batch for the rerun (run() checked the slot is not past it).
    assert job.ours() == before_tables
    assert job.positions() == before_positions
    assert ChangeLog(job.change_log).segments()
    with psycopg.connect(job.dbs.ours, autocommit=True) as conn:
        last_error = conn.execute("SELECT last_error FROM rowfilter.subscription WHERE name = %s",
                                  (job.name,)).fetchone()[0]
    assert "conflict=insert_exists" in last_error

    with psycopg.connect(job.dbs.ours, autocommit=True) as conn:
        conn.execute("DELETE FROM t WHERE id = 5001")
    job.summary(job.run_in_process(capsys))
    assert_same_as_native(job)
    assert '(5001,1,"remote row")' in table_rows(job.dbs.ours, "t")
