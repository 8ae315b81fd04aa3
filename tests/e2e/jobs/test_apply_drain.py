"""One ApplyChanges run drains the slot in bounded batches (issue 16, item 1).

Each case runs the job in this process on the session's Spark against a publisher that a NATIVE
subscription also replicates (the referee), with a small ``max_changes`` so that a few hundred
changes make several batches:

- a backlog larger than a batch is applied by ONE run, in several batches, one ``batch_history`` row
  each, on one Spark session; a backlog already in the change log is applied in slices too;
- changes committed after the run started are left to the next run (the run drains to the
  publisher's flush position read at its start, not for ever);
- a time budget stops the run between batches (``budget_exhausted``); the next run goes on;
- a conflict in a later batch leaves the earlier batches committed and that batch untouched.
"""

from __future__ import annotations

import json
import logging
import threading

import psycopg
import pytest

from airflow_provider_rowfilter import cli
from airflow_provider_rowfilter.change_log.log import ChangeLog
from airflow_provider_rowfilter.connection import in_task
from airflow_provider_rowfilter.core.lsn import parse_lsn
from airflow_provider_rowfilter.flows.apply import capture_ahead, reducers
from airflow_provider_rowfilter.flows.apply.drain import apply
from airflow_provider_rowfilter.humane import PROGRESS_LOGGER
from airflow_provider_rowfilter.jobs import apply as apply_job
from airflow_provider_rowfilter.publisher.capture import capture
from airflow_provider_rowfilter.spark import session as spark_session
from airflow_provider_rowfilter.tooling.native import table_rows
from tests.e2e.jobs.apply_scenario import (
    PUBLICATIONS,
    SUBSCRIBER,
    TABLES,
    expected,
    positions,
    publish,
    wal_lsn,
    write_spec,
)
from tests.e2e.jobs.databases import run_ours
from tests.e2e.jobs.drain_scenario import BATCH, PUBLISHER, backlog


def history(dbs, spec) -> list[tuple]:
    """This subscription's batches, oldest first: (id, transactions, changes, start_lsn, end_lsn)."""
    with psycopg.connect(dbs.ours, autocommit=True) as conn:
        return conn.execute("SELECT id, transactions, changes, start_lsn::text, end_lsn::text "
                            "FROM rowfilter.batch_history WHERE subscription = %s ORDER BY id",
                            (spec.subscription,)).fetchall()


@pytest.fixture(autouse=True)
def _as_password_roles(dbs, password_roles, monkeypatch):
    """Every spec here connects as the run's password roles (tests/roles.py), their passwords in the environment."""
    dbs.authenticate_as(password_roles, monkeypatch)


@pytest.fixture
def subscribed(dbs, spark, tmp_path):
    """Publisher and subscriber with t and u, a native subscription, ours copied (tables in f).

    Judged in Spark, so that every change of the backlog reaches the log and the batch counts below are
    the backlog's (with filtering: source the publisher sends fewer; the drain is the same)."""
    dbs.create(PUBLISHER, SUBSCRIBER)
    native = dbs.subscribe_native(PUBLICATIONS)
    path, spec = write_spec(dbs, tmp_path, filtering="spark")
    run_ours(spec, spark)
    return native, path, spec


