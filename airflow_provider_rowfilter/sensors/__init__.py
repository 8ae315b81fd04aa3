"""Airflow sensors of airflow-provider-rowfilter."""
