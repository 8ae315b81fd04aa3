"""Initial sync of a subscription, and the backfill path: refresh -> snapshot copy -> wait for the copies.

The design's initial-sync DAG (design.md section 3), first version:

1. ``refresh`` (RefreshPublicationOperator): reconcile ``rowfilter.subscription_rel`` with the
   publications, like ``ALTER SUBSCRIPTION … REFRESH PUBLICATION``; a newly published table gets
   state ``i``. It also creates the slot and capture publication on the publisher, so changes made
   from now on are retained for the apply job.
2. ``snapshot`` (SnapshotCopyOperator): copy every table in ``i`` (the rows any publication's filter
   selects, only the published columns) and record the position to replay from; state ``f``.
   Backfill: ``SnapshotCopyOperator(tables=[…], resync=True)`` empties those tables and copies them again.
3. ``wait_for_copies`` (SubscriptionRelSensor): until every chosen table has reached ``f``.

Runs as-is against the embedded PostgreSQL with the demo's tables and publications::

    python -m airflow_provider_rowfilter.pg.embedded start --dir .rowfilter/pg   # prints its URL
    # publisher database "rowfilter_pub" with the demo's schema.sql and publications.sql, subscriber
    # database "rowfilter_sub" with the same (empty) tables: docs/operators.md, "Try it"
    export AIRFLOW_CONN_ROWFILTER_PUBLISHER='postgresql://postgres@127.0.0.1:PORT/rowfilter_pub'
    export AIRFLOW_CONN_ROWFILTER_SUBSCRIBER='postgresql://postgres@127.0.0.1:PORT/rowfilter_sub'
    export AIRFLOW_CONN_SPARK_DEFAULT='{"conn_type": "spark", "host": "local[*]"}'
    airflow dags test rowfilter_initial_sync

Trigger with ``{"tables": ["public.t1"]}`` to copy and wait for some tables only.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG, Param

from airflow_provider_rowfilter.operators.refresh_publication import RefreshPublicationOperator
from airflow_provider_rowfilter.operators.snapshot_copy import SnapshotCopyOperator
from airflow_provider_rowfilter.sensors.subscription_rel import SubscriptionRelSensor

# Shared by the three tasks: which subscription, and the Airflow connections it uses.
SUBSCRIPTION = {
    "subscription": "{{ params.subscription }}",
    "subscriber_conn_id": "rowfilter_subscriber",
}

with DAG(
    dag_id="rowfilter_initial_sync",
    description="Initial sync of a rowfilter subscription: refresh, snapshot copy, wait for the copies",
    schedule=None,
    start_date=datetime(2025, 1, 1),
    catchup=False,
    max_active_runs=1,  # two initial syncs of one subscription would copy the same tables twice
    # Params render as Python objects (a list stays a list), so `publications`/`tables` can be lists.
    render_template_as_native_obj=True,
    params={
        "subscription": Param("demo", type="string", pattern="^[a-z_][a-z0-9_]{0,62}$"),
        "publications": Param(["p1", "p2", "p3", "p4", "p_orders"], type="array"),
        "tables": Param(None, type=["null", "array"], description="schema.table names; null for all"),
    },
    default_args={"retries": 1, "retry_delay": timedelta(minutes=1)},
    tags=["rowfilter", "example"],
) as dag:
    refresh = RefreshPublicationOperator(
        task_id="refresh",
        publications="{{ params.publications }}",
        publisher_conn_id="rowfilter_publisher",
        conf={"spark.ui.enabled": "false"},
        **SUBSCRIPTION,
    )
    snapshot = SnapshotCopyOperator(
        task_id="snapshot",
        publications="{{ params.publications }}",
        publisher_conn_id="rowfilter_publisher",
        tables="{{ params.tables }}",
        conf={"spark.ui.enabled": "false"},
        **SUBSCRIPTION,
    )
    # ApplyChanges, which brings tables from `f` through `s` to `r`, comes in a later milestone; until
    # it exists this DAG waits for `f` (finished copy). Switch to target_state="r" once it runs.
    wait_for_copies = SubscriptionRelSensor(
        task_id="wait_for_copies",
        tables="{{ params.tables }}",
        target_state="f",
        mode="reschedule",
        poke_interval=30,
        timeout=timedelta(hours=6).total_seconds(),
        **SUBSCRIPTION,
    )

    refresh >> snapshot >> wait_for_copies