def test_a_backlog_larger_than_a_batch_is_drained_by_one_run(dbs, spark, subscribed, monkeypatch, caplog):
    native, _, spec = subscribed
    caplog.set_level(logging.INFO, logger=PROGRESS_LOGGER)
    publish(dbs.publisher, backlog(24))  # 24 transactions, 240 changes of t and u
    started = []
    job_session = spark_session.job_session

    def counted(*args, **kwargs):
        started.append(kwargs)
        return job_session(*args, **kwargs)

    monkeypatch.setattr(spark_session, "job_session", counted)
    captured_on = []
    real_capture = capture_ahead.capture

    def traced(*args, **kwargs):
        captured_on.append(threading.current_thread().name)
        return real_capture(*args, **kwargs)

    monkeypatch.setattr(capture_ahead, "capture", traced)
    before = history(dbs, spec)

    result = apply(spec, max_changes=BATCH, spark=spark)

    native.wait_caught_up()
    dbs.assert_same(TABLES)
    assert result.drained and not result.budget_exhausted, result.summary()
    batches = history(dbs, spec)[len(before):]
    assert result.batches == len(batches) >= 5, (result.batches, batches)
    assert result.batch_ids == [b[0] for b in batches] and result.batch_id == batches[-1][0]
    # Every batch is bounded (slot rows include BEGIN/COMMIT: at most BATCH changes, whole transactions).
    assert all(changes <= BATCH for _, _, changes, _, _ in batches), batches
    assert result.changes == sum(b[2] for b in batches) >= 240
    assert result.transactions == sum(b[1] for b in batches) == 24
    # The batches chain: each starts where the one before ended.
    assert all(a[4] == b[3] for a, b in zip(batches, batches[1:], strict=False)), batches
    assert (result.start_lsn, result.end_lsn) == (batches[0][3], batches[-1][4])
    assert parse_lsn(result.end_lsn) >= parse_lsn(result.target_lsn)
    # The last capture reached the target (cut by the bound or not: the run does not capture again to learn that).
    assert result.lag_bytes is not None and parse_lsn(result.capture["end_lsn"]) >= parse_lsn(result.target_lsn)
    assert all(state == "r" for _, _, state, _ in positions(dbs, spec))
    assert len(started) == 1, started  # one Spark session for every batch of the run
    # From the second batch on, each batch's capture ran in a thread while the batch before it was applied;
    # the segments held back meanwhile were pruned once it had finished: the log keeps its newest only.
    assert len(captured_on) == result.batches and captured_on[0] == threading.main_thread().name, captured_on
    assert all(name.startswith(f"rowfilter-capture-{spec.subscription}") for name in captured_on[1:]), captured_on
    assert len(ChangeLog(spec.change_log_dir()).segments()) == 1
    # Between batches the run says how far it is toward its target (a long drain is not silent).
    progress = [r.getMessage() for r in caplog.records if r.name == PROGRESS_LOGGER]
    assert len(progress) == result.batches - 1 and "changes in" in progress[0], progress
    assert f"of WAL to the run's target {result.target_lsn}" in progress[0] and "% done" in progress[0], progress


def test_without_a_bound_the_captures_ahead_grow_while_a_backlog_waits(dbs, spark, tmp_path, monkeypatch):
    """No max_changes: the first capture at the default bound, the next ones sized to about BACKLOG_BATCH_CHANGES
    changes at the last capture's share of changes among its slot rows (here scaled down: 50, then ~90 changes).
    Judged by the publisher, so that no batch needs Spark (the batch sizes are the capture's business)."""
    dbs.create(PUBLISHER, SUBSCRIBER)
    native = dbs.subscribe_native(PUBLICATIONS)
    _, spec = write_spec(dbs, tmp_path, filtering="source")
    run_ours(spec, spark)
    monkeypatch.setattr(capture_ahead, "DEFAULT_MAX_CHANGES", BATCH)
    monkeypatch.setattr(capture_ahead, "BACKLOG_BATCH_CHANGES", 90)
    monkeypatch.setattr(capture_ahead, "BACKLOG_MAX_CHANGES", 4 * BATCH)
    publish(dbs.publisher, backlog(24))  # 240 changes of t and u in 24 transactions
    bounds = []
    real_capture = capture_ahead.capture

    def traced(*args, **kwargs):
        bounds.append(kwargs["max_changes"])
        return real_capture(*args, **kwargs)

    monkeypatch.setattr(capture_ahead, "capture", traced)
    before = history(dbs, spec)

    result = apply(spec)

    native.wait_caught_up()
    dbs.assert_same(TABLES)
    assert result.drained, result.summary()
    changes = [b[2] for b in history(dbs, spec)[len(before):]]
    assert bounds[0] == BATCH and all(BATCH < b < 4 * BATCH for b in bounds[1:]) and len(bounds) >= 2, bounds
    # whole transactions of at most 10 changes each: the first batch within 50 (+ one), a later one past it
    assert changes[0] <= BATCH + 10 and BATCH < max(changes) <= 90 + 10, changes
    assert sum(changes) == result.changes


