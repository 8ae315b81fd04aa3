"""The Airflow tests' fixtures (tests/airflow/fixtures.py, which sets AIRFLOW_HOME before Airflow is imported)."""

from __future__ import annotations

from tests.airflow.fixtures import airflow_conn, airflow_db, cluster, state_db, statsd

__all__ = ["airflow_conn", "airflow_db", "cluster", "state_db", "statsd"]
