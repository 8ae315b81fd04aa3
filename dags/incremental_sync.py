"""Incremental sync of a subscription: one ApplyChanges micro-batch every five minutes.

Each run captures up to ``max_changes`` changes from the subscription's slot into its change log and
applies everything captured and not yet applied, in one subscriber transaction (PostgreSQL's apply
worker, one batch at a time). Tables that finished their copy (``f``) catch up to ``r`` here too.

- ``max_active_runs=1``: batches of one subscription run one after the other;
- ``catchup=False``: a batch takes everything pending, so missed intervals need no runs of their own;
- retries with exponential back-off (30 s, 1 min, 2 min, … at most 15 min): a publisher or subscriber
  that is briefly away is retried; a conflict (an INSERT of an existing key) keeps failing until it
  is resolved, as a native subscription keeps restarting its apply worker.

The task emits an Airflow Asset event for each subscriber table the batch changed
(``postgres://host:port/database/schema/table``) through its AssetAlias outlet ``rowfilter_demo``:
schedule a downstream DAG on such an Asset to run after new data landed.

Run the initial sync first (``rowfilter_initial_sync``); then, on the embedded PostgreSQL of the
"Try it" section of docs/operators.md::

    airflow dags test rowfilter_incremental_sync
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG, Param

from airflow_provider_rowfilter.core.spec import SUBSCRIPTION_NAME
from airflow_provider_rowfilter.operators.apply_changes import ApplyChangesOperator

with DAG(
    dag_id="rowfilter_incremental_sync",
    description="Incremental sync of a rowfilter subscription: one ApplyChanges micro-batch per run",
    schedule="*/5 * * * *",
    start_date=datetime(2025, 1, 1),
    catchup=False,
    max_active_runs=1,
    render_template_as_native_obj=True,
    params={
        "subscription": Param("demo", type="string", pattern=SUBSCRIPTION_NAME.pattern),
        "publications": Param(["p1", "p2", "p3", "p4"], type="array"),
        "max_changes": Param(100_000, type="integer", minimum=1),
    },
    default_args={
        "retries": 4,
        "retry_delay": timedelta(seconds=30),
        "retry_exponential_backoff": 2.0,
        "max_retry_delay": timedelta(minutes=15),
    },
    tags=["rowfilter", "example"],
) as dag:
    ApplyChangesOperator(
        task_id="apply",
        subscription="{{ params.subscription }}",
        publications="{{ params.publications }}",
        publisher_conn_id="rowfilter_publisher",
        subscriber_conn_id="rowfilter_subscriber",
        max_changes="{{ params.max_changes }}",
        asset_alias="rowfilter_demo",
        conf={"spark.ui.enabled": "false"},
    )