def test_a_drain_in_a_task_captures_ahead_with_the_passwords_it_was_handed(dbs, spark, tmp_path, monkeypatch, caplog,
                                                                         password_roles):
    """Issue 29, item 1: ApplyChangesOperator runs the job's batches in its task, the passwords handed in through
    connection.py ``in_task`` (a context variable), none in the environment. The capture ahead of the next batch
    runs in a thread: it must get them too, so that a multi-batch run with password roles neither falls back to
    the Spark job nor warns."""
    dbs.create(PUBLISHER, SUBSCRIBER)
    native = dbs.subscribe_native(PUBLICATIONS)
    _, spec = write_spec(dbs, tmp_path, filtering="source")  # judged by the publisher: no batch needs Spark
    run_ours(spec, spark)
    apply(spec, spark=spark)  # the job's first run records its change log (a task's run goes on only in that one)
    for env in ("ROWFILTER_PUBLISHER_PASSWORD", "ROWFILTER_SUBSCRIBER_PASSWORD"):
        monkeypatch.delenv(env)
    publish(dbs.publisher, backlog(24))
    captured_on = []
    real_capture = capture_ahead.capture

    def traced(*args, **kwargs):
        captured_on.append(threading.current_thread().name)
        return real_capture(*args, **kwargs)

    monkeypatch.setattr(capture_ahead, "capture", traced)
    held_paths = []  # per batch: whether each of its segments was taken from the capture's memory (not read back)
    real_reduce_here = reducers.reduce_here

    def spied(batch, token, held=None):
        held_paths.append([path in (held or {}) for path in batch.paths])
        return real_reduce_here(batch, token, held)

    monkeypatch.setattr(reducers, "reduce_here", spied)
    caplog.set_level(logging.INFO)
    handed = {role: password_roles[role].password for role in ("publisher", "subscriber")}
    with in_task(handed, connect_timeout=10):
        result = apply(spec, max_changes=BATCH, without_spark=True)

    assert result.drained and result.batches >= 3, result.summary()
    assert all(name.startswith(f"rowfilter-capture-{spec.subscription}") for name in captured_on[1:]), captured_on
    assert len(captured_on) == result.batches, captured_on
    # The first batch's segment was captured in this thread before its plan: reduced from the capture's own rows.
    # A later plan may also take a segment the capture ahead published before it was handed over: read back.
    assert held_paths and held_paths[0][0], held_paths
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    native.wait_caught_up()
    dbs.assert_same(TABLES)


def test_a_backlog_already_in_the_log_is_applied_in_slices(dbs, spark, subscribed):
    """A run that captured and stopped (the capture job, or a crash) left many segments: the next run applies
    them about ``max_changes`` changes at a time, not all in one batch."""
    native, _, spec = subscribed
    publish(dbs.publisher, backlog(24))
    while capture(spec, max_changes=BATCH).more:  # the log holds everything; the subscriber nothing of it
        pass
    before = history(dbs, spec)

    result = apply(spec, max_changes=120, spark=spark)

    native.wait_caught_up()
    dbs.assert_same(TABLES)
    batches = history(dbs, spec)[len(before):]
    assert result.drained and result.batches == len(batches) >= 2, (result.summary(), batches)
    assert all(changes <= 120 for _, _, changes, _, _ in batches), batches
    assert sum(b[2] for b in batches) == result.changes >= 240


def test_changes_committed_after_the_run_started_wait_for_the_next_run(dbs, spark, subscribed, monkeypatch):
    native, _, spec = subscribed
    publish(dbs.publisher, backlog(12))
    late: list[str] = []
    real_capture = capture_ahead.capture

    def capture_then_write(*args, **kwargs):
        # A busy publisher: after each of the run's captures, another transaction bigger than a batch commits.
        captured = real_capture(*args, **kwargs)
        if len(late) < 6:  # a bound of its own, so that a run that chased them could not run for ever
            base = 50_000 + 100 * len(late)
            late.append(f"({base},")
            publish(dbs.publisher, [f"INSERT INTO t SELECT g, 1, 'late' FROM generate_series({base}, {base + 59}) g"])
        return captured

    monkeypatch.setattr(capture_ahead, "capture", capture_then_write)
    result = apply(spec, max_changes=BATCH, spark=spark)

    assert result.drained and result.batches >= 2, result.summary()
    assert len(late) < 6, "the run chased the changes committed after it started"
    ours = table_rows(dbs.ours, "t")
    assert not [r for r in ours if "late" in r], "a transaction committed after the run started was applied"
    assert [r for r in expected(dbs, "t") if "late" not in r] == ours  # everything committed before it started
    assert table_rows(dbs.ours, "u") == expected(dbs, "u")
    monkeypatch.setattr(capture_ahead, "capture", real_capture)

    after = apply(spec, max_changes=BATCH, spark=spark)
    native.wait_caught_up()
    assert after.drained
    dbs.assert_same(TABLES)
    assert sum(1 for r in table_rows(dbs.ours, "t") if "late" in r) == 45 * len(late)  # 60 keys, id % 4 <> 0


