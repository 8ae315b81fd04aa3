"""README's first command: the demo, end to end, on the run's PostgreSQL cluster (one incremental batch)."""

from __future__ import annotations

import re

import psycopg
import pytest

from airflow_provider_rowfilter.tooling.demo.run import TABLES, run_demo


@pytest.fixture
def demo_databases(local_pg):
    yield
    for name in ("demo_native", "demo_sub", "demo_pub"):  # with the demo's slot: no WAL kept for the run
        local_pg.drop_database(name)


def test_the_demo_ends_identical_to_native_logical_replication(local_pg, demo_databases, tmp_path, capsys) -> None:
    assert run_demo(str(tmp_path), batches=1, pg=local_pg) == 0
    out = capsys.readouterr().out
    assert "dag.test() rowfilter_initial_sync: success" in out
    assert "dag.test() rowfilter_incremental_sync: success" in out
    # The incremental run is held against a schedule from its task's duration as Airflow recorded it.
    assert re.search(r"the apply task took \d+\.\d s: fits a schedule of every (minute|5 minutes)", out), out[-3000:]
    assert out.count("identical") >= len(TABLES) and "DIFFERENT" not in out
    assert "demo passed" in out
    # The live changes reached the subscriber: the batch after them applied rows to it.
    with psycopg.connect(local_pg.dsn("demo_sub")) as conn:
        applied = conn.execute("SELECT sum(changes) FROM rowfilter.batch_history WHERE subscription = 'demo'"
                               ).fetchone()[0]
    assert applied > 0
    # --keep semantics with a cluster we did not start: the files stay, the cluster keeps running.
    assert (tmp_path / "subscription.yaml").is_file()
    assert local_pg.postmaster_pid is not None
