"""The sensor in reschedule mode and deferred to the trigger, each alone in a DAG, for dag.test()."""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import DAG

from airflow_provider_rowfilter.sensors.subscription_rel import SubscriptionRelSensor

for mode in ("reschedule", "deferrable"):
    with DAG(dag_id=f"rowfilter_sensor_{mode}", schedule=None, start_date=datetime(2025, 1, 1),
             params={"subscription": "s1", "tables": None}, render_template_as_native_obj=True):
        SubscriptionRelSensor(
            task_id="wait",
            subscription="{{ params.subscription }}",
            subscriber_conn_id="rowfilter_subscriber",
            tables="{{ params.tables }}",
            target_state="f",
            poke_interval=1,
            timeout=120,
            **({"mode": "reschedule"} if mode == "reschedule" else {"deferrable": True}),
        )
