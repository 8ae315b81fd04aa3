"""get_provider_info lists every hook, operator, sensor and trigger module, and each of them imports."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import airflow_provider_rowfilter
from airflow_provider_rowfilter.get_provider_info import get_provider_info

ROLES = {"hooks": "hooks", "operators": "operators", "sensors": "sensors", "triggers": "triggers"}


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
