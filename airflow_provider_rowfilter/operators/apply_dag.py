"""What a task knows of another DAG of its subscription, the incremental sync that applies it: paused, running.

Airflow 3's tasks reach the metadata database only through the Execution API, which a running task
instance offers as ``ti.get_dag(dag_id)`` (its ``is_paused``) and ``ti.get_dr_count(dag_id, states=…)``
(airflow/sdk/execution_time/task_runner.py). Where a task runs without them (an operator's ``execute``
called by hand), nothing is known and nothing is said.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ApplyDag:
    """The incremental sync as Airflow sees it now."""

    dag_id: str
    paused: bool
    running_runs: int

    def as_dict(self) -> dict[str, Any]:
        return {"dag_id": self.dag_id, "paused": self.paused, "running_runs": self.running_runs}


def apply_dag(context: Mapping[str, Any] | None, dag_id: str | None) -> ApplyDag | None:
    """``dag_id`` as the Execution API gives it to the task of ``context``; None when it cannot be asked."""
    ti = (context or {}).get("ti") if isinstance(context, Mapping) else None
    if not dag_id or ti is None or not hasattr(ti, "get_dag"):
        return None
    try:
        paused = bool(ti.get_dag(dag_id).is_paused)
        running = int(ti.get_dr_count(dag_id=dag_id, states=["running"]))
    except Exception:  # an Airflow without the call, a DAG not parsed yet: the rest of the check still holds
        return None
    return ApplyDag(dag_id, paused, running)
