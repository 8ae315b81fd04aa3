"""One writer per subscription, held by the database: two workers that share no disk race for one subscription."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest
import yaml

from airflow_provider_rowfilter.change_log.store import open_change_log
from airflow_provider_rowfilter.core.lsn import parse_lsn
from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec
from airflow_provider_rowfilter.flows.refresh import refresh
from airflow_provider_rowfilter.jobs import capture as capture_job
from airflow_provider_rowfilter.publisher.writer_lock import writer_lock_key

LOCK_HOLDER = """SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 2
                   AND classid = hashtext(%s)::oid AND objid = hashtext(%s)::oid"""


def worker_spec(tmp_path: Path, name: str, pub: str, sub: str, change_log: str | None = None) -> Path:
    """A worker's spec file, its change log on a disk of its own (a folder no other worker reads), or ``change_log``."""
    folder = tmp_path / name
    folder.mkdir()
    path = folder / "s1.yaml"
    path.write_text(yaml.safe_dump({"subscription": "s1", "publisher": pub, "subscriber": sub,
                                    "publications": ["p1"], "filtering": "spark",
                                    **({"change_log": change_log} if change_log else {})}))
    return path


@pytest.mark.parametrize("where", ["two-disks", "one-bucket"])
def test_two_workers_without_a_shared_disk_race_for_one_subscription_and_only_one_captures(fresh_db, tmp_path,
                                                                                           capsys, request, where):
    """Issue 32, item 2: the flock of a local ``.lock`` file held nothing between two machines; each worker would
    capture into its own disk, and the slot would advance past changes the other log holds. The writer lock is in
    the subscriber: worker B is refused while A captures, naming A's session, and its log stays empty. The same
    with both workers' log in one bucket (where there is no flock at all)."""
    pub, sub = fresh_db(), fresh_db()
    with psycopg.connect(pub, autocommit=True) as conn:
        conn.execute("CREATE TABLE t1 (a int PRIMARY KEY, b text); CREATE PUBLICATION p1 FOR TABLE t1")
    url = request.getfixturevalue("s3_log") if where == "one-bucket" else None
    a_path, b_path = (worker_spec(tmp_path, "worker-a", pub, sub, url), worker_spec(tmp_path, "worker-b", pub, sub, url))
    refresh(SubscriptionSpec.load(a_path))
    with psycopg.connect(pub, autocommit=True) as conn:
        conn.execute("INSERT INTO t1 SELECT g, 'v' || g FROM generate_series(1, 3000) g")
    began = time.monotonic()
    worker_a = subprocess.Popen([sys.executable, "-m", "airflow_provider_rowfilter.jobs.capture", "--spec",
                                 str(a_path), "--fetch-rows", "5"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        with psycopg.connect(sub, autocommit=True) as conn:
            deadline = time.monotonic() + 60
            while not conn.execute(LOCK_HOLDER, writer_lock_key("s1")).fetchall():
                assert worker_a.poll() is None, worker_a.stderr.read().decode() if worker_a.stderr else ""
                assert time.monotonic() < deadline, "worker A never took the writer lock"
                time.sleep(0.005)
            os.kill(worker_a.pid, signal.SIGSTOP)  # A holds the lock, mid-capture
            (holder,) = conn.execute(LOCK_HOLDER, writer_lock_key("s1")).fetchone()
        assert capture_job.main(["--spec", str(b_path)]) == 1
        err = capsys.readouterr().err
        assert f"another capture of subscription 's1' holds its change log (PID {holder} in the subscriber)" in err
        assert not open_change_log(SubscriptionSpec.load(b_path)).segments()
    finally:
        os.kill(worker_a.pid, signal.SIGCONT)
        out, err_a = worker_a.communicate(timeout=120)
    assert worker_a.returncode == 0, err_a.decode()
    summary = json.loads(out.decode().strip().splitlines()[-1])
    assert summary["changes"] == 3000
    with psycopg.connect(pub) as conn:
        slot = conn.execute("SELECT confirmed_flush_lsn::text FROM pg_replication_slots "
                            "WHERE slot_name = 'rowfilter_s1'").fetchone()[0]
    assert parse_lsn(slot) == parse_lsn(summary["end_lsn"])  # A's segment, and only A's, moved the slot
    print(f"race test: {time.monotonic() - began:.1f} s")


def test_a_capture_killed_holding_the_lock_releases_it(fresh_db, tmp_path, capsys):
    """A worker that vanishes (SIGKILL) leaves no lock behind: the next capture goes on."""
    pub, sub = fresh_db(), fresh_db()
    with psycopg.connect(pub, autocommit=True) as conn:
        conn.execute("CREATE TABLE t1 (a int PRIMARY KEY, b text); CREATE PUBLICATION p1 FOR TABLE t1; "
                     "INSERT INTO t1 VALUES (1, 'x')")
    path = worker_spec(tmp_path, "worker", pub, sub)
    refresh(SubscriptionSpec.load(path))
    with psycopg.connect(pub, autocommit=True) as conn:
        conn.execute("INSERT INTO t1 VALUES (2, 'y')")
    killed = subprocess.run([sys.executable, "-m", "airflow_provider_rowfilter.jobs.capture", "--spec", str(path)],
                            env={**os.environ, "ROWFILTER_FAULT": "capture-after-segment"}, capture_output=True)
    assert killed.returncode == -signal.SIGKILL
    assert capture_job.main(["--spec", str(path)]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["recovered_lsn"] is not None  # the killed run's segment, finished by this one
