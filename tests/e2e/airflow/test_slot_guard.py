"""★ The slot guard (issue 46 item 2), with a real scheduler: a paused apply no longer means a lost slot.

The publisher is a cluster of this module's own, with ``idle_replication_slot_timeout`` set small (a server
setting: on the run's shared cluster it would invalidate other tests' slots; its unit is the second, guc_tables.c
GUC_UNIT_S, and PostgreSQL invalidates an idle slot at a checkpoint: InvalidatePossiblyObsoleteSlot in slot.c).
The subscription is synchronized first, then the DAG factory's DAGs go live under a real api-server, scheduler
and dag-processor with the incremental sync **paused** (``paused_upon_creation``) and the watch DAG every few
seconds. While the publisher keeps changing rows and checkpoints every few seconds, for more than twice the
timeout, the watch's slot guard reads the slot into the change log: the slot is never invalidated, the page says
*paused*, and the lag check's log says why. Then the incremental sync is unpaused through Airflow's REST API: its
runs apply what the guard kept, exactly once (the subscriber's rows equal the publisher's under the filter, every
change counted once), and no table is copied again.
"""

from __future__ import annotations

import json
import shutil
import time
import urllib.request
from collections.abc import Iterator

import psycopg
import pytest
import yaml

from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec
from airflow_provider_rowfilter.flows.apply.drain import apply
from airflow_provider_rowfilter.flows.refresh import refresh
from airflow_provider_rowfilter.flows.table_sync.sync import sync_tables
from airflow_provider_rowfilter.tooling.embedded import LocalPostgres
from airflow_provider_rowfilter.tooling.native import table_rows
from tests.airflow.support import REPO, conn_env
from tests.e2e.airflow.scheduler import running_airflow

TABLE = "CREATE TABLE t (id int PRIMARY KEY, v int, note text); ALTER TABLE t REPLICA IDENTITY FULL;"
#: The publisher's timeout: longer than one watch run takes here (each task is a process of its own).
TIMEOUT = 20
NAME = "guarded"


@pytest.fixture(scope="module")
def publisher_cluster() -> Iterator[LocalPostgres]:
    with LocalPostgres.start() as pg:
        yield pg


def execute(dsn: str, *statements: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)


def slot_state(pub: str) -> tuple:
    with psycopg.connect(pub, autocommit=True) as conn:
        return conn.execute("SELECT invalidation_reason, active, extract(epoch FROM now() - inactive_since) "
                            f"FROM pg_replication_slots WHERE slot_name = 'rowfilter_{NAME}'").fetchone()


