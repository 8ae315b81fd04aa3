"""Refresh a subscription's publications, then copy the tables the refresh added.

``ALTER SUBSCRIPTION … REFRESH PUBLICATION`` for a rowfilter subscription: after a table was added
to (or removed from) one of its publications, ``refresh`` gives the new table state ``i`` and forgets
the removed one; then each table waiting for its copy gets one ``snapshot`` task (dynamic task
mapping, pool ``rowfilter_copies``), as PostgreSQL starts a table-sync worker per new table with
``copy_data = true``. The incremental-sync DAG's next runs bring the copied tables from ``f`` to ``r``.

Manual (``schedule=None``): run it after changing the publications::

    airflow dags test rowfilter_refresh
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG, Param

from airflow_provider_rowfilter.core.spec.values import SUBSCRIPTION_NAME
from airflow_provider_rowfilter.dag_factory import copy_tasks
from airflow_provider_rowfilter.operators.refresh_publication import RefreshPublicationOperator

COPY_POOL = "rowfilter_copies"
SUBSCRIPTION = {"subscription": "{{ params.subscription }}", "subscriber_conn_id": "rowfilter_subscriber"}
JOB = {
    "publications": "{{ params.publications }}",
    "publisher_conn_id": "rowfilter_publisher",
    "conf": {"spark.ui.enabled": "false"},
    **SUBSCRIPTION,
}

with DAG(
    dag_id="rowfilter_refresh",
    description="Refresh a rowfilter subscription's publications and copy the tables it added",
    schedule=None,
    start_date=datetime(2025, 1, 1),
    catchup=False,
    max_active_runs=1,
    render_template_as_native_obj=True,
    params={
        "subscription": Param("demo", type="string", pattern=SUBSCRIPTION_NAME.pattern),
        "publications": Param(["p1", "p2", "p3", "p4"], type="array"),
    },
    default_args={"retries": 1, "retry_delay": timedelta(minutes=1)},
    tags=["rowfilter", "example"],
) as dag:
    refresh = RefreshPublicationOperator(task_id="refresh", **JOB)
    tables_to_copy, _ = copy_tasks(pool=COPY_POOL, tables=None, **JOB)  # and the mapped snapshot

    refresh >> tables_to_copy
