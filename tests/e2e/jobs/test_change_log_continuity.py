"""A change log that misses what the subscriber needs is refused, and nothing moves (issue 14, items 4, 5).

Each case breaks the log or the slot the way an operator can (the log folder deleted between a
capture and the apply that needs it, one segment of three deleted, a second log folder for the same
spec, the slot dropped and recreated), then checks that the apply refuses naming the gap and the
fix, that the subscriber's tables, positions and the slot are as they were, and that the documented
recovery ends with the subscriber equal to PostgreSQL's own logical replication.
"""

# ruff: noqa: F811  (the imported `job` fixture is each test's argument)
from __future__ import annotations

import shutil
import socket

import psycopg
import pytest
import yaml

from airflow_provider_rowfilter.change_log.log import ChangeLog
from airflow_provider_rowfilter.core.lsn import format_lsn, parse_lsn
from airflow_provider_rowfilter.core.relation import TableName
from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec
from airflow_provider_rowfilter.flows.refresh import refresh
from airflow_provider_rowfilter.flows.table_sync.sync import resync
from airflow_provider_rowfilter.jobs import apply as apply_job
from airflow_provider_rowfilter.publisher.capture import capture
from airflow_provider_rowfilter.subscriber.state import SlotLostError
from tests.e2e.jobs.apply_scenario import assert_same_as_native, changes, publish

TABLES = [TableName("public", "t"), TableName("public", "u")]


def run(capsys, spec_path) -> tuple[int, str]:
    """The apply job's entry point in this process: its exit status and its ERROR text (or summary line)."""
    capsys.readouterr()
    code = apply_job.main(["--spec", str(spec_path)])
    out, err = capsys.readouterr()
    return code, err[err.index("ERROR: "):] if code else out


def conflict(job) -> None:
    """Our subscriber holds key 5001, which the publisher then inserts: every apply stops until it is gone."""
    with psycopg.connect(job.dbs.ours, autocommit=True) as conn:
        conn.execute("INSERT INTO t VALUES (5001, 0, 'local row')")
    publish(job.dbs.publisher, ["INSERT INTO t VALUES (5001, 1, 'remote row')"])


def fix_conflict(job) -> None:
    with psycopg.connect(job.dbs.ours, autocommit=True) as conn:
        conn.execute("DELETE FROM t WHERE id = 5001")


def snapshot_of(job) -> tuple:
    """What must not move when a run is refused: our tables, their states and positions, the slot."""
    return job.ours(), job.positions(), job.slot_position()


def stopped_on_conflict(job, capsys) -> tuple:
    code, error = run(capsys, job.spec_path)
    assert code == 1 and "conflict=insert_exists" in error, error
    return snapshot_of(job)


def test_a_deleted_log_folder_is_refused_then_a_resync_recovers(job, capsys, spark):
    conflict(job)
    publish(job.dbs.publisher, changes(0))
    before = stopped_on_conflict(job, capsys)  # captured: the slot is past the tables' positions
    captured_through = ChangeLog(job.change_log).captured_through()
    shutil.rmtree(job.change_log)
    publish(job.dbs.publisher, changes(1))

    code, error = run(capsys, job.spec_path)
    assert code == 1
    assert f"the change log '{job.change_log}' is missing the changes from" in error, error
    assert f'replication slot "{job.slot}" is at {format_lsn(captured_through)}, past the end of this log (empty)' \
        in error, error
    assert "or it was dropped and recreated. The log must be continuous from " in error, error  # one sentence each
    assert "The log at this path was replaced" in error and "public.t, public.u" in error, error
    assert "rowfilter resync --table T --copy" in error, error
    assert snapshot_of(job) == before
    assert not ChangeLog(job.change_log).segments()  # nothing captured into the new folder

    # The fix the error names: the tables copied again, then the runs go on with a new log.
    fix_conflict(job)
    resync(job.spec, TABLES, copy=True, spark=spark)
    code, out = run(capsys, job.spec_path)
    assert code == 0, out
    assert_same_as_native(job)
    assert all(state == "r" for _, _, state, _ in job.positions())


def test_a_deleted_middle_segment_is_refused_naming_it_and_applies_once_restored(job, capsys):
    for round_ in range(3):
        publish(job.dbs.publisher, changes(round_))
        assert capture(job.spec).changes
    log = ChangeLog(job.change_log)
    first, middle, last = log.segments()
    assert first.end_lsn == middle.start_lsn and middle.end_lsn == last.start_lsn
    aside = job.workdir / middle.path.name
    shutil.move(middle.path, aside)
    before = snapshot_of(job)

    code, error = run(capsys, job.spec_path)
    assert code == 1
    assert (f"the change log '{job.change_log}' is missing the changes from {format_lsn(middle.start_lsn)} to "
            f"{format_lsn(middle.end_lsn)}") in error, error
    assert f"the next segment is {last.path.name}" in error, error
    assert "restore the missing segments" in error, error
    assert snapshot_of(job) == before and log.segments() == [first, last]

    shutil.move(aside, middle.path)
    code, out = run(capsys, job.spec_path)
    assert code == 0, out
    assert_same_as_native(job)


