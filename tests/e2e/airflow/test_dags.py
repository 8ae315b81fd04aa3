"""The example DAGs: they import cleanly, and dag.test() runs them for real.

``dag.test()`` runs in a fresh interpreter with its own AIRFLOW_HOME and sqlite metadata database
(``airflow db migrate``), the Airflow connections given as ``AIRFLOW_CONN_*`` environment
variables, and ``spark_default`` a local master: the operators submit the packaged jobs through
pyspark's ``spark-submit``.
"""

from __future__ import annotations

import json
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from airflow_provider_rowfilter.dag_factory import DAG_KINDS
from airflow_provider_rowfilter.tooling.demo.dag_runner import run_dags
from tests.airflow.cluster import CHANGES, PUBLICATIONS, TABLES, Cluster
from tests.airflow.support import REPO, TEST_DAGS, StateDb

DAGS = REPO / "dags"
SPARK = json.dumps({"conn_type": "spark", "host": "local[2]"})


EXAMPLE_DAGS = ["rowfilter_incremental_sync", "rowfilter_initial_sync", "rowfilter_refresh"]
# Built by dags/rowfilter_subscriptions.py from dags/subscriptions/demo_orders.yaml.
FACTORY_DAGS = [f"rowfilter_demo_orders_{kind}" for kind in DAG_KINDS]


def _bag(monkeypatch: pytest.MonkeyPatch) -> Any:
    from airflow.dag_processing.dagbag import DagBag

    monkeypatch.delenv("ROWFILTER_SUBSCRIPTIONS_DIR", raising=False)
    bag = DagBag(dag_folder=DAGS)
    assert bag.import_errors == {}
    return bag


def _edges(dag: Any) -> dict[str, list[str]]:
    return {t.task_id: sorted(t.downstream_task_ids) for t in dag.tasks}


def test_dagbag_imports_the_example_dags_without_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    bag = _bag(monkeypatch)
    assert sorted(bag.dags) == sorted(EXAMPLE_DAGS + FACTORY_DAGS)
    for dag in bag.dags.values():
        assert dag.max_active_runs == 1 and dag.catchup is False, dag.dag_id


