"""The factory's DAGs end to end under ``dag.test()``: a spec file's initial sync, refresh and incremental sync beside
native replication, then every operations DAG with its parameters as the Trigger form sends them."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import psycopg

from airflow_provider_rowfilter.tooling.demo.dag_runner import run_dags
from tests.airflow.cluster import CHANGES, Cluster

FACTORY_SPEC = """\
subscription: dagfactory
publisher_conn_id: rowfilter_publisher
subscriber_conn_id: rowfilter_subscriber
publications: [{publications}]
change_log: {change_log}
airflow:
  poke_interval: 2
  conf: {{spark.ui.enabled: "false"}}
"""


def test_factory_dags_initial_sync_refresh_and_incremental_sync(airflow_db: dict[str, str], cluster: Cluster,
                                                                tmp_path: Path) -> None:
    """A YAML file's initial sync, then a publication added to the file: its refresh copies the new
    table, and its incremental sync applies the changes and brings the new table to ``r``."""
    folder, log = tmp_path / "subscriptions", tmp_path / "changes"
    folder.mkdir()
    spec = folder / "dagfactory.yaml"
    spec.write_text(FACTORY_SPEC.format(publications="p1, p2, p3", change_log=log))

    def between(result: dict[str, Any]) -> None:
        if result["dag_id"] == "rowfilter_dagfactory_initial_sync":
            cluster.execute(cluster.pub_db, CHANGES)
            spec.write_text(FACTORY_SPEC.format(publications="p1, p2, p3, p4", change_log=log))

    began = time.monotonic()
    initial, refresh, incremental = run_dags(
        airflow_db,
        [("rowfilter_dagfactory_initial_sync", None), ("rowfilter_dagfactory_refresh", None),
         ("rowfilter_dagfactory_incremental_sync", None)],
        # The change log outside the spec files' folder: allowed by the deployment (core/spec/paths.py).
        env={**cluster.airflow_env(), "ROWFILTER_SUBSCRIPTIONS_DIR": str(folder), "ROWFILTER_ALLOWED_PATHS": str(log)},
        pools={"rowfilter_copies": 2}, between=between, timeout=900)
    elapsed = time.monotonic() - began
    output = initial["output"]
    first = ["public.t1", "public.t2", "public.t3"]

    assert initial["state"] == "success", output[-8000:]
    assert initial["tasks"] == {"refresh": "success", "tables_to_copy": "success", "apply": "success",
                                "wait_for_ready": "success", **{f"snapshot[{i}]": "success" for i in range(3)}}
    assert initial["xcoms"]["tables_to_copy"] == first
    assert initial["xcoms"]["wait_for_ready"] == dict.fromkeys(first, "r")
    assert '"subscription": "dagfactory"' in output  # the jobs got the file's spec as JSON

    # The file now names p4 too: the refresh adds public.t4 and copies it (one mapped task).
    assert refresh["state"] == "success", output[-8000:]
    assert refresh["xcoms"]["refresh"]["added"] == ["public.t4"]
    assert refresh["xcoms"]["tables_to_copy"] == ["public.t4"]
    assert refresh["tasks"] == {"refresh": "success", "tables_to_copy": "success", "snapshot[0]": "success"}

    # The incremental sync: the changes of the subscribed tables, and t4 from f to r.
    assert incremental["state"] == "success", output[-8000:]
    batch = incremental["xcoms"]["apply"]
    assert batch["changed_tables"] == ["public.t1", "public.t2"]  # t4's changes are in its copy already
    assert {t["table"]: t["state"] for t in batch["tables"]} == dict.fromkeys([*first, "public.t4"], "r")
    where = f"postgres://{cluster.pg.host}:{cluster.pg.port}/{cluster.sub_db}/public"
    assert sorted(e["uri"] for e in incremental["asset_events"]) == [f"{where}/t1", f"{where}/t2"]
    assert log.is_dir() and any(log.iterdir())  # the file's change_log
    for secret in (cluster.pub_password, cluster.sub_password):
        assert secret not in output

    publications, tables = ["p1", "p2", "p3", "p4"], ["t1", "t2", "t3", "t4"]
    cluster.native_referee(publications, tables)
    for table in tables:
        ours, native = cluster.rows(cluster.sub_db, table), cluster.rows(cluster.ref_db, table)
        assert ours == native, f"{table}: ours {ours} != native {native}"
    assert elapsed < 600, f"the DAG runs took {elapsed:.0f} s"

    # The operations DAGs, with their parameters as the Trigger form sends them (issue 18 item 12).
    applied = batch["end_lsn"]

    def slot_lost(result: dict[str, Any]) -> None:
        if result["dag_id"] == "rowfilter_dagfactory_enable_subscription":  # the slot lost before the refresh's run
            cluster.execute(cluster.pub_db, "SELECT pg_drop_replication_slot('rowfilter_dagfactory')")

    runs = run_dags(
        airflow_db,
        [("rowfilter_dagfactory_skip_transaction", {"lsn": "0/10"}),
         ("rowfilter_dagfactory_skip_transaction", {"lsn": "FFFF/0"}),
         ("rowfilter_dagfactory_resync_tables", {"tables": ["public.t1"]}),
         ("rowfilter_dagfactory_resync_tables", {"tables": ["public.t1"], "confirm_empty": True}),
         ("rowfilter_dagfactory_sync_sequences", {"tables": [], "dry_run": True}),
         ("rowfilter_dagfactory_disable_subscription", None),
         ("rowfilter_dagfactory_enable_subscription", None),
         ("rowfilter_dagfactory_refresh", {"recreate_slot": True, "reconcile": True}),
         ("rowfilter_dagfactory_drop_subscription", {"confirm": "dagfactry", "keep_slot": False}),
         ("rowfilter_dagfactory_drop_subscription", {"confirm": "dagfactory", "keep_slot": False})],
        env={**cluster.airflow_env(), "ROWFILTER_SUBSCRIPTIONS_DIR": str(folder), "ROWFILTER_ALLOWED_PATHS": str(log)},
        between=slot_lost, timeout=900)
    too_early, skip, unconfirmed, resync, sequences, disabled, enabled, recreated, wrong_name, dropped = runs
    output = runs[-1]["output"]
    # A resync empties the tables: without confirm_empty it refuses, emptying nothing, and names the repair in place.
    assert unconfirmed["state"] == "failed", output[-5000:]
    assert "a resync empties public.t1 in the subscriber before copying it again, and confirm_empty is not true: " \
           "nothing was emptied" in output
    assert 'the DAG rowfilter_dagfactory_reconcile_tables (Trigger DAG with tables = ["public.t1"])' in output
    # Pause and resume.
    assert disabled["state"] == enabled["state"] == "success", output[-5000:]
    assert disabled["xcoms"]["disable"] == {"subscription": "dagfactory", "enabled": False, "was_enabled": True}
    assert enabled["xcoms"]["enable"] == {"subscription": "dagfactory", "enabled": True, "was_enabled": False}
    # The lost slot's repair from Airflow: a new slot, every table reconciled in place, none emptied.
    assert recreated["state"] == "success", output[-5000:]
    assert recreated["rendered"]["refresh"]["recreate_slot"] is True
    assert "slot of dagfactory recreated: " in output and "kept and held for a reconcile in place" in output
    # (the drop below drops the new slot: its slot_dropped says there was one)
    assert too_early["state"] == "failed", output[-5000:]
    assert f"skip WAL location (LSN 0/10) must be greater than origin LSN {applied}" in output
    assert skip["state"] == "success" and skip["xcoms"]["skip"] == {"subscription": "dagfactory",
                                                                      "skip_lsn": "FFFF/0"}, output[-5000:]
    assert resync["state"] == "success", output[-5000:]
    assert resync["rendered"]["resync"]["tables"] == "public.t1"
    assert cluster.rows(cluster.sub_db, "t1") == cluster.rows(cluster.ref_db, "t1")  # copied again, the same rows
    assert sequences["state"] == "success", output[-5000:]
    assert sequences["xcoms"]["sync_sequences"]["dry_run"] is True and sequences["xcoms"]["sync_sequences"]["changed"] == 0
    assert wrong_name["state"] == "failed"
    assert "confirm='dagfactry' is not the subscription's name; nothing was dropped" in output
    assert dropped["state"] == "success", output[-5000:]
    assert dropped["xcoms"]["drop"]["state_dropped"] and dropped["xcoms"]["drop"]["slot_dropped"]
    with psycopg.connect(cluster.pg.dsn(cluster.pub_db)) as conn:
        assert conn.execute("SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'rowfilter_dagfactory'"
                            ).fetchone() == (0,)
    assert cluster.rows(cluster.sub_db, "t2") == cluster.rows(cluster.ref_db, "t2")  # the tables stay
    for secret in (cluster.pub_password, cluster.sub_password):
        assert secret not in output
