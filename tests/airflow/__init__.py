"""Tests of the Airflow layer: hooks, operators, sensors, triggers and the example DAGs."""
