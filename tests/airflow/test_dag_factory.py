"""The DAG factory: a subscription spec YAML becomes three DAGs, a folder of them every subscription's DAGs.

The spec files stay what the ``rowfilter`` command reads (the command runs on one here); the DAGs they
become are run with ``dag.test()`` against the embedded PostgreSQL and a local Spark.
"""

from __future__ import annotations

import re
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from airflow.sdk import DAG

from airflow_provider_rowfilter.core.errors import SpecError
from airflow_provider_rowfilter.core.relation import TableName, table_names
from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec
from airflow_provider_rowfilter.dag_factory import (
    DAG_KINDS,
    AirflowSettings,
    SpecFileWarning,
    build_dags,
    dags_from_folder,
    tables_waiting_for_copy,
)
from airflow_provider_rowfilter.subscriber.state import StateStore
from airflow_provider_rowfilter.tooling.demo.dag_runner import run_dags
from tests.airflow.support import REPO

DAGS = REPO / "dags"

FULL = """\
subscription: {name}
publisher_conn_id: rowfilter_publisher
subscriber_conn_id: rowfilter_subscriber
publications: [p1, p2]
change_log: changes/{name}
airflow:
  schedule: "*/10 * * * *"
  refresh_schedule: "@daily"
  start_date: 2025-06-01
  max_changes: 5000
  pool: copies_small
  tables: [t1, public.t2]
  retries: 5
  retry_delay: 20
  retry_exponential_backoff: 3
  max_retry_delay: 600
  poke_interval: 5
  sensor_timeout: 120
  spark_conn_id: spark_cluster
  conf: {{spark.ui.enabled: false}}
  tags: [team_a]
"""
MINIMAL = """\
subscription: {name}
publisher_conn_id: rowfilter_publisher
subscriber_conn_id: rowfilter_subscriber
publications: [p1]
"""