def test_a_time_budget_stops_between_batches_and_the_next_run_goes_on(dbs, spark, subscribed, capsys):
    native, path, spec = subscribed
    publish(dbs.publisher, backlog(16))
    before = history(dbs, spec)

    capsys.readouterr()  # the command, on the session's Spark
    assert cli.main(["apply", "--spec", str(path), "--max-changes", str(BATCH), "--time-budget", "0", "--json"]) == 0
    first = json.loads(capsys.readouterr().out.strip().splitlines()[-1])

    assert (first["batches"], first["budget_exhausted"], first["drained"]) == (1, True, False), first
    assert first["time_budget"] == 0 and first["batch_ids"] == [history(dbs, spec)[-1][0]]
    assert len(history(dbs, spec)) == len(before) + 1
    assert 0 < first["changes"] <= BATCH
    new_rows = "SELECT count(*) FROM t WHERE id >= 10000 AND id % 4 <> 0"
    with psycopg.connect(dbs.ours, autocommit=True) as conn:
        applied = conn.execute(new_rows).fetchone()[0]
    with psycopg.connect(dbs.publisher, autocommit=True) as conn:
        published = conn.execute(new_rows).fetchone()[0]
    assert 0 < applied < published, (applied, published)  # the first batch's rows of t, not all

    rest = apply(spec, max_changes=BATCH, spark=spark, time_budget=3600)
    native.wait_caught_up()
    assert rest.drained and not rest.budget_exhausted and rest.batches >= 2, rest.summary()
    dbs.assert_same(TABLES)
    assert first["changes"] + rest.changes >= 160


def test_a_conflict_in_a_later_batch_keeps_the_earlier_batches(dbs, spark, subscribed, capsys, caplog):
    native, path, spec = subscribed
    publish(dbs.ours, ["INSERT INTO t VALUES (5001, 0, 'local row')"])
    statements = backlog(12)
    statements.append("BEGIN; INSERT INTO t VALUES (5001, 1, 'remote row'); "
                      "INSERT INTO t SELECT g, 2, 'same transaction' FROM generate_series(6001, 6009) g; COMMIT")
    publish(dbs.publisher, statements)
    conflict_at = wal_lsn(dbs.publisher)
    before = history(dbs, spec)

    capsys.readouterr()
    code = apply_job.main(["--spec", str(path), "--max-changes", str(BATCH)])
    out, err = capsys.readouterr()

    assert code == 1, err[-3000:]
    assert not out.strip(), out  # no summary line: the run failed
    assert 'conflict detected on relation "public.t": conflict=insert_exists' in err, err[-3000:]
    assert "this run committed" in caplog.text, caplog.text[-3000:]
    committed = history(dbs, spec)[len(before):]
    assert committed, "the batches before the conflicting one were not kept"
    end = parse_lsn(committed[-1][4])
    assert end < conflict_at
    # The subscriber holds exactly the committed batches: every table at their end, nothing of the failed batch.
    assert {lsn for _, _, _, lsn in positions(dbs, spec)} == {committed[-1][4]}
    ours = table_rows(dbs.ours, "t")
    assert '(5001,0,"local row")' in ours and not [r for r in ours if "same transaction" in r]
    with psycopg.connect(dbs.ours, autocommit=True) as conn:
        applied = {k for (k,) in conn.execute("SELECT id FROM t WHERE id >= 10000")}
    transactions = [{g for g in range(10_000 + i * 10, 10_010 + i * 10) if g % 4} for i in range(12) if i % 4 != 3]
    whole = [keys <= applied for keys in transactions]
    assert whole[0] and whole == sorted(whole, reverse=True), whole  # a prefix of the transactions, each whole
    assert applied == set().union(*(k for k, w in zip(transactions, whole, strict=True) if w))

    publish(dbs.ours, ["DELETE FROM t WHERE id = 5001"])
    result = apply(spec, max_changes=BATCH, spark=spark)
    native.wait_caught_up()
    assert result.drained
    dbs.assert_same(TABLES)