def test_a_second_log_folder_is_refused_naming_the_first_and_heartbeats_leave_no_false_gap(job, capsys, tmp_path):
    other = tmp_path / "elsewhere" / "changes"
    other_spec = tmp_path / "other.yaml"
    other_spec.write_text(yaml.safe_dump({**yaml.safe_load(job.spec_path.read_text()), "change_log": str(other)}))
    conflict(job)
    publish(job.dbs.publisher, changes(0))
    stopped_on_conflict(job, capsys)  # captured into the spec's log, not applied
    # Idle for us, busy for the publisher: each run's capture only moves the slot (a heartbeat).
    publish(job.dbs.publisher, ["CREATE TABLE noise (i int)"])
    for i in range(3):
        publish(job.dbs.publisher, [f"INSERT INTO noise VALUES ({i})"])
        before = stopped_on_conflict(job, capsys)
    log = ChangeLog(job.change_log)
    assert len(log.segments()) >= 3
    identity = log.identity()

    code, error = run(capsys, other_spec)
    assert code == 1
    assert error.startswith(f"ERROR: subscription {job.name}'s change log is at {socket.gethostname()}:"
                            f"{job.change_log.resolve()} (id {identity.id}); this run reads {other}: set change_log "
                            "in the spec to that directory"), error
    assert snapshot_of(job) == before
    assert not ChangeLog(other).segments()

    fix_conflict(job)
    publish(job.dbs.publisher, changes(1))
    code, out = run(capsys, job.spec_path)
    assert code == 0, out
    assert_same_as_native(job)


def test_a_slot_dropped_and_recreated_is_refused(job, capsys):
    publish(job.dbs.publisher, changes(0))
    code, out = run(capsys, job.spec_path)
    assert code == 0, out
    publish(job.dbs.publisher, changes(1))  # what the dropped slot would have delivered
    with psycopg.connect(job.dbs.publisher, autocommit=True) as conn:
        conn.execute("SELECT pg_drop_replication_slot(%s)", (job.slot,))
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (job.slot,))
    publish(job.dbs.publisher, changes(2))
    before = snapshot_of(job)

    code, error = run(capsys, job.spec_path)
    assert code == 1 and f'replication slot "{job.slot}" is at' in error and "past the end of this log" in error, error
    assert snapshot_of(job) == before

    # refresh finds the slot gone while the tables hold positions from it: it refuses, changing
    # nothing, rather than create a slot that would stream across the gap (--recreate-slot copies
    # the tables again: tests/e2e/jobs/test_capture_publications.py).
    with psycopg.connect(job.dbs.publisher, autocommit=True) as conn:
        conn.execute("SELECT pg_drop_replication_slot(%s)", (job.slot,))
    with pytest.raises(SlotLostError, match="were never captured"):
        refresh(SubscriptionSpec.load(job.spec_path))
    code, error = run(capsys, job.spec_path)  # the apply names the same fix, never plain refresh
    assert code == 1 and f"is broken: replication slot \"{job.slot}\" no longer exists" in error, error
    assert "rowfilter refresh --recreate-slot" in error, error
    assert (job.ours(), job.positions()) == before[:2]


def test_a_log_behind_the_tables_applies_nothing_and_records_no_batch(job, capsys, tmp_path, spark):
    """A log whose end is behind every table's position (an older copy of it, switched to in the spec)
    holds nothing to apply: no batch is recorded (none ending before it starts), nothing moves back."""
    publish(job.dbs.publisher, changes(0))
    assert run(capsys, job.spec_path)[0] == 0
    older = tmp_path / "older"
    shutil.copytree(job.change_log, older)
    publish(job.dbs.publisher, changes(1))
    assert run(capsys, job.spec_path)[0] == 0
    assert ChangeLog(older).captured_through() < min(parse_lsn(lsn) for _, _, _, lsn in job.positions())
    older_spec = tmp_path / "older.yaml"
    older_spec.write_text(yaml.safe_dump({**yaml.safe_load(job.spec_path.read_text()), "change_log": str(older)}))

    def recorded() -> tuple:
        with psycopg.connect(job.dbs.ours) as conn:
            return (conn.execute("SELECT count(*), bool_and(start_lsn <= end_lsn) FROM rowfilter.batch_history")
                    .fetchone(), conn.execute("SELECT applied_lsn::text FROM rowfilter.subscription").fetchall())

    before, history = snapshot_of(job), recorded()
    newest = sorted(p.name for p in job.change_log.iterdir())
    result = apply_job.apply(SubscriptionSpec.load(older_spec), capture_first=False, spark=spark)
    assert (result.changes, result.start_lsn, result.end_lsn, result.batch_id) == (0, None, None, None)
    assert snapshot_of(job) == before and recorded() == history
    assert history[0][1] is True
    # The log it was fed from ends later than the one now recorded: no longer recorded, but kept (a warning).
    assert sorted(p.name for p in job.change_log.iterdir()) == newest
    # Back to it: the older copy (same log, ending earlier) holds nothing it lacks, and is removed.
    apply_job.apply(SubscriptionSpec.load(job.spec_path), capture_first=False, spark=spark)
    assert not older.exists() and sorted(p.name for p in job.change_log.iterdir()) == newest
