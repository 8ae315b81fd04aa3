"""SubscriptionLsnSensor deferred to its trigger, and in poke mode with at=, for dag.test()."""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import DAG

from airflow_provider_rowfilter.sensors.subscription_lsn import SubscriptionLsnSensor

with DAG(dag_id="rowfilter_lsn_deferrable", schedule=None, start_date=datetime(2025, 1, 1),
         params={"subscription": "s1", "lsn": "0/0"}):
    SubscriptionLsnSensor(task_id="wait", subscription="{{ params.subscription }}", asset_alias="rowfilter_lsn_waits",
                          subscriber_conn_id="rowfilter_subscriber", lsn="{{ params.lsn }}", poke_interval=0.5,
                          timeout=120, deferrable=True)

with DAG(dag_id="rowfilter_lsn_at", schedule=None, start_date=datetime(2025, 1, 1),
         params={"subscription": "s1", "at": "now"}):
    SubscriptionLsnSensor(task_id="wait", subscription="{{ params.subscription }}", asset_alias="rowfilter_lsn_waits",
                          subscriber_conn_id="rowfilter_subscriber", publisher_conn_id="rowfilter_publisher",
                          at="{{ params.at }}", poke_interval=0.5, timeout=120)
