"""ApplyChanges killed for real at every fault point, then rerun: nothing lost, nothing applied twice.

Each case runs the job as its own process (``python -m airflow_provider_rowfilter.jobs.apply``) with
``ROWFILTER_FAULT`` naming one point of core/faults.POINTS, so the process SIGKILLs itself there (no
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

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psycopg
import pytest
import yaml

from airflow_provider_rowfilter.change_log.log import DEFAULT_ROW_GROUP_ROWS, TEMP_PREFIX, ChangeLog
from airflow_provider_rowfilter.core import faults
from airflow_provider_rowfilter.core.lsn import parse_lsn
from airflow_provider_rowfilter.core.spec import SubscriptionSpec
from airflow_provider_rowfilter.jobs import apply as apply_job
from airflow_provider_rowfilter.publisher.capture_objects import capture_names
from airflow_provider_rowfilter.tooling.native import table_rows
from tests.jobs.test_snapshot_differential import Databases, run_ours

TABLES = ("t", "u")
SUBSCRIBER = """
CREATE TABLE t(id int PRIMARY KEY, grp int, v text);
CREATE TABLE u(k int, s text, n int, PRIMARY KEY (k, s));
"""


def publisher_sql(t_rows: int, u_rows: int) -> str:
    """t: replica identity DEFAULT, filtered on its key; u: FULL, filtered on a key and a non-key column."""
    return SUBSCRIBER + f"""