def api(airflow, token: str, path: str, method: str = "GET", body: dict | None = None) -> object:
    request = urllib.request.Request(f"{airflow.url}{path}", method=method, data=None if body is None else
                                     json.dumps(body).encode(), headers={"Authorization": f"Bearer {token}",
                                                                         "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as answer:
        return json.load(answer)


def test_a_paused_apply_keeps_its_slot_and_applies_everything_once(publisher_cluster, fresh_db, tmp_path,
                                                                   monkeypatch):
    began = time.monotonic()
    pg = publisher_cluster
    pub = pg.create_database("guard_pub")
    execute(pub, TABLE, "INSERT INTO t SELECT g, g, 'copied' FROM generate_series(1, 200) g",
            "CREATE PUBLICATION p FOR TABLE t WHERE (v % 2 = 0)")
    sub = fresh_db()
    execute(sub, TABLE)
    monkeypatch.setenv("ROWFILTER_ALLOWED_PATHS", str(tmp_path))
    log = tmp_path / "changes"
    # The initial sync, in this process (through URLs): the DAGs then take over the same subscription and log.
    by_url = tmp_path / "by_url.yaml"
    by_url.write_text(yaml.safe_dump({"subscription": NAME, "publisher": pub, "subscriber": sub, "publications": ["p"],
                                      "change_log": str(log)}))
    spec = SubscriptionSpec.load(by_url)
    refresh(spec)
    assert sync_tables(spec).ok
    apply(spec)
    with psycopg.connect(sub, autocommit=True) as conn:
        copied = conn.execute("SELECT rows_copied, state FROM rowfilter.subscription_rel").fetchall()
        refreshes = conn.execute("SELECT count(*) FROM rowfilter.refresh_history").fetchone()[0]
        batches_before = conn.execute("SELECT coalesce(max(id), 0) FROM rowfilter.batch_history").fetchone()[0]
    assert copied == [(100, "r")]

    dags = tmp_path / "dags"
    (dags / "subscriptions").mkdir(parents=True)
    shutil.copy(REPO / "dags" / "rowfilter_subscriptions.py", dags)
    (dags / "subscriptions" / f"{NAME}.yaml").write_text(yaml.safe_dump({
        "subscription": NAME, "publisher_conn_id": "rf_guard_pub", "subscriber_conn_id": "rf_guard_sub",
        "publications": ["p"], "change_log": str(log),
        "airflow": {"schedule": "@continuous", "paused_upon_creation": True, "watch_schedule": "5s", "retries": 0}}))
    env = {conn_env("rf_guard_pub"): pub, conn_env("rf_guard_sub"): sub, "ROWFILTER_ALLOWED_PATHS": str(tmp_path),
           "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "local[1]"}),
           "PYTHONPATH": str(REPO)}
    execute(pg.dsn(), f"ALTER SYSTEM SET idle_replication_slot_timeout = '{TIMEOUT}s'", "SELECT pg_reload_conf()")
    incremental, watch = f"rowfilter_{NAME}_incremental_sync", f"rowfilter_{NAME}_watch"
    try:
        with running_airflow(tmp_path / "home", dags, env) as airflow:
            airflow.wait_for("the watch DAG's first guard", lambda: airflow.query(
                "SELECT 1 FROM task_instance WHERE dag_id = ? AND task_id = 'guard_slot' AND state = 'success'",
                watch), timeout=300)
            assert airflow.query("SELECT is_paused FROM dag WHERE dag_id = ?", incremental) == [(1,)]
            print(f"first guard after {time.monotonic() - began:.1f} s")
            # The pause: changes keep coming, the publisher checkpoints every few seconds, for twice the timeout.
            paused_at, n, longest_idle = time.monotonic(), 1000, 0.0
            while time.monotonic() - paused_at < 2 * TIMEOUT + 10:
                execute(pub, f"INSERT INTO t VALUES ({n}, {n}, 'paused'), ({n + 1}, {n + 1}, 'paused')",
                        f"UPDATE t SET v = v + 1 WHERE id = {n // 10 - 90}",  # moves a row in or out of the filter
                        f"DELETE FROM t WHERE id = {n // 10 - 80}", "CHECKPOINT")
                n += 2
                reason, active, idle = slot_state(pub)
                assert reason is None, f"the slot was invalidated ({reason}) while the apply was paused"
                longest_idle = max(longest_idle, 0.0 if active or idle is None else float(idle))
                time.sleep(3)
            print(f"paused for {time.monotonic() - paused_at:.1f} s; the slot idle {longest_idle:.1f} s at most")
            guards = airflow.query("SELECT count(*) FROM task_instance WHERE dag_id = ? AND task_id = 'guard_slot' "
                                   "AND state = 'success'", watch)[0][0]
            assert guards >= 3, guards
            # The page says paused (the api-server's data), and the watch's lag check why.
            with urllib.request.urlopen(f"{airflow.url}/auth/token", timeout=30) as answer:
                token = json.load(answer)["access_token"]
            [view] = api(airflow, token, "/rowfilter/api/subscriptions")
            assert view["health"]["verdict"] == "paused", view["health"]
            assert f"its incremental sync {incremental} is paused" in view["health"]["reasons"][0], view["health"]
            assert view["check"] and view["check"]["state"] == "success", view["check"]
            logs = airflow.task_logs(watch, "check_lag")
            assert any(f"paused: its incremental sync {incremental} is paused" in text for text in logs), logs[-1:]
            assert any("reading its slot into the change log, applying nothing" in text
                       for text in airflow.task_logs(watch, "guard_slot"))

            # Unpaused: the incremental sync applies what the guard kept.
            api(airflow, token, f"/api/v2/dags/{incremental}", "PATCH", {"is_paused": False})
            with psycopg.connect(pub) as conn:
                expected = sorted(r[0] for r in conn.execute("SELECT x::text FROM t x WHERE v % 2 = 0"))
            airflow.wait_for("the unpaused apply to catch up", lambda: table_rows(sub, "t") == expected, timeout=240)
            print(f"caught up after {time.monotonic() - began:.1f} s")
    finally:
        execute(pg.dsn(), "ALTER SYSTEM SET idle_replication_slot_timeout = 0", "SELECT pg_reload_conf()")
    assert slot_state(pub)[0] is None
    with psycopg.connect(sub, autocommit=True) as conn:
        assert conn.execute("SELECT rows_copied, state FROM rowfilter.subscription_rel").fetchall() == copied
        assert conn.execute("SELECT count(*) FROM rowfilter.refresh_history").fetchone()[0] == refreshes
        counts = conn.execute("SELECT counts FROM rowfilter.batch_history WHERE id > %s AND subscription = %s",
                              (batches_before, NAME)).fetchall()
    inserted = sum(c.get("public.t", {}).get("insert", 0) + c.get("public.t", {}).get("update_to_insert", 0)
                   for (c,) in counts)
    deleted = sum(c.get("public.t", {}).get("delete", 0) + c.get("public.t", {}).get("update_to_delete", 0)
                  for (c,) in counts)
    assert 100 + inserted - deleted == len(expected), (inserted, deleted, len(expected))  # each change once
    print(f"slot guard test: {time.monotonic() - began:.1f} s")
