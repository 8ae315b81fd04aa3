"""The apply tests' scenario: two filtered tables (t: replica identity DEFAULT, u: FULL), rounds of
publisher changes, and a subscription of ours driven through the job's command line (``Job``).

Shared by tests/e2e/jobs (faults, options, relations, change-log continuity) and tests/airflow; the
``job`` fixture in tests/e2e/jobs/conftest.py builds the scenario with a native subscription beside it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psycopg
import pytest
import yaml

from airflow_provider_rowfilter import faults
from airflow_provider_rowfilter.change_log.segment_writer import DEFAULT_ROW_GROUP_ROWS
from airflow_provider_rowfilter.change_log.store import open_change_log
from airflow_provider_rowfilter.core.lsn import parse_lsn
from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec
from airflow_provider_rowfilter.jobs import apply as apply_job
from airflow_provider_rowfilter.publisher.capture_objects import capture_names
from airflow_provider_rowfilter.tooling.native import table_rows
from tests.e2e.jobs.databases import Databases, names

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

    def __init__(self, dbs: Databases, tmp_path: Path, filtering: str = "auto", change_log: str | None = None) -> None:
        self.dbs = dbs
        self.name = f"fault_{uuid.uuid4().hex[:10]}"
        self.change_log = tmp_path / "changes"  # a directory; or the spec's change_log URL (an object store)
        self.spec_path = tmp_path / "spec.yaml"
        self.spec_path.write_text(yaml.safe_dump({
            "subscription": self.name, "publisher": dbs.publisher, "subscriber": dbs.ours,
            "publications": list(PUBLICATIONS), "change_log": change_log or str(self.change_log),
            "spark_master": "local[2]", "spark_conf": SPARK_CONF, "filtering": filtering}))
        self.spec = SubscriptionSpec.load(self.spec_path)
        self.slot = capture_names(self.name)[0]
        self.workdir = tmp_path

    def run(self, fault: str | None = None, *args: str) -> subprocess.CompletedProcess:
        env = {k: v for k, v in os.environ.items() if k != faults.ENV}
        if fault is not None:
            env[faults.ENV] = fault
        done = subprocess.run(
            [sys.executable, "-m", "airflow_provider_rowfilter.jobs.apply", "--spec", str(self.spec_path), *args],
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
        logged = open_change_log(self.spec).captured_through()
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


def assert_same_as_native(job: Job) -> None:
    job.native.wait_caught_up()
    for table in TABLES:
        assert table_rows(job.dbs.ours, table) == table_rows(job.dbs.native, table), f"table {table} differs"



def wal_lsn(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return parse_lsn(conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0])


def write_spec(dbs: Databases, tmp_path: Path, **extra) -> tuple[Path, SubscriptionSpec]:
    """A spec file (the command line reads it) and the spec it loads to (what apply() gets)."""
    name = f"opt_{next(names)}"
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({
        "subscription": name, "publisher": dbs.spec_publisher, "subscriber": dbs.spec_ours,
        "publications": list(PUBLICATIONS), "change_log": str(tmp_path / name / "changes"), **extra}))
    return path, SubscriptionSpec.load(path)


def positions(dbs: Databases, spec: SubscriptionSpec) -> list[tuple]:
    with psycopg.connect(dbs.ours, autocommit=True) as conn:
        return conn.execute("SELECT schema_name, table_name, state, lsn::text FROM rowfilter.subscription_rel "
                            "WHERE subscription = %s ORDER BY 1, 2", (spec.subscription,)).fetchall()


def subscription(dbs: Databases, spec: SubscriptionSpec) -> dict:
    with psycopg.connect(dbs.ours, autocommit=True) as conn:
        row = conn.execute("SELECT skip_lsn::text, applied_lsn::text, last_error FROM rowfilter.subscription "
                           "WHERE name = %s", (spec.subscription,)).fetchone()
    return dict(zip(("skip_lsn", "applied_lsn", "last_error"), row, strict=True))


FILTERS = {"t": "id % 4 <> 0", "u": "n > 50 AND s <> 'c'"}


def expected(dbs, table: str, name: str | None = None) -> list[str]:
    """The publisher's rows of ``table`` (now called ``name``) that its filter keeps: what the subscriber must hold."""
    with psycopg.connect(dbs.publisher, autocommit=True) as conn:
        rows = conn.execute(f"SELECT x::text FROM {name or table} x WHERE {FILTERS[table]}").fetchall()
    return sorted(r[0] for r in rows)


def frozen(dbs, spec) -> tuple:
    """Everything a stopped batch must leave as it was: both tables, subscription_rel whole, batch_history."""
    with psycopg.connect(dbs.ours, autocommit=True) as conn:
        rel = conn.execute("SELECT schema_name, table_name, state, lsn::text FROM rowfilter.subscription_rel "
                           "WHERE subscription = %s ORDER BY 1, 2", (spec.subscription,)).fetchall()
        batches = conn.execute("SELECT count(*) FROM rowfilter.batch_history WHERE subscription = %s",
                               (spec.subscription,)).fetchone()[0]
    return table_rows(dbs.ours, "t"), table_rows(dbs.ours, "u"), rel, batches


def table_error(dbs, spec, table: str) -> str | None:
    with psycopg.connect(dbs.ours, autocommit=True) as conn:
        return conn.execute("SELECT last_error FROM rowfilter.subscription_rel WHERE subscription = %s AND "
                            "schema_name || '.' || table_name = %s", (spec.subscription, table)).fetchone()[0]
