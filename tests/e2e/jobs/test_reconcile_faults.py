"""A reconcile killed for real at each of its points (faults.RECONCILE_POINTS), then run again.

The killed run leaves the table readable and held in state ``d`` (``status`` says so): the apply leaves it
alone and the snapshot does not copy it, whatever live changes come. The rerun compares it again from a new
snapshot and fixes every range; the table then equals a fresh native subscription created after the filter
change and caught up, and ``verify`` reports it equal.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psycopg
import pytest

from airflow_provider_rowfilter import faults
from airflow_provider_rowfilter.flows.apply.drain import apply
from airflow_provider_rowfilter.flows.refresh import refresh
from airflow_provider_rowfilter.flows.table_sync.sync import sync_tables
from airflow_provider_rowfilter.flows.verify.reconcile import reconcile
from airflow_provider_rowfilter.flows.verify.verify import verify
from tests.e2e.jobs.verify_scenario import Proof, execute, live_changes


def _held(p: Proof) -> tuple[str, object]:
    with psycopg.connect(p.ours, autocommit=True) as conn:
        return conn.execute("SELECT state, reconcile_since FROM rowfilter.subscription_rel WHERE subscription = %s",
                            (p.spec.subscription,)).fetchone()


def _gone(p: Proof, timeout: float = 30) -> None:
    """The killed job's sessions are gone (its table lock and temporary slot with them)."""
    deadline = time.monotonic() + timeout
    with psycopg.connect(p.publisher, autocommit=True) as conn:
        while conn.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE %s",
                           (f"rowfilter:{p.spec.subscription}%",)).fetchone()[0]:
            assert time.monotonic() < deadline
            time.sleep(0.05)


@pytest.mark.parametrize("point", faults.RECONCILE_POINTS)
def test_a_reconcile_killed_then_run_again_gives_a_fresh_copy(fresh_db, tmp_path, point):
    p = Proof(fresh_db, tmp_path, "source", rows=20_000)  # 5 key ranges, each fixed on its own (--group-rows 1)
    try:
        p.caught_up()
        execute(p.publisher, "ALTER PUBLICATION p1 SET TABLE t WHERE (id % 2 = 0)")
        refresh(p.spec)
        with live_changes(p.publisher, start=1_000_000):
            apply(p.spec)
        p.caught_up()
        before = p.rows(p.ours)
        env = {**{k: v for k, v in os.environ.items() if k != faults.ENV}, faults.ENV: point}
        killed = subprocess.run([sys.executable, "-m", "airflow_provider_rowfilter.jobs.reconcile", "--spec",
                                 str(p.path), "--group-rows", "1"], env=env, capture_output=True, text=True,
                                timeout=300, check=False)
        assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
        _gone(p)
        state, since = _held(p)
        assert state == "d" and since is not None
        halfway = p.rows(p.ours)
        if point == "reconcile-after-hold":
            assert halfway == before
        else:
            assert halfway != before
        # Held: the apply leaves it alone (its rows stay what the reconcile left), the snapshot does not copy it.
        with live_changes(p.publisher, start=2_000_000):
            apply(p.spec)
        apply(p.spec)
        assert p.rows(p.ours) == halfway
        (skipped,) = sync_tables(p.spec).tables
        assert "held by a reconcile" in (skipped.note or "")

        with live_changes(p.publisher, start=3_000_000):
            (done,) = reconcile(p.spec, group_rows=1).tables
        assert done.kind == "reconcile" and _held(p) == ("f", None)
        fresh = p.fresh(("p1",))
        p.caught_up()
        assert p.rows(p.ours) == p.rows(fresh.subscriber)
        assert verify(p.spec).clean
    finally:
        p.drop()
