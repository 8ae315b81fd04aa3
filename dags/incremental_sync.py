"""Incremental sync of a subscription: every five minutes, an ApplyChanges run drains the slot.

Each run applies batches one after the other in one Spark application (PostgreSQL's apply worker, one
micro-batch at a time): a batch captures up to ``max_changes`` changes from the subscription's slot
into its change log and applies about that many, in a subscriber transaction of its own. The run
stops once everything the publisher had committed when it started is applied, or when its
``time_budget`` (default 240 s, so a run fits its five-minute interval) is spent; checked between
batches, a batch is never cut, and the next run goes on where it stopped. Tables that finished their
copy (``f``) catch up to ``r`` here too. The task's XCom says how many batches ran, whether the run
drained, and the lag at its end.

- ``max_active_runs=1``: runs of one subscription go one after the other;
- ``catchup=False``: a run drains everything committed before it started, so missed intervals need no
  runs of their own;
- retries with exponential back-off (30 s, 1 min, 2 min, … at most 15 min): a publisher or subscriber
  that is briefly away is retried; a conflict (an INSERT of an existing key) keeps failing until it
  is resolved, as a native subscription keeps restarting its apply worker.

The task emits an Airflow Asset event for each subscriber table the batch changed
(``postgres://host:port/database/schema/table``) through its AssetAlias outlet ``rowfilter_demo``:
schedule a downstream DAG on such an Asset to run after new data landed.

Every minute instead (``schedule="* * * * *"``, ``time_budget`` about 50 s): with ``spark_default`` a
``spark_connect`` connection to a warm Spark Connect server (``rowfilter spark-server start``), a run
with a few hundred changes takes seconds, not the JVM start and cold planning of a spark-submit run;
the demo (``--spark-connect``) shows each run's duration against both schedules (docs/apply.md,
"Spark Connect").

Run the initial sync first (``rowfilter_initial_sync``); then, on the embedded PostgreSQL of the
"Try it" section of docs/operators.md::

    airflow dags test rowfilter_incremental_sync
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG, Param

from airflow_provider_rowfilter.core.spec.values import SUBSCRIPTION_NAME
from airflow_provider_rowfilter.operators.apply_changes import ApplyChangesOperator

with DAG(
    dag_id="rowfilter_incremental_sync",
    description="Incremental sync of a rowfilter subscription: each run drains the slot in ApplyChanges micro-batches",
    schedule="*/5 * * * *",
    start_date=datetime(2025, 1, 1),
    catchup=False,
    max_active_runs=1,
    render_template_as_native_obj=True,
    params={
        "subscription": Param("demo", type="string", pattern=SUBSCRIPTION_NAME.pattern),
        "publications": Param(["p1", "p2", "p3", "p4"], type="array"),
        "max_changes": Param(100_000, type="integer", minimum=1),
        "time_budget": Param(240, type=["null", "number"], minimum=0),
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
        time_budget="{{ params.time_budget }}",
        asset_alias="rowfilter_demo",
        conf={"spark.ui.enabled": "false"},
    )
