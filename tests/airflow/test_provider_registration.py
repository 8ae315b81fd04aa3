"""get_provider_info lists every hook, operator, sensor and trigger module, and each of them imports."""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

import pytest

import airflow_provider_rowfilter
from airflow_provider_rowfilter.get_provider_info import get_provider_info

ROLES = {"hooks": "hooks", "operators": "operators", "sensors": "sensors", "triggers": "triggers"}

TEST_DAGS = Path(__file__).with_name("dags")  # the test DAGs (tests/airflow/dags)


@pytest.mark.parametrize("role", sorted(ROLES))
def test_every_module_of_a_role_is_registered_and_imports(role: str) -> None:
    info = get_provider_info()
    registered = sorted(m for entry in info[role] for m in entry["python-modules"])
    package = importlib.import_module(f"{airflow_provider_rowfilter.__name__}.{ROLES[role]}")
    present = sorted(m.name for m in pkgutil.iter_modules(package.__path__, prefix=f"{package.__name__}."))
    assert registered == present
    for module in registered:
        importlib.import_module(module)
    assert {entry["integration-name"] for entry in info[role]} <= {i["integration-name"] for i in info["integrations"]}


def test_classes_are_where_the_docs_say() -> None:
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
    from airflow.sdk import BaseHook, BaseSensorOperator
    from airflow.triggers.base import BaseTrigger

    from airflow_provider_rowfilter.hooks.rowfilter import RowFilterHook
    from airflow_provider_rowfilter.hooks.subscription_rel import SubscriptionRelHook
    from airflow_provider_rowfilter.operators.apply_changes import ApplyChangesOperator
    from airflow_provider_rowfilter.operators.refresh_publication import RefreshPublicationOperator
    from airflow_provider_rowfilter.operators.snapshot_copy import SnapshotCopyOperator
    from airflow_provider_rowfilter.sensors.subscription_rel import SubscriptionRelSensor
    from airflow_provider_rowfilter.triggers.subscription_rel import SubscriptionRelTrigger

    assert issubclass(RefreshPublicationOperator, SparkSubmitOperator)
    assert issubclass(SnapshotCopyOperator, SparkSubmitOperator)
    assert issubclass(ApplyChangesOperator, SparkSubmitOperator)
    assert issubclass(SubscriptionRelSensor, BaseSensorOperator)
    assert issubclass(SubscriptionRelTrigger, BaseTrigger)
    assert issubclass(RowFilterHook, BaseHook) and issubclass(SubscriptionRelHook, RowFilterHook)


def test_a_postgres_connection_made_with_the_airflow_command(tmp_path, state_db) -> None:
    """Issue 18 item 1: `airflow connections add … --conn-type postgres` (docs/getting-started.md) keeps
    the type (the postgres provider is a dependency), and a task resolves the connection through it."""
    import subprocess
    import sys

    import psycopg

    from airflow_provider_rowfilter.tooling.demo.dag_runner import airflow_home, run_dags

    env = airflow_home(tmp_path / "home", TEST_DAGS)
    info = psycopg.conninfo.conninfo_to_dict(state_db.dsn)
    added = subprocess.run(
        [sys.executable, "-m", "airflow", "connections", "add", "rowfilter_subscriber", "--conn-type", "postgres",
         "--conn-host", str(info["host"]), "--conn-port", str(info["port"]), "--conn-login", str(info["user"]),
         "--conn-schema", str(info["dbname"])],
        env=env, capture_output=True, text=True, timeout=300, check=False)
    assert added.returncode == 0, added.stdout + added.stderr
    assert "overriding with generic" not in added.stdout + added.stderr
    shown = subprocess.run([sys.executable, "-m", "airflow", "connections", "get", "rowfilter_subscriber", "-o",
                            "json"], env=env, capture_output=True, text=True, timeout=300, check=True)
    assert '"conn_type": "postgres"' in shown.stdout, shown.stdout
    # A task of a real DAG run reads the subscriber through that connection (the metadata database's).
    state_db.set_states(**{"public.t1": "r", "public.t2": "r", "sales.t3": "r"})
    [result] = run_dags(env, [("rowfilter_sensor_reschedule", {"subscription": "s1", "tables": None})])
    assert (result["state"], result["tasks"]) == ("success", {"wait": "success"}), result["output"][-3000:]
