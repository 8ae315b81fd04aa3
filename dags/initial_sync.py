"""Initial sync of a subscription: refresh -> one copy per table (mapped, pooled) -> apply -> wait for ``r``.

The initial-sync pipeline (docs/initial-sync.md, docs/operators.md):

1. ``refresh`` (RefreshPublicationOperator): reconcile ``rowfilter.subscription_rel`` with the
   publications, like ``ALTER SUBSCRIPTION … REFRESH PUBLICATION``; a newly published table gets
   state ``i``. It also creates the slot and capture publication on the publisher, so changes made
   from now on are retained for the apply job.
2. ``tables_to_copy``: the tables in ``i`` (or ``d``, a copy that did not finish), read from the
   subscriber.
3. ``snapshot`` (SnapshotCopyOperator, dynamic task mapping): one task per table, each copying the
   rows any publication's filter selects, only the published columns, and recording the position
   to replay from; state ``f``. The tasks run in pool ``rowfilter_copies``, whose slots bound how
   many tables are copied at once. Create it once:
   ``airflow pools set rowfilter_copies 2 "rowfilter initial copies"``.
4. ``apply`` (ApplyChangesOperator): replays, in bounded batches, what changed since each copy up to
   what the publisher had committed when it started, and brings the tables ``f`` -> ``s`` -> ``r``.
   It runs even when no table needed a copy.
5. ``wait_for_ready`` (SubscriptionRelSensor): until every chosen table is ``r``; fails at once on a
   recorded error. (The incremental-sync DAG's runs move tables that are still behind.)

Backfill one table: ``SnapshotCopyOperator(tables=["public.t1"], resync=True)`` empties it and copies
it again (docs/operators.md).

Runs as-is against the embedded PostgreSQL with the demo's tables and publications
(docs/operators.md, "Try it")::

    export AIRFLOW_CONN_ROWFILTER_PUBLISHER='postgresql://postgres@127.0.0.1:PORT/rowfilter_pub?passfile=PASSFILE'
    export AIRFLOW_CONN_ROWFILTER_SUBSCRIBER='postgresql://postgres@127.0.0.1:PORT/rowfilter_sub?passfile=PASSFILE'
    export AIRFLOW_CONN_SPARK_DEFAULT='{"conn_type": "spark", "host": "local[*]"}'
    airflow pools set rowfilter_copies 2 "rowfilter initial copies"
    airflow dags test rowfilter_initial_sync

Trigger with ``{"tables": ["public.t1"]}`` to copy and wait for some tables only.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG, Param

from airflow_provider_rowfilter.core.spec.values import SUBSCRIPTION_NAME
from airflow_provider_rowfilter.dag_factory import copy_tasks
from airflow_provider_rowfilter.operators.apply_changes import ApplyChangesOperator
from airflow_provider_rowfilter.operators.refresh_publication import RefreshPublicationOperator
from airflow_provider_rowfilter.sensors.subscription_rel import SubscriptionRelSensor

#: The pool bounding parallel copies (one slot per table being copied).
COPY_POOL = "rowfilter_copies"
# Which subscription, and the Airflow connections it uses: shared by every task.
SUBSCRIPTION = {"subscription": "{{ params.subscription }}", "subscriber_conn_id": "rowfilter_subscriber"}
JOB = {
    "publications": "{{ params.publications }}",
    "publisher_conn_id": "rowfilter_publisher",
    "conf": {"spark.ui.enabled": "false"},
    **SUBSCRIPTION,
}

with DAG(
    dag_id="rowfilter_initial_sync",
    description="Initial sync of a rowfilter subscription: refresh, one copy per table, apply, wait for r",
    schedule=None,
    start_date=datetime(2025, 1, 1),
    catchup=False,
    max_active_runs=1,  # two initial syncs of one subscription would copy the same tables twice
    # Params render as Python objects (a list stays a list), so `publications`/`tables` can be lists.
    render_template_as_native_obj=True,
    params={
        "subscription": Param("demo", type="string", pattern=SUBSCRIPTION_NAME.pattern),
        "publications": Param(["p1", "p2", "p3", "p4"], type="array"),
        "tables": Param(None, type=["null", "array"], description="schema.table names; null for all"),
    },
    default_args={"retries": 1, "retry_delay": timedelta(minutes=1)},
    tags=["rowfilter", "example"],
) as dag:
    refresh = RefreshPublicationOperator(task_id="refresh", **JOB)
    # tables_to_copy, then one snapshot task per table waiting for its copy (SnapshotCopyOperator
    # mapped over them); the pool bounds how many run at once.
    tables_to_copy, snapshot = copy_tasks(pool=COPY_POOL, tables="{{ params.tables }}", **JOB)
    apply = ApplyChangesOperator(
        task_id="apply",
        trigger_rule="none_failed",  # also when no table needed a copy (the mapped task is skipped)
        asset_alias="rowfilter_demo",  # the AssetAlias outlet the changed subscriber tables are added to
        **JOB,
    )
    wait_for_ready = SubscriptionRelSensor(
        task_id="wait_for_ready",
        tables="{{ params.tables }}",
        target_state="r",
        mode="reschedule",
        poke_interval=30,
        timeout=timedelta(hours=6).total_seconds(),
        **SUBSCRIPTION,
    )

    refresh >> tables_to_copy
    snapshot >> apply >> wait_for_ready