def test_initial_sync_dag_maps_one_pooled_copy_per_table(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.sdk.definitions.mappedoperator import MappedOperator

    from airflow_provider_rowfilter.operators.snapshot_copy import SnapshotCopyOperator

    dag = _bag(monkeypatch).dags["rowfilter_initial_sync"]
    assert _edges(dag) == {"refresh": ["tables_to_copy"], "tables_to_copy": ["snapshot"], "snapshot": ["apply"],
                           "apply": ["wait_for_ready"], "wait_for_ready": []}
    snapshot = dag.get_task("snapshot")
    assert isinstance(snapshot, MappedOperator)
    assert snapshot.pool == "rowfilter_copies"
    assert list(snapshot.expand_input.value) == ["tables"]  # one task per table
    assert snapshot.operator_class is SnapshotCopyOperator
    assert snapshot.partial_kwargs["publisher_conn_id"] == "rowfilter_publisher"
    apply = dag.get_task("apply")
    assert apply.application.endswith("airflow_provider_rowfilter/jobs/apply.py")
    assert apply.trigger_rule == "none_failed"  # runs when no table needed a copy
    assert [o.name for o in apply.outlets] == ["rowfilter_demo"]
    sensor = dag.get_task("wait_for_ready")
    assert (sensor.target_state, sensor.mode) == ("r", "reschedule")
    assert dag.schedule is None


def test_incremental_and_refresh_dags(monkeypatch: pytest.MonkeyPatch) -> None:
    bag = _bag(monkeypatch)
    incremental = bag.dags["rowfilter_incremental_sync"]
    assert _edges(incremental) == {"apply": []}
    assert incremental.schedule == "*/5 * * * *"
    apply = incremental.get_task("apply")
    assert type(apply).__name__ == "ApplyChangesOperator"
    assert apply.retries == 4 and apply.retry_exponential_backoff == 2.0
    assert apply.retry_delay == timedelta(seconds=30) and apply.max_retry_delay == timedelta(minutes=15)
    assert apply.max_changes == "{{ params.max_changes }}"
    assert apply.time_budget == "{{ params.time_budget }}" and incremental.params["time_budget"] == 240
    refresh = bag.dags["rowfilter_refresh"]
    assert _edges(refresh) == {"refresh": ["tables_to_copy"], "tables_to_copy": ["snapshot"], "snapshot": []}
    assert refresh.get_task("snapshot").pool == "rowfilter_copies"


# --- the sensor's reschedule and deferrable modes, end to end -------------------------------------------
def test_sensor_modes_under_dag_test(airflow_db: dict[str, str], state_db: StateDb) -> None:
    """Reschedule mode and deferrable mode wait for real, then succeed; a recorded error fails the run.

    The three runs share one interpreter (each dag.test() of its own subscription) to pay Airflow's
    start-up once.
    """
    reschedule, deferrable, failing = state_db, state_db.another("s2"), state_db.another("s3")
    failing.record_error("public.t2", "copy of public.t2 failed: relation does not exist")
    moved: list[str] = []

    def on_line(line: str) -> None:
        # Move a subscription's tables only once its sensor has seen them behind: the wait is real.
        for db in (reschedule, deferrable):
            if db.subscription not in moved and f"Subscription {db.subscription}: waiting for public.t1 (i)" in line:
                db.set_states(**{"public.t1": "f", "public.t2": "r"})
                moved.append(db.subscription)

    tables = ["public.t1", "public.t2"]
    results = run_dags(
        airflow_db,
        [("rowfilter_sensor_reschedule", {"subscription": "s1", "tables": tables}),
         ("rowfilter_sensor_deferrable", {"subscription": "s2", "tables": tables}),
         ("rowfilter_sensor_reschedule", {"subscription": "s3", "tables": None})],
        dags_folder=TEST_DAGS, env={"AIRFLOW_CONN_ROWFILTER_SUBSCRIBER": state_db.dsn}, on_line=on_line)
    output = results[0]["output"]
    assert moved == ["s1", "s2"], output[-5000:]
    for result in results[:2]:
        assert result["state"] == "success", output[-5000:]
        assert result["tasks"] == {"wait": "success"}
        assert result["xcoms"]["wait"] == {"public.t1": "f", "public.t2": "r"}
    assert "Rescheduling task, marking task as UP_FOR_RESCHEDULE" in output
    assert "running trigger in line" in output
    assert (results[2]["state"], results[2]["tasks"]) == ("failed", {"wait": "failed"})
    assert "copy of public.t2 failed: relation does not exist" in output


# --- the example DAGs end to end, with PostgreSQL's own subscription as referee ---------------------------
def _qualified(tables: list[str]) -> list[str]:
    return sorted(f"public.{t}" for t in tables)


def test_initial_then_incremental_sync_then_refresh(airflow_db: dict[str, str], cluster: Cluster) -> None:
    """initial sync (mapped copies, apply, wait for r) -> changes -> incremental sync -> refresh.

    The subscriber ends identical to PostgreSQL's own subscription of the same publications made
    after the changes; the incremental run's XCom and asset events name what it changed.
    """
    # The roles authenticate with scram: without its password a job could not connect at all.
    with pytest.raises(psycopg.OperationalError, match="password authentication failed|no password"):
        psycopg.connect(cluster.url(cluster.pub_db, cluster.pub_role)).close()
    params = {"subscription": "dagtest", "publications": PUBLICATIONS}
    began = time.monotonic()
    results = run_dags(
        airflow_db,
        [("rowfilter_initial_sync", {**params, "tables": None}),
         ("rowfilter_incremental_sync", {**params, "max_changes": 10_000}),
         ("rowfilter_refresh", params)],
        env=cluster.airflow_env(), pools={"rowfilter_copies": 2}, timeout=900,
        between=lambda result: cluster.execute(cluster.pub_db, CHANGES) if result["dag_id"] == "rowfilter_initial_sync"
        else None)
    elapsed = time.monotonic() - began
    initial, incremental, refresh = results
    output = initial["output"]
    qualified = _qualified(TABLES)

    # 1. The initial sync: one mapped copy per table, then apply brought every table to r.
    assert initial["state"] == "success", output[-8000:]
    assert initial["tasks"] == {"refresh": "success", "tables_to_copy": "success", "apply": "success",
                                "wait_for_ready": "success", **{f"snapshot[{i}]": "success" for i in range(5)}}
    assert "Spark-Submit cmd: spark-submit --master local[2]" in output
    for job in ("refresh", "snapshot", "apply"):
        assert f"airflow_provider_rowfilter/jobs/{job}.py --spec-json" in output
    assert initial["xcoms"]["refresh"]["added"] == qualified
    assert initial["xcoms"]["tables_to_copy"] == qualified
    copies = [initial["xcoms"][f"snapshot[{i}]"] for i in range(5)]
    assert sorted(t["table"] for c in copies for t in c["tables"]) == qualified  # each task copied one table
    assert all(len(c["tables"]) == 1 and c["tables"][0]["state"] == "f" for c in copies)
    applied = initial["xcoms"]["apply"]
    assert applied["subscription"] == "dagtest" and applied["changed_tables"] == []
    assert {t["table"]: t["state"] for t in applied["tables"]} == dict.fromkeys(qualified, "r")
    assert initial["xcoms"]["wait_for_ready"] == dict.fromkeys(qualified, "r")
    assert initial["asset_events"] == []  # nothing changed after the copies

    # 2. The incremental sync applied the changes; the XCom is the batch read from batch_history.
    assert incremental["state"] == "success", output[-8000:]
    batch = incremental["xcoms"]["apply"]
    assert batch["batch_id"] is not None and batch["changes"] > 0 and batch["transactions"] >= 1
    changed = ["public.orders", "public.t1", "public.t2", "public.t4"]
    assert batch["changed_tables"] == changed
    counts = batch["counts"]
    # The publisher filters (filtering: source on PostgreSQL 18): the UPDATE whose row entered p2's filter (e = 99)
    # arrives as the INSERT a native subscriber gets, and t3's row outside p3's filter (g = 13) never leaves it.
    assert counts["public.t2"]["insert"] == 2 and not counts["public.t2"].get("update_to_insert")
    assert counts["public.t1"]["delete"] == 1 and counts["public.t4"]["delete"] == 1
    assert not any(counts.get("public.t3", {}).get(k) for k in ("insert", "update", "delete", "truncate"))
    assert batch["end_lsn"] and batch["start_lsn"]
    with psycopg.connect(cluster.pg.dsn(cluster.sub_db)) as conn:
        written = conn.execute("SELECT id, changes FROM rowfilter.batch_history WHERE subscription = 'dagtest' "
                               "AND id = ANY(%s) ORDER BY id", (batch["batch_ids"],)).fetchall()
        newest = conn.execute("SELECT max(id) FROM rowfilter.batch_history WHERE subscription = 'dagtest'").fetchone()
    # The publisher judged every change (filtering: source): no batch needed Spark, so the task drained the run
    # itself and submitted no job (docs/operators.md); its batches, totalled.
    assert "Subscription dagtest: no batch needed Spark, the run was done in the task" in output
    assert output.count("airflow_provider_rowfilter/jobs/apply.py --spec-json") == 1  # the initial sync's
    assert (batch["drained"], batch["budget_exhausted"], batch["batches"]) == (True, False, len(written)), batch
    assert [i for i, _ in written] == batch["batch_ids"] and batch["batch_id"] == newest[0] == written[-1][0]
    assert batch["changes"] == sum(c for _, c in written)
    # One asset event per changed subscriber table, through the task's AssetAlias outlet.
    where = f"postgres://{cluster.pg.host}:{cluster.pg.port}/{cluster.sub_db}/public"
    events = incremental["asset_events"]
    assert sorted(e["uri"] for e in events) == [f"{where}/{t.split('.')[1]}" for t in changed]
    assert {e["task_id"] for e in events} == {"apply"}
    t2 = next(e for e in events if e["uri"].endswith("/t2"))
    assert t2["extra"]["insert"] == 2 and t2["extra"]["subscription"] == "dagtest"
    assert f"Subscription dagtest: {batch['batches']} batch(es) ({', '.join(map(str, batch['batch_ids']))}) applied" \
        in output
    assert "Drained: every transaction the publisher had committed when the run started is applied" in output
    # Without a spec file the change log lives under AIRFLOW_HOME, the same for every run.
    assert (Path(airflow_db["AIRFLOW_HOME"]) / "rowfilter" / "dagtest" / "changes").is_dir()

    # 3. The refresh found nothing new: no table to copy, the mapped copy is skipped, the run succeeds.
    assert refresh["state"] == "success", output[-8000:]
    assert refresh["tasks"] == {"refresh": "success", "tables_to_copy": "success", "snapshot": "skipped"}
    assert refresh["xcoms"]["refresh"]["added"] == [] and refresh["xcoms"]["tables_to_copy"] == []

    # No password in the output, the command lines, or the rendered fields stored in the database.
    for secret in (cluster.pub_password, cluster.sub_password):
        assert secret not in output
        for result in results:
            assert secret not in json.dumps(result["rendered"])
    # The subscriber holds exactly what PostgreSQL's own subscription of the same publications holds.
    cluster.native_referee()
    for table in TABLES:
        ours, native = cluster.rows(cluster.sub_db, table), cluster.rows(cluster.ref_db, table)
        assert ours == native, f"{table}: ours {ours} != native {native}"
    assert elapsed < 600, f"the DAG runs took {elapsed:.0f} s"
