"""A typo in a live spec file never stops replication silently (issue 29, item 2): with a real scheduler.

The DAG factory's loader file is parsed by a dag-processor and scheduled by a scheduler, as in a
deployment. The subscription's incremental sync is live (unpaused, on its schedule: ``@continuous``,
Airflow's schedule of a new run as soon as the last one ends, so that the test does not wait for a
cron minute to turn); its file then gets a typo. The placeholder that replaces its DAGs keeps the
DAG id, the pause state and the schedule, so the scheduler keeps creating runs, each failing with the
reason as the task's error and calling the file's on-failure callback.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from tests.airflow.support import REPO
from tests.e2e.airflow.scheduler import running_airflow

SPEC = """\
subscription: live
publisher_conn_id: rf_live_publisher
subscriber_conn_id: rf_live_subscriber
publications: [p1]
airflow:
  schedule: "@continuous"
  retries: 0
  on_failure_callback: rowfilter_live_alerts.page
"""
CALLBACK = """\
import os, pathlib

def page(context):
    ti = context["ti"]
    with open(os.environ["ROWFILTER_TEST_PAGED"], "a") as f:
        f.write(f"{ti.dag_id}.{ti.task_id}\\n")
"""
DAG_ID = "rowfilter_live_incremental_sync"


def test_a_spec_broken_while_live_fails_on_its_schedule(tmp_path: Path) -> None:
    began = time.monotonic()
    dags = tmp_path / "dags"
    (dags / "subscriptions").mkdir(parents=True)
    shutil.copy(REPO / "dags" / "rowfilter_subscriptions.py", dags)
    spec = dags / "subscriptions" / "live.yaml"
    spec.write_text(SPEC)
    code = tmp_path / "code"
    code.mkdir()
    (code / "rowfilter_live_alerts.py").write_text(CALLBACK)
    paged = tmp_path / "paged"
    env = {"PYTHONPATH": f"{code}:{REPO}", "ROWFILTER_TEST_PAGED": str(paged)}
    with running_airflow(tmp_path / "home", dags, env) as airflow:
        # Live: parsed, unpaused at creation (issue 29 item 4), on its one-minute schedule.
        airflow.wait_for("the incremental sync to be parsed", lambda: airflow.query(
            "SELECT is_paused FROM dag WHERE dag_id = ? AND is_stale = 0", DAG_ID), timeout=240)
        assert airflow.query("SELECT is_paused, timetable_summary FROM dag WHERE dag_id = ?", DAG_ID) == \
            [(0, "@continuous")]
        print(f"parsed after {time.monotonic() - began:.1f} s")
        # A typo in the file: the placeholder takes its place under the same id.
        spec.write_text(SPEC.replace("  retries: 0", "  retries: 0\n  shedule_typo: 1"))
        airflow.wait_for("the placeholder to be parsed", lambda: airflow.query(
            "SELECT 1 FROM dag WHERE dag_id = ? AND description LIKE 'INVALID SPEC FILE live.yaml%'", DAG_ID),
            timeout=120)
        print(f"placeholder after {time.monotonic() - began:.1f} s")
        before = {run for (run,) in airflow.query("SELECT run_id FROM dag_run WHERE dag_id = ?", DAG_ID)}
        # The scheduler goes on creating runs on the schedule; each fails with the reason.
        failed = airflow.wait_for("a failed run of the placeholder", lambda: [row for row in airflow.query(
            "SELECT r.run_id, r.run_type FROM dag_run r JOIN task_instance t ON t.dag_id = r.dag_id "
            "AND t.run_id = r.run_id WHERE r.dag_id = ? AND r.state = 'failed' AND t.task_id = 'invalid_spec' "
            "AND t.state = 'failed'", DAG_ID) if row[0] not in before], timeout=180)
        print(f"failed run after {time.monotonic() - began:.1f} s")
        assert [run_type for _, run_type in failed] == ["scheduled"] * len(failed)
        assert airflow.query("SELECT is_paused, timetable_summary FROM dag WHERE dag_id = ?", DAG_ID) == \
            [(0, "@continuous")]  # the placeholder kept the pause state and the schedule
        logs = airflow.task_logs(DAG_ID, "invalid_spec")
        assert any("unknown key 'shedule_typo' in airflow:" in log and str(spec) in log for log in logs), logs
        airflow.wait_for("the on-failure callback", lambda: paged.exists() and
                         f"{DAG_ID}.invalid_spec" in paged.read_text(), timeout=60)
    print(f"real scheduler: {time.monotonic() - began:.1f} s")