def _write(folder: Path, name: str, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.yaml"
    path.write_text(text.format(name=name))
    return path


def _edges(dag: Any) -> dict[str, list[str]]:
    return {t.task_id: sorted(t.downstream_task_ids) for t in dag.tasks}


def test_a_spec_file_becomes_three_dags(tmp_path: Path) -> None:
    path = _write(tmp_path, "team_a", FULL)
    dags = build_dags(path)
    assert sorted(dags) == sorted(f"rowfilter_team_a_{kind}" for kind in DAG_KINDS)
    for dag in dags.values():
        assert (dag.max_active_runs, dag.catchup) == (1, False)
        assert {"rowfilter", "subscription:team_a", "team_a"} <= set(dag.tags)
        assert dag.start_date.date().isoformat() == "2025-06-01"

    initial = dags["rowfilter_team_a_initial_sync"]
    assert initial.schedule is None
    assert _edges(initial) == {"refresh": ["tables_to_copy"], "tables_to_copy": ["snapshot"], "snapshot": ["apply"],
                               "apply": ["wait_for_ready"], "wait_for_ready": []}
    snapshot = initial.get_task("snapshot")
    assert snapshot.pool == "copies_small" and list(snapshot.expand_input.value) == ["tables"]
    assert snapshot.partial_kwargs["spec"] == str(path)
    sensor = initial.get_task("wait_for_ready")
    assert (sensor.target_state, sensor.tables, sensor.poke_interval, sensor.timeout) == ("r", ["t1", "public.t2"],
                                                                                        5, 120)
    assert (sensor.subscription, sensor.subscriber_conn_id) == ("team_a", "rowfilter_subscriber")
    assert initial.get_task("apply").trigger_rule == "none_failed"
    assert initial.get_task("tables_to_copy").op_kwargs == {
        "subscription": "team_a", "subscriber_conn_id": "rowfilter_subscriber", "tables": ["t1", "public.t2"]}

    incremental = dags["rowfilter_team_a_incremental_sync"]
    assert incremental.schedule == "*/10 * * * *"
    apply = incremental.get_task("apply")
    assert type(apply).__name__ == "ApplyChangesOperator"
    assert (apply.spec, apply.max_changes, apply._conn_id, apply.conf) == (
        str(path), 5000, "spark_cluster", {"spark.ui.enabled": "false"})
    assert (apply.retries, apply.retry_exponential_backoff) == (5, 3.0)
    assert (apply.retry_delay, apply.max_retry_delay) == (timedelta(seconds=20), timedelta(seconds=600))
    assert [o.name for o in apply.outlets] == ["rowfilter_team_a"]

    refresh = dags["rowfilter_team_a_refresh"]
    assert refresh.schedule == "@daily"
    assert _edges(refresh) == {"refresh": ["tables_to_copy"], "tables_to_copy": ["snapshot"], "snapshot": []}


def test_defaults_of_a_file_without_an_airflow_section(tmp_path: Path) -> None:
    dags = build_dags(_write(tmp_path, "plain", MINIMAL))
    apply = dags["rowfilter_plain_incremental_sync"].get_task("apply")
    assert dags["rowfilter_plain_incremental_sync"].schedule == AirflowSettings.schedule == "*/5 * * * *"
    assert dags["rowfilter_plain_refresh"].schedule is None
    assert dags["rowfilter_plain_initial_sync"].get_task("snapshot").pool == "rowfilter_copies"
    assert (apply.retries, apply.retry_exponential_backoff, apply.max_changes) == (3, 2.0, None)
    assert apply._conn_id == "spark_default"
    assert dags["rowfilter_plain_initial_sync"].get_task("wait_for_ready").mode == "reschedule"
    assert list(dags["rowfilter_plain_incremental_sync"].task_dict) == ["apply"]  # the check is the watch DAG's


def test_the_watch_dag_guards_the_slot_and_checks_on_its_own_schedule(tmp_path: Path) -> None:
    """Issue 46 item 1: the lag and slot check runs in a DAG of its own, after the slot guard, never behind the apply."""
    text = MINIMAL + "airflow:\n  max_retained_wal: 512MB\n  max_batch_age: 900\n"
    dags = build_dags(_write(tmp_path, "watched", text))
    assert list(dags["rowfilter_watched_incremental_sync"].task_dict) == ["apply"]
    watch = dags["rowfilter_watched_watch"]
    assert (watch.schedule, watch.is_paused_upon_creation, watch.max_active_runs) == ("*/5 * * * *", False, 1)
    assert _edges(watch) == {"guard_slot": ["check_lag"], "check_lag": []}
    guard, check = watch.get_task("guard_slot"), watch.get_task("check_lag")
    assert type(guard).__name__ == "SlotGuardOperator" and type(check).__name__ == "SubscriptionLagCheckOperator"
    assert (guard.apply_dag_id, guard.retries, guard.execution_timeout) == (
        "rowfilter_watched_incremental_sync", 0, timedelta(seconds=300))
    assert (check.max_retained_wal, check.max_batch_age, check.trigger_rule, check.retries) == (
        "512MB", 900.0, "all_done", 0)
    assert (check.subscription, check.subscriber_conn_id, check.apply_dag_id, check.skip_unsubscribed) == (
        "watched", "rowfilter_subscriber", "rowfilter_watched_incremental_sync", True)
    assert check.max_sync_age == timedelta(hours=1)  # tables stuck in i, d or f: checked by default
    assert check.apply_schedule == "*/5 * * * *"
    # Without thresholds: the page's rules (three intervals of the schedule, the spec's retained_wal_warning).
    plain = build_dags(_write(tmp_path, "plain2", MINIMAL))["rowfilter_plain2_watch"].get_task("check_lag")
    assert (plain.max_batch_age, plain.max_retained_wal) == (900.0, 1 << 30)
    stuck = build_dags(_write(tmp_path, "stuck", MINIMAL + "airflow:\n  max_sync_age: 7200\n"))
    assert stuck["rowfilter_stuck_watch"].get_task("check_lag").max_sync_age == 7200.0
    every = build_dags(_write(tmp_path, "often", MINIMAL + "airflow:\n  watch_schedule: 30s\n"))
    assert every["rowfilter_often_watch"].schedule == timedelta(seconds=30)
    manual = build_dags(_write(tmp_path, "manual", MINIMAL + "airflow:\n  watch_schedule: null\n"))
    assert manual["rowfilter_manual_watch"].schedule is None
    with pytest.raises(SpecError, match=r"airflow: max_retained_wal='lots' is not a size such as '1GB'"):
        build_dags(_write(tmp_path, "badsize", MINIMAL + "airflow:\n  max_retained_wal: lots\n"))
    with pytest.raises(SpecError, match=r"airflow: watch_schedule='often' is not a schedule Airflow reads"):
        build_dags(_write(tmp_path, "badwatch", MINIMAL + "airflow:\n  watch_schedule: often\n"))


def test_standbys_go_to_the_watchs_readiness_check(tmp_path: Path) -> None:
    text = MINIMAL + "standbys: [pg_standby1, 'postgresql://u@standby2/app']\n"
    check = build_dags(_write(tmp_path, "ha", text))["rowfilter_ha_watch"].get_task("check_lag")
    # The connection ids only: a URL's standby has no password the task could use.
    assert check.standby_conn_ids == ["pg_standby1"]


def test_the_spec_file_stays_valid_for_the_rowfilter_command(fresh_db: Any, tmp_path: Path) -> None:
    pub = fresh_db()
    with psycopg.connect(pub, autocommit=True) as conn:
        conn.execute("CREATE TABLE t1 (a int PRIMARY KEY, b text); CREATE PUBLICATION p1 FOR TABLE t1 WHERE (a > 2)")
    info = psycopg.conninfo.conninfo_to_dict(pub)
    url = f"postgresql://{info['user']}@{info['host']}:{info['port']}/{info['dbname']}"
    path = _write(tmp_path, "cli_ok", FULL.replace("publisher_conn_id: rowfilter_publisher", f"publisher: {url}")
                  .replace("[p1, p2]", "[p1]"))
    spec = SubscriptionSpec.load(path)  # the airflow: section is not the subscription's
    assert (spec.subscription, spec.publications, spec.change_log) == ("cli_ok", ("p1",),
                                                                       str(tmp_path / "changes" / "cli_ok"))
    done = subprocess.run([str(Path(sys.executable).with_name("rowfilter")), "validate", "--json", "--spec", str(path)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert "a > 2" in done.stdout
    # The factory takes the same file (a publisher URL instead of a connection id is fine).
    assert "rowfilter_cli_ok_initial_sync" in build_dags(path)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(MINIMAL + "airflow: [schedule]\n", "airflow: must be a mapping", id="not-a-mapping"),
        pytest.param(MINIMAL + "airflow:\n  shedule: '@daily'\n", "unknown key 'shedule' in airflow:", id="typo"),
        pytest.param(MINIMAL + "airflow:\n  max_changes: 0\n", "max_changes=0 is not a positive integer", id="zero"),
        pytest.param(MINIMAL + "airflow:\n  retries: -1\n", "retries=-1 is not an integer >= 0", id="retries"),
        pytest.param(MINIMAL + "airflow:\n  deferrable: 'yes'\n", "deferrable='yes' is not true or false",
                     id="deferrable"),
        pytest.param(MINIMAL + "airflow:\n  start_date: soon\n", "start_date='soon' is not a date", id="date"),
        pytest.param(MINIMAL + "airflow:\n  dag_id_prefix: 'a b'\n", "dag_id_prefix='a b' is not a DAG id",
                     id="dag-id"),
        pytest.param(MINIMAL + "airflow:\n  conf: [x]\n", "conf=['x'] is not a mapping of settings", id="conf"),
        pytest.param(MINIMAL + "slot: x\n", "unknown key 'slot'", id="spec-unknown-key"),
        pytest.param(MINIMAL.replace("subscriber_conn_id: rowfilter_subscriber",
                                     "subscriber: postgresql://u@h/db"),
                     "the DAG factory needs subscriber_conn_id", id="subscriber-url"),
        pytest.param(MINIMAL.replace("publications: [p1]", "publications: []"), "names no publications",
                     id="no-publications"),
    ],
)
def test_a_bad_file_is_refused_naming_it(tmp_path: Path, text: str, expected: str) -> None:
    path = _write(tmp_path, "bad", text)
    with pytest.raises(SpecError) as e:
        build_dags(path)
    assert expected in str(e.value)
    # In a folder the file stands alone: a placeholder DAG whose task fails with the same error.
    with pytest.warns(SpecFileWarning, match=re.escape(expected)):
        [placeholder] = {dag.description for dag in dags_from_folder(tmp_path).values()}
    assert placeholder.startswith("INVALID SPEC FILE bad.yaml: ") and str(path) in placeholder


def test_tables_to_copy_names_them_as_sql_so_the_snapshot_reads_them_back(state_db: Any) -> None:
    """Issue 28, also found: ``tables_to_copy`` gave ``public.Mixed Case`` unquoted, which the snapshot task read
    as SQL (``public.mixed`` …) and refused, while ``rowfilter snapshot`` copied the table."""
    with psycopg.connect(state_db.dsn, autocommit=True) as conn:
        store = StateStore(conn, "s_quoted")
        with conn.transaction():
            store.ensure_subscription(["p1"], "rowfilter_s_quoted", "rowfilter_s_quoted", {"copy_data": True})
            store.reconcile([TableName("public", "Mixed Case"), TableName("public", "t1")], copy_data=True,
                            current_lsn="0/0")
    listed = tables_waiting_for_copy("s_quoted", state_db.conn_id)
    assert listed == ['public."Mixed Case"', "public.t1"]
    assert table_names(listed) == [TableName("public", "Mixed Case"), TableName("public", "t1")]
    assert tables_waiting_for_copy("s_quoted", state_db.conn_id, tables='public."Mixed Case"') == listed[:1]


def test_a_folder_of_spec_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.dag_processing.dagbag import DagBag

    _write(tmp_path, "team_a", FULL)
    (tmp_path / "team_b.yml").write_text(MINIMAL.format(name="team_b"))
    (tmp_path / "notes.txt").write_text("not a spec")
    dags = dags_from_folder(tmp_path)
    assert sorted(dags) == sorted(f"rowfilter_{team}_{kind}" for team in ("team_a", "team_b") for kind in DAG_KINDS)
    # The dags/ file loads the folder named by ROWFILTER_SUBSCRIPTIONS_DIR.
    monkeypatch.setenv("ROWFILTER_SUBSCRIPTIONS_DIR", str(tmp_path))
    bag = DagBag(dag_folder=DAGS / "rowfilter_subscriptions.py")
    assert bag.import_errors == {}
    assert sorted(bag.dags) == sorted(dags)
    # A second file of the same subscription is refused (one slot, two change logs would lose changes);
    # it becomes a placeholder under its file name, and team_a keeps its DAGs.
    (tmp_path / "team_a_again.yaml").write_text(MINIMAL.format(name="team_a"))
    with pytest.warns(SpecFileWarning, match="subscription 'team_a' is also defined in"):
        again = dags_from_folder(tmp_path)
    assert set(again) == {*dags, "rowfilter_invalid_team_a_again.yaml"}
    assert "subscription 'team_a' is also defined in" in again["rowfilter_invalid_team_a_again.yaml"].description


def test_one_bad_spec_file_does_not_hide_the_others(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    airflow_db: dict[str, str]) -> None:
    """Issue 18 item 2: a typo key in one file; the other file's DAGs load, the bad one says why."""
    from airflow.dag_processing.dagbag import DagBag

    _write(tmp_path, "team_a", MINIMAL)
    bad = _write(tmp_path, "team_b", MINIMAL + "airflow:\n  shedule: '@daily'\n")
    monkeypatch.setenv("ROWFILTER_SUBSCRIPTIONS_DIR", str(tmp_path))
    loader = DAGS / "rowfilter_subscriptions.py"
    bag = DagBag(dag_folder=loader)
    assert bag.import_errors == {}
    assert sorted(bag.dags) == sorted(f"rowfilter_{t}_{k}" for t in ("team_a", "team_b") for k in DAG_KINDS)
    good = bag.dags["rowfilter_team_a_incremental_sync"]
    assert [t.task_id for t in good.tasks] == ["apply"]
    # The bad file's DAGs keep their ids (a run in flight finds its DAG) and carry the reason ...
    placeholder = bag.dags["rowfilter_team_b_incremental_sync"]
    assert [t.task_id for t in placeholder.tasks] == ["invalid_spec"]
    assert "team_b.yaml" in placeholder.description and "unknown key 'shedule'" in placeholder.description
    # ... Airflow records the error as a warning of the loader file, naming the spec file and the key ...
    [warned] = [w for w in bag.captured_warnings[str(loader)] if "SpecFileWarning" in w]
    assert str(bad) in warned and "unknown key 'shedule' in airflow:" in warned
    # ... and a run fails at once (no retry) with it; the good subscription's DAG is there beside it.
    [result] = run_dags(airflow_db, [("rowfilter_team_b_incremental_sync", None)], dags_folder=DAGS,
                        env={"ROWFILTER_SUBSCRIPTIONS_DIR": str(tmp_path)})
    assert (result["state"], result["tasks"]) == ("failed", {"invalid_spec": "failed"}), result["output"][-3000:]
    failure = result["output"].split("Task failed with exception", 1)[-1]
    assert f"AirflowFailException: {bad}: unknown key 'shedule' in airflow:" in failure, result["output"][-3000:]
    assert "up_for_retry" not in result["output"].lower()


def test_the_example_spec_file_in_dags(monkeypatch: pytest.MonkeyPatch) -> None:
    dags = dags_from_folder(DAGS / "subscriptions")
    assert sorted(dags) == sorted(f"rowfilter_demo_orders_{kind}" for kind in DAG_KINDS)
    assert SubscriptionSpec.load(DAGS / "subscriptions" / "demo_orders.yaml").publications == ("p_orders",)


@pytest.mark.parametrize(("tail", "schedule", "guessed"), [
    ("airflow:\n  schedule: '*/2 * * * *'\n  shedule: '@daily'\n", "*/2 * * * *", False),  # a typo beside it
    ("airflow:\n  schedule: null\n  pool: [not, a, name]\n", None, False),  # manual stays manual
    ("airflow:\n  schedule: '@hourly'\n  tags: [a\n", "@hourly", False),  # not YAML any more: read by line
    ("airflow:\n  schedule: '*/5 * * *'\n", "*/5 * * * *", True),  # a schedule Airflow refuses: the default
    ("typo_key: 1\n", "*/5 * * * *", True),  # no schedule given: the factory's default
    ("airflow:\n  schedule: '@continuous'\n  shedule: 1\n", "@continuous", False),  # one run after the other
], ids=["typo-beside", "manual", "not-yaml", "bad-cron", "default", "continuous"])
def test_an_invalid_file_keeps_the_schedule_it_had(tmp_path: Path, tail: str, schedule: str | None,
                                                    guessed: bool) -> None:
    """Issue 29 item 2: a typo in a live spec file must not stop replication silently: the placeholder of
    the incremental sync keeps the file's schedule (or the default), so its failing runs keep coming."""
    _write(tmp_path, "live", MINIMAL + tail)
    with pytest.warns(SpecFileWarning):
        dags = dags_from_folder(tmp_path)
    incremental = dags["rowfilter_live_incremental_sync"]
    assert [t.task_id for t in incremental.tasks] == ["invalid_spec"]
    expected = DAG(dag_id="x", schedule=schedule, start_date=incremental.start_date, max_active_runs=1).timetable
    got = incremental.timetable
    assert (type(got), getattr(got, "expression", None)) == (type(expected), getattr(expected, "expression", None))
    assert incremental.get_task("invalid_spec").retries == 0
    assert ("factory's default" in incremental.doc_md) is guessed
    # The manual DAGs' placeholders stay manual; none is paused when Airflow first sees it.
    assert type(dags["rowfilter_live_skip_transaction"].timetable).__name__ == "NullTimetable"
    assert not any(d.is_paused_upon_creation for d in dags.values())
