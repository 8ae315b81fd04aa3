"""A DAG file parsed as the scheduler parses it, on every loop: no Spark, no Arrow, no numpy loaded.

The DAG factory's file (dags/rowfilter_subscriptions.py) builds every subscription's DAGs from its
spec files; it runs here in a fresh interpreter that refuses pyspark, pyarrow and numpy. The operators
load the apply's code only when a task runs (operators/apply_changes.py ``run_in_task``).
"""

from __future__ import annotations

from pathlib import Path

from tests.blocked_imports import import_blocked

DAG_FILE = Path(__file__).resolve().parents[2] / "dags" / "rowfilter_subscriptions.py"


def test_a_factory_dag_file_parses_without_spark_arrow_or_numpy(monkeypatch) -> None:
    monkeypatch.delenv("ROWFILTER_SUBSCRIPTIONS_DIR", raising=False)
    result = import_blocked([], ("pyspark", "pyarrow", "numpy"), [str(DAG_FILE)])
    assert result["failed"] == {}, "\n".join(dict(result["failed"]).values())
    assert result["leaked"] == []
    names = result["names"][str(DAG_FILE)]
    assert {"rowfilter_demo_orders_initial_sync", "rowfilter_demo_orders_incremental_sync",
            "rowfilter_demo_orders_refresh"} <= set(names)
