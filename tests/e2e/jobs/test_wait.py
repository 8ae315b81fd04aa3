"""★ Read-your-writes (issue 46): `rowfilter wait --lsn X` / `--at TIME` against a real publisher and subscriber.

The wait ends once the product's own apply has brought every table past the publisher LSN of a commit: not before
(a timeout exits 4 and names the tables behind), and at once after. A recorded error ends it with exit 1.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
import yaml

from airflow_provider_rowfilter import cli
from airflow_provider_rowfilter.core.lsn import parse_lsn
from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec
from airflow_provider_rowfilter.flows.apply.drain import apply
from airflow_provider_rowfilter.jobs.refresh import refresh
from airflow_provider_rowfilter.jobs.snapshot import sync_tables

TABLES = """CREATE TABLE t1 (id int PRIMARY KEY, v int); CREATE TABLE t2 (id int PRIMARY KEY, note text);"""


def execute(dsn: str, *statements: str) -> str:
    """Run the statements, then read the position of what they committed (as a writer would, after COMMIT)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)
        return conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()[0]


@pytest.fixture
def synced(fresh_db, tmp_path):
    pub, sub = fresh_db(), fresh_db()
    execute(pub, TABLES, "INSERT INTO t1 SELECT g, g FROM generate_series(1, 50) g",
            "CREATE PUBLICATION p FOR TABLE t1 WHERE (v > 10), t2")
    execute(sub, TABLES)
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({"subscription": "waits", "publisher": pub, "subscriber": sub,
                                    "publications": ["p"], "change_log": str(tmp_path / "log")}))
    spec = SubscriptionSpec.load(path)
    refresh(spec)
    assert sync_tables(spec).ok
    apply(spec)
    return pub, sub, spec, path


def test_wait_ends_once_the_apply_has_passed_the_commit(synced, capsys):
    pub, sub, spec, path = synced
    lsn = execute(pub, "INSERT INTO t1 VALUES (100, 100)", "INSERT INTO t2 VALUES (1, 'x')")
    # Before the apply: the tables stand before the commit, the timeout says which and exits 4.
    began = time.monotonic()
    assert cli.main(["wait", "--spec", str(path), "--lsn", lsn, "--timeout", "1.5", "--interval", "0.2"]) == 4
    assert time.monotonic() - began >= 1.5
    err = capsys.readouterr().err
    assert f"timed out after 1.5 s waiting for subscription waits to apply past {lsn}" in err
    assert "behind: public.t1 (r at " in err and "public.t2 (r at " in err
    # The apply runs while the wait waits: the wait ends then, the rows are there.
    threading.Timer(1.0, apply, (spec,)).start()
    began = time.monotonic()
    assert cli.main(["wait", "--spec", str(path), "--lsn", lsn, "--timeout", "60", "--interval", "0.2",
                     "--json"]) == 0
    waited = time.monotonic() - began
    assert 1.0 <= waited < 30, waited
    out = capsys.readouterr().out
    assert f'"lsn": "{lsn}", "done": true' in out
    with psycopg.connect(sub, autocommit=True) as conn:
        assert conn.execute("SELECT v FROM t1 WHERE id = 100").fetchone() == (100,)
        assert conn.execute("SELECT note FROM t2 WHERE id = 1").fetchone() == ("x",)
        positions = [r[0] for r in conn.execute("SELECT lsn::text FROM rowfilter.subscription_rel")]
    assert all(parse_lsn(p) >= parse_lsn(lsn) for p in positions)
    # An LSN already passed: at once.
    assert cli.main(["wait", "--spec", str(path), "--lsn", lsn, "--timeout", "0"]) == 0
    assert f"every table has applied past {lsn}" in capsys.readouterr().out


def test_wait_at_a_time(synced, capsys):
    pub, sub, spec, path = synced
    execute(pub, "INSERT INTO t1 VALUES (200, 200)")
    # A past time: the position when asked, which holds it; said so. Not there before the apply; there after it.
    past = (datetime.now(UTC) - timedelta(seconds=5)).isoformat()
    assert cli.main(["wait", "--spec", str(path), "--at", past, "--timeout", "0.5", "--interval", "0.1"]) == 4
    err = capsys.readouterr().err
    assert "PostgreSQL keeps no map from a past time to a WAL position" in err and "timed out" in err
    codes: list[int] = []
    waiter = threading.Thread(target=lambda: codes.append(cli.main([
        "wait", "--spec", str(path), "--at", past, "--timeout", "30", "--interval", "0.2"])))
    waiter.start()
    time.sleep(1.0)
    apply(spec)
    waiter.join(30)
    assert codes == [0]
    capsys.readouterr()
    # A time 2 s ahead: read when the publisher's clock reaches it, so it holds the commit made before it and not
    # the one made after it.
    ahead = datetime.now(UTC) + timedelta(seconds=2)
    codes = []
    waiter = threading.Thread(target=lambda: codes.append(cli.main([
        "wait", "--spec", str(path), "--at", ahead.isoformat(), "--timeout", "30", "--interval", "0.2", "--json"])))
    waiter.start()
    time.sleep(1.0)
    before_t = execute(pub, "INSERT INTO t1 VALUES (201, 201)")
    while datetime.now(UTC) < ahead + timedelta(seconds=1):
        time.sleep(0.1)
    after_t = execute(pub, "SELECT 1")  # the position before the next commit
    execute(pub, "INSERT INTO t1 VALUES (202, 202)")
    time.sleep(0.5)
    assert waiter.is_alive()  # nothing applied yet
    apply(spec)
    waiter.join(30)
    assert codes == [0]
    out = capsys.readouterr()
    assert "PostgreSQL keeps no map" not in out.err  # exact: read at the time
    waited_for = json.loads(out.out.strip().splitlines()[-1])["lsn"]
    assert parse_lsn(before_t) <= parse_lsn(waited_for) <= parse_lsn(after_t)


def test_wait_fails_at_once_on_a_recorded_error_and_refuses_bad_input(synced, capsys):
    pub, sub, spec, path = synced
    lsn = execute(pub, "INSERT INTO t1 VALUES (300, 300)")
    with psycopg.connect(sub, autocommit=True) as conn:
        conn.execute("UPDATE rowfilter.subscription SET last_error = 'duplicate key value violates unique "
                     "constraint \"t1_pkey\"' WHERE name = 'waits'")
    began = time.monotonic()
    assert cli.main(["wait", "--spec", str(path), "--lsn", lsn, "--timeout", "60"]) == 1
    assert time.monotonic() - began < 10
    err = capsys.readouterr().err
    assert "subscription 'waits' stopped with an error: duplicate key value violates unique constraint" in err
    assert cli.main(["wait", "--spec", str(path), "--lsn", "not-an-lsn"]) == 1
    assert "invalid input syntax for type pg_lsn: 'not-an-lsn'" in capsys.readouterr().err
    assert cli.main(["wait", "--spec", str(path), "--at", "2026-12-02T09:00"]) == 1
    assert "has no time zone" in capsys.readouterr().err


def test_the_command_exits_4_on_timeout(synced):
    pub, sub, spec, path = synced
    lsn = execute(pub, "INSERT INTO t1 VALUES (400, 400)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-m", "airflow_provider_rowfilter.cli", "wait", "--spec", str(path),
                           "--lsn", lsn, "--timeout", "0.5"], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 4, done.stderr
    assert "timed out after 500 ms" in done.stderr and "Traceback" not in done.stderr
