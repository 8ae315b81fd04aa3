"""★ Read-your-writes (issue 46): SubscriptionLsnSensor under dag.test(), against a real publisher and subscriber
that the product's apply moves, deferred to its trigger and in poke mode with at=; a recorded error fails at once."""

from __future__ import annotations

import threading

import psycopg
import pytest
import yaml

from airflow_provider_rowfilter.core.lsn import parse_lsn
from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec
from airflow_provider_rowfilter.flows.apply.drain import apply
from airflow_provider_rowfilter.jobs.refresh import refresh
from airflow_provider_rowfilter.jobs.snapshot import sync_tables
from airflow_provider_rowfilter.sensors.subscription_lsn import SubscriptionLsnSensor
from airflow_provider_rowfilter.tooling.demo.dag_runner import run_dags
from tests.airflow.support import TEST_DAGS

TABLES = "CREATE TABLE t1 (id int PRIMARY KEY, v int); CREATE TABLE t2 (id int PRIMARY KEY, note text);"


def execute(dsn: str, *statements: str) -> str:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)
        return conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()[0]


def test_the_sensor_waits_for_the_apply_then_emits_the_tables_asset_events(airflow_db, fresh_db, tmp_path):
    pub, sub = fresh_db(), fresh_db()
    execute(pub, TABLES, "INSERT INTO t1 SELECT g, g FROM generate_series(1, 20) g",
            "CREATE PUBLICATION p FOR TABLE t1, t2")
    execute(sub, TABLES)
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({"subscription": "lsnwait", "publisher": pub, "subscriber": sub,
                                    "publications": ["p"], "change_log": str(tmp_path / "log")}))
    spec = SubscriptionSpec.load(path)
    refresh(spec)
    assert sync_tables(spec).ok
    apply(spec)
    lsn = execute(pub, "INSERT INTO t1 VALUES (100, 100)", "INSERT INTO t2 VALUES (1, 'x')")
    applied: list[str] = []
    runs: list[threading.Thread] = []

    def after(previous: list[threading.Thread]) -> None:
        for run in previous:  # one apply at a time, as the incremental sync DAG runs them
            run.join()
        apply(spec)

    def on_line(line: str) -> None:
        # The apply runs only once a sensor has seen the tables behind: each wait is real.
        if "Subscription lsnwait: waiting for public.t1 (r at" not in line or "apply past " not in line:
            return
        target = line.split("apply past ")[1].split()[0]
        if target not in applied:  # once per run (each waits for its own LSN)
            applied.append(target)
            runs.append(threading.Thread(target=after, args=(list(runs),), daemon=True))
            runs[-1].start()

    results = run_dags(airflow_db, [("rowfilter_lsn_deferrable", {"subscription": "lsnwait", "lsn": lsn}),
                                    ("rowfilter_lsn_at", {"subscription": "lsnwait", "at": "now"})],
                       dags_folder=TEST_DAGS, on_line=on_line,
                       env={"AIRFLOW_CONN_ROWFILTER_SUBSCRIBER": sub, "AIRFLOW_CONN_ROWFILTER_PUBLISHER": pub},
                       between=lambda result: execute(pub, "INSERT INTO t2 VALUES (2, 'y')"))
    deferred, at = results
    output = deferred["output"]
    assert len(applied) == 2, output[-5000:]
    assert "running trigger in line" in output
    for result in results:
        assert (result["state"], result["tasks"]) == ("success", {"wait": "success"}), output[-5000:]
        value = result["xcoms"]["wait"]
        assert sorted(value["tables"]) == ["public.t1", "public.t2"]
        assert all(parse_lsn(p.split(" at ")[1]) >= parse_lsn(value["lsn"]) for p in value["tables"].values())
        info = psycopg.conninfo.conninfo_to_dict(sub)
        base = f"postgres://{info['host']}:{info['port']}/{info['dbname']}/public"
        assert sorted(e["uri"] for e in result["asset_events"]) == [f"{base}/t1", f"{base}/t2"]
        assert {e["extra"]["lsn"] for e in result["asset_events"]} == {value["lsn"]}
    assert deferred["xcoms"]["wait"]["lsn"] == lsn
    assert parse_lsn(at["xcoms"]["wait"]["lsn"]) > parse_lsn(lsn)  # at=now: read after the run's commit
    assert "What the publisher had committed at" in output
    with psycopg.connect(sub, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM t2").fetchone() == (2,)


def test_a_recorded_error_fails_at_once(state_db) -> None:
    state_db.record_error("public.t1", "duplicate key value violates unique constraint \"t1_pkey\"")
    from airflow.sdk.exceptions import AirflowFailException

    s = SubscriptionLsnSensor(task_id="w", subscription=state_db.subscription, subscriber_conn_id=state_db.conn_id,
                              lsn="0/1", poke_interval=30, timeout=60)
    with pytest.raises(AirflowFailException, match=r"table public\.t1: duplicate key value"):
        s.execute({})


def test_lsn_or_at_one_of_them() -> None:
    with pytest.raises(ValueError, match="give lsn= .* or at="):
        SubscriptionLsnSensor(task_id="w", subscription="s1", subscriber_conn_id="c")
    with pytest.raises(ValueError, match="at= is resolved once per try"):
        SubscriptionLsnSensor(task_id="w", subscription="s1", subscriber_conn_id="c", at="now", mode="reschedule")
