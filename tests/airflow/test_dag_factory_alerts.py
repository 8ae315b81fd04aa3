"""The ``airflow:`` section's owner, email, on_failure_callback and execution timeouts (issue 18, item 10).

Parsed as the dag-processor parses the shipped loader file (DagBag), and run with ``dag.test()``: a
failing task calls the file's callback. A hung apply is bounded by default (one hour), so it does not
hold the incremental sync's only run slot for ever.
"""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path

import pytest

from airflow_provider_rowfilter.core.errors import SpecError
from airflow_provider_rowfilter.dag_factory import build_dags
from airflow_provider_rowfilter.tooling.demo.dag_runner import run_dags
from tests.airflow.support import REPO

SPEC = """\
subscription: alerts
publisher_conn_id: rf_no_such_publisher
subscriber_conn_id: rf_no_such_subscriber
publications: [p1]
airflow:
  owner: team-orders
  email: [orders-oncall@example.com]
  on_failure_callback: rowfilter_test_alerts.page
  copy_execution_timeout: 7200
"""
CALLBACK = """\
import os, pathlib

def page(context):
    ti = context["ti"]
    pathlib.Path(os.environ["ROWFILTER_TEST_PAGED"]).write_text(f"{ti.dag_id}.{ti.task_id}")
"""


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "rowfilter_test_alerts.py").write_text(CALLBACK)
    monkeypatch.syspath_prepend(str(tmp_path / "code"))
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path / 'code'}:{__import__('os').environ.get('PYTHONPATH', '')}")
    specs = tmp_path / "subscriptions"
    specs.mkdir()
    (specs / "alerts.yaml").write_text(SPEC)
    monkeypatch.setenv("ROWFILTER_SUBSCRIPTIONS_DIR", str(specs))
    return specs


def test_parsed_by_the_dag_processor(folder: Path) -> None:
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=REPO / "dags" / "rowfilter_subscriptions.py")
    assert bag.import_errors == {}
    tasks = {(d, t.task_id): t for d, dag in bag.dags.items() if "alerts" in d for t in dag.tasks}
    assert tasks, sorted(bag.dags)
    for task in tasks.values():
        assert task.owner == "team-orders" and not task.email  # email is Airflow 3's notifier, not the deprecated field
        notifier, page = task.on_failure_callback
        assert (type(notifier).__name__, notifier.to, page.__name__) == ("SmtpNotifier", ["orders-oncall@example.com"],
                                                                          "page")
    hour = timedelta(hours=1)
    assert tasks["rowfilter_alerts_incremental_sync", "apply"].execution_timeout == hour
    assert tasks["rowfilter_alerts_initial_sync", "apply"].execution_timeout == hour
    assert tasks["rowfilter_alerts_refresh", "refresh"].execution_timeout == hour
    assert tasks["rowfilter_alerts_initial_sync", "snapshot"].partial_kwargs["execution_timeout"] == timedelta(hours=2)


def test_a_failing_task_calls_the_callback(folder: Path, tmp_path: Path, airflow_db: dict[str, str]) -> None:
    paged = tmp_path / "paged"
    [result] = run_dags(airflow_db, [("rowfilter_alerts_refresh", None)], dags_folder=REPO / "dags",
                        env={"ROWFILTER_SUBSCRIPTIONS_DIR": str(folder), "ROWFILTER_TEST_PAGED": str(paged),
                             "PYTHONPATH": __import__("os").environ["PYTHONPATH"]})
    assert result["tasks"]["refresh"] == "failed", result["output"][-3000:]
    assert paged.read_text() == "rowfilter_alerts_refresh.refresh", result["output"][-3000:]


@pytest.mark.parametrize(("line", "expected"), [
    ("  on_failure_callback: no_such_module.page", "on_failure_callback='no_such_module.page' cannot be imported"),
    ("  on_failure_callback: os.sep", "on_failure_callback='os.sep' is not a function"),
    ("  email: oncall", "email='oncall' is not an email address"),
    ("  execution_timeout: 0", "execution_timeout=0 is not a number of seconds > 0 (null: no limit)"),
    ("  owner: ''", "owner='' is not a non-empty string"),
])
def test_bad_values_are_refused_naming_the_key(tmp_path: Path, line: str, expected: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(SPEC.split("airflow:")[0] + "airflow:\n" + line + "\n")
    with pytest.raises(SpecError, match=re.escape(expected)):
        build_dags(path)


def test_no_limit_when_asked(tmp_path: Path) -> None:
    path = tmp_path / "unbounded.yaml"
    path.write_text(SPEC.split("airflow:")[0] + "airflow:\n  execution_timeout: null\n")
    dags = build_dags(path)
    assert dags["rowfilter_alerts_incremental_sync"].get_task("apply").execution_timeout is None