ALTER TABLE u REPLICA IDENTITY FULL;
INSERT INTO t SELECT g, g % 5, 't' || g FROM generate_series(1, {t_rows}) g;
INSERT INTO u SELECT g, (ARRAY['a', 'b', 'c'])[1 + g % 3], g FROM generate_series(1, {u_rows}) g;
CREATE PUBLICATION pf_t FOR TABLE t WHERE (id % 4 <> 0);
CREATE PUBLICATION pf_u FOR TABLE u WHERE (n > 50 AND s <> 'c');
"""


PUBLISHER = publisher_sql(200, 200)
PUBLICATIONS = ("pf_t", "pf_u")
SPARK_CONF = {"spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false",
              "spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2"}
JOB_TIMEOUT = 180


def changes(round_: int) -> list[str]:
    """One round of publisher transactions on fresh keys (rounds never touch each other's rows)."""
    base = 1000 * (round_ + 1)  # fresh keys of t for this round
    lo = 40 * round_  # rows of the initial 200 this round updates/deletes
    return [
        f"INSERT INTO t SELECT g, g % 5, 'new' || g FROM generate_series({base}, {base + 39}) g",
        f"BEGIN; UPDATE t SET v = v || '+', grp = NULL WHERE id BETWEEN {lo + 1} AND {lo + 10}; "
        f"UPDATE t SET id = id + {base + 101} WHERE id BETWEEN {lo + 11} AND {lo + 20}; "  # key change, in/out
        f"DELETE FROM t WHERE id BETWEEN {lo + 21} AND {lo + 26}; "
        f"UPDATE u SET n = n + 40 WHERE k BETWEEN {lo + 1} AND {lo + 40}; COMMIT",  # some enter the filter
        f"BEGIN; UPDATE u SET s = 'c' WHERE k BETWEEN {lo + 21} AND {lo + 30} AND s <> 'c'; "  # leave it (key)
        f"INSERT INTO u SELECT g, 'a', g % 100 FROM generate_series({base}, {base + 29}) g; "
        f"DELETE FROM u WHERE k BETWEEN {lo + 31} AND {lo + 36}; "
        f"INSERT INTO t VALUES ({base + 50}, 1, 'short-lived'); UPDATE t SET v = 'twice' WHERE id = {base + 50}; "
        f"DELETE FROM t WHERE id = {base + 50}; COMMIT",
    ]


def bulk(round_: int) -> str:
    """More changes than one row group of the change log, in one transaction."""
    start = 100_000 * (round_ + 1)
    return (f"INSERT INTO t SELECT g, g % 7, 'bulk' FROM generate_series({start}, "
            f"{start + DEFAULT_ROW_GROUP_ROWS + 1999}) g")


def publish(dsn: str, statements: list[str]) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for s in statements:
            conn.execute(s)


class Job:
    """One subscription of ours, driven through the job's command line."""

    def __init__(self, dbs: Databases, tmp_path: Path) -> None:
        self.dbs = dbs
        self.name = f"fault_{uuid.uuid4().hex[:10]}"
        self.change_log = tmp_path / "changes"
        self.spec_path = tmp_path / "spec.yaml"
        self.spec_path.write_text(yaml.safe_dump({
            "subscription": self.name, "publisher": dbs.publisher, "subscriber": dbs.ours,
            "publications": list(PUBLICATIONS), "change_log": str(self.change_log),
            "spark_master": "local[2]", "spark_conf": SPARK_CONF}))
        self.spec = SubscriptionSpec.load(self.spec_path)
        self.slot = capture_names(self.name)[0]
        self.workdir = tmp_path

    def run(self, fault: str | None = None) -> subprocess.CompletedProcess:
        env = {k: v for k, v in os.environ.items() if k != faults.ENV}
        if fault is not None:
            env[faults.ENV] = fault
        done = subprocess.run(
            [sys.executable, "-m", "airflow_provider_rowfilter.jobs.apply", "--spec", str(self.spec_path)],
            env=env, cwd=self.workdir, capture_output=True, text=True, timeout=JOB_TIMEOUT, check=False)
        self.wait_disconnected()
        self.check_slot_within_log()
        return done

    def run_in_process(self, capsys: pytest.CaptureFixture[str]) -> subprocess.CompletedProcess:
        """The job's entry point in this process, on the session's Spark (for runs nobody kills)."""
        capsys.readouterr()
        code = apply_job.main(["--spec", str(self.spec_path)])
        out, err = capsys.readouterr()
        self.check_slot_within_log()
        return subprocess.CompletedProcess(["jobs.apply"], code, out, err)

    def summary(self, done: subprocess.CompletedProcess) -> dict:
        assert done.returncode == 0, done.stderr[-4000:]
        return json.loads(done.stdout.strip().splitlines()[-1])

    def wait_disconnected(self, timeout: float = 30) -> None:
        """The killed job's sessions are gone (its advisory lock and the slot are free again)."""
        deadline = time.monotonic() + timeout
        with psycopg.connect(self.dbs.publisher, autocommit=True) as conn:
            while True:
                left = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE %s",
                    (f"rowfilter:{self.name}%",)).fetchone()[0]
                active = conn.execute("SELECT active FROM pg_replication_slots WHERE slot_name = %s",
                                      (self.slot,)).fetchone()
                if not left and not (active and active[0]):
                    return
                assert time.monotonic() < deadline, f"{left} sessions of {self.name} still there"
                time.sleep(0.05)

    def slot_position(self) -> int:
        with psycopg.connect(self.dbs.publisher, autocommit=True) as conn:
            return parse_lsn(conn.execute("SELECT confirmed_flush_lsn::text FROM pg_replication_slots "
                                          "WHERE slot_name = %s", (self.slot,)).fetchone()[0])

    def check_slot_within_log(self) -> None:
        """The slot is never confirmed past what the change log holds durably."""
        logged = ChangeLog(self.change_log).captured_through()
        slot = self.slot_position()
        if logged is None:
            assert slot == self.initial_slot, "the slot moved although the log holds nothing"
        else:
            assert slot <= logged, f"slot at {slot:X}, past the change log's end {logged:X}"

    def positions(self) -> list[tuple]:
        with psycopg.connect(self.dbs.ours, autocommit=True) as conn:
            return conn.execute(
                "SELECT schema_name, table_name, state, lsn::text FROM rowfilter.subscription_rel "
                "WHERE subscription = %s ORDER BY 1, 2", (self.name,)).fetchall()

    def ours(self) -> dict[str, list[str]]:
        return {t: table_rows(self.dbs.ours, t) for t in TABLES}

    def staged_rows(self) -> int:
        with psycopg.connect(self.dbs.ours, autocommit=True) as conn:
            return conn.execute("SELECT count(*) FROM rowfilter.apply_stage").fetchone()[0]


@pytest.fixture
def job(dbs, spark, tmp_path):
    dbs.create(PUBLISHER, SUBSCRIBER)
    native = dbs.subscribe_native(PUBLICATIONS)
    ours = Job(dbs, tmp_path)
    run_ours(ours.spec, spark)  # refresh + initial copy, in this process
    ours.initial_slot = ours.slot_position()
    ours.native = native
    return ours


def assert_same_as_native(job: Job) -> None:
    job.native.wait_caught_up()
    for table in TABLES:
        assert table_rows(job.dbs.ours, table) == table_rows(job.dbs.native, table), f"table {table} differs"


@pytest.mark.parametrize("point", faults.POINTS)
def test_killed_at_fault_point_then_rerun_matches_native(job, point):
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
    if point == "capture-after-segment":
        assert rerun["capture"]["recovered_lsn"] is not None, rerun["capture"]
    assert_same_as_native(job)
    assert all(state == "r" for _, _, state, _ in job.positions())
    assert job.staged_rows() == 0
    assert not any(p.name.startswith(TEMP_PREFIX) for p in job.change_log.iterdir())
    assert job.slot_position() >= parse_lsn(rerun["end_lsn"]) or rerun["end_lsn"] is None


def test_conflict_stops_the_batch_untouched_then_rerun_after_fix(job, capsys):
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
    assert "Key (id)=(5001) already exists in the subscriber" in error, error
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
